//! Shape and dtype inference: the checks every op makes before any kernel runs, shared by the
//! meta device and real devices (PyTorch's meta functions). A mismatched matmul therefore
//! fails with the same error on meta, CPU and CUDA.

use super::{BinaryOp, ReduceOp, UnaryOp};
use crate::layout::{broadcast_shapes, wrap_dim};
use crate::{DType, Device, Error, Result, Tensor};

/// The common device of two operands.
///
/// # Errors
/// [`Error::DeviceMismatch`].
pub fn same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<Device> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: a.device(),
            rhs: b.device(),
        });
    }
    Ok(a.device())
}

/// The common dtype of two operands (no implicit promotion).
///
/// # Errors
/// [`Error::DTypeMismatch`].
pub fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<DType> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(a.dtype())
}

/// Require a floating dtype.
///
/// # Errors
/// [`Error::UnsupportedDType`].
pub fn require_float(op: &'static str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            expected: "a floating dtype (f32, f64, f16, bf16)",
        });
    }
    Ok(())
}

/// Output dtype of a unary op.
///
/// # Errors
/// Float-only ops on integer dtypes; [`Error::BoolArithmetic`] for `neg` of a bool tensor
/// (PyTorch: "Negation, the `-` operator, on a bool tensor is not supported ...").
pub fn unary(op: UnaryOp, a: &Tensor) -> Result<DType> {
    if op.float_only() {
        require_float(op.name(), a.dtype())?;
    }
    if op == UnaryOp::Neg && a.dtype() == DType::Bool {
        return Err(Error::BoolArithmetic {
            op: "neg",
            message: crate::error::BOOL_NEG,
            instead: crate::error::BOOL_NOT_INSTEAD,
        });
    }
    Ok(a.dtype())
}

/// The op a kernel runs to compute `op` on operands of `dtype` (`with_scalar`: the other
/// operand is a scalar). A bool tensor holds bytes 0 and 1 only, so for bool the result
/// must stay 0 or 1, with PyTorch's meaning: `add` is logical or (`True + True` is `True`,
/// run as `maximum`), `mul`, `maximum` and `minimum` are logical and / or / and as they
/// stand. Every device gets the same rule: it is decided here, before any kernel.
///
/// # Errors
/// [`Error::BoolArithmetic`] for `sub` on bool, with PyTorch's message (`sub_check`): "with
/// two bool tensors ... Use the `^` or `logical_xor()` operator instead" for two tensors,
/// "with a bool tensor ... use the `~` or `logical_not()` operator instead" with a scalar.
pub fn kernel_op(op: BinaryOp, dtype: DType, with_scalar: bool) -> Result<BinaryOp> {
    if dtype != DType::Bool {
        return Ok(op);
    }
    match op {
        BinaryOp::Add => Ok(BinaryOp::Maximum),
        BinaryOp::Sub if with_scalar => Err(Error::BoolArithmetic {
            op: "sub",
            message: crate::error::BOOL_SUB_SCALAR,
            instead: crate::error::BOOL_NOT_INSTEAD,
        }),
        BinaryOp::Sub => Err(Error::BoolArithmetic {
            op: "sub",
            message: crate::error::BOOL_SUB,
            instead: crate::error::BOOL_XOR_INSTEAD,
        }),
        _ => Ok(op),
    }
}

/// The scalar a kernel gets for an operand of `dtype`: for bool 0 or 1 (a scalar is
/// converted to the tensor's dtype, and non-zero converts to `true`, as PyTorch's
/// `Scalar::to<bool>`), so `bool_tensor.add_scalar(5.0)` is logical or with `true`.
pub fn kernel_scalar(s: f64, dtype: DType) -> f64 {
    if dtype == DType::Bool {
        f64::from(u8::from(s != 0.0))
    } else {
        s
    }
}

/// Check that `value` can be written as `dtype` (`full`, `fill_`), by PyTorch's rule
/// ([`DType::holds`]).
///
/// # Errors
/// [`Error::ValueOverflow`]: "value cannot be converted to type `uint8_t` without overflow".
pub fn fill_value(op: &'static str, value: f64, dtype: DType) -> Result<()> {
    if !dtype.holds(value) {
        return Err(Error::ValueOverflow { op, value, dtype });
    }
    Ok(())
}

/// Check that a tensor about to be written in place has no two elements at one memory
/// location (PyTorch's `assert_no_internal_overlap`; [`crate::Layout::has_internal_overlap`]).
/// Without it, `x.expand([4, 3]).add_scalar_(1.0)` would add 1 four times to each element.
///
/// # Errors
/// [`Error::InternalOverlap`] naming `op`, the shape and the strides.
pub fn no_internal_overlap(op: &'static str, t: &Tensor) -> Result<()> {
    if t.layout().has_internal_overlap() {
        return Err(Error::InternalOverlap {
            op,
            shape: t.shape().to_vec(),
            strides: t.strides().to_vec(),
        });
    }
    Ok(())
}

