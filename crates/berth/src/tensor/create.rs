//! Constructors: `zeros`, `ones`, `full`, `empty`, `arange`, `rand`, `randn`, `from_vec`,
//! `from_slice`, `scalar`, and `cat` / `stack`.

use super::Tensor;
use crate::device_kernels::dispatch::{alloc_tensor, kernels_for};
use crate::device_kernels::interface::{RandomDist, View};
use crate::random::{with_global, Generator};
use crate::{DType, Device, Element, Error, Result, Storage};

impl Tensor {
    /// A tensor of `shape` filled with `value` (converted to `dtype`) on `device`
    /// (`torch.full`). On meta nothing is allocated.
    ///
    /// # Errors
    /// 1. [`Error::ValueOverflow`] when `value` does not fit `dtype` (PyTorch: "value cannot be
    ///    converted to type `uint8_t` without overflow"; NaN and ±inf never fit an integer dtype;
    ///    bool takes any value, non-zero → `true`).
    /// 2. [`Error::NumelOverflow`] / [`Error::StorageSizeOverflow`] for a shape too large to
    ///    describe, on every device (meta too).
    /// 3. An unusable device (`cuda:5` with one GPU, `mps`); out of memory
    ///    ([`Error::HostOutOfMemory`] on the CPU).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full_op("full", shape, value, dtype, device)
    }

    /// [`Tensor::full`] whose errors name `op` (`zeros`, `ones`, ...), the function called.
    pub(crate) fn full_op(
        op: &'static str,
        shape: &[usize],
        value: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        crate::ops::infer::fill_value(op, value, dtype)?;
        let device = device.canonical()?;
        let t = alloc_tensor(device, shape, dtype, op)?;
        if !(device.is_meta() || device.is_cpu() && value == 0.0) {
            kernels_for(device, op)?.fill(View::of(&t), value)?;
        }
        Ok(t)
    }

    /// Zeros (`torch.zeros`).
    ///
    /// # Errors
    /// As [`Tensor::full`].
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full_op("zeros", shape, 0.0, dtype, device)
    }

    /// Ones (`torch.ones`).
    ///
    /// # Errors
    /// As [`Tensor::full`].
    pub fn ones(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full_op("ones", shape, 1.0, dtype, device)
    }

    /// A tensor whose contents are unspecified (`torch.empty`; the CPU happens to zero-fill,
    /// do not rely on it).
    ///
    /// # Errors
    /// As [`Tensor::full`].
    pub fn empty(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::empty_op("empty", shape, dtype, device)
    }

    /// [`Tensor::empty`] whose errors name `op` (`to_empty`, ...), the function called.
    pub(crate) fn empty_op(
        op: &'static str,
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let device = device.canonical()?;
        alloc_tensor(device, shape, dtype, op)
    }

    /// A zero-filled tensor with the shape, dtype and device of `other` (`torch.zeros_like`).
    ///
    /// # Errors
    /// As [`Tensor::full`].
    pub fn zeros_like(other: &Tensor) -> Result<Tensor> {
        Tensor::full_op(
            "zeros_like",
            other.shape(),
            0.0,
            other.dtype(),
            other.device(),
        )
    }

    /// `[start, start + step, ...)` up to `end` exclusive (`torch.arange`); the length is
    /// `ceil((end - start) / step)`. The checks and their order are PyTorch's
    /// (`aten/src/ATen/native/RangeFactories.cpp`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] with PyTorch's message:
    /// 1. "step must be nonzero" for a zero or NaN step;
    /// 2. "unsupported range: 0 -> inf" for a NaN or infinite `start` or `end`;
    /// 3. "upper bound and larger bound inconsistent with step sign" for a step pointing away
    ///    from `end`;
    /// 4. "invalid size, possible overflow?" for a length beyond `i64::MAX`.
    ///
    /// Then the errors of [`Tensor::full`], for the length in `dtype` (a length too large to
    /// allocate is [`Error::StorageSizeOverflow`] or [`Error::HostOutOfMemory`] naming the
    /// bytes of `dtype`, never a panic). On meta nothing is allocated, however long.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let bad = |what: String| Error::InvalidArgument { op: "arange", what };
        // PyTorch prints doubles with `<<`: `nan`, `inf`, `-inf`.
        let show = |x: f64| {
            if x.is_nan() {
                "nan".to_string()
            } else {
                x.to_string()
            }
        };
        if step == 0.0 || step.is_nan() {
            return Err(bad(format!(
                "step must be nonzero (got {}); pass a positive or negative step",
                show(step)
            )));
        }
        if !start.is_finite() || !end.is_finite() {
            return Err(bad(format!(
                "unsupported range: {} -> {} (start and end must be finite numbers)",
                show(start),
                show(end)
            )));
        }
        if !((step > 0.0 && end >= start) || (step < 0.0 && end <= start)) {
            return Err(bad(format!(
                "upper bound and larger bound inconsistent with step sign (start {}, end {}, \
                 step {}: a positive step needs end >= start, a negative one end <= start)",
                show(start),
                show(end),
                show(step)
            )));
        }
        let size = ((end - start) / step).ceil();
        if !(size >= 0.0 && size <= i64::MAX as f64) {
            return Err(bad(format!(
                "invalid size, possible overflow? ({} -> {} by {} has {size} elements, more \
                 than {})",
                show(start),
                show(end),
                show(step),
                i64::MAX
            )));
        }
        let n = size as usize;
        // The output is checked and allocated in its own dtype first: on meta nothing more is
        // done (no data at all), and a size error or out of memory names the bytes of `dtype`.
        let device = device.canonical()?;
        if device.is_meta() {
            return alloc_tensor(device, &[n], dtype, "arange");
        }
        // Filled on the host straight into a tensor of `dtype` (no f64 buffer), then moved.
        let t = alloc_tensor(Device::Cpu, &[n], dtype, "arange")?;
        crate::cpu::arange(View::of(&t), start, step)?;
        if device.is_cpu() {
            Ok(t)
        } else {
            t.to_device(device)
        }
    }

    /// Uniform samples on `[0, 1)` from the global generator (`torch.rand`; seed it with
    /// [`crate::manual_seed`]).
    ///
    /// # Errors
    /// As [`Tensor::full`]; a non-float dtype.
    pub fn rand(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        with_global(|g| Tensor::rand_with(shape, dtype, device, g))
    }

    /// Standard-normal samples from the global generator (`torch.randn`).
    ///
    /// # Errors
    /// As [`Tensor::rand`].
    pub fn randn(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        with_global(|g| Tensor::randn_with(shape, dtype, device, g))
    }

    /// Uniform samples on `[0, 1)` from an explicit generator.
    ///
    /// # Errors
    /// As [`Tensor::rand`].
    pub fn rand_with(
        shape: &[usize],
        dtype: DType,
        device: Device,
        g: &mut Generator,
    ) -> Result<Tensor> {
        Tensor::random(
            shape,
            dtype,
            device,
            RandomDist::Uniform {
                low: 0.0,
                high: 1.0,
            },
            g,
        )
    }

    /// Standard-normal samples from an explicit generator.
    ///
    /// # Errors
    /// As [`Tensor::rand`].
    pub fn randn_with(
        shape: &[usize],
        dtype: DType,
        device: Device,
        g: &mut Generator,
    ) -> Result<Tensor> {
        Tensor::random(
            shape,
            dtype,
            device,
            RandomDist::Normal {
                mean: 0.0,
                std: 1.0,
            },
            g,
        )
    }

    /// Samples of `dist` from `g` (uniform bounds / normal parameters in `dist`). Errors name
    /// `rand` for a uniform `dist`, `randn` for a normal one.
    ///
    /// # Errors
    /// As [`Tensor::rand`].
    pub fn random(
        shape: &[usize],
        dtype: DType,
        device: Device,
        dist: RandomDist,
        g: &mut Generator,
    ) -> Result<Tensor> {
        let op = match dist {
            RandomDist::Uniform { .. } => "rand",
            RandomDist::Normal { .. } => "randn",
        };
        Tensor::random_op(op, shape, dtype, device, dist, g)
    }

    /// [`Tensor::random`] whose errors name `op` (`randn`, `Linear`, ...), the function called.
    pub(crate) fn random_op(
        op: &'static str,
        shape: &[usize],
        dtype: DType,
        device: Device,
        dist: RandomDist,
        g: &mut Generator,
    ) -> Result<Tensor> {
        crate::ops::infer::require_float(op, dtype)?;
        let device = device.canonical()?;
        let t = alloc_tensor(device, shape, dtype, op)?;
        if !device.is_meta() {
            let (seed, offset) = g.advance(t.numel() as u64);
            kernels_for(device, op)?.random(View::of(&t), dist, seed, offset)?;
        }
        Ok(t)
    }

    /// A tensor holding `data` with `shape` on `device` (`torch.tensor`).
    ///
    /// # Errors
    /// [`Error::DataLength`] when `data.len()` is not the product of `shape`;
    /// [`Error::NumelOverflow`]; device errors; out of memory.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: Device) -> Result<Tensor> {
        let n = crate::layout::checked_numel(shape, "from_slice")?;
        if n != data.len() {
            return Err(Error::DataLength {
                op: "from_slice",
                shape: shape.to_vec(),
                expected: n,
                got: data.len(),
            });
        }
        let device = device.canonical()?;
        let nbytes = crate::layout::checked_nbytes(shape, T::DTYPE, "from_slice")?;
        if device.is_meta() {
            return Ok(Tensor::from_contiguous(
                Storage::meta(nbytes),
                shape,
                T::DTYPE,
            ));
        }
        let storage = Storage::try_host_zeroed(nbytes)?;
        {
            let mut w = storage.write_host("from_slice")?;
            for (o, &v) in w.typed_mut::<T::Repr>().iter_mut().zip(data) {
                *o = v.to_repr();
            }
        }
        let t = Tensor::from_contiguous(storage, shape, T::DTYPE);
        if device.is_cpu() {
            Ok(t)
        } else {
            t.to_device(device)
        }
    }

    /// As [`Tensor::from_slice`], taking ownership.
    ///
    /// # Errors
    /// As [`Tensor::from_slice`].
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::from_slice(&data, shape, device)
    }

    /// A 0-dim tensor on the CPU holding `value`.
    pub fn scalar<T: Element>(value: T) -> Tensor {
        let storage = Storage::host_zeroed(T::DTYPE.size_in_bytes());
        if let Ok(mut w) = storage.write_host("scalar") {
            w.typed_mut::<T::Repr>()[0] = value.to_repr();
        }
        Tensor::from_contiguous(storage, &[], T::DTYPE)
    }

    /// Concatenate along `dim` (`torch.cat`): every tensor has the same rank, dtype and device,
    /// and equal sizes except in `dim`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list; shape, dtype or device mismatch.
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        Tensor::cat_op("cat", tensors, dim)
    }

    /// [`Tensor::cat`] whose errors name `op` (`stack`), the function called.
    fn cat_op(op: &'static str, tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::InvalidArgument {
            op,
            what: "expected a non-empty list of tensors".into(),
        })?;
        let d = crate::layout::wrap_dim(dim, first.rank().max(1), op)?;
        if first.rank() == 0 {
            return Err(Error::Shape {
                op,
                what: "zero-dimensional tensors cannot be concatenated; use stack".into(),
            });
        }
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            crate::ops::infer::same_device(op, first, t)?;
            crate::ops::infer::same_dtype(op, first, t)?;
            let ok = t.rank() == first.rank()
                && t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(i, (a, b))| i == d || a == b);
            if !ok {
                return Err(Error::Shape {
                    op,
                    what: format!(
                        "sizes of tensors must match except in dimension {d}: got {:?} and {:?}",
                        first.shape(),
                        t.shape()
                    ),
                });
            }
            // Saturates: an overflowing total is then refused by `alloc_tensor`.
            shape[d] = shape[d].saturating_add(t.shape()[d]);
        }
        let out = alloc_tensor(first.device(), &shape, first.dtype(), op)?;
        if !first.device().is_meta() {
            let k = kernels_for(first.device(), op)?;
            let mut off = 0;
            for t in tensors {
                let len = t.shape()[d];
                let dst = out.layout().narrow(d, off, len);
                k.copy(
                    View {
                        storage: out.storage(),
                        layout: &dst,
                        dtype: out.dtype(),
                    },
                    View::of(t),
                )?;
                off += len;
            }
        }
        Ok(out)
    }

    /// Stack along a new dimension `dim` (`torch.stack`): all tensors have the same shape.
    ///
    /// # Errors
    /// As [`Tensor::cat`], plus differing shapes; [`Error::DimOutOfRange`] with `op: "stack"`
    /// for a `dim` outside `[-rank-1, rank]`.
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::InvalidArgument {
            op: "stack",
            what: "expected a non-empty list of tensors".into(),
        })?;
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::Shape {
                op: "stack",
                what: format!(
                    "stack expects each tensor to be equal size, but got {:?} and {:?}",
                    first.shape(),
                    t.shape()
                ),
            });
        }
        // The new dimension ranges over [-rank-1, rank]; checked here so the error names stack.
        let d = crate::layout::wrap_dim(dim, first.rank() + 1, "stack")? as isize;
        let views = tensors
            .iter()
            .map(|t| t.unsqueeze(d))
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat_op("stack", &views.iter().collect::<Vec<_>>(), d)
    }
}
