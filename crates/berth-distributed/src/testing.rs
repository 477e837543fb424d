//! Helpers for tests of data-parallel code without a GPU: a job of `world_size` ranks run as
//! threads of one process, each with its own [`StoreCommunicator`] over a real TCP store
//! (rank 0's thread hosts it on a free port of 127.0.0.1), and a communicator that records
//! when collectives are launched.

use std::time::Duration;

use crate::communicator::Communicator;
use crate::env::RendezvousEnv;
use crate::error::Result;
use crate::rendezvous::Rendezvous;
use crate::store::free_port;
use crate::store_communicator::StoreCommunicator;

/// Runs `body(communicator)` for every rank of a `world_size`-rank job, each rank on its own
/// thread with a [`StoreCommunicator`] joined through a real rendezvous (timeout `timeout`),
/// and returns the results in rank order. Each rank's communicator is finished after `body`.
///
/// # Errors
/// The first rank's error (rendezvous, `body`'s, or finishing).
///
/// # Panics
/// When a rank's thread panics (the panic is passed on).
pub fn run_store_ranks<R: Send>(
    world_size: usize,
    timeout: Duration,
    body: impl Fn(&StoreCommunicator) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let port = free_port()?;
    let body = &body;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world_size)
            .map(|rank| {
                s.spawn(move || {
                    let env = RendezvousEnv {
                        rank,
                        world_size,
                        local_rank: rank,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                    };
                    let comm = StoreCommunicator::new(Rendezvous::join(env, timeout)?);
                    let r = body(&comm)?;
                    comm.finish()?;
                    Ok(r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// A communicator that appends `"launch <numel> elements"` to a shared log for each
/// all-reduce it is asked for, then passes it on to `inner`: tests interleave their own
/// entries ("ready 3") to show when buckets launch during backward.
#[derive(Debug)]
pub struct Recording<'a, C> {
    inner: &'a C,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl<'a, C: Communicator> Recording<'a, C> {
    /// Records into `log` and passes every collective on to `inner`.
    pub fn new(inner: &'a C, log: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> Self {
        Recording { inner, log }
    }
}

impl<C: Communicator> Communicator for Recording<'_, C> {
    type Work = C::Work;

    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn rendezvous(&self) -> &Rendezvous {
        self.inner.rendezvous()
    }

    fn all_reduce_sum(&self, t: &berth::Tensor) -> Result<C::Work> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("launch {} elements", t.numel()));
        self.inner.all_reduce_sum(t)
    }

    fn broadcast(&self, t: &berth::Tensor, src: usize) -> Result<()> {
        self.inner.broadcast(t, src)
    }

    /// Finishing is left to the owner of `inner`.
    fn finish(self) -> Result<()> {
        Ok(())
    }
}