/// Output shape and dtype of a broadcasting binary op.
///
/// # Errors
/// Device, dtype or broadcast mismatch; float-only ops on integers.
pub fn binary(
    op: &'static str,
    float_only: bool,
    a: &Tensor,
    b: &Tensor,
) -> Result<(Vec<usize>, DType)> {
    same_device(op, a, b)?;
    let dtype = same_dtype(op, a, b)?;
    if float_only {
        require_float(op, dtype)?;
    }
    Ok((broadcast_shapes(a.shape(), b.shape(), op)?, dtype))
}

/// The dtype checks of a tensor–scalar op on the tensor's own dtype (float-only ops, bool
/// `sub`); the dtype it computes in is [`scalar_result`]'s.
///
/// # Errors
/// Float-only ops on integers ([`Error::UnsupportedDType`]); [`Error::BoolArithmetic`] as
/// [`kernel_op`].
pub fn scalar(op: BinaryOp, a: &Tensor) -> Result<DType> {
    if op.float_only() {
        require_float(op.name(), a.dtype())?;
    }
    kernel_op(op, a.dtype(), true)?;
    Ok(a.dtype())
}

/// `s` as an `i64` when it is an integer in `i64`'s range (`[-2^63, 2^63)`), the values a
/// Python int scalar of PyTorch's can have; `None` for a fraction, NaN, ±inf or an integral
/// value past that range.
pub fn integral_i64(s: f64) -> Option<i64> {
    (s.fract() == 0.0 && DType::I64.holds(s)).then_some(s as i64)
}

/// The dtype a tensor–scalar op on a tensor of `dtype` computes in and returns, by
/// PyTorch's type promotion with a Python scalar.
///
/// Note [Scalar promotion]: berth's scalars are `f64`, so an integral value in `i64`'s range
/// ([`integral_i64`]) stands for a Python int and any other (a fraction, NaN, ±inf, or
/// beyond `i64`) for a Python float. A float tensor keeps its dtype (the scalar is
/// converted to it). An integer or bool tensor keeps its dtype with an int scalar, which
/// then wraps into it as PyTorch's does (`u8 [1] + 300` is `[45]`); with a float scalar the
/// result is PyTorch's default float dtype, `f32` (`torch.tensor([1]) + 0.5` is
/// `tensor([1.5])`): the tensor is converted to `f32` first, then the op runs there. An
/// in-place op cannot change its tensor's dtype, so there that is
/// [`Error::ResultTypeCast`] ([`scalar_inplace`]). A bool tensor with an int scalar stays
/// bool (`add` is logical or with `s != 0`, see [`kernel_scalar`]), where PyTorch would give
/// int64.
pub fn scalar_result(dtype: DType, s: f64) -> DType {
    if !dtype.is_float() && integral_i64(s).is_none() {
        DType::F32
    } else {
        dtype
    }
}

/// Check that an in-place tensor–scalar op can write its result into the tensor's dtype
/// (Note [Scalar promotion]), after [`scalar`]'s checks.
///
/// # Errors
/// As [`scalar`]; [`Error::ResultTypeCast`] for an integer or bool tensor and a scalar that is
/// not an `i64` integer (PyTorch: "result type Float can't be cast to the desired output type
/// Long").
pub fn scalar_inplace(op: BinaryOp, a: &Tensor, s: f64) -> Result<DType> {
    let dtype = scalar(op, a)?;
    let result = scalar_result(dtype, s);
    if result != dtype {
        return Err(Error::ResultTypeCast {
            op: op.name(),
            result,
            output: dtype,
        });
    }
    Ok(dtype)
}

/// A reduction plan: the wrapped, sorted dims, the output shape without and with keepdim, and
/// the output dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducePlan {
    /// Reduced dimensions, sorted and distinct.
    pub dims: Vec<usize>,
    /// Output shape with reduced dims removed.
    pub shape: Vec<usize>,
    /// Output shape with reduced dims kept as size 1.
    pub keepdim_shape: Vec<usize>,
    /// Output dtype.
    pub dtype: DType,
}

