//! `DType`: the element types a tensor can hold, and [`Element`], the Rust type of each.

use std::fmt;

use half::{bf16, f16};

/// The element type of a tensor (PyTorch's `torch.dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit IEEE float (`torch.float32`, the default).
    F32,
    /// 64-bit IEEE float (`torch.float64`).
    F64,
    /// 16-bit IEEE float (`torch.float16`).
    F16,
    /// bfloat16 (`torch.bfloat16`).
    BF16,
    /// 64-bit signed integer (`torch.int64`, class indices).
    I64,
    /// 32-bit signed integer (`torch.int32`).
    I32,
    /// 8-bit unsigned integer (`torch.uint8`, images).
    U8,
    /// Boolean, one byte per element holding 0 or 1 (`torch.bool`).
    Bool,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];

    /// Size of one element in bytes (`torch.dtype.itemsize`).
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point dtype (`torch.dtype.is_floating_point`).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// The short name (`f32`, `bf16`, `i64`, `bool` ...), as in [`Display`](fmt::Display).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// The C++ element type PyTorch names in its conversion errors (`uint8_t`, `int64_t`,
    /// `float`, `at::Half` ...; the `#type` of `c10::Scalar`'s accessors).
    pub fn c_type_name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "at::Half",
            DType::BF16 => "at::BFloat16",
            DType::I64 => "int64_t",
            DType::I32 => "int",
            DType::U8 => "uint8_t",
            DType::Bool => "bool",
        }
    }

    /// PyTorch's `ScalarType` name (`Float`, `Long`, `Byte` ...), as its type-promotion
    /// errors write it ("result type Float can't be cast to the desired output type Long").
    pub fn scalar_type_name(self) -> &'static str {
        match self {
            DType::F32 => "Float",
            DType::F64 => "Double",
            DType::F16 => "Half",
            DType::BF16 => "BFloat16",
            DType::I64 => "Long",
            DType::I32 => "Int",
            DType::U8 => "Byte",
            DType::Bool => "Bool",
        }
    }

    /// Whether `value` can be written as this dtype without overflow, by PyTorch's rule
    /// (`c10::checked_convert` / `overflows<To, double>`): integer dtypes hold the values in
    /// `[MIN, MAX]` (a fraction is truncated, as PyTorch) and never NaN or ±inf; float dtypes
    /// hold NaN, ±inf and every value up to their largest finite one; `bool` holds every value
    /// ("converting to bool can't overflow": non-zero, NaN included, is `true`).
    pub fn holds(self, value: f64) -> bool {
        let (lowest, max) = match self {
            DType::Bool => return true,
            DType::F64 => return true,
            DType::F32 | DType::F16 | DType::BF16 if value.is_nan() || value.is_infinite() => {
                return true
            }
            DType::F32 => (f64::from(f32::MIN), f64::from(f32::MAX)),
            DType::F16 => (f16::MIN.to_f64(), f16::MAX.to_f64()),
            DType::BF16 => (bf16::MIN.to_f64(), bf16::MAX.to_f64()),
            // `i64::MAX as f64` rounds up to 2^63, which i64 cannot hold.
            DType::I64 => return (-(2f64.powi(63))..2f64.powi(63)).contains(&value),
            DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
            DType::U8 => (0.0, 255.0),
        };
        // NaN fails both comparisons' negation: it is never in range of an integer dtype.
        value >= lowest && value <= max
    }

    /// PyTorch's legacy tensor-type name for this dtype on a device kind, e.g.
    /// `torch.cuda.FloatTensor` (used in PyTorch-compatible error messages).
    pub fn torch_tensor_type(self, cuda: bool) -> String {
        let n = self.scalar_type_name();
        if cuda {
            format!("torch.cuda.{n}Tensor")
        } else {
            format!("torch.{n}Tensor")
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust type that is the element of one [`DType`]. Sealed: implemented for `f32`, `f64`,
/// `half::f16`, `half::bf16`, `i64`, `i32`, `u8` and `bool`.
pub trait Element:
    Copy + Send + Sync + fmt::Debug + PartialEq + PartialOrd + 'static + private::Sealed
{
    /// The dtype of this type.
    const DTYPE: DType;
    /// How the element is stored in memory (`Self`, except `bool`, stored as a `u8` 0/1).
    type Repr: crate::storage::Pod;
    /// To the stored representation.
    fn to_repr(self) -> Self::Repr;
    /// From the stored representation (for `bool`: non-zero is `true`).
    fn from_repr(r: Self::Repr) -> Self;
    /// The value as `f64` (`true` → 1.0).
    fn to_f64(self) -> f64;
    /// The value from `f64` (rounded to nearest for floats; saturating truncation toward zero
    /// for integers, as Rust's `as`; non-zero → `true`).
    fn from_f64(v: f64) -> Self;
}

mod private {
    pub trait Sealed {}
}

macro_rules! element {
    ($t:ty, $dt:ident, |$v:ident| $to:expr, |$w:ident| $from:expr) => {
        impl private::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            type Repr = $t;
            #[inline]
            fn to_repr(self) -> $t {
                self
            }
            #[inline]
            fn from_repr(r: $t) -> Self {
                r
            }
            #[inline]
            fn to_f64(self) -> f64 {
                let $v = self;
                $to
            }
            #[inline]
            fn from_f64($w: f64) -> Self {
                $from
            }
        }
    };
}

element!(f32, F32, |v| v as f64, |w| w as f32);
element!(f64, F64, |v| v, |w| w);
element!(f16, F16, |v| v.to_f64(), |w| f16::from_f64(w));
element!(bf16, BF16, |v| v.to_f64(), |w| bf16::from_f64(w));
element!(i64, I64, |v| v as f64, |w| w as i64);
element!(i32, I32, |v| v as f64, |w| w as i32);
element!(u8, U8, |v| v as f64, |w| w as u8);

impl private::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    type Repr = u8;
    #[inline]
    fn to_repr(self) -> u8 {
        u8::from(self)
    }
    #[inline]
    fn from_repr(r: u8) -> Self {
        r != 0
    }
    #[inline]
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    #[inline]
    fn from_f64(w: f64) -> Self {
        w != 0.0
    }
}
