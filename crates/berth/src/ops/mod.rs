//! The operations of the tensor layer, as plain enums shared by every device, and their shape
//! and dtype inference ([`infer`]), which runs before any kernel — the same checks for meta,
//! CPU and CUDA, so a mismatched matmul fails identically everywhere.

pub mod infer;

/// Elementwise functions of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `max(x, 0)`.
    Relu,
    /// `e^x` (floats only).
    Exp,
    /// Natural logarithm (floats only).
    Log,
    /// Square root (floats only).
    Sqrt,
    /// `|x|`.
    Abs,
}

impl UnaryOp {
    /// The PyTorch name of the op.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Relu => "relu",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Abs => "abs",
        }
    }

    /// Whether the op is defined only for floating dtypes.
    pub fn float_only(self) -> bool {
        matches!(self, UnaryOp::Exp | UnaryOp::Log | UnaryOp::Sqrt)
    }
}

/// Elementwise functions of two operands (tensor–tensor with broadcasting, or tensor–scalar).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (true division; integer inputs must be converted to a float dtype first).
    Div,
    /// `a ^ b` (floats only).
    Pow,
    /// `max(a, b)`.
    Maximum,
    /// `min(a, b)`.
    Minimum,
}

impl BinaryOp {
    /// The PyTorch name of the op.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }

    /// Whether the op is defined only for floating dtypes.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Pow)
    }
}

/// Elementwise comparisons; the result has dtype `bool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmpOp {
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
}

impl CmpOp {
    /// The PyTorch name of the op.
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
        }
    }
}

/// Reductions over some dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum (integers and bool sum to `i64`, as PyTorch).
    Sum,
    /// Mean (floats only).
    Mean,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Index of the maximum (`i64`; the first one on ties, as PyTorch on CPU).
    ArgMax,
}

impl ReduceOp {
    /// The PyTorch name of the op.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
        }
    }
}
