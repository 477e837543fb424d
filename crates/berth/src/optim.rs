//! Optimisers: SGD with momentum, PyTorch's rule
//! ([`torch.optim.SGD`](https://pytorch.org/docs/stable/generated/torch.optim.SGD.html),
//! dampening 0, no Nesterov, no weight decay), with a fused multi-tensor update.
//!
//! [`sgd_momentum_`] is the functional form (PyTorch's `torch.optim._functional.sgd` with
//! `fused=True`): one kernel call for every parameter that fits it — one pass on the CPU, one
//! launch per 16 parameters on CUDA (`cuda::kernels::SGD_MAX_TENSORS`)
//! instead of four to five launches and a temporary each. [`Sgd`] keeps the momentum buffers
//! between steps. Results are bit for bit those of the unfused tensor ops
//! (`Note [Fused updates are exact]` in `src/cuda/kernels/optim.rs`; `Note [Fused host SGD]`
//! in `src/cpu/optim.rs`).

use std::collections::HashSet;

use crate::device_kernels::dispatch::kernels_for;
use crate::device_kernels::interface::{SgdParam, View};
use crate::{DType, Error, Result, Storage, Tensor};

/// Op name of the fused update (what the profiler records).
const OP: &str = "fused_sgd";

/// One SGD-with-momentum step in place: for each `i`,
/// `v ← μ·v + g` (or `v ← g` when `first_step`, whatever `v` held), then `p ← p − lr·v`, with
/// `p = params[i]`, `g = grads[i]`, `v = momentum_buffers[i]` and `μ = momentum`. This is
/// `torch.optim.SGD`'s update (dampening 0, no Nesterov), computed as PyTorch's CUDA kernels
/// and berth's tensor ops compute it, `p + v·(−lr)`.
///
/// Every parameter whose three tensors are contiguous f32 or f64 of one dtype and shape, in
/// storages no other tensor of the call uses, on the device and dtype of the first such
/// parameter, goes through one fused kernel call
/// ([`DeviceKernels::sgd_momentum`](crate::device_kernels::DeviceKernels::sgd_momentum));
/// the others take the tensor ops (`mul_scalar_`, `add_`, `add_scaled_`, or `copy_` on the
/// first step), after the fused call. Either way the result has the same bits. On the meta
/// device only the checks run.
///
/// # Errors
/// [`Error::InvalidArgument`] when the three slices differ in length; [`Error::Shape`],
/// [`Error::DTypeMismatch`] or [`Error::DeviceMismatch`] when a gradient or momentum buffer
/// does not match its parameter (checked for every parameter before anything is written);
/// the tensor ops' errors (as [`Tensor::add_`]) for the unfused ones; device errors.
///
/// # Examples
/// ```
/// use berth::{Device, Tensor};
/// let p = Tensor::from_vec(vec![1.0f32, 2.0], &[2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![0.5f32, -1.0], &[2], Device::Cpu)?;
/// let v = Tensor::zeros(&[2], berth::DType::F32, Device::Cpu)?;
/// berth::optim::sgd_momentum_(&[&p], &[&g], &[&v], 0.1, 0.9, true)?;
/// assert_eq!(p.to_vec::<f32>()?, vec![0.95, 2.1]); // v = g, p -= 0.1 g
/// # Ok::<(), berth::Error>(())
/// ```
pub fn sgd_momentum_(
    params: &[&Tensor],
    grads: &[&Tensor],
    momentum_buffers: &[&Tensor],
    lr: f64,
    momentum: f64,
    first_step: bool,
) -> Result<()> {
    if grads.len() != params.len() || momentum_buffers.len() != params.len() {
        return Err(Error::InvalidArgument {
            op: OP,
            what: format!(
                "{} parameters, {} gradients and {} momentum buffers: give one of each per parameter",
                params.len(),
                grads.len(),
                momentum_buffers.len()
            ),
        });
    }
    for ((p, g), v) in params.iter().zip(grads).zip(momentum_buffers) {
        for (t, what) in [(g, "gradient"), (v, "momentum buffer")] {
            crate::ops::infer::same_device(OP, p, t)?;
            if t.dtype() != p.dtype() {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    lhs: p.dtype(),
                    rhs: t.dtype(),
                });
            }
            if t.shape() != p.shape() {
                return Err(Error::Shape {
                    op: OP,
                    what: format!(
                        "a {what} of shape {:?} for a parameter of shape {:?}: they must be equal",
                        t.shape(),
                        p.shape()
                    ),
                });
            }
        }
    }
    let (fused, rest) = split_fused(params, grads, momentum_buffers);
    if let Some(&(p0, _, _)) = fused.first() {
        if !p0.device().is_meta() {
            let views: Vec<SgdParam<'_>> = fused
                .iter()
                .map(|(p, g, v)| SgdParam {
                    param: View::of(p),
                    grad: View::of(g),
                    velocity: View::of(v),
                })
                .collect();
            kernels_for(p0.device(), OP)?.sgd_momentum(&views, momentum, lr, first_step)?;
        }
    }
    for (p, g, v) in rest {
        if first_step {
            v.copy_(g)?;
        } else {
            v.mul_scalar_(momentum)?;
            v.add_(g)?;
        }
        p.add_scaled_(v, -lr)?;
    }
    Ok(())
}

