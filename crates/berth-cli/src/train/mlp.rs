//! The main job's model: an MLP `784 → hidden → 10` with `ReLU`, its hand-written backward, and
//! SGD with momentum (PyTorch's `torch.optim.SGD` update rule).
//!
//! No general autograd: the backward of `Linear`, `ReLU` and softmax cross-entropy is written
//! out, and a test checks it against finite differences.

use berth::nn::{Linear, Module};
use berth::{DType, Device, Generator, Result, Tensor};

/// Pixels per Fashion-MNIST image (28 × 28), the model's input width.
pub const INPUTS: usize = 784;
/// Fashion-MNIST classes, the model's output width.
pub const CLASSES: usize = 10;

/// `fc2(relu(fc1(x)))`: `x [batch, 784] → logits [batch, 10]`.
#[derive(Debug)]
pub struct Mlp {
    /// `Linear(784, hidden)`.
    pub fc1: Linear,
    /// `Linear(hidden, 10)`.
    pub fc2: Linear,
}

/// What the forward pass keeps for the backward pass.
#[derive(Debug)]
pub struct Activations {
    /// `fc1(x)`, `[batch, hidden]` (pre-activation; `ReLU`'s backward masks with it).
    pub hidden_pre: Tensor,
    /// `relu(hidden_pre)`, `[batch, hidden]`.
    pub hidden: Tensor,
    /// `fc2(hidden)`, `[batch, 10]`.
    pub logits: Tensor,
}

/// Gradients of the mean cross-entropy loss, in [`Module::named_parameters`] order.
#[derive(Debug)]
pub struct Gradients {
    /// d loss / d `fc1.weight`, `[hidden, 784]`.
    pub w1: Tensor,
    /// d loss / d `fc1.bias`, `[hidden]`.
    pub b1: Tensor,
    /// d loss / d `fc2.weight`, `[10, hidden]`.
    pub w2: Tensor,
    /// d loss / d `fc2.bias`, `[10]`.
    pub b2: Tensor,
}

impl Gradients {
    /// The gradients in the order of [`Mlp::params`].
    pub fn as_slice(&self) -> [&Tensor; 4] {
        [&self.w1, &self.b1, &self.w2, &self.b2]
    }
}

impl Mlp {
    /// A model with PyTorch's default `Linear` initialisation drawn from `g`, on `device`.
    ///
    /// # Errors
    /// The device cannot be used, or allocation fails.
    pub fn new(hidden: usize, device: Device, g: &mut Generator) -> Result<Mlp> {
        Ok(Mlp {
            fc1: Linear::new_with(INPUTS, hidden, true, DType::F32, device, g)?,
            fc2: Linear::new_with(hidden, CLASSES, true, DType::F32, device, g)?,
        })
    }

    /// The parameters in a fixed order: `fc1.weight, fc1.bias, fc2.weight, fc2.bias`.
    pub fn params(&self) -> [&Tensor; 4] {
        let [w1, b1, w2, b2] = [
            &self.fc1.weight,
            self.fc1
                .bias
                .as_ref()
                .expect("Mlp::new builds fc1 with a bias"),
            &self.fc2.weight,
            self.fc2
                .bias
                .as_ref()
                .expect("Mlp::new builds fc2 with a bias"),
        ];
        [w1, b1, w2, b2]
    }

    /// The forward pass, keeping what the backward needs.
    ///
    /// # Errors
    /// `x` is not `[batch, 784]` f32 on the model's device.
    pub fn forward_train(&self, x: &Tensor) -> Result<Activations> {
        let hidden_pre = self.fc1.forward(x)?;
        let hidden = hidden_pre.relu()?;
        let logits = self.fc2.forward(&hidden)?;
        Ok(Activations {
            hidden_pre,
            hidden,
            logits,
        })
    }

