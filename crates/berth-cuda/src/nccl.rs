//! NCCL communicators and collectives on device memory: one rank of a communicator per
//! process and device, the unique id rank 0 makes, or every rank in this process, one per
//! device ([`Communicator::init_all`]); `all_reduce`, `broadcast`, `all_gather`,
//! `reduce_scatter` queued on a stream; and [`group`], which lets one thread issue a
//! collective on several devices (Note [One thread, several devices]). NCCL is loaded at run time (Note
//! [Loading NCCL] in `src/ffi/nccl.rs`); without it every entry point answers
//! [`CudaError::NcclUnavailable`], never a panic.
//!
//! This is the layer below a process group: it queues each collective on the stream it is
//! given and orders nothing itself. Which stream that is, how it is ordered with the compute
//! stream and how buffers stay alive is the caller's (berth-distributed's process group).

use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};

use crate::ffi::nccl as raw;
use crate::{CudaError, Stream};

/// Element types NCCL reduces (`ncclDataType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclDType {
    /// `ncclFloat32`, 4 bytes.
    F32,
    /// `ncclFloat16`, 2 bytes.
    F16,
    /// `ncclBfloat16`, 2 bytes.
    BF16,
    /// `ncclFloat64`, 8 bytes.
    F64,
    /// `ncclInt32`, 4 bytes.
    I32,
    /// `ncclInt64`, 8 bytes.
    I64,
    /// `ncclUint8`, 1 byte.
    U8,
}

impl NcclDType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            NcclDType::F32 | NcclDType::I32 => 4,
            NcclDType::F16 | NcclDType::BF16 => 2,
            NcclDType::F64 | NcclDType::I64 => 8,
            NcclDType::U8 => 1,
        }
    }

    fn raw(self) -> ncclDataType_t {
        match self {
            NcclDType::F32 => ncclDataType_t::ncclFloat32,
            NcclDType::F16 => ncclDataType_t::ncclFloat16,
            NcclDType::BF16 => ncclDataType_t::ncclBfloat16,
            NcclDType::F64 => ncclDataType_t::ncclFloat64,
            NcclDType::I32 => ncclDataType_t::ncclInt32,
            NcclDType::I64 => ncclDataType_t::ncclInt64,
            NcclDType::U8 => ncclDataType_t::ncclUint8,
        }
    }
}

/// Reductions (`ncclRedOp_t`; PyTorch's `ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg` (NCCL 2.10 and later): the sum divided by the number of ranks.
    Avg,
}

