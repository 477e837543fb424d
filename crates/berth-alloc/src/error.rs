//! Errors of backends, allocators and configuration.
//!
//! The retry contract is in the variants (cubecl's `IoError`): [`BackendError::OutOfMemory`] is the
//! only backend failure a policy answers by freeing cache and retrying; [`AllocError::OutOfMemory`]
//! means "everything was tried", [`AllocError::CapExceeded`] and [`AllocError::TooLarge`] mean the
//! request can never succeed as configured.

use crate::ids::{DevicePtr, StreamId};
use crate::stats::format_size;

/// A failure of a [`crate::backend::MemoryBackend`] call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The device has not got `bytes` bytes available now (`CUDA_ERROR_OUT_OF_MEMORY`); for
    /// `op` `"reserve"`, no free virtual address range of `bytes` bytes is left (address space,
    /// not device memory, and worded so).
    #[error("{}", backend_oom_message(op, *bytes))]
    OutOfMemory {
        /// The backend call that failed (`"malloc"`, `"map"`).
        op: &'static str,
        /// The size asked for, in bytes.
        bytes: u64,
    },
    /// A pointer or range that this backend did not hand out, or already took back.
    #[error("{op}: {ptr} is not a live allocation of this backend; pass a pointer returned by malloc/reserve and not yet freed")]
    InvalidPointer {
        /// The backend call that failed.
        op: &'static str,
        /// The offending address.
        ptr: DevicePtr,
    },
    /// A driver call failed with this `CUresult` (the code and its name as the driver's header
    /// spells it, e.g. 1 / `CUDA_ERROR_INVALID_VALUE`).
    #[error("CUDA driver call {op} failed: {name} (code {code})")]
    Driver {
        /// The driver entry point, e.g. `"cuMemMap"`.
        op: &'static str,
        /// The numeric `CUresult`.
        code: u32,
        /// The `CUresult`'s name.
        name: String,
    },
    /// An `unmap` whose range is not a union of whole mappings: it would split the mapping at
    /// `mapping` (the CUDA driver unmaps and releases only whole mappings, `cuMemUnmap`).
    #[error("{op}: range {addr}+{bytes} bytes splits the mapping of {mapping_bytes} bytes at {mapping}; unmap whole mappings only, as made by map")]
    SplitsMapping {
        /// The backend call that failed (`"unmap"`).
        op: &'static str,
        /// Start of the range asked for.
        addr: DevicePtr,
        /// Length of the range asked for, in bytes.
        bytes: u64,
        /// Start of the mapping the range cuts through.
        mapping: DevicePtr,
        /// Length of that mapping, in bytes.
        mapping_bytes: u64,
    },
    /// Any other failure, with the driver's message.
    #[error("{op} failed: {message}")]
    Other {
        /// The backend call that failed (`"cuMemAlloc"`, `"record_fence"`, ...).
        op: &'static str,
        /// What went wrong, in the driver's words.
        message: String,
    },
}

/// [`BackendError::OutOfMemory`]'s message: a failed `reserve` ran out of address space, which
/// says nothing about device memory (newcomer defect 10 read "device out of memory" while the
/// device was empty).
fn backend_oom_message(op: &str, bytes: u64) -> String {
    if op == "reserve" {
        format!(
            "address space exhausted: reserve of {bytes} bytes ({}) failed: no free virtual \
             address range that large is left (device memory may be free)",
            format_size(bytes)
        )
    } else {
        format!("device out of memory: {op} of {bytes} bytes failed")
    }
}

impl BackendError {
    /// Whether this is [`BackendError::OutOfMemory`], the only retryable kind.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, BackendError::OutOfMemory { .. })
    }
}

