//! `pin_memory`: page-locked host batches, collated straight into pinned buffers.
//!
//! Note [Collate into pinned memory]: PyTorch collates a batch into ordinary (shared) memory and a
//! pin thread then copies it into page-locked memory: one full extra copy per batch. berth-data
//! hands the collate a [`PinTarget`] in its [`CollateContext`](crate::CollateContext); tensor
//! collates allocate their output there, so the gather of rows *is* the pinning. After the
//! collate, the batch's [`PinMemory::pin_memory`] runs in the worker: it is a no-op for tensors
//! already pinned, copies the ones a custom collate left in pageable memory, keeps container types
//! (<https://github.com/pytorch/pytorch/issues/70158>), and is the hook a custom batch type
//! overrides (PyTorch's `pin_memory()` method, <https://github.com/pytorch/pytorch/pull/16743>).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use crate::error::Result;

/// A source of page-locked host buffers: berth's pinned host caching allocator on a CUDA machine,
/// or a simulated pinned backend in tests.
pub trait PinnedHost: Send + Sync + std::fmt::Debug {
    /// A short name for messages, e.g. `"cuda-host"` or `"sim-pinned"`.
    fn name(&self) -> &str;

    /// A contiguous CPU tensor of `shape` and `dtype` whose storage is page-locked; its contents
    /// are unspecified (every collate overwrites them).
    ///
    /// # Errors
    /// The allocator's out-of-memory or backend error.
    fn empty_pinned(&self, shape: &[usize], dtype: berth::DType) -> Result<berth::Tensor>;

    /// Whether `tensor`'s storage is page-locked memory this source knows (the default asks
    /// the storage: [`berth::Tensor::is_pinned`]).
    fn is_pinned(&self, tensor: &berth::Tensor) -> bool {
        tensor.is_pinned()
    }
}

/// Where `pin_memory` puts batches: a shared handle to a [`PinnedHost`].
#[derive(Debug, Clone)]
pub struct PinTarget {
    host: Arc<dyn PinnedHost>,
}

impl PinTarget {
    /// A target over `host`.
    pub fn new(host: Arc<dyn PinnedHost>) -> Self {
        PinTarget { host }
    }

    /// The pinned memory source.
    pub fn host(&self) -> &Arc<dyn PinnedHost> {
        &self.host
    }

    /// The default target: berth's pinned host allocator when CUDA is available, else `None`.
    pub(crate) fn default_for_host() -> Option<PinTarget> {
        crate::pinned_default::default_pinned_host().map(PinTarget::new)
    }
}

/// The worker-side pin step of a loader, type-erased over the batch type.
pub(crate) type PinFn<B> = Arc<dyn Fn(B, &PinTarget) -> Result<B> + Send + Sync>;

/// A batch type that can be put in page-locked memory (PyTorch's `pin_memory` recursion, and the
/// custom `pin_memory()` method hook of pytorch#16743).
///
/// Containers pin their elements and keep their own type. A type that holds no tensor implements
/// it with an empty body: the default returns the value unchanged and warns once that it was not
/// pinned (PyTorch's "plain object" rule; silently unpinned batches:
/// <https://github.com/ultralytics/yolov3/issues/1713>).
pub trait PinMemory: Sized + Send {
    /// Returns `self` with its tensors in `target`'s page-locked memory.
    ///
    /// # Errors
    /// The pinned allocator's error.
    fn pin_memory(self, _target: &PinTarget) -> Result<Self> {
        crate::loader::warn_once(
            "pin-unsupported-type",
            &format!(
                "pin_memory: batch type {} has no pin_memory of its own; returned unchanged (not pinned)",
                std::any::type_name::<Self>()
            ),
        );
        Ok(self)
    }
}

macro_rules! pin_identity {
    ($($t:ty),+) => { $(impl PinMemory for $t { fn pin_memory(self, _: &PinTarget) -> Result<Self> { Ok(self) } })+ };
}
pin_identity!(String, bool, u8, i32, i64, u32, u64, usize, f32, f64, ());

impl<T: PinMemory> PinMemory for Vec<T> {
    fn pin_memory(self, target: &PinTarget) -> Result<Self> {
        self.into_iter().map(|x| x.pin_memory(target)).collect()
    }
}

impl<T: PinMemory> PinMemory for Option<T> {
    fn pin_memory(self, target: &PinTarget) -> Result<Self> {
        self.map(|x| x.pin_memory(target)).transpose()
    }
}

impl<K: Ord + Send, V: PinMemory> PinMemory for BTreeMap<K, V> {
    fn pin_memory(self, target: &PinTarget) -> Result<Self> {
        self.into_iter()
            .map(|(k, v)| Ok((k, v.pin_memory(target)?)))
            .collect()
    }
}

impl<K: Eq + Hash + Send, V: PinMemory> PinMemory for HashMap<K, V> {
    fn pin_memory(self, target: &PinTarget) -> Result<Self> {
        self.into_iter()
            .map(|(k, v)| Ok((k, v.pin_memory(target)?)))
            .collect()
    }
}

macro_rules! pin_tuple {
    ($($t:ident),+) => {
        #[allow(non_snake_case)]
        impl<$($t: PinMemory),+> PinMemory for ($($t,)+) {
            fn pin_memory(self, target: &PinTarget) -> Result<Self> {
                let ($($t,)+) = self;
                Ok(($($t.pin_memory(target)?,)+))
            }
        }
    };
}
pin_tuple!(A);
pin_tuple!(A, B);
pin_tuple!(A, B, C);
pin_tuple!(A, B, C, D);
pin_tuple!(A, B, C, D, E);
pin_tuple!(A, B, C, D, E, F);
