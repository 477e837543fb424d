//! [`MapTensors`]: the one traversal of a batch's nested containers of tensors.
//!
//! Note [One batch traversal]: every step that touches each tensor of a loaded batch — pinning
//! ([`pin_memory`](crate::pin_memory), in the worker), the copy to a device and
//! `record_stream` ([`DevicePrefetcher`](crate::prefetch::DevicePrefetcher)) — is a function
//! from one tensor to one tensor, mapped over the batch by [`MapTensors::map_tensors`]. The
//! containers are walked here and nowhere else (PyTorch walks them three times:
//! `pin_memory`'s recursion in `_utils/pin_memory.py`, `default_convert`'s and the
//! `tree_map` of `torch.utils._pytree`). Containers keep their own type: a tuple stays a tuple,
//! a map keeps its keys and its type (<https://github.com/pytorch/pytorch/issues/70158>).
//!
//! Collation is not such a map: it turns many samples into one batch (a transposition), so its
//! per-type rules live in [`Collatable`](crate::Collatable).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use berth::Tensor;

use crate::error::Result;
use berth::alloc::warnings::warn_once;

/// A batch whose tensors can be mapped one by one, keeping the batch's structure (PyTorch's
/// `pin_memory` recursion and the custom `pin_memory()` method hook of pytorch#16743, as one
/// trait for every per-tensor step).
///
/// Containers (`Vec`, `Option`, `BTreeMap`, `HashMap`, tuples of up to six) map their elements;
/// [`Tensor`] applies the function; strings, numbers, `bool` and `()` hold no tensor and are
/// returned unchanged. A struct gets a field-by-field implementation from
/// [`impl_map_tensors!`](crate::impl_map_tensors) (or [`impl_collate!`](crate::impl_collate)).
/// A type that holds no tensor may implement it with an empty body: the default returns the
/// value unchanged and warns once that its tensors, if any, were left as they are (PyTorch's
/// "plain object" rule; silently unpinned batches:
/// <https://github.com/ultralytics/yolov3/issues/1713>). A type may also write its own body,
/// which is then the hook every per-tensor step goes through (PyTorch calls a batch's own
/// `pin_memory()`).
pub trait MapTensors: Sized {
    /// `self` with every tensor `t` replaced by `f(t)`, in a fixed order (a container's
    /// iteration order; a `HashMap`'s is unspecified). The first error stops the walk.
    ///
    /// # Errors
    /// The first error `f` returns.
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        let _ = f;
        warn_once("map-tensors-unsupported-type", || {
            format!(
                "batch type {} has no map_tensors of its own; returned unchanged (not pinned, not moved to a device)",
                std::any::type_name::<Self>()
            )
        });
        Ok(self)
    }
}

impl MapTensors for Tensor {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        f(self)
    }
}

macro_rules! no_tensors {
    ($($t:ty),+) => {$(
        impl MapTensors for $t {
            fn map_tensors(self, _: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
                Ok(self)
            }
        }
    )+};
}
no_tensors!(String, bool, u8, i32, i64, u32, u64, usize, f32, f64, ());

impl<T: MapTensors> MapTensors for Vec<T> {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        self.into_iter().map(|x| x.map_tensors(f)).collect()
    }
}

impl<T: MapTensors> MapTensors for Option<T> {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        self.map(|x| x.map_tensors(f)).transpose()
    }
}

impl<K: Ord, V: MapTensors> MapTensors for BTreeMap<K, V> {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        self.into_iter()
            .map(|(k, v)| Ok((k, v.map_tensors(f)?)))
            .collect()
    }
}

impl<K: Eq + Hash, V: MapTensors> MapTensors for HashMap<K, V> {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        self.into_iter()
            .map(|(k, v)| Ok((k, v.map_tensors(f)?)))
            .collect()
    }
}

macro_rules! tuple_map {
    ($($t:ident),+) => {
        #[allow(non_snake_case)]
        impl<$($t: MapTensors),+> MapTensors for ($($t,)+) {
            fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
                let ($($t,)+) = self;
                Ok(($($t.map_tensors(f)?,)+))
            }
        }
    };
}
tuple_map!(A);
tuple_map!(A, B);
tuple_map!(A, B, C);
tuple_map!(A, B, C, D);
tuple_map!(A, B, C, D, E);
tuple_map!(A, B, C, D, E, F);

/// Implements [`MapTensors`] for a struct with named fields, field by field (each field's type
/// implements [`MapTensors`]); the struct keeps its type.
///
/// ```
/// # use berth::Tensor;
/// struct SampleBatch { x: Tensor, label: Tensor, name: Vec<String> }
/// berth_data::impl_map_tensors!(SampleBatch { x, label, name });
/// ```
#[macro_export]
macro_rules! impl_map_tensors {
    ($ty:ident { $($field:ident),+ $(,)? }) => {
        impl $crate::MapTensors for $ty {
            fn map_tensors(
                self,
                f: &mut dyn FnMut($crate::__berth::Tensor) -> $crate::Result<$crate::__berth::Tensor>,
            ) -> $crate::Result<Self> {
                Ok($ty { $($field: $crate::MapTensors::map_tensors(self.$field, f)?,)+ })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth::{DType, Device};

    #[test]
    fn maps_every_tensor_and_keeps_the_structure() {
        let t = || Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap();
        let batch = (
            vec![t(), t()],
            BTreeMap::from([("a".to_string(), Some(t()))]),
            7_i64,
        );
        let mut seen = 0;
        let out = batch
            .map_tensors(&mut |x| {
                seen += 1;
                Ok(x.add_scalar(1.0)?)
            })
            .unwrap();
        assert_eq!(seen, 3);
        assert_eq!(out.0[1].to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
        assert_eq!(
            out.1["a"].as_ref().unwrap().to_vec::<f32>().unwrap(),
            vec![1.0, 1.0]
        );
        assert_eq!(out.2, 7);
    }
}
