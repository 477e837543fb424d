//! What berth's two NCCL groups share — [`ProcessGroup`](crate::ProcessGroup) (one process per
//! GPU) and [`LocalGroup`](crate::LocalGroup) (one process driving several GPUs): the stream
//! ordering of every collective ([`ordered`]), the [`Work`] it returns, and the check of a
//! tensor a collective takes ([`nccl_dtype`]).
//!
//! Note [Collective stream ordering]: every collective runs on the group's own communication
//! stream of each device it touches, as in PyTorch's `ProcessGroupNCCL`, so it can overlap
//! compute. Ordering is by events, never by host waits, for each device: (1) an event recorded
//! on the caller's current stream of the device (the compute stream) is waited by that
//! device's communication stream, so the collective reads what compute wrote; (2) the NCCL
//! calls are queued on the communication streams (for several devices of one process, inside
//! one NCCL group: Note [One thread, several devices] in `berth_cuda::nccl`); (3) an event
//! recorded on each communication stream ends the collective there; (4) [`Work::wait`] makes
//! each device's compute stream wait its end event (the host does not block), so later compute
//! sees the result.
//!
//! Buffers stay alive across the two streams by *reference*, FSDP2's approach, not by
//! `record_stream`: the [`Work`] holds the tensors until every compute stream has been made to
//! wait for the collective's end (at `wait`, or at drop if never waited). After that, every
//! later use of the memory, including its reuse by the caching allocator after a free on the
//! compute stream, is stream-ordered after the collective. `record_stream` would also be
//! correct, but it makes the allocator hold each block until an event recorded at free time
//! is seen completed, which grows reserved memory under a steady stream of collectives
//! (PyTorch's reason for FSDP2's switch,
//! <https://dev-discuss.pytorch.org/t/fsdp-cudacachingallocator-an-outsider-newb-perspective/1486>),
//! and it costs an event query per block. Holding a reference costs nothing but the
//! `Work` itself.

use berth::cuda::{CudaError, Event, Stream};
use berth::{DType, Tensor};
use berth_cuda::nccl::NcclDType;

use crate::error::{DistError, Result};

/// Checks that `t` is contiguous and of a type NCCL reduces, and gives that type. The device
/// is the caller's to check (each group words it for its own layout).
///
/// # Errors
/// [`DistError::InvalidTensor`] naming `op`.
pub(crate) fn nccl_dtype(op: &'static str, t: &Tensor) -> Result<NcclDType> {
    if !t.is_contiguous() {
        return Err(DistError::InvalidTensor {
            op,
            what: "the tensor is not contiguous; call .contiguous() first".into(),
        });
    }
    Ok(match t.dtype() {
        DType::F32 => NcclDType::F32,
        DType::F64 => NcclDType::F64,
        DType::F16 => NcclDType::F16,
        DType::BF16 => NcclDType::BF16,
        DType::I64 => NcclDType::I64,
        DType::I32 => NcclDType::I32,
        DType::U8 | DType::Bool => NcclDType::U8,
        other => {
            return Err(DistError::InvalidTensor {
                op,
                what: format!("NCCL has no reduction for {other:?}"),
            })
        }
    })
}

