//! [`Collatable`]: `default_collate`'s rule per sample type, and the [`CollateContext`] a collate
//! runs in.
//!
//! [`Collatable`] is the per-type rule of PyTorch's `default_collate` (`_utils/collate.py`):
//! tensors are stacked along a new dimension 0; numbers become a 1-D tensor of the batch (floats
//! as f64, integers as i64, bools as bool, like Python's); strings are kept as a list; tuples,
//! `Vec`s and maps recurse per position or key. Rust keeps types where Python could not: a tuple
//! stays a tuple (PyTorch turns it into a list), and a named struct keeps its type with
//! [`impl_collate!`](crate::impl_collate) (PyTorch's namedtuple rule). The tensor and number
//! rules are in `src/tensor_collate.rs`; the loader-facing `collate_fn` is
//! [`Collate`](crate::Collate), in `src/collate.rs`.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use crate::error::{DataError, Result};
use crate::pin::PinTarget;

/// What a collate knows about where it runs: the worker, and where to put its output.
#[derive(Debug, Clone, Default)]
pub struct CollateContext {
    /// The worker thread running the collate, `None` on the main thread (`num_workers = 0`).
    pub worker_id: Option<usize>,
    /// When set (`pin_memory = true`), collates allocate their output tensors in page-locked host
    /// memory from this target, so the batch needs no second copy to be pinned.
    pub pin: Option<PinTarget>,
}

/// A sample type that knows how to collate a batch of itself (`default_collate`'s rules).
pub trait Collatable: Sized + Send + 'static {
    /// The collated batch.
    type Batch: Send + 'static;

    /// Collates `items` (at least one) into a batch.
    ///
    /// # Errors
    /// [`DataError::Collate`] when the items do not match (shapes, lengths, keys), or a tensor
    /// error.
    fn collate(items: Vec<Self>, ctx: &CollateContext) -> Result<Self::Batch>;
}

impl Collatable for String {
    type Batch = Vec<String>;
    fn collate(items: Vec<Self>, _ctx: &CollateContext) -> Result<Vec<String>> {
        Ok(items)
    }
}

impl<T: Collatable> Collatable for Vec<T> {
    type Batch = Vec<T::Batch>;
    fn collate(items: Vec<Self>, ctx: &CollateContext) -> Result<Self::Batch> {
        let width = items.first().map_or(0, Vec::len);
        if let Some(bad) = items.iter().position(|v| v.len() != width) {
            return Err(DataError::collate(format!(
                "each element in list of batch should be of equal size (element 0 has {width}, element {bad} has {})",
                items[bad].len()
            )));
        }
        let mut columns: Vec<Vec<T>> = (0..width)
            .map(|_| Vec::with_capacity(items.len()))
            .collect();
        for item in items {
            for (col, x) in columns.iter_mut().zip(item) {
                col.push(x);
            }
        }
        columns.into_iter().map(|c| T::collate(c, ctx)).collect()
    }
}

macro_rules! map_collate {
    ($map:ident, $($bound:tt)+) => {
        impl<K: $($bound)+ + Send + std::fmt::Debug + 'static, V: Collatable> Collatable for $map<K, V> {
            type Batch = $map<K, V::Batch>;
            fn collate(items: Vec<Self>, ctx: &CollateContext) -> Result<Self::Batch> {
                let keys: Vec<K> = items.first().map(|m| m.keys().cloned().collect()).unwrap_or_default();
                let mut columns: Vec<Vec<V>> = keys.iter().map(|_| Vec::with_capacity(items.len())).collect();
                for (n, mut item) in items.into_iter().enumerate() {
                    if item.len() != keys.len() {
                        return Err(DataError::collate(format!(
                            "element {n} of the batch has {} keys, element 0 has {}: every map must have the same keys",
                            item.len(), keys.len()
                        )));
                    }
                    for (col, k) in columns.iter_mut().zip(&keys) {
                        let v = item.remove(k).ok_or_else(|| DataError::collate(format!(
                            "element {n} of the batch has no key {k:?}, which element 0 has"
                        )))?;
                        col.push(v);
                    }
                }
                keys.into_iter().zip(columns).map(|(k, c)| Ok((k, V::collate(c, ctx)?))).collect()
            }
        }
    };
}
map_collate!(BTreeMap, Ord + Clone);
map_collate!(HashMap, Eq + Hash + Clone);

macro_rules! tuple_collate {
    ($($t:ident $v:ident),+) => {
        impl<$($t: Collatable),+> Collatable for ($($t,)+) {
            type Batch = ($($t::Batch,)+);
            fn collate(items: Vec<Self>, ctx: &CollateContext) -> Result<Self::Batch> {
                $(let mut $v = Vec::with_capacity(items.len());)+
                for ($($t,)+) in items {
                    $($v.push($t);)+
                }
                Ok(($($t::collate($v, ctx)?,)+))
            }
        }
    };
}
#[allow(non_snake_case)]
mod tuples {
    use super::*;
    tuple_collate!(A a);
    tuple_collate!(A a, B b);
    tuple_collate!(A a, B b, C c);
    tuple_collate!(A a, B b, C c, D d);
    tuple_collate!(A a, B b, C c, D d, E e);
    tuple_collate!(A a, B b, C c, D d, E e, F f);
}

/// Implements [`Collatable`] (and [`MapTensors`](crate::MapTensors), through
/// [`impl_map_tensors!`](crate::impl_map_tensors)) for a struct with named fields, field by field:
/// the batch keeps the struct's type (PyTorch's namedtuple rule,
/// <https://github.com/pytorch/pytorch/issues/14613>), or becomes a given batch struct with the
/// same field names (give that one [`impl_map_tensors!`](crate::impl_map_tensors) to pin it or
/// move it to a device).
///
/// ```
/// # use berth::Tensor;
/// struct Pair { x: Tensor, y: Tensor }
/// berth_data::impl_collate!(Pair { x, y });            // Batch = Pair (x, y stacked)
/// struct Sample { x: Tensor, label: i64 }
/// struct SampleBatch { x: Tensor, label: Tensor }
/// berth_data::impl_collate!(Sample { x, label } => SampleBatch);
/// berth_data::impl_map_tensors!(SampleBatch { x, label });
/// ```
#[macro_export]
macro_rules! impl_collate {
    ($ty:ident { $($field:ident),+ $(,)? }) => {
        $crate::impl_collate!($ty { $($field),+ } => $ty);
        $crate::impl_map_tensors!($ty { $($field),+ });
    };
    ($ty:ident { $($field:ident),+ $(,)? } => $batch:ident) => {
        impl $crate::Collatable for $ty {
            type Batch = $batch;
            fn collate(items: Vec<Self>, ctx: &$crate::CollateContext) -> $crate::Result<$batch> {
                $(let mut $field = Vec::with_capacity(items.len());)+
                for item in items {
                    $($field.push(item.$field);)+
                }
                Ok($batch { $($field: $crate::Collatable::collate($field, ctx)?,)+ })
            }
        }
    };
}
