//! Neural-network building blocks: the [`Module`] trait, [`Linear`], [`Sequential`] with
//! [`ReLU`], and state dicts saved as safetensors files ([`save_state_dict`],
//! [`load_state_dict_file`], [`load_state_dict_bytes`]).

mod linear;
mod safetensors_io;
mod sequential;

use std::collections::BTreeMap;

pub use linear::Linear;
pub use safetensors_io::{load_state_dict_bytes, load_state_dict_file, save_state_dict};
pub use sequential::{ReLU, Sequential};

use crate::{Device, Error, Result, Tensor};

/// Parameter name → tensor, sorted by name (PyTorch's `OrderedDict` from `state_dict()`).
pub type StateDict = BTreeMap<String, Tensor>;

/// A layer or model (PyTorch's `nn.Module`, without autograd).
///
/// Implementors provide [`Module::forward`] and the two parameter listings; moving, state dicts
/// and loading are provided.
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

    /// Move every parameter to `device` (`Module.to(device)`; meta → real is an error, use
    /// [`Module::to_empty`]).
    ///
    /// # Errors
    /// As [`Tensor::to_device`].
    fn to_device(&mut self, device: Device) -> Result<()> {
        for (_, p) in self.named_parameters_mut() {
            *p = p.to_device(device)?;
        }
        Ok(())
    }

    /// Replace every parameter by an uninitialised tensor of the same shape on `device`
    /// (`Module.to_empty`, the way out of meta: moving a meta model with `.to()` fails with "Cannot
    /// copy out of meta tensor; no data!", <https://github.com/pytorch/pytorch/pull/53143>).
    ///
    /// # Errors
    /// The device cannot be used; allocation failure.
    fn to_empty(&mut self, device: Device) -> Result<()> {
        for (_, p) in self.named_parameters_mut() {
            *p = p.to_empty(device)?;
        }
        Ok(())
    }

    /// The parameters as CPU tensors, by name (`Module.state_dict()`); CPU parameters are
    /// shared (detached aliases), device parameters copied.
    ///
    /// # Errors
    /// [`Error::MetaNoData`] for meta parameters; copy errors.
    fn state_dict(&self) -> Result<StateDict> {
        self.named_parameters()
            .into_iter()
            .map(|(n, p)| Ok((n, p.detach().cpu()?)))
            .collect()
    }

    /// Copy values from `state` into the parameters (strict, as PyTorch's default): every
    /// parameter must be present with the same shape and no extra key may exist. Values are
    /// converted to each parameter's dtype and device. Nothing is changed when a check fails:
    /// the keys, the shapes, and what a copy would refuse (a meta value for a parameter with
    /// memory, a parameter whose elements share memory) are checked for every parameter
    /// before the first is written. Only a device failure during the copies themselves (out
    /// of memory for a converted value, a failed transfer) can leave some parameters written.
    ///
    /// # Errors
    /// [`Error::MissingKey`], [`Error::UnexpectedKeys`], [`Error::StateDictShape`];
    /// [`Error::MetaNoData`] for a meta value and a parameter with memory;
    /// [`Error::InternalOverlap`]; device errors.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        let params = self.named_parameters();
        for (name, p) in &params {
            let Some(s) = state.get(name) else {
                return Err(Error::MissingKey {
                    key: name.clone(),
                    present: state.keys().cloned().collect(),
                });
            };
            if s.shape() != p.shape() {
                return Err(Error::StateDictShape {
                    key: name.clone(),
                    expected: p.shape().to_vec(),
                    got: s.shape().to_vec(),
                });
            }
        }
        let unexpected: Vec<String> = state
            .keys()
            .filter(|k| !params.iter().any(|(n, _)| n == *k))
            .cloned()
            .collect();
        if !unexpected.is_empty() {
            return Err(Error::UnexpectedKeys { keys: unexpected });
        }
        // What the copies could refuse is checked for every parameter before the first write
        // (values are converted one at a time below, so a device model never holds two
        // copies of its parameters).
        for (name, p) in &params {
            if p.device().is_meta() {
                continue;
            }
            if state[name].device().is_meta() {
                return Err(Error::MetaNoData {
                    op: "load_state_dict",
                });
            }
            crate::ops::infer::no_internal_overlap("load_state_dict", p)?;
        }
        drop(params);
        for (name, p) in self.named_parameters_mut() {
            if p.device().is_meta() {
                continue;
            }
            let src = state[&name].to(p.device(), p.dtype(), false, false)?;
            p.copy_(&src)?;
        }
        Ok(())
    }
}