/// Runs one collective under Note [Collective stream ordering]: steps (1) for each of
/// `comm_streams` (one per device the collective touches), `launch` (step 2, which queues the
/// NCCL calls on those streams), then step (3) for each; the returned [`Work`] does step (4).
///
/// When `launch` fails after queueing some of its calls, the compute streams are still
/// ordered after whatever was queued before `keep` is let go, and `launch`'s error is returned.
///
/// # Errors
/// [`DistError::Cuda`]: `launch`'s error, or the driver's when recording or waiting an event
/// fails.
pub(crate) fn ordered(
    comm_streams: &[Stream],
    keep: Vec<Tensor>,
    launch: impl FnOnce() -> std::result::Result<(), CudaError>,
) -> Result<Work> {
    let mut computes = Vec::with_capacity(comm_streams.len());
    for comm in comm_streams {
        let compute = berth::cuda::current_stream(comm.device())?;
        let ready = compute.record_event()?;
        comm.wait_event(&ready)?;
        computes.push(compute);
    }
    let launched = launch();
    let mut work = Work {
        ends: Vec::with_capacity(comm_streams.len()),
        keep,
    };
    let mut recorded = Ok(());
    for (comm, compute) in comm_streams.iter().zip(computes) {
        match comm.record_event() {
            Ok(end) => work.ends.push(End { end, compute }),
            Err(e) => {
                // No end event to wait: the host waits the stream before `keep` goes.
                if let Err(sync) = comm.synchronize() {
                    berth::alloc::warnings::warn_once("collective-end-sync", || {
                        format!("a collective's end event could not be recorded on cuda:{} ({e}) and waiting its stream failed too: {sync}", comm.device())
                    });
                }
                if recorded.is_ok() {
                    recorded = Err(e);
                }
            }
        }
    }
    // On an error `work` drops here, ordering the compute streams first (its `Drop`).
    launched?;
    recorded?;
    Ok(work)
}

/// One device's end of a collective: the event ending it on the communication stream, and
/// the compute stream that must wait it.
#[derive(Debug)]
struct End {
    end: Event,
    compute: Stream,
}

/// A collective in flight (PyTorch's `Work`), on one device or on several: holds its tensors
/// until every compute stream is ordered after it (Note [Collective stream ordering]).
#[derive(Debug)]
#[must_use = "call wait() so that the compute stream sees the collective's result"]
pub struct Work {
    /// One per device the collective ran on.
    ends: Vec<End>,
    keep: Vec<Tensor>,
}

impl Work {
    /// Makes each device's compute stream (the current stream when the collective was
    /// issued) wait for the collective; returns at once (`work.wait()`).
    ///
    /// # Errors
    /// [`DistError::Cuda`] when the driver fails (the first failure; every device is still
    /// tried).
    pub fn wait(mut self) -> Result<()> {
        let r = self.order_compute();
        self.keep.clear();
        r.map_err(DistError::from)
    }

    /// Whether the collective has finished on the GPU, on every device
    /// (`work.is_completed()`).
    ///
    /// # Errors
    /// [`DistError::Cuda`].
    pub fn is_completed(&self) -> Result<bool> {
        for e in &self.ends {
            if !e.end.query()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Blocks the host until the collective has finished on every device (a barrier's wait).
    pub(crate) fn synchronize_host(&self) -> Result<()> {
        for e in &self.ends {
            e.end.synchronize()?;
        }
        Ok(())
    }

    /// Step (4) for every device; the first error.
    fn order_compute(&self) -> std::result::Result<(), CudaError> {
        let mut first = Ok(());
        for e in &self.ends {
            if let Err(err) = e.compute.wait_event(&e.end) {
                if first.is_ok() {
                    first = Err(err);
                }
            }
        }
        first
    }
}

impl crate::communicator::PendingWork for Work {
    fn wait(self) -> Result<()> {
        Work::wait(self)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if self.keep.is_empty() {
            return;
        }
        // Never waited: order the compute streams anyway before the tensors are let go.
        if let Err(e) = self.order_compute() {
            berth::alloc::warnings::warn_once("work-drop-wait", || {
                format!("a collective's Work was dropped without wait() and ordering the compute stream after it failed: {e}")
            });
        }
    }
}

/// Checks that `big` (the output of an all-gather, the input of a reduce-scatter) has `want`
/// elements of `small`'s dtype. `which` names `big` in the message ("each output", "the input"); for a
/// group's per-device lists, already checked to be uniform, tensor 0 of each stands for all.
pub(crate) fn check_sizes(
    op: &'static str,
    which: &str,
    big: &Tensor,
    small: &Tensor,
    want: usize,
) -> Result<()> {
    if big.dtype() != small.dtype() || big.numel() != want {
        return Err(DistError::InvalidTensor {
            op,
            what: format!(
                "{which} holds {} elements of {:?}; world_size × {} = {want} elements of {:?} are needed",
                big.numel(),
                big.dtype(),
                small.numel(),
                small.dtype()
            ),
        });
    }
    Ok(())
}
