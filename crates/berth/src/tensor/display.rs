//! `Display` for [`Tensor`]: PyTorch's `repr`, e.g. `tensor([[0.1000, 2.0000]], device='cuda:0',
//! dtype=f16)`.
//!
//! The rules are PyTorch's `torch/_tensor_str.py`
//! (<https://github.com/pytorch/pytorch/blob/main/torch/_tensor_str.py>) with its default print
//! options (`precision=4`, `threshold=1000`, `edgeitems=3`, `linewidth=80`):
//! - more than 1000 elements are summarised: the first and last 3 entries of every dimension
//!   longer than 6, with `...` between (only those entries are read from the device);
//! - floats share one format: integral values as `1.`, otherwise 4 decimals (`0.1000`), or
//!   scientific notation (`1.0000e+05`) when the largest magnitude is at least 1e8, or more than
//!   1000 times the smallest non-zero one, or (for non-integral values) the smallest is under
//!   1e-4; `nan`, `inf`, `-inf`;
//! - every entry is right-aligned to the widest; rows wrap at 80 columns;
//! - `device='…'` unless on the CPU, `dtype=…` unless `f32`, `i64` or `bool` (the dtypes PyTorch
//!   infers from Python values), `requires_grad=True` when set; meta tensors show `...` and
//!   their `size=(…)`, as PyTorch's do; empty tensors of rank other than 1 show their size.
//!
//! Reading the values synchronises with pending device work (as printing does in PyTorch). When
//! they cannot be read (the device failed), the text says so instead of failing the formatter.

use std::fmt;

use crate::{DType, Device, Tensor};

/// PyTorch's `threshold`: more elements than this are summarised.
const THRESHOLD: usize = 1000;
/// PyTorch's `edgeitems`: entries kept at each end of a summarised dimension.
const EDGE: usize = 3;
/// PyTorch's `precision`: decimals of floats.
const PRECISION: usize = 4;
/// PyTorch's `linewidth`.
const LINEWIDTH: usize = 80;

/// One value as read for printing: floats as `f64`, integers and bool exactly as `i64`
/// (an `f64` would print `2^53 + 1` as `9007199254740992`).
#[derive(Clone, Copy)]
enum Val {
    F(f64),
    I(i64),
}

impl Val {
    fn as_f64(self) -> f64 {
        match self {
            Val::F(v) => v,
            Val::I(v) => v as f64,
        }
    }
}

/// A tensor's values as read for printing: nested rows, `None` for a summarised gap.
enum Node {
    /// The entries of a last dimension.
    Row(Vec<Option<Val>>),
    /// The sub-tensors of an outer dimension.
    Dims(Vec<Option<Node>>),
}

/// Every element of `t`, in row-major order.
fn vals_of(t: &Tensor) -> crate::Result<Vec<Val>> {
    if t.dtype().is_float() {
        return Ok(t.to_vec_f64()?.into_iter().map(Val::F).collect());
    }
    // Converted on the host, as the values are read there anyway.
    let v = t.cpu()?.to_dtype(DType::I64)?.to_vec::<i64>()?;
    Ok(v.into_iter().map(Val::I).collect())
}

/// The indices of a dimension of size `n` that are printed: all of them, or only the
/// first and last [`EDGE`] when `summarise` (with `None` for the gap). Only these are
/// visited, so a dimension of 2^40 (an `expand`ed view) prints at once.
fn kept(n: usize, summarise: bool) -> Vec<Option<usize>> {
    if !summarise || n <= 2 * EDGE {
        return (0..n).map(Some).collect();
    }
    (0..EDGE)
        .map(Some)
        .chain(std::iter::once(None))
        .chain((n - EDGE..n).map(Some))
        .collect()
}

/// Reads `t` (rank ≥ 1) for printing, keeping only the edges of long dimensions when
/// `summarise`.
fn read(t: &Tensor, summarise: bool) -> crate::Result<Node> {
    let n = t.shape()[0];
    if t.rank() == 1 {
        if summarise && n > 2 * EDGE {
            let head = vals_of(&t.narrow(0, 0, EDGE)?)?;
            let tail = vals_of(&t.narrow(0, n - EDGE, EDGE)?)?;
            let mut row: Vec<Option<Val>> = head.into_iter().map(Some).collect();
            row.push(None);
            row.extend(tail.into_iter().map(Some));
            return Ok(Node::Row(row));
        }
        return Ok(Node::Row(vals_of(t)?.into_iter().map(Some).collect()));
    }
    let mut dims = Vec::new();
    for i in kept(n, summarise) {
        dims.push(match i {
            Some(i) => Some(read(&t.select(0, i)?, summarise)?),
            None => None,
        });
    }
    Ok(Node::Dims(dims))
}

/// Every value of `node`, for choosing the common format.
fn values(node: &Node, out: &mut Vec<Val>) {
    match node {
        Node::Row(r) => out.extend(r.iter().flatten()),
        Node::Dims(d) => d.iter().flatten().for_each(|n| values(n, out)),
    }
}

/// How every entry of one tensor is written (PyTorch's `_Formatter`).
#[derive(Clone, Copy)]
enum Style {
    Int,
    Bool,
    /// Floats whose finite values are all integral: `1.`.
    IntegralFloat,
    Fixed,
    Scientific,
}

