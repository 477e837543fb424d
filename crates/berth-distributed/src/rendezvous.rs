//! `Rendezvous`: every process of a job finds the others through rank 0's [`TcpStore`],
//! checks that they agree on the job, and exchanges what a communicator needs (the NCCL
//! unique id), as `torch.distributed.init_process_group(init_method="env://")` does.
//!
//! Note [Rendezvous steps]: (1) rank 0 hosts the store on `0.0.0.0:MASTER_PORT` and sets
//! `world_size`; (2) every rank connects to `MASTER_ADDR:MASTER_PORT`, retrying until the
//! timeout (ranks may start before rank 0); (3) each rank compares its `WORLD_SIZE` with rank
//! 0's, and on a mismatch writes the reason under `error` (so the others fail at once rather
//! than at their timeout) and fails with [`DistError::WorldSizeMismatch`]; (4) each rank claims
//! `rank/<r>` with a token of its own (a second process with the same `RANK` fails with
//! [`DistError::DuplicateRank`]); (5) each rank adds 1 to `arrived` and waits until it reaches
//! `WORLD_SIZE`; at the timeout the ranks without a `rank/<r>` key are named in
//! [`DistError::RendezvousTimeout`]. Barriers after that are counters numbered by call, so every
//! rank must call them in the same order (as every collective). Rank 0's store lives as long as
//! its [`Rendezvous`]: end a job with [`Rendezvous::finish`], where rank 0 waits for every rank
//! to finish, so that it does not take the store away while another rank still reads from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::env::RendezvousEnv;
use crate::error::{DistError, Result};
use crate::store::{StoreServer, TcpStore, POLL_INTERVAL};

/// PyTorch's default process-group timeout for NCCL, 10 minutes
/// (`torch.distributed.constants.default_pg_nccl_timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

const ERROR_KEY: &str = "error";
/// Counts the ranks that read `error`.
const ERROR_SEEN_KEY: &str = "error_seen";
/// How long rank 0 keeps its store up after a failed wait for the others to read the error.
const ERROR_GRACE: Duration = Duration::from_secs(3);

/// A joined job: this process's rank, the world size, and the store shared with the others.
#[derive(Debug)]
pub struct Rendezvous {
    env: RendezvousEnv,
    store: TcpStore,
    timeout: Duration,
    barriers: AtomicU64,
    /// Rank 0 hosts the store; declared last so the client above closes first.
    _server: Option<StoreServer>,
}

impl Rendezvous {
    /// Joins the job described by `env`, waiting up to `timeout` for every rank (Note
    /// [Rendezvous steps]).
    ///
    /// # Errors
    /// [`DistError::Listen`] (rank 0 cannot bind `MASTER_PORT`), [`DistError::ConnectTimeout`]
    /// (no store at `MASTER_ADDR:MASTER_PORT`), [`DistError::WorldSizeMismatch`],
    /// [`DistError::DuplicateRank`], [`DistError::PeerFailed`] (another rank failed one of
    /// these checks), [`DistError::RendezvousTimeout`] (ranks missing after `timeout`), and
    /// [`DistError::Io`] when the store goes away.
    pub fn join(env: RendezvousEnv, timeout: Duration) -> Result<Self> {
        let start = Instant::now();
        let server = if env.rank == 0 {
            Some(StoreServer::bind(&format!("0.0.0.0:{}", env.master_port))?)
        } else {
            None
        };
        let store = TcpStore::connect(&env.store_addr(), timeout)?;
        if env.rank == 0 {
            store.set("world_size", env.world_size.to_string().as_bytes())?;
        }
        let rdzv = Rendezvous {
            env,
            store,
            timeout,
            barriers: AtomicU64::new(0),
            _server: server,
        };
        let left = timeout.saturating_sub(start.elapsed());
        let rank0 = match rdzv.store.get("world_size", left) {
            Ok(v) => String::from_utf8_lossy(&v).parse::<usize>().ok(),
            Err(DistError::KeyTimeout { .. }) => {
                return Err(rdzv.missing_ranks_error("rank/", 0));
            }
            Err(e) => return Err(e),
        };
        let (rank, mine) = (rdzv.env.rank, rdzv.env.world_size);
        let Some(rank0) = rank0 else {
            return Err(DistError::Protocol {
                addr: rdzv.store.addr().to_string(),
                what: "world_size is not a number".into(),
            });
        };
        if rank0 != mine {
            let err = DistError::WorldSizeMismatch { rank, mine, rank0 };
            rdzv.say_error(&err);
            return Err(err);
        }
        let token = claim_token();
        if rdzv.store.set_if_absent(&format!("rank/{rank}"), &token)? != token {
            let err = DistError::DuplicateRank {
                rank,
                world_size: mine,
            };
            rdzv.say_error(&err);
            return Err(err);
        }
        rdzv.store.add("arrived", 1)?;
        rdzv.wait_count("arrived", "rank/", start)?;
        Ok(rdzv)
    }

    /// This process's global rank (`RANK`).
    pub fn rank(&self) -> usize {
        self.env.rank
    }

    /// The number of processes (`WORLD_SIZE`).
    pub fn world_size(&self) -> usize {
        self.env.world_size
    }

    /// The rank on this node (`LOCAL_RANK`): the GPU index by convention.
    pub fn local_rank(&self) -> usize {
        self.env.local_rank
    }

    /// How long waits on other ranks last before they fail (the timeout given to
    /// [`join`](Self::join)).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The store shared by the job.
    pub fn store(&self) -> &TcpStore {
        &self.store
    }

