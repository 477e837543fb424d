//! `default_collate` for tensors and numbers.
//!
//! Stacking is a tight copy of each item's bytes into one output buffer, from
//! [`collate_output`]: pinned when the [`CollateContext`] carries a
//! [`PinTarget`](crate::PinTarget) (Note [Collate into pinned memory] in `src/pinning.rs`).

use berth::{Device, Element, Tensor};

use crate::collatable::{Collatable, CollateContext};
use crate::error::{DataError, Result};
use crate::pinning::{collate_output, copy_tensor_bytes, pin_tensor};

impl Collatable for Tensor {
    type Batch = Tensor;

    /// Stacks along a new dimension 0 (`torch.stack(batch, 0)`); all items must have one shape,
    /// dtype and device. Host items are copied straight into one (possibly pinned) buffer;
    /// device items go through [`Tensor::stack`].
    fn collate(items: Vec<Tensor>, ctx: &CollateContext) -> Result<Tensor> {
        let Some(first) = items.first() else {
            return Err(DataError::collate("cannot collate an empty batch"));
        };
        if let Some((i, t)) = items.iter().enumerate().find(|(_, t)| {
            t.shape() != first.shape() || t.dtype() != first.dtype() || t.device() != first.device()
        }) {
            return Err(DataError::collate(format!(
                "stack expects each tensor to be equal size, dtype and device, but element 0 is {:?} {} on {} and element {i} is {:?} {} on {}",
                first.shape(),
                first.dtype().as_str(),
                first.device(),
                t.shape(),
                t.dtype().as_str(),
                t.device()
            )));
        }
        if !first.device().is_cpu() {
            let refs: Vec<&Tensor> = items.iter().collect();
            return Ok(Tensor::stack(&refs, 0)?);
        }
        let mut shape = Vec::with_capacity(first.rank() + 1);
        shape.push(items.len());
        shape.extend_from_slice(first.shape());
        let out = collate_output(&shape, first.dtype(), ctx)?;
        let row = first.nbytes();
        {
            let mut w = out.storage().write_host("collate")?;
            let dst = w.bytes_mut();
            for (i, t) in items.iter().enumerate() {
                copy_tensor_bytes(t, &mut dst[i * row..(i + 1) * row])?;
            }
        }
        Ok(out)
    }
}

/// A 1-D tensor of the batch's numbers, moved into pinned memory when `ctx` asks.
fn numbers<T: Element>(items: Vec<T>, ctx: &CollateContext) -> Result<Tensor> {
    let n = items.len();
    let t = Tensor::from_vec(items, &[n], Device::Cpu)?;
    match &ctx.pin {
        Some(target) => pin_tensor(t, target),
        None => Ok(t),
    }
}

macro_rules! number_collate {
    ($($t:ty => $e:ty),+ $(,)?) => {$(
        impl Collatable for $t {
            type Batch = Tensor;
            /// A 1-D tensor of the batch (`default_collate` on numbers).
            fn collate(items: Vec<$t>, ctx: &CollateContext) -> Result<Tensor> {
                numbers::<$e>(items.into_iter().map(|x| x as $e).collect(), ctx)
            }
        }
    )+};
}
// Floats keep their width (numpy scalar rule); integers become i64 like Python ints, except
// i32 and u8 which keep their dtype (numpy scalar rule).
number_collate!(f32 => f32, f64 => f64, i64 => i64, i32 => i32, u8 => u8, usize => i64, u32 => i64, u64 => i64);

impl Collatable for bool {
    type Batch = Tensor;
    /// A 1-D bool tensor of the batch.
    fn collate(items: Vec<bool>, ctx: &CollateContext) -> Result<Tensor> {
        numbers::<bool>(items, ctx)
    }
}
