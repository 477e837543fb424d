//! The main job's model: an MLP `784 → hidden → 10` with `ReLU` and its hand-written backward.
//! The optimiser is [`berth::optim::Sgd`] (PyTorch's `torch.optim.SGD` rule, one fused kernel
//! call per step; its `Note [Fused host SGD]` started here).
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
        let mut out: [Option<Tensor>; 4] = Default::default();
        self.backward_with(x, acts, targets, |i, g| {
            out[i] = Some(g.alias());
            Ok::<(), berth::Error>(())
        })?;
        let [Some(w1), Some(b1), Some(w2), Some(b2)] = out else {
            unreachable!("backward_with hands over all four gradients")
        };
        Ok(Gradients { w1, b1, w2, b2 })
    }

    /// [`backward`](Self::backward), handing each gradient to `ready(index, grad)` the moment
    /// it is computed, `index` in [`Mlp::params`] order. They come in reverse parameter order,
    /// `fc2.bias` (3), `fc2.weight` (2), `fc1.bias` (1), `fc1.weight` (0), as autograd makes
    /// them ready: DDP's reducer launches a bucket's all-reduce while the rest of backward runs
    /// (Note [Bucket launch order] in `berth_distributed::reducer`). Each gradient may be
    /// dropped once `ready` returns.
    ///
    /// # Errors
    /// As [`backward`](Self::backward); `ready`'s error, which stops the pass.
    pub fn backward_with<E: From<berth::Error>>(
        &self,
        x: &Tensor,
        acts: &Activations,
        targets: &Tensor,
        mut ready: impl FnMut(usize, &Tensor) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let g = acts.logits.cross_entropy_backward(targets)?;
        ready(3, &g.sum_dim(0, false)?)?;
        ready(2, &g.t()?.matmul(&acts.hidden)?)?;
        let dh = g.matmul(&self.fc2.weight)?;
        let dpre = dh.relu_backward(&acts.hidden_pre)?;
        ready(1, &dpre.sum_dim(0, false)?)?;
        ready(0, &dpre.t()?.matmul(x)?)?;
        Ok(())
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
