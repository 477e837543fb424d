//! `LocalGroup`: one process driving every GPU of the group, NCCL collectives on one berth
//! tensor per device — the second shape of issue 33's process group, beside
//! [`ProcessGroup`](crate::ProcessGroup)'s one process per GPU.
//!
//! # Why this name and this shape
//! PyTorch drives several local GPUs from one process in `torch.nn.DataParallel`, whose
//! gradient reduction and parameter broadcast go through `torch.cuda.comm` and
//! `torch.cuda.nccl`: `torch.cuda.nccl.all_reduce(inputs, op=...)`, `broadcast(inputs,
//! root=0)`, `all_gather(inputs, outputs)`, `reduce_scatter(inputs, outputs, op=...)`, each
//! taking *a list of tensors, one per device*, over communicators made by
//! `ncclCommInitAll` (`torch/csrc/cuda/nccl.cpp`). c10d's `ProcessGroupNCCL` once accepted the
//! same lists (`dist.all_reduce_multigpu` and friends, removed in PyTorch 2.x). berth keeps
//! that calling convention — tensor `i` on device `i` of the group — and calls the type
//! `LocalGroup` because every rank is local: there is no rendezvous, no store and no unique
//! id to hand around, only NCCL's multi-device-per-process mode
//! (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/communicators.html#creating-communicators-for-multiple-devices-per-process>).
//! The collectives are named and ordered as [`ProcessGroup`](crate::ProcessGroup)'s
//! (`all_reduce`, `broadcast`, `all_gather`, `reduce_scatter`, `barrier`), and return the same
//! [`Work`], here holding one end event per device.
//!
//! # Ordering
//! Each device's collective runs on that device's communication stream, ordered with that
//! device's current (compute) stream by events (Note [Collective stream ordering] in
//! `src/collective.rs`, the code `ProcessGroup` runs too). The NCCL calls of one collective
//! are issued from this thread inside one NCCL group (Note [One thread, several devices] in
//! `berth_cuda::nccl`), after every tensor has been checked, so a refusal never leaves some
//! devices' collectives launched without the others.
//!
//! # Why not [`Communicator`](crate::Communicator)
//! That trait is one *rank's* view of data-parallel training: one tensor per call, on one
//! device, a rank and a rendezvous whose store carries each rank's report, as DDP's
//! [`Reducer`](crate::Reducer) drives it once per process. A `LocalGroup` has no single rank
//! and no store, and each call takes a tensor on every device, so implementing the trait
//! would mean inventing a rank and a rendezvous it does not have. Single-process data
//! parallelism (`DataParallel`'s replicas) would drive a `LocalGroup` directly, one bucket
//! tensor per replica; berth's trainer does not do that yet.

use berth::cuda::{CudaError, Stream};
use berth::{DType, Device, Tensor};
use berth_cuda::nccl::{group, Communicator, NcclDType, ReduceOp};

use crate::collective::{check_sizes, nccl_dtype, ordered, Work};
use crate::error::{DistError, Result};

/// One process driving an NCCL communicator on each of several local GPUs
/// (`ncclCommInitAll`; PyTorch's `torch.cuda.nccl` over `DataParallel`'s devices). Rank `i` of
/// the group is `devices()[i]`; every collective takes one tensor per device, in that order.
#[derive(Debug)]
pub struct LocalGroup {
    /// `comms[i]` is rank `i`, on `devices[i]`.
    comms: Vec<Communicator>,
    /// The group's communication stream on each device.
    comm_streams: Vec<Stream>,
    devices: Vec<usize>,
}

impl LocalGroup {
    /// A group over `devices` (CUDA device indices, e.g. `&[0, 1]`), rank `i` on
    /// `devices[i]`: one NCCL communicator per device (`ncclCommInitAll`) and one
    /// communication stream per device.
    ///
    /// # Errors
    /// [`DistError::Cuda`] with, before any NCCL call, `CudaError::InvalidArgument` when
    /// `devices` is empty or names a device twice, `CudaError::InvalidDevice` for a device
    /// that is not visible, `CudaError::Unavailable` without a driver,
    /// `CudaError::NcclUnavailable` when NCCL does not load; then `CudaError::Nccl` when NCCL
    /// fails.
    pub fn new(devices: &[usize]) -> Result<LocalGroup> {
        let comms = Communicator::init_all(devices)?;
        let comm_streams = devices
            .iter()
            .map(|&d| Stream::new(d, 0))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(LocalGroup {
            comms,
            comm_streams,
            devices: devices.to_vec(),
        })
    }

