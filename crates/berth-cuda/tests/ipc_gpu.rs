//! Sharing memory of the `paged` and `expandable` policies with another process on a real GPU
//! (`Note [Sharing mapped memory]` in `ipc.rs`): what `torch.multiprocessing` does with a CUDA
//! tensor under `berth_torch`. One policy per process (`Note [One allocator registry]`), so the
//! test starts this binary again as the sender for each policy, and the sender starts it once
//! more as the receiver.

use std::process::Command;

use berth_alloc::{AllocatorConfig, StreamId};
use berth_cuda::copy::{copy_dtoh_async, copy_htod_async};
use berth_cuda::ipc::{self, SharedMapping, SharedRange};
use berth_cuda::{memory, CudaError, Stream};

const MIB: usize = 1 << 20;
const TEST: &str = "a_block_shared_with_another_process_reads_and_writes_the_same_memory";
/// `sender:<policy>` or `receiver`, in the started copies.
const ROLE: &str = "BERTH_IPC_ROLE";
/// The receiver's inputs: the handle (hex), the block's offset in it and its length.
const HANDLE: &str = "BERTH_IPC_HANDLE";
const OFFSET: &str = "BERTH_IPC_OFFSET";
const LEN: &str = "BERTH_IPC_LEN";

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn copy_in(ptr: u64, src: &[u8]) {
    let stream = Stream::default_stream(0).unwrap();
    // SAFETY: `src` outlives the copy (synchronized below); `ptr..+len` is idle device memory.
    unsafe { copy_htod_async(ptr, src.as_ptr(), src.len(), &stream) }.unwrap();
    stream.synchronize().unwrap();
}

fn copy_out(ptr: u64, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    let stream = Stream::default_stream(0).unwrap();
    // SAFETY: `back` holds `len` bytes and outlives the copy (synchronized below).
    unsafe { copy_dtoh_async(back.as_mut_ptr(), ptr, len, &stream) }.unwrap();
    stream.synchronize().unwrap();
    back
}

fn run_self(envs: &[(&str, String)]) -> (bool, String) {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", TEST, "--include-ignored", "--nocapture"]);
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Opens the handle, checks the block's bytes, writes 0xAB over its first byte.
fn receiver() {
    let range = SharedRange::from_bytes(&unhex(&std::env::var(HANDLE).unwrap())).unwrap();
    let offset: u64 = std::env::var(OFFSET).unwrap().parse().unwrap();
    let len: usize = std::env::var(LEN).unwrap().parse().unwrap();
    let opened = ipc::open(0, &range).unwrap();
    assert_eq!(opened.bytes() as u64, range.bytes());
    let got = copy_out(opened.ptr() + offset, len);
    assert!(got == pattern(len), "the receiver reads the sender's bytes");
    copy_in(opened.ptr() + offset, &[0xAB]);
    println!(
        "receiver read {len} bytes in {} mappings",
        range.mappings.len()
    );
}

fn sender(policy: &str) {
    memory::configure(AllocatorConfig::parse(policy).unwrap()).unwrap();
    let a = memory::allocator(0).unwrap();
    let len = 96 * MIB + 12_345;
    let block = a.allocate(len, StreamId::DEFAULT).unwrap();
    let ptr = block.ptr().0;
    copy_in(ptr, &pattern(len));
    let (base, range) = ipc::share(0, ptr, len).unwrap().expect("mapped memory");
    assert!(base <= ptr && ptr + len as u64 <= base + range.bytes());
    // The same block shares to the same handle (a receiver caching by handle maps it once).
    let (base2, again) = ipc::share(0, ptr, len).unwrap().unwrap();
    assert_eq!((base2, &again), (base, &range));
    assert_eq!(range.pid, std::process::id() as i32);

    // Opened in this process too, at another address, the same memory.
    {
        let here = ipc::open(0, &range).unwrap();
        assert_ne!(here.ptr(), base);
        assert!(copy_out(here.ptr() + (ptr - base), len) == pattern(len));
    }

    let (ok, out) = run_self(&[
        (ROLE, "receiver".into()),
        (HANDLE, hex(&range.to_bytes())),
        (OFFSET, (ptr - base).to_string()),
        (LEN, len.to_string()),
    ]);
    assert!(ok, "receiver failed:\n{out}");
    assert!(out.contains(&format!("receiver read {len} bytes")), "{out}");
    assert_eq!(
        copy_out(ptr, 2),
        vec![0xAB, 1],
        "the receiver wrote into this memory"
    );

    // A sender that is gone: a clear error, nothing mapped.
    let gone = SharedRange {
        pid: i32::MAX - 7,
        mappings: vec![SharedMapping {
            offset: 0,
            bytes: range.mappings[0].bytes,
            fd: range.mappings[0].fd,
        }],
    };
    match ipc::open(0, &gone) {
        Err(CudaError::Ipc { reason }) => {
            assert!(reason.contains("has exited"), "{reason}");
        }
        other => panic!("expected Ipc, got {other:?}"),
    }
    // An address the policy did not map is not berth's to share: `None` (left to cudaIpc).
    assert!(ipc::share(0, 0x1000, 16).unwrap().is_none());
    drop(block);
    a.empty_cache().unwrap();
    println!("sender {policy}: ok ({} mappings)", range.mappings.len());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn a_block_shared_with_another_process_reads_and_writes_the_same_memory() {
    match std::env::var(ROLE).as_deref() {
        Ok("receiver") => return receiver(),
        Ok(role) if role.starts_with("sender:") => return sender(&role["sender:".len()..]),
        _ => {}
    }
    if !berth_cuda::testing::require_gpu(TEST) {
        return;
    }
    for policy in ["backend:paged", "expandable_segments:True"] {
        let (ok, out) = run_self(&[(ROLE, format!("sender:{policy}"))]);
        assert!(ok, "{policy}:\n{out}");
        assert!(out.contains(&format!("sender {policy}: ok")), "{out}");
        println!(
            "{}",
            out.lines().find(|l| l.starts_with("sender")).unwrap_or("")
        );
    }
}
