//! `Linear`: `y = x Wᵀ + b` (PyTorch's `nn.Linear`).

use super::Module;
use crate::device_kernels::interface::RandomDist;
use crate::random::{with_global, Generator};
use crate::{DType, Device, Result, Tensor};

/// A fully connected layer: weight `[out_features, in_features]`, bias `[out_features]`.
///
/// Initialised as PyTorch's `reset_parameters`: `kaiming_uniform_(a = √5)` for the weight,
/// which is `U(−1/√in, 1/√in)`, and the same bound for the bias.
#[derive(Debug)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer with bias on `device` (f32), initialised from the global generator. On meta
    /// nothing is allocated.
    ///
    /// # Errors
    /// The device cannot be used; allocation failure.
    pub fn new(in_features: usize, out_features: usize, device: Device) -> Result<Linear> {
        with_global(|g| Linear::new_with(in_features, out_features, true, DType::F32, device, g))
    }

    /// A layer with every option and an explicit generator.
    ///
    /// # Errors
    /// As [`Linear::new`]; a non-float dtype.
    pub fn new_with(
        in_features: usize,
        out_features: usize,
        bias: bool,
        dtype: DType,
        device: Device,
        g: &mut Generator,
    ) -> Result<Linear> {
        let (weight, bias) = Linear::draw(in_features, out_features, bias, dtype, device, g)?;
        Ok(Linear { weight, bias })
    }

    /// Weight and bias drawn from `U(−1/√in, 1/√in)` (PyTorch's `Linear.reset_parameters`), in
    /// that order from `g`, on `device` as `dtype`.
    fn draw(
        in_features: usize,
        out_features: usize,
        bias: bool,
        dtype: DType,
        device: Device,
        g: &mut Generator,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let bound = if in_features > 0 {
            1.0 / (in_features as f64).sqrt()
        } else {
            0.0
        };
        let dist = RandomDist::Uniform {
            low: -bound,
            high: bound,
        };
        let weight = Tensor::random_op(
            "Linear",
            &[out_features, in_features],
            dtype,
            device,
            dist,
            g,
        )?
        .with_requires_grad(true)?;
        let bias = if bias {
            Some(
                Tensor::random_op("Linear", &[out_features], dtype, device, dist, g)?
                    .with_requires_grad(true)?,
            )
        } else {
            None
        };
        Ok((weight, bias))
    }

    /// `in_features`.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// `out_features`.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v = vec![("weight".to_string(), &self.weight)];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }

    fn named_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = vec![("weight".to_string(), &mut self.weight)];
        if let Some(b) = &mut self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }

    fn reset_parameters(&mut self, g: &mut Generator) -> Result<()> {
        let (weight, bias) = Linear::draw(
            self.in_features(),
            self.out_features(),
            self.bias.is_some(),
            self.weight.dtype(),
            self.weight.device(),
            g,
        )?;
        self.weight = weight;
        self.bias = bias;
        Ok(())
    }
}