/// A failure of an allocator ([`crate::DeviceAllocator`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// PyTorch's `torch.OutOfMemoryError`: no cached block fits and the backend could not provide
    /// a new segment even after the retry sequence. The allocator stays usable. The message is
    /// PyTorch's (`CUDACachingAllocator.cpp`, `malloc`), sizes as `format_size` prints them.
    #[error("{}", oom_message(*.requested, *.device, *.device_total, *.device_free, *.allocated, *.reserved_unallocated, *.allowed, *.hint))]
    OutOfMemory {
        /// The bytes asked of the backend (the segment size, not the tensor size: a 5 MiB
        /// tensor reports 20 MiB, as PyTorch does).
        requested: u64,
        /// The request as the caller made it, in bytes.
        requested_by_caller: u64,
        /// The device index.
        device: i32,
        /// Total device memory in bytes (`cudaMemGetInfo`).
        device_total: u64,
        /// Free device memory in bytes (`cudaMemGetInfo`).
        device_free: u64,
        /// Bytes allocated by this allocator (`allocated_bytes.all.current`).
        allocated: u64,
        /// Bytes reserved but not allocated (`reserved − allocated`).
        reserved_unallocated: u64,
        /// The memory-fraction cap in bytes, when one is set.
        allowed: Option<u64>,
        /// Which advice the message ends with (depends on the policy that failed).
        hint: OomHint,
    },
    /// The request alone exceeds the memory-fraction cap: it cannot succeed even with an empty
    /// cache. Counted as an OOM (`num_ooms`), like PyTorch, and [`AllocError::is_out_of_memory`]
    /// is true for it.
    #[error("CUDA out of memory. Tried to allocate {}. GPU {device} has a total capacity of {} of which {} is free. {} allowed; the request alone exceeds the per-process memory fraction; raise it with set_memory_fraction or allocate less", format_size(*.requested), format_size(*.device_total), format_size(*.device_free), format_size(*.cap))]
    CapExceeded {
        /// The bytes that would have been asked of the backend.
        requested: u64,
        /// The device index.
        device: i32,
        /// Total device memory in bytes.
        device_total: u64,
        /// Free device memory in bytes.
        device_free: u64,
        /// The cap in bytes (`fraction × total`).
        cap: u64,
    },
    /// A request too large for any device (PyTorch: "Tried to allocate more than 1EB memory").
    #[error("CUDA out of memory. Tried to allocate more than 1EB memory ({requested} bytes requested); requests must be below 2^60 bytes")]
    TooLarge {
        /// The request in bytes.
        requested: u64,
    },
    /// A pointer this allocator never handed out (PyTorch: "invalid device pointer").
    #[error("invalid device pointer: {ptr} was not allocated by this allocator (or is not the start of an allocation)")]
    InvalidPointer {
        /// The offending address.
        ptr: DevicePtr,
    },
    /// A pointer that was handed out but is already freed.
    #[error("double free: {ptr} was already freed; free each allocation exactly once")]
    DoubleFree {
        /// The offending address.
        ptr: DevicePtr,
    },
    /// `set_memory_fraction` got a value outside `0..=1` (PyTorch: "Invalid fraction value").
    #[error("Invalid fraction value: {fraction}. Allowed range: 0~1")]
    InvalidFraction {
        /// The value given.
        fraction: f64,
    },
    /// A feature the backend cannot provide (for example expandable segments without
    /// [`crate::backend::VirtualMemoryBackend`]).
    #[error("{feature} needs {needs}, which this backend does not provide")]
    Unsupported {
        /// The feature asked for.
        feature: &'static str,
        /// The missing capability.
        needs: &'static str,
    },
    /// A private-pool call named a pool that does not exist, or one in the wrong state
    /// (`Note [Private pools]` in `caching::private_pools`).
    #[error("private pool {id:?}: cannot {what}")]
    NoSuchPool {
        /// The pool's id (PyTorch's `MempoolId_t`).
        id: (u64, u64),
        /// What was asked and why it cannot be done.
        what: &'static str,
    },
    /// `begin_allocate_to_pool` for a pool that is already being allocated to (PyTorch:
    /// "beginAllocateToPool: already recording to `mempool_id`").
    #[error(
        "private pool {id:?} is already being allocated to; end that first (end_allocate_to_pool)"
    )]
    PoolInUse {
        /// The pool's id.
        id: (u64, u64),
    },
    /// The policy does not implement the feature asked for; another policy does.
    #[error("the {policy} policy does not support {feature}; {instead}")]
    PolicyLacks {
        /// The feature asked for.
        feature: &'static str,
        /// The policy's name.
        policy: String,
        /// What to do instead.
        instead: &'static str,
    },
    /// A pool checkpoint that does not fit the pool's memory as it is now
    /// ([`crate::DeviceAllocator::restore_pool`]).
    #[error("private pool {id:?}: cannot restore its checkpoint: {what}; a checkpoint must list blocks of this pool (as getCheckpointState took them), none overlapping, in memory the pool still holds")]
    BadCheckpoint {
        /// The pool's id.
        id: (u64, u64),
        /// What does not fit.
        what: String,
    },
    /// More private pools than one device can index (32766) are alive.
    #[error("too many private pools alive on this device (at most 32766); release pools no longer used (release_pool) and empty the cache")]
    TooManyPools,
    /// A tag name that cannot be used: tags are non-empty names (`crate::tags`).
    #[error(
        "invalid tag {given:?}: a tag is a non-empty name such as \"weights\" or \"kv_cache\""
    )]
    InvalidTag {
        /// The name given.
        given: String,
    },
    /// An allocation in a tag that is asleep (`Note [Sleep and wake]` in `crate::paged`).
    #[error("cannot allocate in tag {tag:?}: it is asleep; wake it first (wake([{tag:?}]))")]
    TagAsleep {
        /// The sleeping tag.
        tag: String,
    },
    /// `sleep` of a tag no allocation ever carried.
    #[error("no allocation was ever made in tag {tag:?}; known tags: {known:?}")]
    UnknownTag {
        /// The name given.
        tag: String,
        /// The tags this allocator knows.
        known: Vec<String>,
    },
    /// `sleep` of a tag that is already asleep.
    #[error("tag {tag:?} is already asleep; wake it before sleeping it again")]
    AlreadyAsleep {
        /// The tag.
        tag: String,
    },
    /// `wake` of a tag that is awake.
    #[error("tag {tag:?} is awake; only a sleeping tag can be woken")]
    NotAsleep {
        /// The tag.
        tag: String,
    },
    /// `sleep` was asked to offload a tag it does not put to sleep.
    #[error("cannot offload tag {tag:?}: it is not among the tags put to sleep; list it in both")]
    OffloadNotSlept {
        /// The tag.
        tag: String,
    },
    /// `sleep` was asked to offload without host memory to back up into.
    #[error("sleep was asked to offload {tags:?} but given no host memory for the backups; pass one (a pinned host backend)")]
    NoBackupMemory {
        /// The tags to offload.
        tags: Vec<String>,
    },
    /// `sleep` or `wake` while a private pool is being allocated to (a CUDA graph capture):
    /// unmapping, synchronizing and copying are illegal then.
    #[error("cannot {op} while a private pool is being allocated to (CUDA graph capture); end the capture first")]
    SleepDuringCapture {
        /// `"sleep"` or `"wake"`.
        op: &'static str,
    },
    /// The host memory for a sleeping tag's backups could not be had: nothing was released,
    /// the tags are still awake.
    #[error("cannot offload tag {tag:?}: {bytes} bytes of host memory for its backups are not available ({source}); nothing was released")]
    OffloadFailed {
        /// The tag whose backups did not fit.
        tag: String,
        /// Host bytes all the offloaded tags needed.
        bytes: u64,
        /// The host backend's error.
        #[source]
        source: BackendError,
    },
    /// Waking a tag could not get its device memory back: the tags stay asleep with their
    /// backups kept; free memory and wake again.
    #[error("cannot wake tag {tag:?}: {bytes} bytes of device memory are not available ({source}); it stays asleep with its backups kept")]
    WakeFailed {
        /// The tag whose memory could not be mapped.
        tag: String,
        /// Device bytes the woken tags needed.
        bytes: u64,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// A backend call failed for a reason other than running out of memory.
    #[error("backend failure on {stream}: {source}")]
    Backend {
        /// The stream of the operation.
        stream: StreamId,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// A bad configuration string.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl AllocError {
    /// Whether this is an out-of-memory condition ([`AllocError::OutOfMemory`],
    /// [`AllocError::CapExceeded`] or [`AllocError::TooLarge`]), i.e. what PyTorch raises as
    /// `torch.OutOfMemoryError`. Only [`AllocError::OutOfMemory`] may succeed on a retry.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            AllocError::OutOfMemory { .. }
                | AllocError::CapExceeded { .. }
                | AllocError::TooLarge { .. }
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn oom_message(
    requested: u64,
    device: i32,
    total: u64,
    free: u64,
    allocated: u64,
    reserved_unallocated: u64,
    allowed: Option<u64>,
    hint: OomHint,
) -> String {
    let allowed = allowed
        .map(|a| format!("{} allowed; ", format_size(a)))
        .unwrap_or_default();
    let hint = hint.text();
    format!(
        "CUDA out of memory. Tried to allocate {}. GPU {device} has a total capacity of {} of which {} is free. \
         Including non-PyTorch memory, this process has {} memory in use. {allowed}Of the allocated memory {} is allocated by PyTorch, \
         and {} is reserved by PyTorch but unallocated. {hint}  See documentation for Memory Management  \
         (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
        format_size(requested),
        format_size(total),
        format_size(free),
        format_size(total.saturating_sub(free)),
        format_size(allocated),
        format_size(reserved_unallocated),
    )
}

/// The advice an [`AllocError::OutOfMemory`] message ends with: PyTorch's for its two modes
/// (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>, the
/// "If reserved but unallocated memory is large" sentence), and berth's own for `paged`, which
/// has no `max_split_size_mb` or expandable segments to suggest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OomHint {
    /// PyTorch's caching policy without expandable segments: suggest them.
    ExpandableSegments,
    /// PyTorch's caching policy with expandable segments on: suggest `max_split_size_mb`.
    MaxSplitSize,
    /// berth's `paged` policy: it already gave its free pages back and retried.
    Paged,
}

impl OomHint {
    /// The sentence the message ends with.
    pub fn text(self) -> &'static str {
        match self {
            OomHint::ExpandableSegments => {
                "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
            }
            OomHint::MaxSplitSize => {
                "If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation."
            }
            OomHint::Paged => {
                "berth's paged policy already returned its free pages to the device and retried, so the memory is in use: free tensors you no longer need or make the request smaller."
            }
        }
    }
}

