//! Neural-network building blocks: the [`Module`] trait with parameters and buffers
//! ([`NamedBuffer`], persistent or not), [`Linear`], [`PositionalEncoding`] (a buffer),
//! [`Sequential`] with [`ReLU`], and state dicts saved as safetensors files
//! ([`save_state_dict`], [`load_state_dict_file`], [`load_state_dict_bytes`]).

mod buffer;
mod linear;
mod load;
mod positional;
mod safetensors_io;
mod sequential;

use std::collections::BTreeMap;

pub use buffer::NamedBuffer;
pub use linear::Linear;
pub use load::{IncompatibleKeys, LoadOptions};
pub use positional::PositionalEncoding;
pub use safetensors_io::{load_state_dict_bytes, load_state_dict_file, save_state_dict};
pub use sequential::{ReLU, Sequential};

use crate::{Device, Result, Tensor};

/// Parameter or persistent buffer name → tensor, sorted by name (PyTorch's `OrderedDict` from
/// `state_dict()`).
pub type StateDict = BTreeMap<String, Tensor>;

/// A layer or model (PyTorch's `nn.Module`, without autograd).
///
/// Implementors provide [`Module::forward`] and the two parameter listings, and the two buffer
/// listings when they hold buffers; moving, state dicts and loading are provided.
pub trait Module {
    /// Apply the module.
    ///
    /// # Errors
    /// Shape, dtype or device errors of the underlying ops.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Every parameter with its dotted name (`"0.weight"`), in a stable order.
    fn named_parameters(&self) -> Vec<(String, &Tensor)>;

    /// Every parameter, mutable, in the same order as [`Module::named_parameters`].
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)>;

    /// Every parameter.
    fn parameters(&self) -> Vec<&Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// Every buffer (persistent or not) with its dotted name, in a stable order (PyTorch's
    /// `named_buffers()`, with each buffer's `persistent` flag from `register_buffer`). The
    /// default: no buffers.
    fn named_buffers(&self) -> Vec<NamedBuffer<&Tensor>> {
        Vec::new()
    }

    /// Every buffer, mutable, in the same order as [`Module::named_buffers`]. The default: no
    /// buffers.
    fn named_buffers_mut(&mut self) -> Vec<NamedBuffer<&mut Tensor>> {
        Vec::new()
    }

    /// Move every parameter and every buffer, persistent or not, to `device`
    /// (`Module.to(device)`; meta → real is an error, use [`Module::to_empty`]).
    ///
    /// # Errors
    /// As [`Tensor::to_device`].
    fn to_device(&mut self, device: Device) -> Result<()> {
        for (_, p) in self.named_parameters_mut() {
            *p = p.to_device(device)?;
        }
        for b in self.named_buffers_mut() {
            *b.tensor = b.tensor.to_device(device)?;
        }
        Ok(())
    }

    /// Replace every parameter and every buffer, persistent or not, by an uninitialised tensor
    /// of the same shape and dtype on `device` (`Module.to_empty`, the way out of meta: moving a
    /// meta model with `.to()` fails with "Cannot copy out of meta tensor; no data!",
    /// <https://github.com/pytorch/pytorch/pull/53143>).
    ///
    /// # Errors
    /// The device cannot be used; allocation failure.
    fn to_empty(&mut self, device: Device) -> Result<()> {
        for (_, p) in self.named_parameters_mut() {
            *p = p.to_empty(device)?;
        }
        for b in self.named_buffers_mut() {
            *b.tensor = b.tensor.to_empty(device)?;
        }
        Ok(())
    }

    /// Draws every parameter again from its initialisation, and computes every buffer again
    /// from its initialiser (persistent or not), in place of their current values, on their
    /// current device and dtype (PyTorch's per-module `reset_parameters()`, called for each
    /// submodule; PyTorch's normalisation layers reset their running-statistics buffers there
    /// too). The way to give a model built on meta real values after [`Module::to_empty`]:
    /// `to_empty(device)` then `reset_parameters(&mut g)`, as PyTorch's
    /// <https://pytorch.org/docs/stable/meta.html> describes. Modules without parameters or
    /// buffers do nothing.
    ///
    /// # Errors
    /// Parameters on the meta device stay on meta (drawing is free there); device errors.
    fn reset_parameters(&mut self, g: &mut crate::random::Generator) -> Result<()> {
        let _ = g;
        Ok(())
    }

    /// The parameters and persistent buffers as CPU tensors, by name (`Module.state_dict()`;
    /// non-persistent buffers are left out, as PyTorch leaves them); CPU tensors are shared
    /// (detached aliases), device tensors copied.
    ///
    /// # Errors
    /// [`crate::Error::MetaNoData`] for a meta parameter or persistent buffer; copy errors.
    fn state_dict(&self) -> Result<StateDict> {
        buffer::state_entries(self)
            .into_iter()
            .map(|(n, p)| Ok((n, p.detach().cpu()?)))
            .collect()
    }

    /// Copy values from `state` into the parameters and persistent buffers (strict, as
    /// PyTorch's default): every parameter and persistent buffer must be present with the same
    /// shape and no extra key may exist (a key naming a non-persistent buffer is an extra key,
    /// as in PyTorch). Values are converted to each tensor's dtype and device. Nothing is
    /// changed when a check fails: the keys, the shapes, and what a copy would refuse (a tensor
    /// on the meta device, a meta value for a tensor with memory, a tensor whose elements share
    /// memory) are checked for every parameter and persistent buffer before the first is
    /// written. Only a device failure during the copies themselves (out of memory for a
    /// converted value, a failed transfer) can leave some of them written.
    ///
    /// # Errors
    /// [`crate::Error::MissingKey`], [`crate::Error::UnexpectedKeys`],
    /// [`crate::Error::StateDictShape`]; [`crate::Error::LoadIntoMeta`] for a parameter or
    /// persistent buffer on the meta device (load with [`LoadOptions::assign`] instead);
    /// [`crate::Error::MetaNoData`] for a meta value and a tensor with memory;
    /// [`crate::Error::InternalOverlap`]; device errors.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        self.load_state_dict_with(state, LoadOptions::default())
            .map(|_| ())
    }

    /// [`Module::load_state_dict`] with PyTorch's `strict` and `assign` options
    /// (`load_state_dict(state_dict, strict, assign)`): not strict, the keys that do not match
    /// are returned (a size mismatch is still an error); with `assign`, each parameter and
    /// persistent buffer becomes the checkpoint's tensor (its device and dtype; a parameter
    /// keeps its `requires_grad`), which is how a model built on the meta device is loaded.
    ///
    /// # Errors
    /// As [`Module::load_state_dict`]; with `assign`, only the key and shape errors.
    fn load_state_dict_with(
        &mut self,
        state: &StateDict,
        options: LoadOptions,
    ) -> Result<IncompatibleKeys> {
        load::load(self, state, options)
    }
}