impl ReduceOp {
    fn raw(self) -> ncclRedOp_t {
        match self {
            ReduceOp::Sum => ncclRedOp_t::ncclSum,
            ReduceOp::Prod => ncclRedOp_t::ncclProd,
            ReduceOp::Max => ncclRedOp_t::ncclMax,
            ReduceOp::Min => ncclRedOp_t::ncclMin,
            ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

/// NCCL's version as `(major, minor, patch)`, e.g. `(2, 27, 3)`.
///
/// # Errors
/// [`CudaError::NcclUnavailable`] when no NCCL library loads; [`CudaError::Nccl`].
pub fn nccl_version() -> Result<(u32, u32, u32), CudaError> {
    let code = raw::get_version()?.max(0) as u32;
    // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 (major*1000 + … before).
    Ok(if code >= 20900 {
        (code / 10000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    })
}

/// Why NCCL cannot be used here, or `None` when it loads (never panics).
pub fn nccl_unavailable_reason() -> Option<String> {
    raw::nccl_loaded().err().map(|e| e.to_string())
}

/// The gate for tests that need a GPU and NCCL: as [`crate::testing::require_gpu`], then
/// `true` when NCCL loads; otherwise prints `skipping <test>: <reason>` and returns `false`.
///
/// # Panics
/// When `BERTH_REQUIRE_GPU=1` is set and there is no GPU or NCCL does not load: on the machine
/// that must run the GPU tests a missing NCCL is a failure, not a skip.
pub fn require_nccl(test: &str) -> bool {
    if !crate::testing::require_gpu(test) {
        return false;
    }
    match nccl_unavailable_reason() {
        None => true,
        Some(reason) => {
            if crate::testing::gpu_required() {
                panic!("{test}: BERTH_REQUIRE_GPU=1 but NCCL does not load: {reason}");
            }
            println!("skipping {test}: {reason}");
            false
        }
    }
}

/// A new NCCL unique id (`ncclGetUniqueId`): made on rank 0 and handed to every rank (through
/// the rendezvous store) before [`Communicator::init_rank`].
///
/// # Errors
/// [`CudaError::NcclUnavailable`]; [`CudaError::Nccl`] (no network interface NCCL can use).
pub fn unique_id() -> Result<[u8; 128], CudaError> {
    raw::get_unique_id()
}

/// One rank of an NCCL communicator on one device; destroyed on drop.
#[derive(Debug)]
pub struct Communicator {
    comm: u64,
    device: usize,
    rank: usize,
    world_size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread. Concurrent calls on one
// communicator are not allowed; every call that uses it is an `unsafe fn` whose precondition 3
// forbids them (and `Drop` has `&mut self`).
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `world_size` on `device`
    /// (`ncclCommInitRank`): blocks until every rank has joined.
    ///
    /// # Errors
    /// [`CudaError::InvalidArgument`] when `world_size` is 0 or `rank >= world_size`;
    /// [`CudaError::Unavailable`] / [`CudaError::InvalidDevice`] for the device;
    /// [`CudaError::NcclUnavailable`]; [`CudaError::Nccl`].
    pub fn init_rank(
        device: usize,
        world_size: usize,
        rank: usize,
        id: &[u8; 128],
    ) -> Result<Communicator, CudaError> {
        if world_size == 0 || rank >= world_size || world_size > i32::MAX as usize {
            return Err(CudaError::InvalidArgument {
                op: "ncclCommInitRank",
                what: format!(
                    "rank {rank} of world size {world_size}: need 0 <= rank < world_size"
                ),
            });
        }
        crate::check_device(device)?;
        raw::nccl_loaded()?;
        crate::context::bind(device)?;
        let comm = raw::comm_init_rank(world_size as i32, id, rank as i32)?;
        Ok(Communicator {
            comm,
            device,
            rank,
            world_size,
        })
    }

    /// One communicator per device of `devices`, all driven by this process
    /// (`ncclCommInitAll`): communicator `i` is rank `i` of `devices.len()`, on `devices[i]`.
    /// This is NCCL's "multiple devices per process" mode
    /// (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/communicators.html#creating-communicators-for-multiple-devices-per-process>):
    /// every rank is in this process, so there is no unique id to hand around. One thread
    /// issuing a collective on each of them must do so inside one [`group`] (Note [One thread,
    /// several devices]).
    ///
    /// # Errors
    /// Before any NCCL call: [`CudaError::InvalidArgument`] when `devices` is empty or lists a
    /// device twice; [`CudaError::InvalidDevice`] for a device that is not visible;
    /// [`CudaError::Unavailable`] without a driver; [`CudaError::NcclUnavailable`] when no NCCL
    /// library loads. Then [`CudaError::Driver`] when a device's context cannot be made, and
    /// [`CudaError::Nccl`] when NCCL fails.
    pub fn init_all(devices: &[usize]) -> Result<Vec<Communicator>, CudaError> {
        check_device_list("ncclCommInitAll", devices)?;
        raw::nccl_loaded()?;
        let _restore = crate::context::restore_context_after(devices[0])?;
        // berth's primary contexts, retained before NCCL's runtime calls use them (the runtime
        // shares the primary context: Note [Foreign contexts]).
        for &d in devices {
            crate::context::bind(d)?;
        }
        // In range for a C int: every device is below the visible count, itself a C int.
        let list: Vec<i32> = devices.iter().map(|&d| d as i32).collect();
        let comms = raw::comm_init_all(&list)?;
        let world_size = devices.len();
        Ok(comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (comm, &device))| Communicator {
                comm,
                device,
                rank,
                world_size,
            })
            .collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The device of this rank.
    pub fn device(&self) -> usize {
        self.device
    }

    fn call(
        &self,
        op: &'static str,
        dtype: NcclDType,
        stream: &Stream,
    ) -> Result<raw::Call, CudaError> {
        if stream.device() != self.device {
            return Err(CudaError::DeviceMismatch {
                op,
                expected: self.device,
                actual: stream.device(),
            });
        }
        crate::context::bind(self.device)?;
        Ok(raw::Call {
            comm: self.comm,
            stream: stream.as_raw(),
            dtype: dtype.raw(),
        })
    }

    /// Queues an all-reduce of `count` elements from `send` into `recv` (they may be equal:
    /// in place) on `stream`.
    ///
    /// # Safety
    /// 1. `send` and `recv` are device memory of this communicator's device holding `count`
    ///    elements of `dtype`.
    /// 2. Nothing else reads `recv` or writes either buffer until the collective has run on
    ///    `stream`, and both stay allocated until then.
    /// 3. No other thread calls a collective on this communicator at the same time, and every
    ///    rank issues the same collectives in the same order (NCCL's rule).
    ///
    /// # Errors
    /// [`CudaError::DeviceMismatch`] when `stream` is on another device; [`CudaError::Nccl`].
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let call = self.call("all_reduce", dtype, stream)?;
        // SAFETY: the comm is live (owned), the stream borrowed; preconditions 1 and 2.
        unsafe { raw::all_reduce(&call, send, recv, count, op.raw()) }
    }

    /// Queues a broadcast of `count` elements from rank `root`'s `send` into every rank's
    /// `recv` on `stream`.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce).
    ///
    /// # Errors
    /// [`CudaError::InvalidArgument`] when `root >= world_size`; as
    /// [`all_reduce`](Self::all_reduce).
    pub unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDType,
        root: usize,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        if root >= self.world_size {
            return Err(CudaError::InvalidArgument {
                op: "broadcast",
                what: format!(
                    "root {root} is not a rank of a world of {}",
                    self.world_size
                ),
            });
        }
        let call = self.call("broadcast", dtype, stream)?;
        // SAFETY: as all_reduce.
        unsafe { raw::broadcast(&call, send, recv, count, root as i32) }
    }

    /// Queues an all-gather: each rank's `send_count` elements, in rank order, into every
    /// rank's `recv` (`send_count × world_size` elements).
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `recv` holding `send_count × world_size`
    /// elements.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: NcclDType,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let call = self.call("all_gather", dtype, stream)?;
        // SAFETY: as all_reduce.
        unsafe { raw::all_gather(&call, send, recv, send_count) }
    }

    /// Queues a reduce-scatter: `recv_count × world_size` elements of `send` reduced over the
    /// ranks, rank `r` keeping elements `r × recv_count ..` in `recv`.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `send` holding `recv_count × world_size`
    /// elements.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: NcclDType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let call = self.call("reduce_scatter", dtype, stream)?;
        // SAFETY: as all_reduce.
        unsafe { raw::reduce_scatter(&call, send, recv, recv_count, op.raw()) }
    }
}

