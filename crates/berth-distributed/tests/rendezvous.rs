//! The rendezvous with real processes on one machine (CPU only): this test binary starts copies
//! of itself, each running the ignored test `child_process` as one rank with torchrun's
//! environment, and reads what each printed.
//!
//! Each child prints one line, `RESULT ok <hex of the exchanged id>` or
//! `RESULT err <variant>: <message>`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_distributed::{DistError, Rendezvous, RendezvousEnv};

/// The child's environment variable saying how long its rendezvous may wait, in ms.
const TIMEOUT_VAR: &str = "BERTH_TEST_RDZV_TIMEOUT_MS";
/// Set only in children.
const CHILD_VAR: &str = "BERTH_TEST_RDZV_CHILD";

/// One rank: join, exchange a 128-byte id (the size of an `ncclUniqueId`) from rank 0, two
/// barriers, finish.
#[test]
#[ignore = "a child process of the rendezvous tests, started by them with torchrun's environment"]
fn child_process() {
    if std::env::var_os(CHILD_VAR).is_none() {
        println!("child_process runs only as a rank started by the rendezvous tests");
        return;
    }
    let ms: u64 = std::env::var(TIMEOUT_VAR).unwrap().parse().unwrap();
    let result = (|| -> Result<Vec<u8>, DistError> {
        let env = RendezvousEnv::from_env()?;
        let rdzv = Rendezvous::join(env, Duration::from_millis(ms))?;
        let id = rdzv.broadcast_from_rank0("nccl_unique_id", || {
            // Stands in for ncclGetUniqueId: 128 bytes only rank 0 knows.
            let seed = std::process::id();
            Ok((0..128u32)
                .map(|i| (seed.wrapping_mul(31).wrapping_add(i * 7)) as u8)
                .collect())
        })?;
        rdzv.barrier()?;
        rdzv.barrier()?;
        rdzv.finish()?;
        Ok(id)
    })();
    match result {
        Ok(id) => println!(
            "RESULT ok {}",
            id.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        Err(e) => println!("RESULT err {}: {e}", variant(&e)),
    }
}

fn variant(e: &DistError) -> &'static str {
    match e {
        DistError::MissingEnv { .. } => "MissingEnv",
        DistError::InvalidEnv { .. } => "InvalidEnv",
        DistError::ConnectTimeout { .. } => "ConnectTimeout",
        DistError::Listen { .. } => "Listen",
        DistError::Io { .. } => "Io",
        DistError::Protocol { .. } => "Protocol",
        DistError::KeyTimeout { .. } => "KeyTimeout",
        DistError::RendezvousTimeout { .. } => "RendezvousTimeout",
        DistError::WorldSizeMismatch { .. } => "WorldSizeMismatch",
        DistError::DuplicateRank { .. } => "DuplicateRank",
        DistError::PeerFailed { .. } => "PeerFailed",
        _ => "other",
    }
}

/// A port free right now (bound and released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a rank with `RANK=rank`, `WORLD_SIZE=world`.
fn spawn(port: u16, rank: usize, world: usize, timeout_ms: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "child_process",
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .env(TIMEOUT_VAR, timeout_ms.to_string())
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Each child's RESULT line, in the order given; a child still running after 60 s fails the
/// test (no rendezvous here waits that long).
fn results(children: Vec<Child>) -> Vec<String> {
    let start = Instant::now();
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().unwrap().is_none() {
                if start.elapsed() > Duration::from_secs(60) {
                    c.kill().unwrap();
                    panic!("a rank hung past 60 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r.to_string()))
                .unwrap_or_else(|| panic!("no RESULT line in:\n{text}"))
        })
        .collect()
}

fn all_ranks_agree(world: usize, start_order: &[usize]) {
    let port = free_port();
    let mut children: Vec<(usize, Child)> = Vec::new();
    for &rank in start_order {
        children.push((rank, spawn(port, rank, world, 20_000)));
        // Later ranks start a little later, so some connect before rank 0 listens.
        std::thread::sleep(Duration::from_millis(100));
    }
    children.sort_by_key(|(r, _)| *r);
    let out = results(children.into_iter().map(|(_, c)| c).collect());
    let first = &out[0];
    assert!(first.starts_with("ok "), "rank 0: {first}");
    assert_eq!(first.len(), 3 + 256, "a 128-byte id: {first}");
    for (rank, line) in out.iter().enumerate() {
        assert_eq!(line, first, "rank {rank} got another id");
    }
}

#[test]
fn two_processes_exchange_the_id() {
    all_ranks_agree(2, &[0, 1]);
}

#[test]
fn four_processes_exchange_the_id_whatever_the_start_order() {
    // Rank 0, which hosts the store, starts last: the others retry their connection.
    all_ranks_agree(4, &[3, 1, 2, 0]);
}

#[test]
fn a_rank_that_never_arrives_is_named_after_the_timeout() {
    let port = free_port();
    let start = Instant::now();
    let out = results(vec![
        spawn(port, 0, 4, 3000),
        spawn(port, 1, 4, 3000),
        spawn(port, 3, 4, 3000),
    ]);
    assert!(start.elapsed() >= Duration::from_millis(3000));
    // Whichever rank's timer runs out first says so; the others then fail with its error
    // (or time out themselves): every rank names the missing rank.
    assert!(
        out.iter().any(|l| l.starts_with("err RendezvousTimeout: ")),
        "{out:?}"
    );
    for line in &out {
        assert!(
            line.starts_with("err RendezvousTimeout: ")
                || line.starts_with("err PeerFailed: rendezvous failed on another rank: rank "),
            "{line}"
        );
        assert!(
            line.contains(
                "rendezvous timed out after 3s: 3 of 4 ranks arrived; missing rank(s) [2]"
            ),
            "{line}"
        );
    }
}

#[test]
fn without_rank_0_connecting_times_out() {
    let port = free_port();
    let out = results(vec![spawn(port, 1, 2, 500)]);
    assert!(out[0].starts_with("err ConnectTimeout: "), "{}", out[0]);
    assert!(out[0].contains(&format!("127.0.0.1:{port}")), "{}", out[0]);
}

#[test]
fn a_wrong_world_size_fails_every_rank_at_once() {
    let port = free_port();
    let start = Instant::now();
    // Rank 0 says 2 processes, rank 1 says 3; the timeout is long, the failure must not wait it.
    let out = results(vec![spawn(port, 0, 2, 30_000), spawn(port, 1, 3, 30_000)]);
    assert!(start.elapsed() < Duration::from_secs(20));
    assert_eq!(
        out[1],
        "err WorldSizeMismatch: WORLD_SIZE mismatch: rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2; every process must be started with the same WORLD_SIZE"
    );
    assert!(out[0].starts_with("err PeerFailed: "), "{}", out[0]);
    assert!(out[0].contains("rank 1 has WORLD_SIZE=3"), "{}", out[0]);
}

#[test]
fn a_rank_started_twice_is_refused() {
    let port = free_port();
    let out = results(vec![
        spawn(port, 0, 2, 3000),
        spawn(port, 1, 2, 3000),
        spawn(port, 1, 2, 3000),
    ]);
    let dup = out
        .iter()
        .filter(|l| l.starts_with("err DuplicateRank: "))
        .count();
    assert_eq!(dup, 1, "{out:?}");
}
