//! `StoreCommunicator`: collectives on CPU tensors through the job's [`TcpStore`](crate::TcpStore), the role
//! gloo plays for CPU tensors in PyTorch (<https://pytorch.org/docs/stable/distributed.html#backends>):
//! slow, but correct and deterministic, so that the data-parallel path runs with `--devices
//! cpu,cpu` and on CI without a GPU, in real processes or in threads of one process.
//!
//! Note [Store all-reduce]: collective number `seq` (every rank counts its collectives, and
//! all ranks issue the same ones in the same order) cuts the tensor into chunks of at most
//! [`MAX_VALUE_BYTES`]; each rank sets `ar/<seq>/<chunk>/<rank>`
//! to its chunk's little-endian `f32` bytes, then reads every rank's chunks and sums them **in
//! rank order** (`((x₀ + x₁) + x₂) + …`), so every rank computes bit-identical results, as
//! NCCL's ring does for all of its ranks. Each rank then adds 1 to `ar/<seq>/read`; the rank
//! that brings it to the world size deletes the collective's keys, so the store holds at most
//! the collectives still being read. Broadcasts work alike under `bc/<seq>/…`, read by the
//! other ranks. The all-reduce has finished when it returns: [`StoreWork`] has nothing left to
//! wait for. Traffic is world size² × the tensor per collective through one store: fine for
//! tests and small CPU jobs, not a substitute for NCCL.

use std::sync::atomic::{AtomicU64, Ordering};

use berth::{DType, Device, Tensor};

use crate::communicator::{Communicator, PendingWork};
use crate::error::{DistError, Result};
use crate::rendezvous::Rendezvous;
use crate::store::MAX_VALUE_BYTES;

/// `f32` elements per store value (Note [Store all-reduce]).
const CHUNK_ELEMS: usize = MAX_VALUE_BYTES / 4;

/// A CPU process group over the job's TCP store (Note [Store all-reduce]).
#[derive(Debug)]
pub struct StoreCommunicator {
    rdzv: Rendezvous,
    seq: AtomicU64,
}

/// A store collective: already complete when it is returned.
#[derive(Debug)]
pub struct StoreWork(());

impl PendingWork for StoreWork {
    fn wait(self) -> Result<()> {
        Ok(())
    }
}

impl StoreCommunicator {
    /// A communicator over a joined rendezvous.
    pub fn new(rdzv: Rendezvous) -> StoreCommunicator {
        StoreCommunicator {
            rdzv,
            seq: AtomicU64::new(0),
        }
    }

    /// The tensor's values, checked: contiguous `f32` on the CPU.
    fn values(op: &'static str, t: &Tensor) -> Result<Vec<f32>> {
        if t.device() != Device::Cpu {
            return Err(DistError::InvalidTensor {
                op,
                what: format!(
                    "the tensor is on {}; the store communicator takes CPU tensors (use the NCCL ProcessGroup for CUDA tensors)",
                    t.device()
                ),
            });
        }
        if t.dtype() != DType::F32 || !t.is_contiguous() {
            return Err(DistError::InvalidTensor {
                op,
                what: format!(
                    "the tensor is {:?}{}; the store communicator takes contiguous f32 tensors",
                    t.dtype(),
                    if t.is_contiguous() {
                        ""
                    } else {
                        ", not contiguous"
                    }
                ),
            });
        }
        Ok(t.to_vec::<f32>()?)
    }