/// Checks a list of devices for [`Communicator::init_all`]: non-empty, no device twice,
/// every device visible. Makes no NCCL call.
///
/// # Errors
/// [`CudaError::InvalidArgument`] (naming the repeated device and both positions);
/// [`CudaError::InvalidDevice`]; [`CudaError::Unavailable`].
fn check_device_list(op: &'static str, devices: &[usize]) -> Result<(), CudaError> {
    if devices.is_empty() {
        return Err(CudaError::InvalidArgument {
            op,
            what: "the device list is empty; name at least one device, e.g. [0]".into(),
        });
    }
    for (i, d) in devices.iter().enumerate() {
        if let Some(j) = devices[..i].iter().position(|e| e == d) {
            return Err(CudaError::InvalidArgument {
                op,
                what: format!(
                    "cuda:{d} is listed twice (positions {j} and {i}); list each device once"
                ),
            });
        }
    }
    for &d in devices {
        crate::check_device(d)?;
    }
    Ok(())
}

/// Runs `launch` between `ncclGroupStart` and `ncclGroupEnd` (Note [One thread, several
/// devices]): the collectives it queues are launched together when it returns, so one thread
/// can issue a collective on every communicator of [`Communicator::init_all`].
///
/// Note [One thread, several devices]: an NCCL collective blocks until every rank has joined
/// it, so a thread that calls `ncclAllReduce` on rank 0's communicator, then on rank 1's,
/// would wait in the first call for a rank that it has not yet asked. NCCL's rule is to
/// bracket the calls with `ncclGroupStart` / `ncclGroupEnd`; inside the group each call only
/// queues its operation, and `ncclGroupEnd` launches them all
/// (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/groups.html#management-of-multiple-gpus-from-one-thread>).
/// `ncclGroupEnd` switches the current device for each communicator; berth restores the
/// thread's context afterwards (Note [Foreign contexts]).
///
/// Every argument must be checked *before* the group: `ncclGroupEnd` is called whatever
/// `launch` returns (NCCL's group state is per thread and must be closed), and NCCL launches
/// what was queued unless one of its own calls failed, so an error of berth's own halfway
/// through would leave some ranks launched without the others.
///
/// # Errors
/// [`CudaError::NcclUnavailable`]; `launch`'s error; [`CudaError::Nccl`] from
/// `ncclGroupStart` / `ncclGroupEnd` (an invalid call inside the group is reported here).
pub fn group<T>(launch: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    raw::nccl_loaded()?;
    let _restore = crate::context::restore_context_after(crate::current_device().unwrap_or(0))?;
    raw::group_start()?;
    let mut open = OpenGroup(true);
    let launched = launch();
    open.0 = false;
    let ended = raw::group_end();
    let value = launched?;
    ended?;
    Ok(value)
}

