//! `berth replay` on inputs it must check or read right: an alloc at a live address, snapshot
//! pickles with histories on several devices, `BERTH_ALLOC_CONF`, and the address ties that
//! `--real-addrs` resolves.

use std::path::PathBuf;
use std::process::{Command, Output};

mod common;
use common::{normalize, trace_file, TempDir};

fn berth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env_remove("BERTH_ALLOC_CONF")
        .output()
        .expect("berth runs")
}

/// `BERTH_ALLOC_CONF` tunes the PyTorch policy's rows (here `max_split_size_mb`, which makes
/// PyTorch's policy reserve more on `lstm_varlen_train`), is checked, and its policy keys are
/// named as unused.
#[test]
fn replay_reads_berth_alloc_conf_for_the_pytorch_rows() {
    let lstm = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../berth-alloc/tests/data/lstm_varlen_train.trace.json.gz");
    let run = |conf: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_berth"));
        c.args([
            "replay",
            "--json",
            "--policy",
            "pytorch",
            lstm.to_str().unwrap(),
        ]);
        match conf {
            Some(v) => c.env("BERTH_ALLOC_CONF", v),
            None => c.env_remove("BERTH_ALLOC_CONF"),
        };
        c.output().expect("berth runs")
    };
    let reserved = |out: &Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        normalize(String::from_utf8_lossy(&out.stdout).trim_end())["peak_reserved"]
            .as_u64()
            .unwrap()
    };
    let plain = reserved(&run(None));
    // PyTorch's own live figure for this trace in its default mode.
    assert_eq!(plain, 20_088_619_008);
    let split = reserved(&run(Some("max_split_size_mb:64")));
    assert!(
        split > plain,
        "max_split_size_mb:64 gave {split}, the default {plain}"
    );
    let noted = run(Some("backend:native"));
    assert_eq!(reserved(&noted), plain);
    assert!(
        String::from_utf8_lossy(&noted.stderr)
            .contains("its `backend` and `expandable_segments` are not used"),
        "{}",
        String::from_utf8_lossy(&noted.stderr)
    );
    let bad = run(Some("bogus"));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            "berth: error: BERTH_ALLOC_CONF: unrecognized allocator config key 'bogus'"
        ),
        "{err}"
    );
}

/// Where the PyTorch policy's row differs from PyTorch's recorded figures because of address
/// ties, the table says how to match them (`--real-addrs`), and with it they match.
#[test]
fn a_pytorch_row_off_by_address_ties_points_to_real_addrs() {
    let unet = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../berth-alloc/tests/data/unet_diffusion_train.trace.json.gz");
    let unet = unet.to_str().unwrap();
    let out = berth(&["replay", "--policy", "pytorch", unet]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("pass --real-addrs to use the segment addresses the trace recorded"),
        "{text}"
    );
    let out = berth(&["replay", "--policy", "pytorch", "--real-addrs", unet]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("--real-addrs"), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pytorch ") || l.starts_with("torch (recorded) "))
        .collect();
    // Segments, ratio, the peak reserved's unit and number: from the right, past the two
    // columns the recorded row leaves as `-` (device calls, ns/op).
    fn figures(l: &str) -> Vec<&str> {
        l.split_whitespace().rev().skip(2).take(4).collect()
    }
    assert_eq!(rows.len(), 2, "{text}");
    assert_eq!(figures(rows[0]), figures(rows[1]), "{text}");
}

/// Two live blocks cannot share an address: an alloc at a live one is refused at that event,
/// not blamed on a later free.
#[test]
fn an_alloc_at_a_live_address_is_refused_at_that_event() {
    let (_dir, path) = trace_file(
        "live-alloc",
        "t.json",
        r#"{"events": [["alloc", 16, 100, 0, 1], ["alloc", 16, 100, 0, 2], ["free_completed", 16, 100, 0, 3], ["free_completed", 16, 100, 0, 4]]}"#,
    );
    let out = berth(&["replay", path.to_str().unwrap()]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(": trace event #1: alloc at address 0x10, which is already live (allocated by row #0 and not freed since)"),
        "{err}"
    );
}

/// A snapshot pickle holding `histories` (device index → alloc sizes, each freed) as bytes.
fn snapshot_pickle(histories: &[&[u64]]) -> Vec<u8> {
    use berth_alloc::{MemorySnapshot, StreamId, TraceAction, TraceEntry};
    let entry = |action, addr, size| TraceEntry {
        action,
        addr,
        size,
        stream: StreamId::DEFAULT,
        time_us: 0,
    };
    let device_traces = histories
        .iter()
        .map(|sizes| {
            let mut t = Vec::new();
            for (i, &size) in sizes.iter().enumerate() {
                let addr = 0x1000 * (i as u64 + 1);
                t.push(entry(TraceAction::Alloc, addr, size));
                t.push(entry(TraceAction::FreeCompleted, addr, size));
            }
            t
        })
        .collect();
    berth_alloc::pickle::dump_snapshot(&MemorySnapshot {
        segments: Vec::new(),
        device_traces,
        allocator_settings: berth_alloc::AllocatorConfig::default(),
    })
}

/// A snapshot is replayed for the device that has a history (named on stderr when it is not
/// device 0); with several, `--snapshot-device` picks one and its absence is an error.
#[test]
fn a_snapshot_replays_the_device_with_a_history() {
    let dir = TempDir::new("replay-snapshot-device");
    let only_2 = dir.join("only2.pickle");
    std::fs::write(&only_2, snapshot_pickle(&[&[], &[], &[1024, 2048]])).unwrap();
    let out = berth(&[
        "replay",
        "--json",
        "--policy",
        "pytorch",
        only_2.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("replaying device 2's history"), "{err}");
    let v = normalize(String::from_utf8(out.stdout).unwrap().trim_end());
    assert_eq!(v["ops"], 4, "device 2's two allocs and frees: {v}");
    assert_eq!(v["peak_requested"], 2048);

    let two = dir.join("two.pickle");
    std::fs::write(&two, snapshot_pickle(&[&[512], &[4096, 8192, 512]])).unwrap();
    let two_s = two.to_str().unwrap();
    let out = berth(&["replay", two_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the snapshot holds the allocator histories of devices 0, 1; pass --snapshot-device N to replay one"),
        "{err}"
    );
    for (device, ops, peak) in [("0", 2, 512), ("1", 6, 8192)] {
        let out = berth(&[
            "replay",
            "--json",
            "--policy",
            "pytorch",
            "--snapshot-device",
            device,
            two_s,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = normalize(String::from_utf8(out.stdout).unwrap().trim_end());
        assert_eq!(
            (v["ops"].as_u64(), v["peak_requested"].as_u64()),
            (Some(ops), Some(peak)),
            "device {device}: {v}"
        );
    }
    let out = berth(&["replay", "--snapshot-device", "5", two_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--snapshot-device 5: that device has no allocator history; the snapshot has one for device 0, 1"),
        "{err}"
    );
}
