//! `Sequential` and `ReLU`: compose modules (PyTorch's `nn.Sequential`, `nn.ReLU`).

use super::{Module, NamedBuffer};
use crate::{Result, Tensor};

/// `max(x, 0)` as a module (no parameters).
#[derive(Debug, Default, Clone, Copy)]
pub struct ReLU;

impl Module for ReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
}

/// Modules applied in order; parameters and buffers are named `"<index>.<name>"` as PyTorch.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module + Send + Sync>>,
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequential")
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Append a module (builder style).
    pub fn push(mut self, m: impl Module + Send + Sync + 'static) -> Sequential {
        self.layers.push(Box::new(m));
        self
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are no modules.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.alias();
        for l in &self.layers {
            y = l.forward(&y)?;
        }
        Ok(y)
    }

    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(
                l.named_parameters()
                    .into_iter()
                    .map(|(n, t)| (format!("{i}.{n}"), t)),
            );
        }
        v
    }

    fn named_buffers(&self) -> Vec<NamedBuffer<&Tensor>> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let prefix = i.to_string();
            v.extend(l.named_buffers().into_iter().map(|b| b.prefixed(&prefix)));
        }
        v
    }

    fn named_buffers_mut(&mut self) -> Vec<NamedBuffer<&mut Tensor>> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter_mut().enumerate() {
            let prefix = i.to_string();
            v.extend(
                l.named_buffers_mut()
                    .into_iter()
                    .map(|b| b.prefixed(&prefix)),
            );
        }
        v
    }

    fn reset_parameters(&mut self, g: &mut crate::random::Generator) -> Result<()> {
        self.layers
            .iter_mut()
            .try_for_each(|l| l.reset_parameters(g))
    }

    fn named_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.extend(
                l.named_parameters_mut()
                    .into_iter()
                    .map(|(n, t)| (format!("{i}.{n}"), t)),
            );
        }
        v
    }
}