/// Plan a reduction over `dims` (`None`, or an empty list: all dimensions, as PyTorch's
/// `x.sum(dim=[])`, `x.mean(dim=[])` and `x.amax(dim=[])`, which reduce everything).
///
/// # Errors
/// Dims out of range or repeated; mean of an integer tensor; max/argmax over an empty region.
pub fn reduce(op: ReduceOp, a: &Tensor, dims: Option<&[isize]>) -> Result<ReducePlan> {
    let rank = a.rank();
    let mut ds: Vec<usize> = match dims {
        None | Some([]) => (0..rank).collect(),
        Some(d) => d
            .iter()
            .map(|&d| wrap_dim(d, rank, op.name()))
            .collect::<Result<_>>()?,
    };
    if rank == 0 {
        ds.clear();
    }
    ds.sort_unstable();
    let before = ds.len();
    ds.dedup();
    if ds.len() != before {
        return Err(Error::InvalidArgument {
            op: op.name(),
            what: "a dimension appears more than once in dims".into(),
        });
    }
    let dtype = match op {
        ReduceOp::Sum if !a.dtype().is_float() => DType::I64,
        ReduceOp::Mean => {
            if !a.dtype().is_float() {
                return Err(Error::UnsupportedDType {
                    op: "mean",
                    dtype: a.dtype(),
                    expected: "a floating dtype (mean(): could not infer output dtype; convert with to_dtype(F32))",
                });
            }
            a.dtype()
        }
        ReduceOp::ArgMax => DType::I64,
        _ => a.dtype(),
    };
    let count: usize = ds.iter().map(|&d| a.shape()[d]).product();
    if matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax) && count == 0 {
        return Err(Error::InvalidArgument {
            op: op.name(),
            what: format!("cannot reduce an empty region of shape {:?}; the reduced dimensions must be non-empty", a.shape()),
        });
    }
    let shape = (0..rank)
        .filter(|d| !ds.contains(d))
        .map(|d| a.shape()[d])
        .collect();
    let keepdim_shape = (0..rank)
        .map(|d| if ds.contains(&d) { 1 } else { a.shape()[d] })
        .collect();
    Ok(ReducePlan {
        dims: ds,
        shape,
        keepdim_shape,
        dtype,
    })
}

/// A matmul plan: both operands promoted to ≥ 2-D and broadcast to a common batch shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulPlan {
    /// Shape the left operand is viewed as: `[B.., m, k]`.
    pub lhs_shape: Vec<usize>,
    /// Shape the right operand is viewed as: `[B.., k, n]`.
    pub rhs_shape: Vec<usize>,
    /// Kernel output shape `[B.., m, n]`.
    pub kernel_shape: Vec<usize>,
    /// Final output shape (1-D operands' added dims removed, as `torch.matmul`).
    pub out_shape: Vec<usize>,
    /// Output dtype.
    pub dtype: DType,
}

/// Plan `a @ b` with `torch.matmul`'s rules (1-D, 2-D and batched with broadcast batch dims).
///
/// # Errors
/// [`Error::MatmulShape`] when the inner sizes differ; 0-dim operands; device/dtype mismatch;
/// [`Error::NumelOverflow`] when a broadcast operand's element count overflows.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<MatmulPlan> {
    same_device("matmul", a, b)?;
    let dtype = same_dtype("matmul", a, b)?;
    if a.rank() == 0 || b.rank() == 0 {
        return Err(Error::Shape {
            op: "matmul",
            what: format!(
                "both arguments need at least 1 dimension, got shapes {:?} and {:?}",
                a.shape(),
                b.shape()
            ),
        });
    }
    let mut ls = a.shape().to_vec();
    let mut rs = b.shape().to_vec();
    let (a1, b1) = (ls.len() == 1, rs.len() == 1);
    if a1 {
        ls.insert(0, 1);
    }
    if b1 {
        rs.push(1);
    }
    let (k1, k2) = (ls[ls.len() - 1], rs[rs.len() - 2]);
    if k1 != k2 {
        return Err(Error::MatmulShape {
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
            k1,
            k2,
        });
    }
    let batch = broadcast_shapes(&ls[..ls.len() - 2], &rs[..rs.len() - 2], "matmul")?;
    let (m, n) = (ls[ls.len() - 2], rs[rs.len() - 1]);
    let with = |x: &[usize]| batch.iter().chain(x).copied().collect::<Vec<_>>();
    let kernel_shape = with(&[m, n]);
    // The operands are viewed broadcast to these shapes: they must be describable too.
    crate::layout::checked_numel(&with(&[m, k1]), "matmul")?;
    crate::layout::checked_numel(&with(&[k1, n]), "matmul")?;
    let mut out_shape = batch.clone();
    if !a1 {
        out_shape.push(m);
    }
    if !b1 {
        out_shape.push(n);
    }
    Ok(MatmulPlan {
        lhs_shape: with(&[m, k1]),
        rhs_shape: with(&[k1, n]),
        kernel_shape,
        out_shape,
        dtype,
    })
}

/// Check `logits [N, C]` (float) and `targets [N]` (i64) for cross-entropy.
///
/// # Errors
/// Wrong ranks, batch sizes, dtypes or devices.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<()> {
    same_device("cross_entropy", logits, targets)?;
    require_float("cross_entropy", logits.dtype())?;
    if targets.dtype() != DType::I64 {
        return Err(Error::UnsupportedDType {
            op: "cross_entropy",
            dtype: targets.dtype(),
            expected: "i64 class indices for the targets",
        });
    }
    if logits.rank() != 2 || targets.rank() != 1 || logits.shape()[0] != targets.shape()[0] {
        return Err(Error::Shape {
            op: "cross_entropy",
            what: format!(
                "expected logits [N, C] and targets [N], got {:?} and {:?}",
                logits.shape(),
                targets.shape()
            ),
        });
    }
    Ok(())
}
