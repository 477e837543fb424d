//! `berth::Error`: the one error type of the `berth` crate.
//!
//! Every message says what was wrong and what would be right; fields carry the structured
//! context (`op`, shapes, devices) so callers can match instead of parsing strings.

use crate::{DType, Device};

/// Errors of the `berth` crate. Lower-level errors convert into it with `?`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA error (driver, availability, device index).
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),

    /// An allocator error (out of memory, bad configuration, invalid pointer).
    #[error(transparent)]
    Alloc(#[from] berth_alloc::AllocError),

    /// A device string that does not parse.
    #[error(transparent)]
    ParseDevice(#[from] crate::device::ParseDeviceError),

    /// A device that parses but cannot be used here (`mps` on Linux).
    #[error("device {device} is not available on this platform: {reason}")]
    DeviceNotAvailable {
        /// The device asked for.
        device: Device,
        /// Why, in words.
        reason: String,
    },

    /// Reading the values of a meta tensor. One kind for `item`, `to_vec` and copies out of
    /// meta (PyTorch has two, <https://github.com/pytorch/pytorch/issues/119588> and
    /// <https://github.com/pytorch/pytorch/pull/53143>); both of PyTorch's messages are part of
    /// the text.
    #[error(
        "Tensor.{op}() cannot be called on meta tensors: Cannot copy out of meta tensor; no \
         data! (meta tensors carry shape and dtype only; use to_empty(device) to get a tensor \
         with memory)"
    )]
    MetaNoData {
        /// The reading operation (`item`, `to_vec`, `to`, ...).
        op: &'static str,
    },

    /// An operation without a shape rule on the meta device: an explicit error, never a wrong
    /// shape (<https://github.com/mlverse/torch/issues/877>).
    #[error("no meta implementation for {op}: it cannot run on the meta device")]
    NoMetaImpl {
        /// The operation.
        op: &'static str,
    },

    /// An operation with no kernel on a device (yet).
    #[error("{op} has no kernel on {device}; move the tensors to cpu first")]
    NoKernel {
        /// The operation.
        op: &'static str,
        /// The device.
        device: Device,
    },

    /// Two operands on different devices.
    #[error(
        "{op}: expected all tensors to be on the same device, but found {lhs} and {rhs}; move \
         one with .to(device)"
    )]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's device.
        lhs: Device,
        /// The second operand's device.
        rhs: Device,
    },

    /// Two operands with different dtypes (berth does not promote implicitly).
    #[error("{op}: expected both operands to have the same dtype, got {lhs} and {rhs}; convert one with to_dtype")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's dtype.
        lhs: DType,
        /// The second operand's dtype.
        rhs: DType,
    },

    /// A dtype the operation does not support.
    #[error("{op} does not support dtype {dtype}; expected {expected}")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// The dtypes accepted, in words.
        expected: &'static str,
    },

    /// `to_vec::<T>()` / `item::<T>()` with a `T` of another dtype than the tensor's.
    #[error(
        "{op}: the tensor has dtype {actual} but {requested} was requested; call to_dtype first, or to_vec_f64() for the elements of any dtype as f64 (what PyTorch's tolist() converts to)"
    )]
    ElementType {
        /// The operation.
        op: &'static str,
        /// The tensor's dtype.
        actual: DType,
        /// The dtype of the requested Rust type.
        requested: DType,
    },

    /// Shapes that cannot broadcast together.
    #[error("{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast together (sizes must match or be 1, aligned from the right)")]
    BroadcastMismatch {
        /// The operation.
        op: &'static str,
        /// The first shape.
        lhs: Vec<usize>,
        /// The second shape.
        rhs: Vec<usize>,
    },

    /// `expand` to a shape the tensor cannot broadcast to.
    #[error("{op}: cannot expand shape {from:?} to {to:?} (only size-1 dimensions can grow)")]
    ExpandMismatch {
        /// The operation.
        op: &'static str,
        /// The tensor's shape.
        from: Vec<usize>,
        /// The target shape.
        to: Vec<usize>,
    },

    /// Matmul with inner dimensions that differ (PyTorch: "mat1 and mat2 shapes cannot be
    /// multiplied (2x3 and 4x5)").
    #[error("matmul: shapes {lhs:?} and {rhs:?} cannot be multiplied: the last dimension of the first ({k1}) must equal the second-to-last of the second ({k2})")]
    MatmulShape {
        /// The first operand's shape.
        lhs: Vec<usize>,
        /// The second operand's shape.
        rhs: Vec<usize>,
        /// The first operand's inner size.
        k1: usize,
        /// The second operand's inner size.
        k2: usize,
    },

    /// A shape that does not fit the operation (wrong rank, wrong element count ...).
    #[error("{op}: {what}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What was wrong and what would be right.
        what: String,
    },

    /// A shape whose element count does not fit (PyTorch's `safe_compute_numel`: "numel:
    /// integer multiplication overflow"). The product of the sizes, counting a size 0 as 1 as
    /// the contiguous strides do (PyTorch's "Stride calculation overflowed"), must be at most
    /// `isize::MAX`, PyTorch's `int64_t` limit.
    #[error("{op}: numel: integer multiplication overflow: the number of elements of shape {shape:?} does not fit in isize (the product of the sizes, counting a size 0 as 1, must be at most {}); use smaller sizes", isize::MAX)]
    NumelOverflow {
        /// The operation.
        op: &'static str,
        /// The shape asked for.
        shape: Vec<usize>,
    },

    /// A shape whose size in bytes does not fit (PyTorch's `computeStorageNbytes`: "Storage
    /// size calculation overflowed"): `numel × element size` must be at most `isize::MAX`
    /// bytes, the largest allocation Rust (and PyTorch's `int64_t` sizes) can describe.
    #[error("{op}: Storage size calculation overflowed: shape {shape:?} of {dtype} needs {numel} elements × {} bytes, more than {} bytes; use smaller sizes or a smaller dtype", dtype.size_in_bytes(), isize::MAX)]
    StorageSizeOverflow {
        /// The operation.
        op: &'static str,
        /// The shape asked for.
        shape: Vec<usize>,
        /// The element type.
        dtype: DType,
        /// The number of elements of `shape` (it fits; its size in bytes does not).
        numel: usize,
    },

    /// The system allocator refused host memory for a tensor (PyTorch's
    /// `DefaultCPUAllocator: not enough memory: you tried to allocate N bytes`). Not a panic or
    /// an abort: the process goes on, and a smaller request may succeed.
    #[error("{device}: out of memory: DefaultCPUAllocator: not enough memory: you tried to allocate {requested_bytes} bytes ({}); free some tensors or use smaller shapes", berth_alloc::stats::format_size(*.requested_bytes as u64))]
    HostOutOfMemory {
        /// The device (`cpu`).
        device: Device,
        /// The size of the failed request, in bytes.
        requested_bytes: usize,
    },

    /// A value that does not fit the dtype it is written as (`full`, `fill_`): PyTorch's
    /// `checked_convert` ("value cannot be converted to type `uint8_t` without overflow").
    /// Integer dtypes reject values outside their range and NaN/±inf; float dtypes reject
    /// finite values beyond their largest finite value; bool accepts every value (non-zero →
    /// `true`), as PyTorch.
    #[error("{op}: value cannot be converted to type {} without overflow: {value} is outside the range of {dtype}; pass a value the dtype can hold", dtype.c_type_name())]
    ValueOverflow {
        /// The operation.
        op: &'static str,
        /// The value given.
        value: f64,
        /// The dtype it had to fit.
        dtype: DType,
    },

    /// Arithmetic that has no meaning on `bool` tensors (PyTorch's `sub_check` and `neg`
    /// checks); the message is PyTorch's.
    #[error("{op}: {message} (in berth: {instead})")]
    BoolArithmetic {
        /// The operation (`sub`, `neg`).
        op: &'static str,
        /// PyTorch's message, naming the logical operator to use instead.
        message: &'static str,
        /// berth's equivalent of that operator.
        instead: &'static str,
    },

    /// An in-place write to a tensor in which several elements share one memory location (a
    /// dimension of size > 1 with stride 0, e.g. after `expand`): PyTorch's
    /// `assert_no_internal_overlap`.
    #[error("{op}: unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation. (shape {shape:?}, strides {strides:?})")]
    InternalOverlap {
        /// The in-place operation.
        op: &'static str,
        /// The written-to tensor's shape.
        shape: Vec<usize>,
        /// Its strides, in elements (a 0 on a dimension of size > 1 is the overlap).
        strides: Vec<usize>,
    },

    /// A dimension index outside `[-rank, rank - 1]`; a 0-d tensor takes `-1` and `0`, as a
    /// 1-D one (PyTorch's `maybe_wrap_dim`, whose message this is).
    #[error("{op}: Dimension out of range (expected to be in range of [{}, {}], but got {dim})", -(rank.max(&1).cast_signed()), rank.max(&1).cast_signed() - 1)]
    DimOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dimension given.
        dim: isize,
        /// The tensor's rank (the number of dimensions `dim` indexes).
        rank: usize,
    },

    /// An in-place op whose result has a dtype the written tensor cannot hold: an integer or
    /// bool tensor and a scalar that is not an integer (PyTorch: "result type Float can't be
    /// cast to the desired output type Long"; Note [Scalar promotion]).
    #[error("{op}: result type {} can't be cast to the desired output type {}; use the out-of-place op, which returns {result}, or convert the tensor with to_dtype first", result.scalar_type_name(), output.scalar_type_name())]
    ResultTypeCast {
        /// The in-place operation.
        op: &'static str,
        /// The dtype the op's result has.
        result: DType,
        /// The dtype of the tensor written.
        output: DType,
    },

    /// An index (or range end) past the size of a dimension.
    #[error("{op}: index {index} is out of range for dimension {dim} of size {size}")]
    IndexOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dimension.
        dim: usize,
        /// The index (or range end) given.
        index: usize,
        /// The dimension's size.
        size: usize,
    },

    /// `item()` on a tensor with other than one element (PyTorch: "a Tensor with 2 elements
    /// cannot be converted to Scalar").
    #[error("item(): a Tensor with {numel} elements cannot be converted to Scalar; item() needs exactly one element (reduce first, e.g. sum())")]
    NotAScalar {
        /// The tensor's number of elements.
        numel: usize,
    },

    /// Data whose length does not match the shape.
    #[error("{op}: shape {shape:?} needs {expected} elements but {got} were given")]
    DataLength {
        /// The operation.
        op: &'static str,
        /// The shape asked for.
        shape: Vec<usize>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements given.
        got: usize,
    },

    /// An argument outside what the call accepts.
    #[error("{op}: invalid argument: {what}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What was wrong and what would be right.
        what: String,
    },

    /// `load_state_dict` without an entry the module needs (PyTorch: `"Missing key(s) in
    /// state_dict"`).
    #[error("load_state_dict: missing key {key:?} in state_dict (the module has a parameter of that name; present keys: {present:?})")]
    MissingKey {
        /// The parameter name.
        key: String,
        /// The keys the state dict does have.
        present: Vec<String>,
    },

    /// `load_state_dict` with keys the module does not have (strict loading).
    #[error("load_state_dict: unexpected key(s) {keys:?} in state_dict (the module has no such parameters)")]
    UnexpectedKeys {
        /// The extra keys.
        keys: Vec<String>,
    },

    /// `load_state_dict` with a tensor of the wrong shape (PyTorch: "size mismatch for
    /// weight: copying a param with shape ... from checkpoint, the shape in current model is ...").
    #[error("load_state_dict: size mismatch for {key}: copying a param with shape {got:?} from checkpoint, the shape in current model is {expected:?}")]
    StateDictShape {
        /// The parameter name.
        key: String,
        /// The module's shape.
        expected: Vec<usize>,
        /// The state dict's shape.
        got: Vec<usize>,
    },

    /// `load_state_dict` (without `assign`) into a parameter or persistent buffer on the meta
    /// device: the copy would load nothing (PyTorch warns "copying from a non-meta parameter
    /// ... to a meta parameter ... is a no-op" and reports success:
    /// <https://github.com/pytorch/pytorch/issues/102212>).
    #[error("load_state_dict: {key} (a parameter or persistent buffer) is on the meta device, so copying into it would load nothing; load with LoadOptions {{ assign: true, .. }} (PyTorch's assign=True) to take the checkpoint's tensors, or call to_empty(device) first")]
    LoadIntoMeta {
        /// The parameter's or buffer's dotted name.
        key: String,
    },

    /// Reading or writing a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation (`save`, `load`).
        op: &'static str,
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// An input file read whole that could not be read or is over the size cap (Note
    /// [Bounded reads] in `berth_alloc::input`).
    #[error(transparent)]
    Input(#[from] berth_alloc::input::InputError),

    /// A safetensors file that could not be encoded or decoded.
    #[error("safetensors: {0}")]
    SafeTensors(#[from] safetensors::SafeTensorError),
}

impl Error {
    /// Whether this is an out-of-memory condition on any device: [`Error::HostOutOfMemory`], an
    /// allocator error for which [`berth_alloc::AllocError::is_out_of_memory`] holds, or a CUDA
    /// error for which [`crate::cuda::CudaError::is_out_of_memory`] holds (the device
    /// allocator's out-of-memory reaches tensors wrapped as `Error::Cuda(CudaError::Alloc)`, a
    /// pinned one as `CudaError::PinnedAlloc`). The one question to ask of any berth error,
    /// whichever layer it came through.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::HostOutOfMemory { .. } => true,
            Error::Alloc(e) => e.is_out_of_memory(),
            Error::Cuda(e) => e.is_out_of_memory(),
            _ => false,
        }
    }
}

/// PyTorch's message for `a - b` with two bool tensors (`sub_check`).
pub(crate) const BOOL_SUB: &str = "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.";

/// PyTorch's message for `a - s` with a bool tensor and a non-bool operand (`sub_check`).
pub(crate) const BOOL_SUB_SCALAR: &str = "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.";

/// berth's logical xor of two bool tensors.
pub(crate) const BOOL_XOR_INSTEAD: &str = "a.ne(&b) is the logical xor of two bool tensors";

/// berth's logical not of a bool tensor.
pub(crate) const BOOL_NOT_INSTEAD: &str = "a.eq_scalar(0.0) is the logical not of a bool tensor";

/// PyTorch's message for `-a` with a bool tensor (`neg`).
pub(crate) const BOOL_NEG: &str = "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.";

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