    /// The backward pass of `cross_entropy(logits, targets)` (mean over the batch).
    ///
    /// With `g = softmax(logits) − onehot(targets)) / batch`:
    /// `dW2 = gᵀ·h`, `db2 = Σ_batch g`, `dh = g·W2`, `dpre = dh ⊙ [pre > 0]`,
    /// `dW1 = dpreᵀ·x`, `db1 = Σ_batch dpre`.
    ///
    /// # Errors
    /// Shape or device mismatches between `x`, `acts` and `targets` (i64 class indices, `[batch]`).
    pub fn backward(&self, x: &Tensor, acts: &Activations, targets: &Tensor) -> Result<Gradients> {
        let g = acts.logits.cross_entropy_backward(targets)?;
        let w2 = g.t()?.matmul(&acts.hidden)?;
        let b2 = g.sum_dim(0, false)?;
        let dh = g.matmul(&self.fc2.weight)?;
        let dpre = dh.relu_backward(&acts.hidden_pre)?;
        let w1 = dpre.t()?.matmul(x)?;
        let b1 = dpre.sum_dim(0, false)?;
        Ok(Gradients { w1, b1, w2, b2 })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }

    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v: Vec<(String, &Tensor)> = Vec::new();
        for (prefix, layer) in [("fc1", &self.fc1), ("fc2", &self.fc2)] {
            for (name, t) in layer.named_parameters() {
                v.push((format!("{prefix}.{name}"), t));
            }
        }
        v
    }

    fn named_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v: Vec<(String, &mut Tensor)> = Vec::new();
        for (prefix, layer) in [("fc1", &mut self.fc1), ("fc2", &mut self.fc2)] {
            for (name, t) in layer.named_parameters_mut() {
                v.push((format!("{prefix}.{name}"), t));
            }
        }
        v
    }
}

/// SGD with momentum, PyTorch's rule (`torch.optim.SGD`, dampening 0, no Nesterov):
/// `v ← μ·v + g` (the first step sets `v ← g`), `p ← p − lr·v`.
#[derive(Debug)]
pub struct Sgd {
    lr: f64,
    momentum: f64,
    velocity: Option<Vec<Tensor>>,
}

impl Sgd {
    /// An optimiser with learning rate `lr` and momentum `momentum` (0 disables it).
    pub fn new(lr: f64, momentum: f64) -> Sgd {
        Sgd {
            lr,
            momentum,
            velocity: None,
        }
    }

    /// One update of `params` (in place, through their storage) with `grads`, pairwise.
    ///
    /// # Errors
    /// Shape or device mismatch between a parameter and its gradient.
    pub fn step(&mut self, params: &[&Tensor], grads: &[&Tensor]) -> Result<()> {
        if self.momentum == 0.0 {
            for (p, g) in params.iter().zip(grads) {
                p.add_scaled_(g, -self.lr)?;
            }
            return Ok(());
        }
        match &mut self.velocity {
            None => {
                let mut vs = Vec::with_capacity(grads.len());
                for (p, g) in params.iter().zip(grads) {
                    let v = Tensor::clone(g)?;
                    p.add_scaled_(&v, -self.lr)?;
                    vs.push(v);
                }
                self.velocity = Some(vs);
            }
            Some(vs) => {
                for ((p, g), v) in params.iter().zip(grads).zip(vs.iter()) {
                    if momentum_step_host(p, g, v, self.momentum, self.lr)? {
                        continue;
                    }
                    v.mul_scalar_(self.momentum)?;
                    v.add_(g)?;
                    p.add_scaled_(v, -self.lr)?;
                }
            }
        }
        Ok(())
    }
}

/// Elements per rayon task of the fused host update (64 KiB of f32 per operand).
const SGD_CHUNK: usize = 1 << 14;

/// Note [Fused host SGD]: the momentum update as one pass over `p`, `g` and `v` when all three
/// are contiguous f32 host tensors of one shape in distinct storages; returns whether it ran.
/// Three tensor ops (`v *= μ`, `v += g`, `p += −lr·v`, the last with a temporary) made five
/// passes and an allocation: 1.5 ms a step on one core of the 2-core box for the 784 × 256
/// weight, about half of the step. Each element is computed with the same f32 operations in the
/// same order as the three ops (`v·μ`, `+ g`, then `p + v·(−lr)`), so the result is bit for
/// bit the same. Split over rayon in chunks of [`SGD_CHUNK`] elements.
///
/// # Errors
/// A storage that cannot be read or written (never for host tensors).
fn momentum_step_host(p: &Tensor, g: &Tensor, v: &Tensor, momentum: f64, lr: f64) -> Result<bool> {
    let fits = |t: &Tensor| {
        t.device().is_cpu()
            && t.dtype() == DType::F32
            && t.is_contiguous()
            && t.shape() == p.shape()
    };
    if !(fits(p) && fits(g) && fits(v))
        || p.shares_storage(g)
        || p.shares_storage(v)
        || g.shares_storage(v)
    {
        return Ok(false);
    }
    use rayon::prelude::*;
    let n = p.numel();
    let (mu, neg_lr) = (momentum as f32, (-lr) as f32);
    let mut pw = p.storage().write_host("sgd")?;
    let mut vw = v.storage().write_host("sgd")?;
    let gr = g.storage().read_host("sgd")?;
    let pd = &mut pw.typed_mut::<f32>()[p.storage_offset()..p.storage_offset() + n];
    let vd = &mut vw.typed_mut::<f32>()[v.storage_offset()..v.storage_offset() + n];
    let gd = &gr.typed::<f32>()[g.storage_offset()..g.storage_offset() + n];
    let body = |((pc, vc), gc): ((&mut [f32], &mut [f32]), &[f32])| {
        for ((p, v), &g) in pc.iter_mut().zip(vc.iter_mut()).zip(gc) {
            *v = *v * mu + g;
            *p += *v * neg_lr;
        }
    };
    if n >= 4 * SGD_CHUNK {
        pd.par_chunks_mut(SGD_CHUNK)
            .zip(vd.par_chunks_mut(SGD_CHUNK))
            .zip(gd.par_chunks(SGD_CHUNK))
            .for_each(body);
    } else {
        body(((pd, vd), gd));
    }
    Ok(true)
}

