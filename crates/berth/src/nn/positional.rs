//! `PositionalEncoding`: adds the sinusoidal position table of "Attention Is All You Need" to
//! its input, the table held as a buffer (the module of PyTorch's transformer tutorial,
//! <https://pytorch.org/tutorials/beginner/transformer_tutorial.html>, without its dropout).

use super::{Module, NamedBuffer};
use crate::random::Generator;
use crate::{DType, Device, Error, Result, Tensor};

/// Adds `pe[..seq]` to an input of shape `[.., seq, d_model]`, where the buffer `pe`, of shape
/// `[max_len, d_model]`, holds `pe[p, 2i] = sin(p / 10000^(2i / d_model))` and
/// `pe[p, 2i + 1] = cos(p / 10000^(2i / d_model))`.
///
/// The table is a buffer named `"pe"`: computed, never trained. It follows
/// [`Module::to_device`] and [`Module::to_empty`] and is computed again by
/// [`Module::reset_parameters`]. Whether it is in the state dict is the constructor's
/// `persistent` choice (PyTorch's `register_buffer("pe", pe, persistent=...)`): a table that
/// is cheap to recompute is commonly registered with `persistent=False` so checkpoints do not
/// carry it.
#[derive(Debug)]
pub struct PositionalEncoding {
    /// `[max_len, d_model]`.
    pe: Tensor,
    persistent: bool,
}

impl PositionalEncoding {
    /// A table for sequences of up to `max_len` positions of `d_model` features, f32, on
    /// `device` (on meta nothing is computed or allocated).
    ///
    /// # Errors
    /// [`Error::NumelOverflow`] when `max_len × d_model` overflows; the device cannot be used;
    /// allocation failure.
    pub fn new(
        d_model: usize,
        max_len: usize,
        persistent: bool,
        device: Device,
    ) -> Result<PositionalEncoding> {
        PositionalEncoding::new_with(d_model, max_len, persistent, DType::F32, device)
    }

    /// As [`PositionalEncoding::new`], with the table's dtype.
    ///
    /// # Errors
    /// As [`PositionalEncoding::new`]; [`Error::UnsupportedDType`] for a non-float dtype.
    pub fn new_with(
        d_model: usize,
        max_len: usize,
        persistent: bool,
        dtype: DType,
        device: Device,
    ) -> Result<PositionalEncoding> {
        let pe = PositionalEncoding::table(d_model, max_len, dtype, device)?;
        Ok(PositionalEncoding { pe, persistent })
    }

    /// The table `[max_len, d_model]` as `dtype` on `device`, computed in f64 on the host and
    /// converted (meta: shape only).
    fn table(d_model: usize, max_len: usize, dtype: DType, device: Device) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: "PositionalEncoding",
                dtype,
                expected: "a floating-point dtype (f32, f64, f16, bf16)",
            });
        }
        // The shape is checked (and on meta the tensor made) before any host memory is used.
        let empty = Tensor::empty(&[max_len, d_model], dtype, device)?;
        if device.is_meta() {
            return Ok(empty);
        }
        let n = max_len * d_model;
        let values = crate::cpu::try_collect(
            n,
            (0..n).map(|k| {
                let (p, j) = (k / d_model, k % d_model);
                let rate = (-(10000f64.ln()) * (j - j % 2) as f64 / d_model as f64).exp();
                let angle = p as f64 * rate;
                if j % 2 == 0 {
                    angle.sin()
                } else {
                    angle.cos()
                }
            }),
        )?;
        drop(empty);
        Tensor::from_vec(values, &[max_len, d_model], Device::Cpu)?.to(device, dtype, false, false)
    }

    /// The table buffer `pe`, `[max_len, d_model]`.
    pub fn pe(&self) -> &Tensor {
        &self.pe
    }

    /// Whether `pe` is in the state dict.
    pub fn persistent(&self) -> bool {
        self.persistent
    }
}

impl Module for PositionalEncoding {
    /// `x + pe[..seq]` for `x` of shape `[.., seq, d_model]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `x` has fewer than 2 dimensions, its last is not
    /// `d_model` or its second last exceeds `max_len`; dtype or device mismatch.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (max_len, d_model) = (self.pe.shape()[0], self.pe.shape()[1]);
        let shape = x.shape();
        let ok = shape.len() >= 2
            && shape[shape.len() - 1] == d_model
            && shape[shape.len() - 2] <= max_len;
        if !ok {
            return Err(Error::InvalidArgument {
                op: "PositionalEncoding",
                what: format!(
                    "input of shape {shape:?}: expected [.., seq, {d_model}] with seq at most \
                     {max_len}"
                ),
            });
        }
        x.add(&self.pe.narrow(0, 0, shape[shape.len() - 2])?)
    }

    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }

    fn named_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }

    fn named_buffers(&self) -> Vec<NamedBuffer<&Tensor>> {
        vec![NamedBuffer::new("pe", &self.pe, self.persistent)]
    }

    fn named_buffers_mut(&mut self) -> Vec<NamedBuffer<&mut Tensor>> {
        vec![NamedBuffer::new("pe", &mut self.pe, self.persistent)]
    }

    /// Computes `pe` again on its device and dtype (no draws from `g`).
    fn reset_parameters(&mut self, _g: &mut Generator) -> Result<()> {
        let (max_len, d_model) = (self.pe.shape()[0], self.pe.shape()[1]);
        self.pe = PositionalEncoding::table(d_model, max_len, self.pe.dtype(), self.pe.device())?;
        Ok(())
    }
}
