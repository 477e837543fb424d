//! Buffers: tensors a module holds that are not parameters (PyTorch's
//! `Module.register_buffer(name, tensor, persistent=True)`,
//! <https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_buffer>).
//!
//! A module reports its buffers through [`super::Module::named_buffers`], each as a
//! [`NamedBuffer`] saying whether it is persistent. Both kinds follow
//! [`super::Module::to_device`] and [`super::Module::to_empty`], and are drawn again by
//! [`super::Module::reset_parameters`]; only persistent ones are in
//! [`super::Module::state_dict`] and loaded by [`super::Module::load_state_dict`]. A checkpoint
//! key naming a non-persistent buffer is an unexpected key, as in PyTorch, whose
//! `_load_from_state_dict` matches keys against the parameters and the buffers not in
//! `_non_persistent_buffers_set` only.
//!
//! This file is the one home of "which tensors are a module's state": [`state_entries`] lists
//! the parameters and persistent buffers, and both saving and loading go through it.

use super::Module;
use crate::Tensor;

/// One buffer of a module: its dotted name, the tensor (`&Tensor` or `&mut Tensor`) and
/// whether it is persistent (part of the state dict).
#[derive(Debug)]
pub struct NamedBuffer<T> {
    /// The dotted name (`"1.pe"` inside a [`super::Sequential`]), as in the state dict.
    pub name: String,
    /// The buffer.
    pub tensor: T,
    /// Whether the buffer is in the state dict (PyTorch's `persistent` argument of
    /// `register_buffer`; the default there is `true`).
    pub persistent: bool,
}

impl<T> NamedBuffer<T> {
    /// A buffer named `name`.
    pub fn new(name: impl Into<String>, tensor: T, persistent: bool) -> NamedBuffer<T> {
        NamedBuffer {
            name: name.into(),
            tensor,
            persistent,
        }
    }

    /// The same buffer named `"{prefix}.{name}"` (a submodule's buffer seen from its parent).
    pub fn prefixed(self, prefix: &str) -> NamedBuffer<T> {
        NamedBuffer {
            name: format!("{prefix}.{}", self.name),
            ..self
        }
    }
}

/// The tensors of `module` that make its state dict: every parameter, then every persistent
/// buffer, by dotted name (PyTorch's `_save_to_state_dict` / `_load_from_state_dict` both walk
/// `_parameters` and the buffers not in `_non_persistent_buffers_set`).
pub(super) fn state_entries<M: Module + ?Sized>(module: &M) -> Vec<(String, &Tensor)> {
    let mut v = module.named_parameters();
    v.extend(
        module
            .named_buffers()
            .into_iter()
            .filter(|b| b.persistent)
            .map(|b| (b.name, b.tensor)),
    );
    v
}
