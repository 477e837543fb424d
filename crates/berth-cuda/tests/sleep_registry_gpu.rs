//! Sleep and wake through the per-device registry on a real GPU with the `paged` policy
//! (`berth_cuda::sleep`, what `berth_torch.sleep` calls): the backups' host memory
//! (`Note [Backup host memory]`) kept between sleeps when asked and given back on request,
//! and a process that exits while a tag sleeps, leaking nothing. One policy per test
//! process (`Note [One allocator registry]`), so this file holds one test; the exiting
//! process is this test binary started again.

use std::process::Command;

use berth_alloc::{AllocatorConfig, StreamId};
use berth_cuda::copy::{copy_dtoh_async, copy_htod_async};
use berth_cuda::mem_get_info;
use berth_cuda::memory;
use berth_cuda::sleep::{self, TagGuard};
use berth_cuda::Stream;

const MIB: usize = 1 << 20;
const TEST: &str = "sleep_wake_keeps_host_memory_when_asked_and_an_exit_while_asleep_leaks_nothing";
/// Set in the started copy: sleep with an offload, then exit without waking.
const CHILD: &str = "BERTH_SLEEP_EXIT_CHILD";

fn used() -> u64 {
    let (free, total) = mem_get_info(0).unwrap();
    (total - free) as u64
}

/// Allocates `mib` MiB in tag `tag` and fills it with `byte`.
fn filled(tag: &str, mib: usize, byte: u8) -> berth_alloc::Allocation {
    let a = memory::allocator(0).unwrap();
    let block = {
        let _t = TagGuard::new(tag).unwrap();
        a.allocate(mib * MIB, StreamId::DEFAULT).unwrap()
    };
    let src = vec![byte; mib * MIB];
    let stream = Stream::default_stream(0).unwrap();
    // SAFETY: `src` holds the block's bytes and outlives the copy (synchronized below); the
    // block is new and idle.
    unsafe { copy_htod_async(block.ptr().0, src.as_ptr(), src.len(), &stream) }.unwrap();
    stream.synchronize().unwrap();
    block
}

/// This process's resident host memory, in bytes (`VmRSS` of `/proc/self/status`).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// The bytes of `block`.
fn read(block: &berth_alloc::Allocation, bytes: usize) -> Vec<u8> {
    let mut back = vec![0u8; bytes];
    let stream = Stream::default_stream(0).unwrap();
    // SAFETY: `back` holds `bytes` bytes and outlives the copy (synchronized below).
    unsafe { copy_dtoh_async(back.as_mut_ptr(), block.ptr().0, bytes, &stream) }.unwrap();
    stream.synchronize().unwrap();
    back
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn sleep_wake_keeps_host_memory_when_asked_and_an_exit_while_asleep_leaks_nothing() {
    if !berth_cuda::testing::require_gpu(TEST) {
        return;
    }
    memory::configure(AllocatorConfig::parse("backend:paged").unwrap()).unwrap();
    if std::env::var_os(CHILD).is_some() {
        let _w = filled("weights", 512, 0x5A);
        let s = sleep::sleep(0, &["weights"], &["weights"]).unwrap();
        println!("child asleep: {} bytes offloaded", s.offloaded_bytes);
        // No wake, no drop: the process ends with the tag asleep.
        std::process::exit(0);
    }

    // The host memory of the backups: freed at wake by default, kept when asked.
    let weights = filled("weights", 512, 0xA5);
    let rss_awake = rss();
    let first = sleep::sleep(0, &["weights"], &["weights"]).unwrap();
    assert_eq!(first.offloaded_bytes, 512 * MIB as u64);
    let rss_asleep = rss();
    let woke = sleep::wake(0, &["weights"]).unwrap();
    assert_eq!(woke.restored_bytes, 512 * MIB as u64);
    // The backup is freed by a background thread; kept_host_bytes waits for it.
    assert_eq!(sleep::kept_host_bytes(), 0, "freed at wake by default");
    let rss_woken = rss();
    println!(
        "host resident: awake {rss_awake}, asleep {rss_asleep}, woken {rss_woken} bytes; wake \
         {:?} + handing the backup to the freeing thread {:?}",
        woke.map_and_copy_time, woke.free_host_memory_time
    );
    assert!(
        rss_asleep >= rss_awake + 500 * MIB as u64,
        "the backup is resident while asleep"
    );
    assert!(
        rss_woken + 448 * MIB as u64 <= rss_asleep,
        "the backup went back to the system after the wake"
    );
    sleep::keep_host_memory(true);
    let second = sleep::sleep(0, &["weights"], &["weights"]).unwrap();
    sleep::wake(0, &["weights"]).unwrap();
    assert_eq!(
        sleep::kept_host_bytes(),
        512 * MIB as u64,
        "kept when asked"
    );
    let third = sleep::sleep(0, &["weights"], &["weights"]).unwrap();
    assert_eq!(
        sleep::kept_host_bytes(),
        0,
        "the kept buffer was taken again"
    );
    let woke = sleep::wake(0, &["weights"]).unwrap();
    println!(
        "host memory: first sleep {:?} (getting host memory {:?}), second {:?}, third (kept \
         buffer) {:?} (getting host memory {:?}); wake {:?} + freeing {:?}",
        first.copy_and_release_time + first.host_memory_time,
        first.host_memory_time,
        second.copy_and_release_time + second.host_memory_time,
        third.copy_and_release_time + third.host_memory_time,
        third.host_memory_time,
        woke.map_and_copy_time,
        woke.free_host_memory_time,
    );
    let back = read(&weights, 512 * MIB);
    assert!(
        back.iter().all(|&b| b == 0xA5),
        "contents survive three cycles"
    );
    assert_eq!(sleep::release_host_memory().unwrap(), 512 * MIB as u64);
    assert_eq!(sleep::kept_host_bytes(), 0);
    sleep::keep_host_memory(false);
    drop(weights);
    memory::allocator(0).unwrap().empty_cache().unwrap();

    // A process that exits while a tag sleeps: it ends cleanly and the driver has all of
    // its memory back.
    let before = used();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--include-ignored", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("child asleep: {} bytes offloaded", 512 * MIB)),
        "{stdout}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let after = used();
    assert!(
        after <= before + 2 * MIB as u64,
        "the driver has the exited process's memory back: {before} -> {after}"
    );
}