impl Style {
    fn choose(dtype: DType, vals: &[Val]) -> Style {
        if dtype == DType::Bool {
            return Style::Bool;
        }
        if !dtype.is_float() {
            return Style::Int;
        }
        let finite: Vec<f64> = vals
            .iter()
            .map(|v| v.as_f64())
            .filter(|v| v.is_finite())
            .collect();
        let nonzero: Vec<f64> = finite
            .iter()
            .map(|v| v.abs())
            .filter(|&v| v > 0.0)
            .collect();
        let max = nonzero.iter().copied().fold(0.0, f64::max);
        let min = nonzero.iter().copied().fold(f64::INFINITY, f64::min);
        if finite.iter().all(|v| v.fract() == 0.0) {
            if !nonzero.is_empty() && (max / min > 1000.0 || max > 1e8) {
                Style::Scientific
            } else {
                Style::IntegralFloat
            }
        } else if !nonzero.is_empty() && (max / min > 1000.0 || max > 1e8 || min < 1e-4) {
            Style::Scientific
        } else {
            Style::Fixed
        }
    }

    fn write(self, v: Val) -> String {
        let v = match v {
            Val::I(i) if matches!(self, Style::Int) => return i.to_string(),
            Val::I(i) if matches!(self, Style::Bool) => {
                return if i != 0 { "True" } else { "False" }.into()
            }
            v => v.as_f64(),
        };
        if v.is_nan() {
            return "nan".into();
        }
        if v.is_infinite() {
            return if v > 0.0 { "inf" } else { "-inf" }.into();
        }
        match self {
            Style::Int => format!("{v}"),
            Style::Bool => if v != 0.0 { "True" } else { "False" }.into(),
            Style::IntegralFloat => format!("{v:.0}."),
            Style::Fixed => format!("{v:.PRECISION$}"),
            Style::Scientific => {
                // Rust writes `1.0000e5`; PyTorch (Python's `%e`) writes `1.0000e+05`.
                let s = format!("{v:.PRECISION$e}");
                match s.split_once('e') {
                    Some((m, e)) => {
                        let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                        format!("{m}e{sign}{digits:0>2}")
                    }
                    None => s,
                }
            }
        }
    }
}

/// Writes `node` at nesting `indent` (the column after `tensor(` plus the brackets opened).
fn render(node: &Node, style: Style, width: usize, indent: usize, out: &mut String) {
    match node {
        Node::Row(r) => {
            out.push('[');
            let per_line = ((LINEWIDTH.saturating_sub(indent + 1)) / (width + 2)).max(1);
            for (i, v) in r.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    if i % per_line == 0 {
                        out.push('\n');
                        out.push_str(&" ".repeat(indent + 1));
                    } else {
                        out.push(' ');
                    }
                }
                match v {
                    Some(v) => out.push_str(&format!("{:>width$}", style.write(*v))),
                    // PyTorch joins `' ...'` with `', '`: two spaces before it in a row.
                    None => out.push_str(" ..."),
                }
            }
            out.push(']');
        }
        Node::Dims(d) => {
            out.push('[');
            let depth = depth(node);
            for (i, sub) in d.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    // One blank line per nesting level below the rows, as PyTorch.
                    out.push_str(&"\n".repeat(depth - 1));
                    out.push_str(&" ".repeat(indent + 1));
                }
                match sub {
                    Some(n) => render(n, style, width, indent + 1, out),
                    None => out.push_str("..."),
                }
            }
            out.push(']');
        }
    }
}

/// Dimensions below and including `node`.
fn depth(node: &Node) -> usize {
    match node {
        Node::Row(_) => 1,
        Node::Dims(d) => 1 + d.iter().flatten().next().map_or(1, depth),
    }
}

/// The `, device=…, dtype=…` suffixes.
fn suffixes(t: &Tensor, extra: &[String]) -> String {
    let mut s = String::new();
    if t.device() != Device::Cpu {
        s.push_str(&format!(", device='{}'", t.device()));
    }
    for e in extra {
        s.push_str(", ");
        s.push_str(e);
    }
    if !matches!(t.dtype(), DType::F32 | DType::I64 | DType::Bool) {
        s.push_str(&format!(", dtype={}", t.dtype()));
    }
    if t.requires_grad() {
        s.push_str(", requires_grad=True");
    }
    s
}

/// PyTorch's `size=(2, 3)` (and `(4,)` for one dimension).
fn size_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    if dims.len() == 1 {
        format!("size=({},)", dims[0])
    } else {
        format!("size=({})", dims.join(", "))
    }
}

impl fmt::Display for Tensor {
    /// PyTorch's `repr` of the tensor (see the module docs for the rules).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const OPEN: &str = "tensor(";
        if self.device().is_meta() {
            return write!(
                f,
                "{OPEN}...{})",
                suffixes(self, &[size_text(self.shape())])
            );
        }
        if self.numel() == 0 {
            let extra = if self.rank() == 1 {
                vec![]
            } else {
                vec![size_text(self.shape())]
            };
            return write!(f, "{OPEN}[]{})", suffixes(self, &extra));
        }
        let body = if self.rank() == 0 {
            vals_of(self).map(|v| {
                let style = Style::choose(self.dtype(), &v);
                style.write(v[0])
            })
        } else {
            read(self, self.numel() > THRESHOLD).map(|node| {
                let mut vals = Vec::new();
                values(&node, &mut vals);
                let style = Style::choose(self.dtype(), &vals);
                // PyTorch's `_Formatter` measures floats over their non-zero finite values
                // only (so `nan` and `0.` never widen a column), other dtypes over all.
                let float = self.dtype().is_float();
                let width = vals
                    .iter()
                    .filter(|v| !float || (v.as_f64().is_finite() && v.as_f64() != 0.0))
                    .map(|&v| style.write(v).len())
                    .max()
                    .unwrap_or(1);
                let mut out = String::new();
                render(&node, style, width, OPEN.len(), &mut out);
                out
            })
        };
        match body {
            Ok(body) => write!(f, "{OPEN}{body}{})", suffixes(self, &[])),
            Err(e) => write!(
                f,
                "{OPEN}<values unreadable: {e}>{})",
                suffixes(self, &[size_text(self.shape())])
            ),
        }
    }
}