/// Ends a group on an unwinding path, so that NCCL's per-thread group state is closed.
struct OpenGroup(bool);

impl Drop for OpenGroup {
    fn drop(&mut self) {
        if self.0 {
            if let Err(e) = raw::group_end() {
                berth_alloc::warnings::warn_once("nccl-group-end", || {
                    format!("ncclGroupEnd failed while unwinding from an NCCL group: {e}")
                });
            }
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // SAFETY: the communicator is owned and used by nothing after this.
        if let Err(e) = unsafe { raw::comm_destroy(self.comm) } {
            berth_alloc::warnings::warn_once("nccl-comm-destroy", || {
                format!(
                    "ncclCommDestroy failed while dropping a communicator on cuda:{}: {e}",
                    self.device
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ranks_are_refused_before_any_call() {
        let id = [0u8; 128];
        for (world, rank) in [(0, 0), (2, 2)] {
            let err = Communicator::init_rank(0, world, rank, &id).unwrap_err();
            assert!(
                matches!(
                    err,
                    CudaError::InvalidArgument {
                        op: "ncclCommInitRank",
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn init_all_refuses_bad_device_lists_before_any_nccl_call() {
        // Checked before NCCL is even loaded: on a machine without NCCL these would otherwise
        // be `NcclUnavailable`.
        let err = Communicator::init_all(&[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ncclCommInitAll: invalid argument: the device list is empty; name at least one device, e.g. [0]"
        );
        let _two = crate::testing::fake_device_count(2);
        let err = Communicator::init_all(&[1, 0, 1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ncclCommInitAll: invalid argument: cuda:1 is listed twice (positions 0 and 2); list each device once"
        );
        let err = Communicator::init_all(&[0, 2]).unwrap_err();
        assert_eq!(err, CudaError::InvalidDevice { index: 2, count: 2 });
    }

    #[test]
    fn init_all_without_a_driver_or_nccl_is_a_typed_error() {
        if !crate::is_available() {
            // No driver: the device check answers first.
            let err = Communicator::init_all(&[0]).unwrap_err();
            assert!(matches!(err, CudaError::Unavailable { .. }), "{err}");
        }
        if nccl_unavailable_reason().is_some() {
            // Devices that pass the check, then no NCCL.
            let _two = crate::testing::fake_device_count(2);
            let err = Communicator::init_all(&[0, 1]).unwrap_err();
            assert!(matches!(err, CudaError::NcclUnavailable { .. }), "{err}");
            let err = group(|| Ok(())).unwrap_err();
            assert!(matches!(err, CudaError::NcclUnavailable { .. }), "{err}");
        }
    }

    #[test]
    fn without_nccl_the_answer_is_a_typed_error() {
        // Whatever this machine has, asking never panics; without NCCL the reason names the
        // libraries tried.
        match nccl_unavailable_reason() {
            Some(reason) => {
                assert!(
                    reason.contains("libnccl.so.2") || reason.contains("BERTH_NCCL_LIBRARY"),
                    "{reason}"
                );
                assert!(matches!(
                    nccl_version(),
                    Err(CudaError::NcclUnavailable { .. })
                ));
                assert!(matches!(
                    unique_id(),
                    Err(CudaError::NcclUnavailable { .. })
                ));
            }
            None => {
                let (major, minor, patch) = nccl_version().unwrap();
                println!("NCCL {major}.{minor}.{patch} loaded");
                assert_eq!(major, 2);
                // A unique id needs no GPU (NCCL's bootstrap address and a random magic).
                let id = unique_id().unwrap();
                assert_ne!(id, [0u8; 128]);
            }
        }
    }

    /// Every collective on a communicator of one rank on one GPU (what a one-GPU machine can
    /// run): each leaves the data as it was, through NCCL's real code paths.
    #[test]
    #[ignore = "needs a CUDA GPU and NCCL: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without a GPU)"]
    fn world_size_one_runs_every_collective() {
        if !require_nccl("nccl world_size_one_runs_every_collective") {
            return;
        }
        let stream = Stream::new(0, 0).unwrap();
        let comm = Communicator::init_rank(0, 1, 0, &unique_id().unwrap()).unwrap();
        let host: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
        let zeros = vec![0f32; host.len()];
        let bytes = host.len() * 4;
        let a = crate::ffi::mem_alloc(0, bytes).unwrap();
        let b = crate::ffi::mem_alloc(0, bytes).unwrap();
        let read = |ptr: u64| {
            let mut out = vec![0f32; host.len()];
            // SAFETY: `ptr` holds `bytes` bytes of device memory; the stream is synchronised
            // before `out` is read.
            unsafe {
                crate::copy::copy_dtoh_async(out.as_mut_ptr().cast(), ptr, bytes, &stream).unwrap();
            }
            stream.synchronize().unwrap();
            out
        };
        // SAFETY: `a` and `b` hold 1024 f32 each and are used only on `stream`, synchronised
        // before every read; `host` outlives the copy (synchronised below).
        unsafe {
            crate::copy::copy_htod_async(a, host.as_ptr().cast(), bytes, &stream).unwrap();
            comm.all_reduce(a, a, host.len(), NcclDType::F32, ReduceOp::Sum, &stream)
                .unwrap();
            assert_eq!(read(a), host, "all_reduce(sum) of one rank, in place");
            comm.all_reduce(a, b, host.len(), NcclDType::F32, ReduceOp::Avg, &stream)
                .unwrap();
            assert_eq!(read(b), host, "all_reduce(avg) out of place");
            crate::copy::copy_htod_async(b, zeros.as_ptr().cast(), bytes, &stream).unwrap();
            comm.broadcast(a, b, host.len(), NcclDType::F32, 0, &stream)
                .unwrap();
            assert_eq!(read(b), host, "broadcast from rank 0");
            crate::copy::copy_htod_async(b, zeros.as_ptr().cast(), bytes, &stream).unwrap();
            comm.all_gather(a, b, host.len(), NcclDType::F32, &stream)
                .unwrap();
            assert_eq!(read(b), host, "all_gather of one rank");
            crate::copy::copy_htod_async(b, zeros.as_ptr().cast(), bytes, &stream).unwrap();
            comm.reduce_scatter(a, b, host.len(), NcclDType::F32, ReduceOp::Max, &stream)
                .unwrap();
            assert_eq!(read(b), host, "reduce_scatter of one rank");
            // A root outside the world is refused before anything is queued.
            let other = comm.broadcast(a, b, host.len(), NcclDType::F32, 1, &stream);
            assert!(matches!(
                other,
                Err(CudaError::InvalidArgument {
                    op: "broadcast",
                    ..
                })
            ));
            stream.synchronize().unwrap();
            crate::ffi::mem_free(0, a).unwrap();
            crate::ffi::mem_free(0, b).unwrap();
        }
    }
    /// `ncclCommInitAll` over `[0]` (and `[0, 1]` where two GPUs are visible) and an
    /// all-reduce on every communicator from this one thread inside a group.
    #[test]
    #[ignore = "needs a CUDA GPU and NCCL: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without a GPU)"]
    fn init_all_runs_a_grouped_all_reduce() {
        if !require_nccl("nccl init_all_runs_a_grouped_all_reduce") {
            return;
        }
        let count = crate::device_count();
        let lists: &[&[usize]] = if count >= 2 {
            &[&[0], &[0, 1]]
        } else {
            &[&[0]]
        };
        if count < 2 {
            println!("init_all_runs_a_grouped_all_reduce: one GPU visible, so [0, 1] is not run");
        }
        for &devices in lists {
            let comms = Communicator::init_all(devices).unwrap();
            let n = devices.len();
            assert_eq!(
                comms
                    .iter()
                    .map(|c| (c.rank(), c.world_size(), c.device()))
                    .collect::<Vec<_>>(),
                devices
                    .iter()
                    .enumerate()
                    .map(|(r, &d)| (r, n, d))
                    .collect::<Vec<_>>()
            );
            let len = 256;
            let bytes = len * 4;
            let streams: Vec<Stream> = devices
                .iter()
                .map(|&d| Stream::new(d, 0).unwrap())
                .collect();
            // Rank r holds r + 1 + i at element i: the sum over ranks is n(n+1)/2 + n·i.
            let mut bufs = Vec::new();
            for (r, (&d, s)) in devices.iter().zip(&streams).enumerate() {
                let host: Vec<f32> = (0..len).map(|i| (r + 1 + i) as f32).collect();
                let ptr = crate::ffi::mem_alloc(d, bytes).unwrap();
                // SAFETY: `ptr` holds `bytes` bytes on `d`; `s` is synchronised before `host`
                // is dropped.
                unsafe {
                    crate::copy::copy_htod_async(ptr, host.as_ptr().cast(), bytes, s).unwrap();
                }
                s.synchronize().unwrap();
                bufs.push(ptr);
            }
            group(|| {
                for ((c, s), &p) in comms.iter().zip(&streams).zip(&bufs) {
                    // SAFETY: `p` holds `len` f32 on the communicator's device and is used by
                    // nothing else until `s` is synchronised below; one thread, one group.
                    unsafe { c.all_reduce(p, p, len, NcclDType::F32, ReduceOp::Sum, s)? };
                }
                Ok(())
            })
            .unwrap();
            let want: Vec<f32> = (0..len).map(|i| (n * (n + 1) / 2 + n * i) as f32).collect();
            for ((&d, s), &p) in devices.iter().zip(&streams).zip(&bufs) {
                let mut out = vec![0f32; len];
                // SAFETY: `p` holds `bytes` bytes; `s` is synchronised before `out` is read.
                unsafe {
                    crate::copy::copy_dtoh_async(out.as_mut_ptr().cast(), p, bytes, s).unwrap();
                }
                s.synchronize().unwrap();
                assert_eq!(
                    out, want,
                    "grouped all_reduce(sum) over {devices:?}, on cuda:{d}"
                );
                // SAFETY: the stream is synchronised; nothing uses `p` after this.
                unsafe { crate::ffi::mem_free(d, p).unwrap() };
            }
        }
    }
}