    /// The group's devices: rank `i` is `devices()[i]`.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The number of devices (ranks) in the group.
    pub fn world_size(&self) -> usize {
        self.devices.len()
    }

    /// Note [Collective stream ordering] around `launch`, which gets each rank's communicator
    /// and communication stream and is run inside one NCCL group.
    fn run(
        &self,
        keep: Vec<Tensor>,
        launch: impl Fn(usize, &Communicator, &Stream) -> std::result::Result<(), CudaError>,
    ) -> Result<Work> {
        ordered(&self.comm_streams, keep, || {
            group(|| {
                for (rank, (comm, stream)) in self.comms.iter().zip(&self.comm_streams).enumerate()
                {
                    launch(rank, comm, stream)?;
                }
                Ok(())
            })
        })
    }

    /// All-reduces `tensors` in place: afterwards every device's tensor holds the reduction
    /// over all of them (`torch.cuda.nccl.all_reduce(tensors, op)`). `tensors[i]` is on
    /// `devices()[i]`; all have one shape and dtype.
    ///
    /// # Errors
    /// [`DistError::InvalidTensor`] when the count, a device, the dtype or the shape does not
    /// match (the message names the tensor and what it should be), or a tensor is not
    /// contiguous; [`DistError::Cuda`].
    pub fn all_reduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Work> {
        let dtype = check_per_device("all_reduce", &self.devices, tensors)?;
        let n = tensors[0].numel();
        self.run(aliases(&[tensors]), |rank, comm, s| {
            let ptr = tensors[rank].data_ptr();
            // SAFETY: tensor `rank` is a contiguous tensor of `n` elements of `dtype` on this
            // communicator's device (checked), kept alive by the Work until the compute stream
            // waits the collective (Note [Collective stream ordering]); this thread issues the
            // group's collectives one group at a time, in the caller's order.
            unsafe { comm.all_reduce(ptr, ptr, n, dtype, op, s) }
        })
    }

    /// Copies rank `root`'s tensor (on `devices()[root]`) into every device's tensor, in
    /// place (`torch.cuda.nccl.broadcast(tensors, root)`).
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce); [`DistError::Cuda`] with
    /// `CudaError::InvalidArgument` when `root` is not a rank of the group.
    pub fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<Work> {
        let dtype = check_per_device("broadcast", &self.devices, tensors)?;
        if root >= self.world_size() {
            return Err(CudaError::InvalidArgument {
                op: "broadcast",
                what: format!(
                    "root {root} is not a rank of a group of {} devices; the root is an index into {:?}",
                    self.world_size(),
                    self.devices
                ),
            }
            .into());
        }
        let n = tensors[0].numel();
        self.run(aliases(&[tensors]), |rank, comm, s| {
            let ptr = tensors[rank].data_ptr();
            // SAFETY: as all_reduce.
            unsafe { comm.broadcast(ptr, ptr, n, dtype, root, s) }
        })
    }

    /// Gathers every device's `inputs[i]` into every `outputs[i]`, in rank order
    /// (`torch.cuda.nccl.all_gather`, `dist.all_gather_into_tensor` on each device): each
    /// output has `world_size × inputs[0].numel()` elements of the inputs' dtype.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce), for each list; [`DistError::InvalidTensor`] when
    /// the outputs' size or dtype does not fit the inputs.
    pub fn all_gather(&self, outputs: &[Tensor], inputs: &[Tensor]) -> Result<Work> {
        let dtype = check_per_device("all_gather", &self.devices, inputs)?;
        check_per_device("all_gather", &self.devices, outputs)?;
        let n = inputs[0].numel();
        check_sizes(
            "all_gather",
            "each output",
            &outputs[0],
            &inputs[0],
            n * self.world_size(),
        )?;
        self.run(aliases(&[outputs, inputs]), |rank, comm, s| {
            let (o, i) = (outputs[rank].data_ptr(), inputs[rank].data_ptr());
            // SAFETY: as all_reduce; output `rank` holds world_size × n elements (checked).
            unsafe { comm.all_gather(i, o, n, dtype, s) }
        })
    }

    /// Reduces `inputs` over the devices and keeps rank `i`'s share (elements `i × n ..
    /// (i + 1) × n` of the reduction) in `outputs[i]` (`torch.cuda.nccl.reduce_scatter`,
    /// `dist.reduce_scatter_tensor` on each device): each input has `world_size ×
    /// outputs[0].numel()` elements.
    ///
    /// # Errors
    /// As [`all_gather`](Self::all_gather), with the inputs' size checked against the outputs.
    pub fn reduce_scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        op: ReduceOp,
    ) -> Result<Work> {
        let dtype = check_per_device("reduce_scatter", &self.devices, outputs)?;
        check_per_device("reduce_scatter", &self.devices, inputs)?;
        let n = outputs[0].numel();
        check_sizes(
            "reduce_scatter",
            "each input",
            &inputs[0],
            &outputs[0],
            n * self.world_size(),
        )?;
        self.run(aliases(&[outputs, inputs]), |rank, comm, s| {
            let (o, i) = (outputs[rank].data_ptr(), inputs[rank].data_ptr());
            // SAFETY: as all_reduce; input `rank` holds world_size × n elements (checked).
            unsafe { comm.reduce_scatter(i, o, n, dtype, op, s) }
        })
    }

    /// Waits on the host until the collectives queued before it have finished on every
    /// device of the group (`dist.barrier()`, a one-element all-reduce on each device, as
    /// PyTorch's NCCL group does it). Every rank is this process, so there is no one else to
    /// wait for.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub fn barrier(&self) -> Result<()> {
        let ones = self
            .devices
            .iter()
            .map(|&d| Tensor::zeros(&[1], DType::F32, Device::Cuda(d as u16)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let work = self.all_reduce(&ones, ReduceOp::Sum)?;
        work.synchronize_host()?;
        work.wait()
    }
}

