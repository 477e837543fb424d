//! NCCL, loaded at run time: every NCCL call berth makes, each once.
//!
//! Note [Loading NCCL]: cudarc 0.19's `nccl` module has the bindings (its `nccl::sys` types
//! are used here) but its loader tries `libnccl.so`, `libnccl.so.<CUDA major>` and a list of
//! other suffixes, never `libnccl.so.2`, the name NCCL's packages and the `nvidia-nccl-cu*`
//! wheels install (the `libnccl.so` link comes only with a `-dev` package); and it panics
//! when it finds nothing. So berth opens the library itself, `libnccl.so.2` first, then
//! `libnccl.so`, or the path in `BERTH_NCCL_LIBRARY` when set, resolves the handful of
//! symbols it calls, and answers [`CudaError::NcclUnavailable`] naming what it tried when
//! none loads. Return codes are read as plain integers (`ncclResult_t` values outside
//! cudarc's enum must not become one).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};

use crate::CudaError;

/// The names tried, in order, when `BERTH_NCCL_LIBRARY` is not set (Note [Loading NCCL]).
pub(crate) const NCCL_LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

type Stream = *mut c_void;

struct Nccl {
    /// Kept for the life of the process: the function pointers below point into it.
    _lib: libloading::Library,
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int,
    comm_init_all: unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        Stream,
    ) -> c_int,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        Stream,
    ) -> c_int,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        Stream,
    ) -> c_int,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        Stream,
    ) -> c_int,
}

static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();

fn open() -> Result<Nccl, String> {
    let names: Vec<String> = match std::env::var("BERTH_NCCL_LIBRARY") {
        Ok(path) if !path.is_empty() => vec![path],
        _ => NCCL_LIBRARY_NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let mut errors = Vec::new();
    for name in &names {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return resolve(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "no NCCL library could be loaded (tried {}); install NCCL 2 (the libnccl2 package, or pip's nvidia-nccl-cu13) and put its directory on LD_LIBRARY_PATH, or set BERTH_NCCL_LIBRARY to the library's path",
        errors.join("; ")
    ))
}

fn resolve(lib: libloading::Library) -> Result<Nccl, libloading::Error> {
    // SAFETY: for each `get` below, the symbol types are NCCL 2's C signatures (`nccl.h`), as in
    // cudarc's `nccl::sys`, with the result read as a plain `int`.
    unsafe {
        Ok(Nccl {
            get_version: *lib.get(b"ncclGetVersion\0")?,
            get_unique_id: *lib.get(b"ncclGetUniqueId\0")?,
            comm_init_rank: *lib.get(b"ncclCommInitRank\0")?,
            comm_init_all: *lib.get(b"ncclCommInitAll\0")?,
            group_start: *lib.get(b"ncclGroupStart\0")?,
            group_end: *lib.get(b"ncclGroupEnd\0")?,
            comm_destroy: *lib.get(b"ncclCommDestroy\0")?,
            get_error_string: *lib.get(b"ncclGetErrorString\0")?,
            all_reduce: *lib.get(b"ncclAllReduce\0")?,
            broadcast: *lib.get(b"ncclBroadcast\0")?,
            all_gather: *lib.get(b"ncclAllGather\0")?,
            reduce_scatter: *lib.get(b"ncclReduceScatter\0")?,
            _lib: lib,
        })
    }
}

fn nccl() -> Result<&'static Nccl, CudaError> {
    NCCL.get_or_init(open)
        .as_ref()
        .map_err(|reason| CudaError::NcclUnavailable {
            reason: reason.clone(),
        })
}

fn check(op: &'static str, code: c_int) -> Result<(), CudaError> {
    if code == 0 {
        return Ok(());
    }
    let message = match nccl() {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        Ok(n) => unsafe {
            let p = (n.get_error_string)(code);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        },
        Err(_) => String::new(),
    };
    Err(CudaError::Nccl { op, code, message })
}

/// Whether NCCL loads, and why not (Note [Loading NCCL]).
pub(crate) fn nccl_loaded() -> Result<(), CudaError> {
    nccl().map(drop)
}

/// `ncclGetVersion`: e.g. 22703 for NCCL 2.27.3.
pub(crate) fn get_version() -> Result<i32, CudaError> {
    let n = nccl()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer.
    check("ncclGetVersion", unsafe { (n.get_version)(&mut v) })?;
    Ok(v)
}