/// A bad allocator configuration string (`PYTORCH_CUDA_ALLOC_CONF` syntax).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key that is not an allocator option.
    #[error("unrecognized allocator config key '{key}'; known keys: {known}")]
    UnknownKey {
        /// The key as written.
        key: String,
        /// The accepted keys, comma-separated.
        known: &'static str,
    },
    /// A value the key does not accept.
    #[error("invalid value '{value}' for allocator config key '{key}': expected {expected}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// What would be accepted.
        expected: &'static str,
    },
    /// An option of PyTorch's policy given with `backend:paged`, whose policy has no such knob.
    #[error(
        "allocator config key '{key}' tunes PyTorch's caching allocator (backend:native) and \
         has no meaning for backend:{backend}; remove '{key}' or use backend:native"
    )]
    NotForBackend {
        /// The key.
        key: &'static str,
        /// The backend that was chosen.
        backend: &'static str,
    },
    /// The environment variable is set but is not valid UTF-8, so it cannot be read as options
    /// (it used to be treated as unset, silently running the default policy).
    #[error("the environment variable {var} is set but is not valid UTF-8: write it as ASCII key:value pairs, e.g. {var}=backend:native")]
    NotUnicode {
        /// The variable's name.
        var: &'static str,
    },
    /// An option of PyTorch's allocator that berth does not implement
    /// ([`crate::config::PYTORCH_ONLY_KEYS`]), written in berth's own configuration.
    #[error("allocator config key '{key}' is an option of PyTorch's allocator that berth does not implement; remove it (read from PyTorch's PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF it is skipped with a warning)")]
    NotImplemented {
        /// The key.
        key: &'static str,
    },
    /// The configuration read from an environment variable was refused: the variable's name
    /// and why ([`crate::AllocatorConfig::from_env`]).
    #[error("{var}: {error}")]
    InVariable {
        /// The variable (one of [`crate::config::CONFIG_VARIABLES`]).
        var: &'static str,
        /// What was wrong with its value (part of this error's message, not a separate source).
        error: Box<ConfigError>,
    },
    /// A malformed entry (no `key:value` shape, unbalanced brackets).
    #[error("malformed allocator config at byte {position}: {message} (expected comma-separated key:value pairs)")]
    Syntax {
        /// Byte offset in the string.
        position: usize,
        /// What was found.
        message: String,
    },
}

/// Why a policy name or a policy's options were refused ([`crate::Policy::parse`],
/// [`crate::Policy::config`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The name is none of [`crate::Policy::ALL`]'s.
    #[error("unknown berth allocator policy {given:?}: use one of \"pytorch\", \"expandable\", \"paged\"")]
    Unknown {
        /// The name given.
        given: String,
    },
    /// The options set a key the policy name decides.
    #[error("allocator option '{key}' is set by the policy name; remove it and pick the policy instead (\"pytorch\", \"expandable\" or \"paged\")")]
    PolicyKey {
        /// The key (`backend` or `expandable_segments`).
        key: &'static str,
    },
    /// The extra options (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax) are malformed or do not
    /// apply to the policy.
    #[error("allocator options for policy {policy:?}: {source}")]
    Config {
        /// The policy the options were given with.
        policy: &'static str,
        /// What was wrong with them.
        #[source]
        source: ConfigError,
    },
}