/// The hidden width of the MLP a state dict holds, checked before anything is built: the four
/// tensors `fc1.weight` `[hidden, 784]`, `fc1.bias` `[hidden]`, `fc2.weight` `[10, hidden]` and
/// `fc2.bias` `[10]`, with `hidden ≥ 1`. (Found by fuzzing: a scalar `fc1.weight` panicked, and
/// one of shape `[1048576, 0]` built a 3.3 GB model before the shape error.)
///
/// # Errors
/// A message naming the first tensor that is missing or has the wrong shape, and the shape
/// that would be right.
pub fn hidden_of(state: &berth::nn::StateDict) -> Result<usize, String> {
    let shape = |name: &str| -> Result<&[usize], String> {
        state.get(name).map(|t| t.shape()).ok_or_else(|| {
            format!("no `{name}` in the file; it was not written by `berth train --save`")
        })
    };
    let w1 = shape("fc1.weight")?;
    let hidden = match w1 {
        [h, i] if *h >= 1 && *i == INPUTS => *h,
        _ => {
            return Err(format!(
                "`fc1.weight` has shape {w1:?}; expected [hidden, {INPUTS}] with hidden ≥ 1"
            ))
        }
    };
    for (name, want) in [
        ("fc1.bias", vec![hidden]),
        ("fc2.weight", vec![CLASSES, hidden]),
        ("fc2.bias", vec![CLASSES]),
    ] {
        let got = shape(name)?;
        if got != want.as_slice() {
            return Err(format!("`{name}` has shape {got:?}; expected {want:?}"));
        }
    }
    Ok(hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loss_of(model: &Mlp, x: &Tensor, y: &Tensor) -> f64 {
        let logits = model.forward(x).unwrap();
        logits
            .cross_entropy(y)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .item::<f64>()
            .unwrap()
    }

    /// Central differences in f64 against the analytic gradient of every parameter entry
    /// of a small model.
    #[test]
    fn backward_matches_finite_differences() {
        let mut g = Generator::new(7);
        let hidden = 5;
        let model = Mlp::new(hidden, Device::Cpu, &mut g).unwrap();
        let batch = 3;
        let x = Tensor::randn_with(&[batch, INPUTS], DType::F32, Device::Cpu, &mut g).unwrap();
        let y = Tensor::from_vec(vec![1i64, 7, 3], &[batch], Device::Cpu).unwrap();
        let acts = model.forward_train(&x).unwrap();
        let grads = model.backward(&x, &acts, &y).unwrap();
        let eps = 1e-2;
        for (param, grad) in model.params().into_iter().zip(grads.as_slice()) {
            let analytic: Vec<f32> = grad.to_vec().unwrap();
            assert_eq!(analytic.len(), param.numel());
            // Every entry of the small tensors; a stride through fc1.weight (3920 entries).
            let step = if param.numel() > 100 { 97 } else { 1 };
            for i in (0..param.numel()).step_by(step) {
                let flat = param.reshape(&[param.numel()]).unwrap();
                let cell = flat.narrow(0, i, 1).unwrap();
                let orig: f32 = cell.item().unwrap();
                cell.fill_(f64::from(orig) + eps).unwrap();
                let up = loss_of(&model, &x, &y);
                cell.fill_(f64::from(orig) - eps).unwrap();
                let down = loss_of(&model, &x, &y);
                cell.fill_(f64::from(orig)).unwrap();
                let numeric = (up - down) / (2.0 * eps);
                let a = f64::from(analytic[i]);
                assert!(
                    (numeric - a).abs() <= 2e-3 + 2e-2 * a.abs(),
                    "entry {i}: analytic {a}, numeric {numeric}"
                );
            }
        }
    }

    /// The fused host update gives the same bits as the three tensor ops it replaces.
    #[test]
    fn fused_host_sgd_matches_the_tensor_ops() {
        let mut g = Generator::new(3);
        let n = 5 * SGD_CHUNK + 7; // the parallel path, with a ragged last chunk
        let r = |g: &mut Generator| Tensor::randn_with(&[n], DType::F32, Device::Cpu, g).unwrap();
        let (p0, v0, gr) = (r(&mut g), r(&mut g), r(&mut g));
        let (p1, v1) = (Tensor::clone(&p0).unwrap(), Tensor::clone(&v0).unwrap());
        assert!(momentum_step_host(&p0, &gr, &v0, 0.9, 0.05).unwrap());
        v1.mul_scalar_(0.9).unwrap();
        v1.add_(&gr).unwrap();
        p1.add_scaled_(&v1, -0.05).unwrap();
        assert_eq!(p0.to_vec::<f32>().unwrap(), p1.to_vec::<f32>().unwrap());
        assert_eq!(v0.to_vec::<f32>().unwrap(), v1.to_vec::<f32>().unwrap());
        // Aliased or non-f32 operands take the tensor ops.
        assert!(!momentum_step_host(&p0, &p0, &v0, 0.9, 0.05).unwrap());
        let p64 = p0.to_dtype(DType::F64).unwrap();
        assert!(!momentum_step_host(&p64, &gr, &v0, 0.9, 0.05).unwrap());
    }

    #[test]
    fn sgd_momentum_follows_pytorch_rule() {
        let p = Tensor::from_vec(vec![1.0f32, 2.0], &[2], Device::Cpu).unwrap();
        let g = Tensor::from_vec(vec![0.5f32, -1.0], &[2], Device::Cpu).unwrap();
        let mut opt = Sgd::new(0.1, 0.9);
        opt.step(&[&p], &[&g]).unwrap();
        // v = g; p = p - 0.1 g
        assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.95, 2.1]);
        opt.step(&[&p], &[&g]).unwrap();
        // v = 0.9 g + g = 1.9 g; p -= 0.19 g
        let got = p.to_vec::<f32>().unwrap();
        assert!(
            (got[0] - 0.855).abs() < 1e-6 && (got[1] - 2.29).abs() < 1e-6,
            "{got:?}"
        );
    }

    #[test]
    fn state_dict_names_and_shapes() {
        let mut g = Generator::new(1);
        let model = Mlp::new(16, Device::Cpu, &mut g).unwrap();
        let sd = model.state_dict().unwrap();
        let shapes: Vec<(String, Vec<usize>)> = sd
            .iter()
            .map(|(k, t)| (k.clone(), t.shape().to_vec()))
            .collect();
        assert_eq!(
            shapes,
            vec![
                ("fc1.bias".to_string(), vec![16]),
                ("fc1.weight".to_string(), vec![16, 784]),
                ("fc2.bias".to_string(), vec![10]),
                ("fc2.weight".to_string(), vec![10, 16]),
            ]
        );
    }

    /// `berth eval --load` checks a file's shapes before building the model (fuzzing found a
    /// panic on a scalar `fc1.weight` and a 3.3 GB model built for `[1048576, 0]`).
    #[test]
    fn state_dict_shapes_are_checked_before_building() {
        let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, Device::Cpu).unwrap();
        let good = |h: usize| {
            berth::nn::StateDict::from([
                ("fc1.weight".to_owned(), z(&[h, INPUTS])),
                ("fc1.bias".to_owned(), z(&[h])),
                ("fc2.weight".to_owned(), z(&[CLASSES, h])),
                ("fc2.bias".to_owned(), z(&[CLASSES])),
            ])
        };
        assert_eq!(hidden_of(&good(3)), Ok(3));
        let mut scalar = good(3);
        scalar.insert("fc1.weight".into(), Tensor::scalar(1.0f32));
        let e = hidden_of(&scalar).unwrap_err();
        assert!(e.contains("`fc1.weight` has shape []"), "{e}");
        let mut empty = good(3);
        empty.insert("fc1.weight".into(), z(&[1 << 20, 0]));
        assert!(hidden_of(&empty)
            .unwrap_err()
            .contains("expected [hidden, 784]"));
        let mut bad_fc2 = good(3);
        bad_fc2.insert("fc2.weight".into(), z(&[CLASSES, 4]));
        assert!(hidden_of(&bad_fc2)
            .unwrap_err()
            .contains("expected [10, 3]"));
        let mut missing = good(3);
        missing.remove("fc2.bias");
        assert!(hidden_of(&missing).unwrap_err().contains("no `fc2.bias`"));
    }
}