/// A parameter, its gradient and its momentum buffer.
type Triple<'a> = (&'a Tensor, &'a Tensor, &'a Tensor);

/// The parameters the fused kernel takes (see [`sgd_momentum_`]) and the others, in order.
fn split_fused<'a>(
    params: &[&'a Tensor],
    grads: &[&'a Tensor],
    bufs: &[&'a Tensor],
) -> (Vec<Triple<'a>>, Vec<Triple<'a>>) {
    let (mut fused, mut rest) = (Vec::new(), Vec::new());
    let mut seen: HashSet<*const Storage> = HashSet::new();
    let id = |t: &Tensor| std::sync::Arc::as_ptr(t.storage());
    for ((&p, &g), &v) in params.iter().zip(grads).zip(bufs) {
        let head = fused.first().map(|&(h, _, _): &Triple<'a>| h);
        let fits = matches!(p.dtype(), DType::F32 | DType::F64)
            && head.is_none_or(|h| h.device() == p.device() && h.dtype() == p.dtype())
            && [p, g, v].iter().all(|t| t.is_contiguous())
            && {
                let ids = [p, g, v].map(id);
                let distinct = ids[0] != ids[1] && ids[0] != ids[2] && ids[1] != ids[2];
                distinct && ids.iter().all(|id| !seen.contains(id))
            };
        if fits {
            seen.extend([p, g, v].map(id));
            fused.push((p, g, v));
        } else {
            rest.push((p, g, v));
        }
    }
    (fused, rest)
}

/// SGD with momentum, PyTorch's rule
/// ([`torch.optim.SGD`](https://pytorch.org/docs/stable/generated/torch.optim.SGD.html) with
/// dampening 0, no Nesterov, no weight decay): `v ← μ·v + g` (the first step sets `v ← g`),
/// `p ← p − lr·v`; plain `p ← p − lr·g` when the momentum is 0. The update is
/// [`sgd_momentum_`] (fused).
///
/// # Examples
/// ```
/// use berth::{optim::Sgd, Device, Tensor};
/// let p = Tensor::from_vec(vec![1.0f32], &[1], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![1.0f32], &[1], Device::Cpu)?;
/// let mut opt = Sgd::new(0.5, 0.5);
/// opt.step(&[&p], &[&g])?; // v = 1, p = 0.5
/// opt.step(&[&p], &[&g])?; // v = 1.5, p = -0.25
/// assert_eq!(p.to_vec::<f32>()?, vec![-0.25]);
/// # Ok::<(), berth::Error>(())
/// ```
#[derive(Debug)]
pub struct Sgd {
    lr: f64,
    momentum: f64,
    /// One per parameter, made on the first step (PyTorch's `momentum_buffer` state).
    buffers: Option<Vec<Tensor>>,
}

impl Sgd {
    /// An optimiser with learning rate `lr` and momentum `momentum` (0 disables it).
    pub fn new(lr: f64, momentum: f64) -> Sgd {
        Sgd {
            lr,
            momentum,
            buffers: None,
        }
    }

    /// The momentum buffers, one per parameter of the steps so far (`None` before the first
    /// step or with momentum 0).
    pub fn momentum_buffers(&self) -> Option<&[Tensor]> {
        self.buffers.as_deref()
    }

    /// One update of `params` (in place, through their storage) with `grads`, pairwise. The
    /// parameters must be the same tensors, in the same order, at every step.
    ///
    /// # Errors
    /// As [`sgd_momentum_`]; [`Error::InvalidArgument`] when the number of parameters changes
    /// after the first step; allocation errors for the buffers on the first step.
    pub fn step(&mut self, params: &[&Tensor], grads: &[&Tensor]) -> Result<()> {
        if self.momentum == 0.0 {
            if grads.len() != params.len() {
                return Err(Error::InvalidArgument {
                    op: "sgd",
                    what: format!(
                        "{} parameters and {} gradients: give one gradient per parameter",
                        params.len(),
                        grads.len()
                    ),
                });
            }
            for (p, g) in params.iter().zip(grads) {
                p.add_scaled_(g, -self.lr)?;
            }
            return Ok(());
        }
        match &self.buffers {
            Some(vs) => {
                let vs: Vec<&Tensor> = vs.iter().collect();
                sgd_momentum_(params, grads, &vs, self.lr, self.momentum, false)
            }
            None => {
                let vs = grads
                    .iter()
                    .map(|g| Tensor::empty(g.shape(), g.dtype(), g.device()))
                    .collect::<Result<Vec<_>>>()?;
                let refs: Vec<&Tensor> = vs.iter().collect();
                sgd_momentum_(params, grads, &refs, self.lr, self.momentum, true)?;
                self.buffers = Some(vs);
                Ok(())
            }
        }
    }
}
