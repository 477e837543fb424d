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
        sleeping: Vec::new(),
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

/// Newcomer defect 8: `/dev/zero` given to `replay`, `memviz` or `eval --load` was read until
/// the process was killed. A stream is judged by its first byte (a zero is neither a pickle nor
/// JSON: refused at once, whatever the cap), and every whole-file read stops at the cap, which
/// the error names.
#[test]
fn dev_zero_as_any_input_fails_at_once_or_at_the_input_cap() {
    for (args, want) in [
        (
            &["replay", "/dev/zero"][..],
            "malformed trace JSON at line 1, column 1",
        ),
        (
            &["memviz", "/dev/zero", "-o", "/dev/null"][..],
            "not a memory snapshot",
        ),
    ] {
        let t0 = std::time::Instant::now();
        let out = berth(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "{args:?}"
        );
    }
    // eval --load checks the safetensors header's length before reading on: /dev/zero
    // declares a header of 0 bytes and is refused at once, under the default 1 GiB cap too.
    let t0 = std::time::Instant::now();
    let out = berth(&["eval", "--load", "/dev/zero"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--load /dev/zero: safetensors: header too small"),
        "{err}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{err}");
    assert!(err.len() < 1000, "{err}");
}

/// Newcomer defect 11: a `free_completed` whose size or stream is not its `alloc`'s is refused
/// with its row number.
#[test]
fn replay_refuses_a_free_that_contradicts_its_alloc() {
    let (_dir, path) = trace_file(
        "free-mismatch",
        "t.json",
        r#"{"events": [["alloc", 4096, 512, 0, 0], ["free_completed", 4096, 1024, 0, 1]]}"#,
    );
    let out = berth(&["replay", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("#1")
            && err.contains(
                "says 1024 bytes on stream 0, but its alloc (row #0) was 512 bytes on stream 0"
            ),
        "{err}"
    );
}

/// Newcomer defect 10: with `--capacity 64PiB`, 64 streams exhausted the simulator's address
/// space under `expandable` and `paged`, with contradictory errors and no table (then the
/// capacity was refused up front for every policy, still with no table). The reproducer's
/// trace (`trace-64-streams.json`: on each of 64 streams 512 bytes allocated and freed) now
/// replays under `paged`, which reserves only a request's pages once the address space is short
/// (`Note [Paged address space]`); `expandable` gets its own row with one clear error (its
/// reservations of 9/8 × 64 PiB per stream and pool fill the 2^62 − 2^40 bytes at stream 56),
/// a note names the capacity it would need, and the table holds every policy.
#[test]
fn sixty_four_streams_at_64_pib_print_the_table_and_paged_replays() {
    let rows: Vec<String> = (0..64u64)
        .flat_map(|s| {
            let addr = (1u64 << 40) + s * 4096;
            [
                format!(r#"["alloc", {addr}, 512, {s}, {}]"#, 2 * s),
                format!(r#"["free_completed", {addr}, 512, {s}, {}]"#, 2 * s + 1),
            ]
        })
        .collect();
    let json = format!(r#"{{"events": [{}]}}"#, rows.join(", "));
    let (_dir, path) = trace_file("64-streams", "t.json", &json);
    let t0 = std::time::Instant::now();
    let out = berth(&[
        "replay",
        "--policy",
        "all",
        "--capacity",
        "64PiB",
        path.to_str().unwrap(),
    ]);
    assert!(t0.elapsed().as_secs() < 60, "{:?}", t0.elapsed());
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // Status 1: a policy failed; the others' rows are printed.
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{err}");
    let row = |policy: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{policy} ")))
            .unwrap_or_else(|| panic!("no {policy} row in {stdout}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    // ops, peak requested, peak reserved, ratio, segments: paged keeps one 2 MiB page mapped
    // at a time (64 maps and 63 unmaps); PyTorch's default policy keeps a 2 MiB small-pool
    // segment per stream (64 segments, 128 MiB).
    assert_eq!(
        row("paged")[..8],
        [
            "paged",
            "128",
            "512",
            "bytes",
            "2.00",
            "MiB",
            "4096.0000x",
            "64"
        ]
    );
    assert_eq!(row("paged")[8], "127", "device calls");
    assert_eq!(
        row("pytorch")[..8],
        [
            "pytorch",
            "128",
            "512",
            "bytes",
            "128.00",
            "MiB",
            "262144.0000x",
            "64"
        ]
    );
    let expandable = stdout
        .lines()
        .find(|l| l.starts_with("expandable "))
        .unwrap();
    assert!(
        expandable.contains("failed at trace event #112 (alloc of 512 bytes)")
            && expandable.contains("address space exhausted: reserve of"),
        "{expandable}"
    );
    // 2^62 − 2^40 bytes hold the 2 × 9/8 × capacity of each stream for this capacity.
    let max = (((((1u64 << 62) - (1 << 40)) / 64 - (64 << 20)) / 9 * 4) >> 20) << 20;
    assert!(
        err.contains("allocates on 64 streams")
            && err.contains(&format!("pass --capacity {max} or less for it"))
            && err.contains("replaying t with policy expandable"),
        "{err}"
    );
    assert!(!err.contains("paged"), "{err}");
    // At that capacity every policy replays.
    let out = berth(&[
        "replay",
        "--json",
        "--policy",
        "all",
        "--capacity",
        &max.to_string(),
        path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(!stdout.contains("out_of_memory"), "{stdout}");
}

/// Newcomer defect 15: replay refused the protocol-0 and protocol-1 snapshot pickles memviz
/// reads (it knew a pickle only by the 0x80 of protocol 2 and later). One snapshot written
/// with protocols 0, 1 and 4 (`pickle.dumps(d, protocol=p)`) replays the same.
#[test]
fn replay_reads_snapshot_pickles_of_every_protocol() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let rows: Vec<String> = [0, 1, 4]
        .iter()
        .map(|p| {
            let file = data.join(format!("three_allocs.proto{p}.pickle"));
            let out = berth(&[
                "replay",
                "--json",
                "--policy",
                "pytorch",
                file.to_str().unwrap(),
            ]);
            assert!(
                out.status.success(),
                "protocol {p}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let mut v = normalize(String::from_utf8_lossy(&out.stdout).trim());
            v.as_object_mut().unwrap().remove("trace");
            assert_eq!(v["ops"], 3, "protocol {p}: {v}");
            assert_eq!(v["peak_requested"], 3 << 20, "protocol {p}: {v}");
            v.to_string()
        })
        .collect();
    assert_eq!(rows[0], rows[1]);
    assert_eq!(rows[0], rows[2]);
}

/// Newcomer defect 18: `--snapshot-device` was ignored for JSON traces, a BOM and a size of
/// 2^64 were worded oddly, and a trace's recorded `alloc_conf` was unused.
#[test]
fn small_replay_inconsistencies_are_said() {
    let (_dir, path) = trace_file(
        "snapshot-device-json",
        "t.json",
        r#"{"events": [["alloc", 4096, 512, 0, 0]]}"#,
    );
    let out = berth(&["replay", "--snapshot-device", "1", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--snapshot-device 1:") && err.contains("is a JSON trace"),
        "{err}"
    );

    // A byte-order mark is skipped: the trace reads as without it.
    let (_dir, bom) = trace_file(
        "bom",
        "t.json",
        "\u{feff}{\"events\": [[\"alloc\", 4096, 512, 0, 0]]}",
    );
    let out = berth(&[
        "replay",
        "--json",
        "--policy",
        "pytorch",
        bom.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        normalize(String::from_utf8_lossy(&out.stdout).trim())["ops"],
        1
    );

    let (_dir, big) = trace_file(
        "size-2p64",
        "t.json",
        r#"{"events": [["alloc", 1, 18446744073709551616, 0, 0]]}"#,
    );
    let out = berth(&["replay", big.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("size 18446744073709551616 is more than 18446744073709551615 (2^64 − 1)"),
        "{err}"
    );

    // The recorded alloc_conf is used when none is set, and said.
    let (_dir, conf) = trace_file(
        "alloc-conf",
        "t.json",
        r#"{"alloc_conf": "max_split_size_mb:20", "events": [["alloc", 4096, 104857600, 0, 0], ["free_completed", 4096, 104857600, 0, 1]]}"#,
    );
    let out = berth(&["replay", "--policy", "pytorch", conf.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("replaying with the trace's recorded alloc_conf 'max_split_size_mb:20'"),
        "{err}"
    );
    let (_dir, bogus) = trace_file(
        "alloc-conf-bogus",
        "t.json",
        r#"{"alloc_conf": "roundup_power2_divisions:bogus", "events": [["alloc", 4096, 512, 0, 0]]}"#,
    );
    let out = berth(&["replay", bogus.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "the trace's recorded alloc_conf 'roundup_power2_divisions:bogus' does not parse"
        ),
        "{err}"
    );
}

/// Newcomer defect 18: a negative `--capacity`, `--snapshot-device` (replay) or `--device`
/// (memviz) got clap's "unexpected argument '-1' found; to pass '-1' as a value, use '-- -1'";
/// they get the flag's own message, as `berth train`'s numbers do.
#[test]
fn negative_values_get_the_flags_own_messages() {
    let trace =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/small_two_stream.trace.json");
    let t = trace.to_str().unwrap();
    for (args, want) in [
        (
            &["replay", "--capacity", "-1", t][..],
            "invalid --capacity '-1': expected a positive number of bytes",
        ),
        (
            &["replay", "--snapshot-device", "-1", t][..],
            "--snapshot-device -1: the device index must be at least 0",
        ),
        (
            &["memviz", "--device", "-1", t, "-o", "/dev/null"][..],
            "expected a device index such as 0 (or cuda:0), found \"-1\"",
        ),
    ] {
        let out = berth(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(want) && !err.contains("'-- -1'"),
            "{args:?}: {err}"
        );
    }
}
