//! Loading a state dict into a module: PyTorch's `Module.load_state_dict(state_dict,
//! strict=True, assign=False)` (<https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.load_state_dict>),
//! checked whole before the first parameter is written.
//!
//! Where PyTorch has a trap berth does better: loading without `assign` into parameters on the
//! meta device is an error ([`Error::LoadIntoMeta`]), not a success that loaded nothing
//! (<https://github.com/pytorch/pytorch/issues/102212>,
//! <https://github.com/huggingface/transformers/issues/37615>). berth's modules hold parameters
//! only (no buffers, so none are non-persistent).

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
    /// Parameters with no entry in the state dict (left as they were).
    pub missing_keys: Vec<String>,
    /// Entries with no parameter (ignored).
    pub unexpected_keys: Vec<String>,
}

/// [`Module::load_state_dict_with`]'s body.
pub(super) fn load<M: Module + ?Sized>(
    module: &mut M,
    state: &StateDict,
    options: LoadOptions,
) -> Result<IncompatibleKeys> {
    let params = module.named_parameters();
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
        if options.assign {
            *p = s.detach();
        } else {
            let src = s.to(p.device(), p.dtype(), false, false)?;
            p.copy_(&src)?;
        }
    }
    Ok(keys)
}