/// `ncclGetUniqueId`: the 128 bytes rank 0 hands to every rank.
pub(crate) fn get_unique_id() -> Result<[u8; 128], CudaError> {
    let n = nccl()?;
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out-pointer.
    check("ncclGetUniqueId", unsafe { (n.get_unique_id)(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

/// `ncclCommInitRank` on the current device (the caller bound it): blocks until all `nranks`
/// ranks have called it with the same id.
pub(crate) fn comm_init_rank(nranks: i32, id: &[u8; 128], rank: i32) -> Result<u64, CudaError> {
    let n = nccl()?;
    let id = ncclUniqueId {
        internal: id.map(|b| b as c_char),
    };
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a valid out-pointer; NCCL checks the id and the ranks.
    check("ncclCommInitRank", unsafe {
        (n.comm_init_rank)(&mut comm, nranks, id, rank)
    })?;
    Ok(comm as usize as u64)
}

/// `ncclCommInitAll`: one communicator per device of `devices`, all in this process, rank `i`
/// on `devices[i]`
/// (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclcomminitall>).
/// NCCL switches the current device while it runs; the caller restores berth's context.
///
/// The caller has checked that `devices` is non-empty, has no duplicates and names visible
/// devices (NCCL checks too, with less telling errors).
pub(crate) fn comm_init_all(devices: &[c_int]) -> Result<Vec<u64>, CudaError> {
    let n = nccl()?;
    let ndev = c_int::try_from(devices.len()).map_err(|_| CudaError::InvalidArgument {
        op: "ncclCommInitAll",
        what: format!("{} devices do not fit NCCL's int count", devices.len()),
    })?;
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
    // SAFETY: `comms` has room for `ndev` communicators and `devices` holds `ndev` ints.
    check("ncclCommInitAll", unsafe {
        (n.comm_init_all)(comms.as_mut_ptr(), ndev, devices.as_ptr())
    })?;
    Ok(comms.into_iter().map(|c| c as usize as u64).collect())
}

/// `ncclGroupStart`: NCCL calls on this thread until the matching [`group_end`] are queued
/// and launched together
/// (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/group.html#ncclgroupstart>).
pub(crate) fn group_start() -> Result<(), CudaError> {
    let n = nccl()?;
    // SAFETY: no arguments; NCCL keeps the group depth per thread.
    check("ncclGroupStart", unsafe { (n.group_start)() })
}

/// `ncclGroupEnd`: launches what was queued since the matching [`group_start`]
/// (<https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/group.html#ncclgroupend>).
/// NCCL switches the current device while it launches; the caller restores berth's context.
pub(crate) fn group_end() -> Result<(), CudaError> {
    let n = nccl()?;
    // SAFETY: no arguments; the queued calls' buffers are their callers' contract.
    check("ncclGroupEnd", unsafe { (n.group_end)() })
}

/// `ncclCommDestroy`.
///
/// # Safety
/// 1. `comm` came from [`comm_init_rank`] or [`comm_init_all`] and is not used after this call.
pub(crate) unsafe fn comm_destroy(comm: u64) -> Result<(), CudaError> {
    let n = nccl()?;
    // SAFETY: precondition 1.
    check("ncclCommDestroy", unsafe {
        (n.comm_destroy)(comm as usize as ncclComm_t)
    })
}

/// The arguments every collective shares.
pub(crate) struct Call {
    pub(crate) comm: u64,
    pub(crate) stream: u64,
    pub(crate) dtype: ncclDataType_t,
}

/// `ncclAllReduce` of `count` elements.
///
/// # Safety
/// 1. `call.comm` is a live communicator and `call.stream` a live stream of its device.
/// 2. `send` and `recv` are device memory of that device holding `count` elements of
///    `call.dtype`, untouched by other work until the collective ran on `call.stream`.
pub(crate) unsafe fn all_reduce(
    call: &Call,
    send: u64,
    recv: u64,
    count: usize,
    op: ncclRedOp_t,
) -> Result<(), CudaError> {
    let n = nccl()?;
    // SAFETY: preconditions 1 and 2.
    check("ncclAllReduce", unsafe {
        (n.all_reduce)(
            send as usize as *const c_void,
            recv as usize as *mut c_void,
            count,
            call.dtype,
            op,
            call.comm as usize as ncclComm_t,
            call.stream as usize as Stream,
        )
    })
}

/// `ncclBroadcast` of `count` elements from `root`.
///
/// # Safety
/// As [`all_reduce`] (`send` is read on `root` only).
pub(crate) unsafe fn broadcast(
    call: &Call,
    send: u64,
    recv: u64,
    count: usize,
    root: i32,
) -> Result<(), CudaError> {
    let n = nccl()?;
    // SAFETY: as all_reduce.
    check("ncclBroadcast", unsafe {
        (n.broadcast)(
            send as usize as *const c_void,
            recv as usize as *mut c_void,
            count,
            call.dtype,
            root,
            call.comm as usize as ncclComm_t,
            call.stream as usize as Stream,
        )
    })
}

/// `ncclAllGather`: `send_count` elements from each rank into `recv` (`send_count × nranks`).
///
/// # Safety
/// As [`all_reduce`], with `recv` holding `send_count × nranks` elements.
pub(crate) unsafe fn all_gather(
    call: &Call,
    send: u64,
    recv: u64,
    send_count: usize,
) -> Result<(), CudaError> {
    let n = nccl()?;
    // SAFETY: as all_reduce.
    check("ncclAllGather", unsafe {
        (n.all_gather)(
            send as usize as *const c_void,
            recv as usize as *mut c_void,
            send_count,
            call.dtype,
            call.comm as usize as ncclComm_t,
            call.stream as usize as Stream,
        )
    })
}

/// `ncclReduceScatter`: `recv_count × nranks` elements reduced, each rank keeping its
/// `recv_count`.
///
/// # Safety
/// As [`all_reduce`], with `send` holding `recv_count × nranks` elements.
pub(crate) unsafe fn reduce_scatter(
    call: &Call,
    send: u64,
    recv: u64,
    recv_count: usize,
    op: ncclRedOp_t,
) -> Result<(), CudaError> {
    let n = nccl()?;
    // SAFETY: as all_reduce.
    check("ncclReduceScatter", unsafe {
        (n.reduce_scatter)(
            send as usize as *const c_void,
            recv as usize as *mut c_void,
            recv_count,
            call.dtype,
            op,
            call.comm as usize as ncclComm_t,
            call.stream as usize as Stream,
        )
    })
}
