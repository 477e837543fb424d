//! Loading a state dict into a module: PyTorch's `Module.load_state_dict(state_dict,
//! strict=True, assign=False)` (<https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.load_state_dict>),
//! checked whole before the first parameter is written.
//!
//! Where PyTorch has a trap berth does better: loading without `assign` into parameters on the
//! meta device is an error ([`Error::LoadIntoMeta`]), not a success that loaded nothing
//! (<https://github.com/pytorch/pytorch/issues/102212>,
//! <https://github.com/huggingface/transformers/issues/37615>).
//!
//! The keys are matched against the parameters and the persistent buffers
//! ([`super::buffer::state_entries`]); a non-persistent buffer is never missing, and a key
//! naming one is unexpected, as PyTorch's `_load_from_state_dict` reports it. PyTorch checks
//! only the first name segment after each submodule's prefix, so it also lets pass a key equal
//! to a submodule's path (`"0"`) or one that extends a parameter's name (`"0.weight.x"`); berth
//! reports those as unexpected too: a key that names no parameter or persistent buffer loads
//! nothing.

use super::buffer::state_entries;
use super::{Module, StateDict};
use crate::{Error, Result};

/// How [`Module::load_state_dict_with`] loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Every parameter must have a key and every key a parameter (PyTorch's `strict=True`,
    /// the default); when false, the keys that do not match are returned instead.
    pub strict: bool,
    /// The module takes the checkpoint's tensors themselves, with their device and dtype,
    /// instead of copying values into its own (PyTorch's `assign=True`): the way to load into
    /// a model built on the meta device.
    pub assign: bool,
}

impl Default for LoadOptions {
    /// PyTorch's defaults: strict, copying.
    fn default() -> Self {
        LoadOptions {
            strict: true,
            assign: false,
        }
    }
}

/// The keys a non-strict load did not match (PyTorch's `_IncompatibleKeys`), sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncompatibleKeys {
    /// Parameters and persistent buffers with no entry in the state dict (left as they were).
    pub missing_keys: Vec<String>,
    /// Entries with no parameter or persistent buffer (ignored), keys naming a non-persistent
    /// buffer among them.
    pub unexpected_keys: Vec<String>,
}

/// [`Module::load_state_dict_with`]'s body.
pub(super) fn load<M: Module + ?Sized>(
    module: &mut M,
    state: &StateDict,
    options: LoadOptions,
) -> Result<IncompatibleKeys> {
    let params = state_entries(module);
    let mut keys = IncompatibleKeys::default();
    for (name, p) in &params {
        let Some(s) = state.get(name) else {
            if options.strict {
                return Err(Error::MissingKey {
                    key: name.clone(),
                    present: state.keys().cloned().collect(),
                });
            }
            keys.missing_keys.push(name.clone());
            continue;
        };
        // A size mismatch is an error even when not strict, as in PyTorch.
        if s.shape() != p.shape() {
            return Err(Error::StateDictShape {
                key: name.clone(),
                expected: p.shape().to_vec(),
                got: s.shape().to_vec(),
            });
        }
    }
    keys.unexpected_keys = state
        .keys()
        .filter(|k| !params.iter().any(|(n, _)| n == *k))
        .cloned()
        .collect();
    if options.strict && !keys.unexpected_keys.is_empty() {
        return Err(Error::UnexpectedKeys {
            keys: keys.unexpected_keys,
        });
    }
    // What the copies could refuse is checked for every parameter before the first write
    // (values are converted one at a time below, so a device model never holds two copies
    // of its parameters).
    if !options.assign {
        for (name, p) in &params {
            let Some(s) = state.get(name) else { continue };
            if p.device().is_meta() {
                return Err(Error::LoadIntoMeta { key: name.clone() });
            }
            if s.device().is_meta() {
                return Err(Error::MetaNoData {
                    op: "load_state_dict",
                });
            }
            crate::ops::infer::no_internal_overlap("load_state_dict", p)?;
        }
    }
    drop(params);
    for (name, p) in module.named_parameters_mut() {
        let Some(s) = state.get(&name) else { continue };
        // With `assign`, a parameter keeps its `requires_grad` (PyTorch wraps the checkpoint's
        // tensor as `Parameter(input_param, requires_grad=param.requires_grad)`).
        write(p, s, options.assign, true)?;
    }
    for b in module.named_buffers_mut() {
        let Some(s) = state.get(&b.name).filter(|_| b.persistent) else {
            continue;
        };
        write(b.tensor, s, options.assign, false)?;
    }
    Ok(keys)
}

/// Loads `s` into `dst`: the checkpoint's tensor itself with `assign` (a parameter keeping its
/// `requires_grad` when `keep_grad`), else its values converted to `dst`'s device and dtype.
fn write(dst: &mut crate::Tensor, s: &crate::Tensor, assign: bool, keep_grad: bool) -> Result<()> {
    if assign {
        let requires_grad = keep_grad && dst.requires_grad();
        *dst = s.detach().with_requires_grad(requires_grad)?;
    } else {
        let src = s.to(dst.device(), dst.dtype(), false, false)?;
        dst.copy_(&src)?;
    }
    Ok(())
}