    fn get_f32(&self, key: &str) -> Result<Vec<f32>> {
        let bytes = self.rdzv.store().get(key, self.rdzv.timeout())?;
        if bytes.len() % 4 != 0 {
            return Err(DistError::Protocol {
                addr: self.rdzv.store().addr().to_string(),
                what: format!("{key} holds {} bytes, not whole f32s", bytes.len()),
            });
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Adds this rank to `prefix/read`; the last of `readers` deletes `keys` and the counter.
    fn release(&self, prefix: &str, readers: usize, keys: &[String]) -> Result<()> {
        let store = self.rdzv.store();
        let counter = format!("{prefix}/read");
        if store.add(&counter, 1)? == readers as i64 {
            for k in keys {
                store.delete_key(k)?;
            }
            store.delete_key(&counter)?;
        }
        Ok(())
    }

    fn write_back(t: &Tensor, values: Vec<f32>) -> Result<()> {
        let src = Tensor::from_vec(values, t.shape(), Device::Cpu)?;
        Ok(t.copy_(&src)?)
    }
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Communicator for StoreCommunicator {
    type Work = StoreWork;

    fn rank(&self) -> usize {
        self.rdzv.rank()
    }

    fn world_size(&self) -> usize {
        self.rdzv.world_size()
    }

    fn rendezvous(&self) -> &Rendezvous {
        &self.rdzv
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<StoreWork> {
        let mine = Self::values("all_reduce", t)?;
        let world = self.world_size();
        if world == 1 {
            return Ok(StoreWork(()));
        }
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("ar/{seq}");
        let store = self.rdzv.store();
        let chunks = mine.len().div_ceil(CHUNK_ELEMS).max(1);
        let key = |c: usize, r: usize| format!("{prefix}/{c}/{r}");
        for c in 0..chunks {
            let part =
                &mine[(c * CHUNK_ELEMS).min(mine.len())..((c + 1) * CHUNK_ELEMS).min(mine.len())];
            store.set(&key(c, self.rank()), &le_bytes(part))?;
        }
        let mut sum = Vec::with_capacity(mine.len());
        let mut keys = Vec::with_capacity(chunks * world);
        for c in 0..chunks {
            let start = sum.len();
            for r in 0..world {
                let k = key(c, r);
                let part = self.get_f32(&k)?;
                keys.push(k);
                if r == 0 {
                    sum.extend_from_slice(&part);
                } else if part.len() != sum.len() - start {
                    return Err(DistError::InvalidTensor {
                        op: "all_reduce",
                        what: format!(
                            "rank {r} sent {} elements for chunk {c}, rank 0 {}: every rank must all-reduce tensors of the same size",
                            part.len(),
                            sum.len() - start
                        ),
                    });
                } else {
                    for (s, v) in sum[start..].iter_mut().zip(part) {
                        *s += v;
                    }
                }
            }
        }
        if sum.len() != mine.len() {
            return Err(DistError::InvalidTensor {
                op: "all_reduce",
                what: format!(
                    "rank 0 sent {} elements, this rank has {}: every rank must all-reduce tensors of the same size",
                    sum.len(),
                    mine.len()
                ),
            });
        }
        self.release(&prefix, world, &keys)?;
        Self::write_back(t, sum)?;
        Ok(StoreWork(()))
    }

    fn broadcast(&self, t: &Tensor, src: usize) -> Result<()> {
        let mine = Self::values("broadcast", t)?;
        let world = self.world_size();
        if src >= world {
            return Err(DistError::InvalidTensor {
                op: "broadcast",
                what: format!("source rank {src} is not a rank of this group (0..{world})"),
            });
        }
        if world == 1 {
            return Ok(());
        }
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("bc/{seq}");
        let chunks = mine.len().div_ceil(CHUNK_ELEMS).max(1);
        let keys: Vec<String> = (0..chunks).map(|c| format!("{prefix}/{c}")).collect();
        if self.rank() == src {
            for (c, k) in keys.iter().enumerate() {
                let part = &mine
                    [(c * CHUNK_ELEMS).min(mine.len())..((c + 1) * CHUNK_ELEMS).min(mine.len())];
                self.rdzv.store().set(k, &le_bytes(part))?;
            }
            return Ok(());
        }
        let mut all = Vec::with_capacity(mine.len());
        for k in &keys {
            all.extend(self.get_f32(k)?);
        }
        if all.len() != mine.len() {
            return Err(DistError::InvalidTensor {
                op: "broadcast",
                what: format!(
                    "rank {src} sent {} elements, this rank's tensor has {}: every rank must pass a tensor of the same size",
                    all.len(),
                    mine.len()
                ),
            });
        }
        self.release(&prefix, world - 1, &keys)?;
        Self::write_back(t, all)
    }

    fn finish(self) -> Result<()> {
        self.rdzv.finish()
    }
}
