//! `berth launch` end to end (CPU only): the environment each rank gets, and a failing rank.

use std::process::Command;
use std::time::{Duration, Instant};

fn berth(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .expect("berth runs")
}

#[test]
fn each_rank_gets_torchruns_environment() {
    let out = berth(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29511",
        "--",
        "sh",
        "-c",
        "echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK MASTER=$MASTER_ADDR:$MASTER_PORT",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 MASTER=10.0.0.1:29511",
            "RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 MASTER=10.0.0.1:29511",
        ]
    );
}

#[test]
fn a_failing_rank_stops_the_others() {
    let start = Instant::now();
    let out = berth(&[
        "launch",
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 30",
    ]);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "the others were stopped"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        "berth: error: rank 1 exited with exit status: 3; stopped the 2 other rank(s) still running on this node\n"
    );
}

#[test]
fn bad_node_rank_is_a_usage_error() {
    let out = berth(&[
        "launch",
        "--nproc-per-node",
        "1",
        "--node-rank",
        "1",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "berth: error: --node-rank 1: node ranks of --nnodes 1 are 0 to 0\n"
    );
}