impl Drop for LocalGroup {
    fn drop(&mut self) {
        // The communicators are destroyed after this: let their queued collectives finish.
        for s in &self.comm_streams {
            if let Err(e) = s.synchronize() {
                berth::alloc::warnings::warn_once("local-group-drop-sync", || {
                    format!(
                        "dropping a LocalGroup: waiting for cuda:{}'s collectives failed: {e}",
                        s.device()
                    )
                });
            }
        }
    }
}

/// References to every tensor of `lists`, for the [`Work`] to hold.
fn aliases(lists: &[&[Tensor]]) -> Vec<Tensor> {
    lists
        .iter()
        .flat_map(|l| l.iter().map(Tensor::alias))
        .collect()
}

/// Checks one collective argument of a [`LocalGroup`] over `devices`: one tensor per device,
/// one dtype and one shape over all of them, each contiguous and of a type NCCL reduces, and
/// tensor `i` on `cuda:devices[i]`. Checked in that order, with no GPU needed for any check
/// before the devices'. Gives the NCCL element type.
///
/// # Errors
/// [`DistError::InvalidTensor`] naming `op`, the tensor's position and what would be right.
pub(crate) fn check_per_device(
    op: &'static str,
    devices: &[usize],
    tensors: &[Tensor],
) -> Result<NcclDType> {
    let invalid = |what: String| DistError::InvalidTensor { op, what };
    let Some(first) = tensors.first().filter(|_| tensors.len() == devices.len()) else {
        return Err(invalid(format!(
            "got {} tensor(s) for a group of {} device(s) {devices:?}; pass one per device, tensor i on cuda:devices[i]",
            tensors.len(),
            devices.len()
        )));
    };
    for (i, t) in tensors.iter().enumerate().skip(1) {
        if t.dtype() != first.dtype() {
            return Err(invalid(format!(
                "tensor {i} is {:?} but tensor 0 is {:?}; every device's tensor must have one dtype",
                t.dtype(),
                first.dtype()
            )));
        }
        if t.shape() != first.shape() {
            return Err(invalid(format!(
                "tensor {i} has shape {:?} but tensor 0 has shape {:?}; every device's tensor must have one shape",
                t.shape(),
                first.shape()
            )));
        }
    }
    let mut dtype = None;
    for (i, t) in tensors.iter().enumerate() {
        dtype = Some(nccl_dtype(op, t).map_err(|e| match e {
            DistError::InvalidTensor { what, .. } => invalid(format!("tensor {i}: {what}")),
            other => other,
        })?);
    }
    for (i, (t, &d)) in tensors.iter().zip(devices).enumerate() {
        if t.device() != Device::Cuda(d as u16) {
            return Err(invalid(format!(
                "tensor {i} is on {}; it must be on cuda:{d}, device {i} of the group {devices:?}",
                t.device()
            )));
        }
    }
    // Set by the loop above: `tensors` is not empty.
    dtype.ok_or_else(|| invalid("no tensors".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(data: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice(data, shape, Device::Cpu).unwrap()
    }

    fn what(err: DistError) -> (&'static str, String) {
        match err {
            DistError::InvalidTensor { op, what } => (op, what),
            other => panic!("expected InvalidTensor, got {other:?}"),
        }
    }

    #[test]
    fn a_tensor_count_other_than_the_device_count_is_refused() {
        let t = cpu(&[1.0, 2.0], &[2]);
        for tensors in [
            vec![],
            vec![t.alias()],
            vec![t.alias(), t.alias(), t.alias()],
        ] {
            let (op, what) = what(check_per_device("all_reduce", &[0, 1], &tensors).unwrap_err());
            assert_eq!(op, "all_reduce");
            assert_eq!(
                what,
                format!(
                    "got {} tensor(s) for a group of 2 device(s) [0, 1]; pass one per device, tensor i on cuda:devices[i]",
                    tensors.len()
                )
            );
        }
    }

    #[test]
    fn a_dtype_or_shape_mismatch_names_the_tensor() {
        let a = cpu(&[1.0, 2.0], &[2]);
        let b = Tensor::from_slice(&[1.0f64, 2.0], &[2], Device::Cpu).unwrap();
        let (_, w) = what(check_per_device("broadcast", &[0, 1], &[a.alias(), b]).unwrap_err());
        assert_eq!(
            w,
            "tensor 1 is F64 but tensor 0 is F32; every device's tensor must have one dtype"
        );
        let c = cpu(&[1.0, 2.0], &[1, 2]);
        let (_, w) = what(check_per_device("all_reduce", &[0, 1], &[a, c]).unwrap_err());
        assert_eq!(
            w,
            "tensor 1 has shape [1, 2] but tensor 0 has shape [2]; every device's tensor must have one shape"
        );
    }

    #[test]
    fn a_non_contiguous_tensor_is_refused() {
        let m = cpu(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).t().unwrap();
        assert!(!m.is_contiguous());
        let (op, w) = what(check_per_device("reduce_scatter", &[3], &[m]).unwrap_err());
        assert_eq!(op, "reduce_scatter");
        assert_eq!(
            w,
            "tensor 0: the tensor is not contiguous; call .contiguous() first"
        );
    }

    #[test]
    fn a_tensor_on_the_wrong_device_names_the_device_it_needs() {
        let a = cpu(&[1.0, 2.0], &[2]);
        let (_, w) = what(check_per_device("all_gather", &[2, 0], &[a.alias(), a]).unwrap_err());
        assert_eq!(
            w,
            "tensor 0 is on cpu; it must be on cuda:2, device 0 of the group [2, 0]"
        );
    }

    #[test]
    fn all_gather_and_reduce_scatter_sizes_are_checked() {
        let small = cpu(&[1.0, 2.0], &[2]);
        let big = cpu(&[0.0; 3], &[3]);
        let (op, w) = what(check_sizes("all_gather", "each output", &big, &small, 4).unwrap_err());
        assert_eq!(op, "all_gather");
        assert_eq!(
            w,
            "each output holds 3 elements of F32; world_size × 2 = 4 elements of F32 are needed"
        );
        let ok = cpu(&[0.0; 4], &[4]);
        check_sizes("reduce_scatter", "each input", &ok, &small, 4).unwrap();
        let wrong_type = Tensor::from_slice(&[0i32; 4], &[4], Device::Cpu).unwrap();
        let (_, w) =
            what(check_sizes("reduce_scatter", "each input", &wrong_type, &small, 4).unwrap_err());
        assert_eq!(
            w,
            "each input holds 4 elements of I32; world_size × 2 = 4 elements of F32 are needed"
        );
    }
}