    /// Rank 0 computes a value with `make` and every rank returns it: the exchange of the
    /// NCCL unique id (`ncclGetUniqueId` on rank 0, handed to `ncclCommInitRank` everywhere).
    /// `key` names the exchange; use a new key for each.
    ///
    /// # Errors
    /// `make`'s error on rank 0 (also written under `error`, so the others fail with
    /// [`DistError::PeerFailed`]); [`DistError::KeyTimeout`] when rank 0 has not published
    /// the value within the timeout; [`DistError::Io`].
    pub fn broadcast_from_rank0(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let key = format!("bcast/{key}");
        if self.env.rank == 0 {
            let value = make().inspect_err(|e| self.say_error(e))?;
            self.store.set(&key, &value)?;
            return Ok(value);
        }
        let start = Instant::now();
        loop {
            if let Some(v) = self.store.try_get(&key)? {
                return Ok(v);
            }
            self.check_peer_error()?;
            if start.elapsed() >= self.timeout {
                return Err(DistError::KeyTimeout {
                    key,
                    timeout: self.timeout,
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits until every rank has called `barrier` as many times as this one (host-side, over
    /// the store; no device work is ordered by it).
    ///
    /// # Errors
    /// [`DistError::RendezvousTimeout`] naming the ranks that did not arrive; as
    /// [`join`](Self::join).
    pub fn barrier(&self) -> Result<()> {
        let n = self.barriers.fetch_add(1, Ordering::SeqCst);
        let key = format!("barrier/{n}");
        self.store
            .set(&format!("{key}/rank/{}", self.env.rank), b"1")?;
        self.store.add(&key, 1)?;
        self.wait_count(&key, &format!("{key}/rank/"), Instant::now())
    }

    /// Ends the rendezvous. Every rank says so through the store; the others return at once,
    /// and rank 0, which hosts the store, waits until all have said it before its store
    /// stops, so that no rank loses the store mid-request (Note [Rendezvous steps]).
    ///
    /// # Errors
    /// On rank 0, [`DistError::RendezvousTimeout`] naming the ranks that did not finish within
    /// the timeout; [`DistError::Io`] when the store is gone.
    pub fn finish(self) -> Result<()> {
        self.store
            .set(&format!("finished/rank/{}", self.env.rank), b"1")?;
        self.store.add("finished", 1)?;
        if self.env.rank == 0 {
            self.wait_count("finished", "finished/rank/", Instant::now())?;
        }
        Ok(())
    }

    /// Waits until the counter `key` reaches the world size; at the timeout, names the ranks
    /// `r` without a key `{per_rank}{r}`.
    fn wait_count(&self, key: &str, per_rank: &str, start: Instant) -> Result<()> {
        let world = self.env.world_size as i64;
        loop {
            let n = self.store.add(key, 0)?;
            if n >= world {
                return Ok(());
            }
            if let Err(e) = self.check_peer_error() {
                // Another rank failed first: rank 0 too keeps its store up until the others
                // have read why, or they would fail with a lost connection instead.
                self.linger_after_error(n);
                return Err(e);
            }
            if start.elapsed() >= self.timeout {
                let err = self.missing_ranks_error(per_rank, n);
                self.say_error(&err);
                self.linger_after_error(n);
                return Err(err);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn missing_ranks_error(&self, per_rank: &str, arrived: i64) -> DistError {
        let missing = (0..self.env.world_size)
            .filter(|r| !matches!(self.store.try_get(&format!("{per_rank}{r}")), Ok(Some(_))))
            .collect();
        DistError::RendezvousTimeout {
            timeout: self.timeout,
            arrived: arrived.max(0) as usize,
            world_size: self.env.world_size,
            missing,
        }
    }

    fn check_peer_error(&self) -> Result<()> {
        match self.store.try_get(ERROR_KEY)? {
            Some(message) => {
                // Rank 0 keeps its store up until the others have read the error.
                drop(self.store.add(ERROR_SEEN_KEY, 1));
                Err(DistError::PeerFailed {
                    message: String::from_utf8_lossy(&message).into_owned(),
                })
            }
            None => Ok(()),
        }
    }

    /// Tells the other ranks why this one failed; the first error said is kept. A failure to
    /// say it leaves the others to their timeout, which still names this rank as missing.
    fn say_error(&self, err: &DistError) {
        let message = format!("rank {}: {err}", self.env.rank);
        drop(self.store.set_if_absent(ERROR_KEY, message.as_bytes()));
    }
}

impl Rendezvous {
    /// On rank 0, after a failed wait (its own timeout, or another rank's error it read):
    /// waits (at most [`ERROR_GRACE`]) until `arrived - 1` ranks have read the error (every
    /// rank that arrived but the one that said it), so that they fail with it rather than
    /// with a lost connection when rank 0's store stops.
    fn linger_after_error(&self, arrived: i64) {
        if self.env.rank != 0 {
            return;
        }
        let start = Instant::now();
        while start.elapsed() < ERROR_GRACE {
            match self.store.add(ERROR_SEEN_KEY, 0) {
                Ok(seen) if seen < arrived - 1 => std::thread::sleep(POLL_INTERVAL),
                _ => return,
            }
        }
    }
}

/// A token unique to this process and call: the process id and the time in nanoseconds.
fn claim_token() -> Vec<u8> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}:{nanos}", std::process::id()).into_bytes()
}
