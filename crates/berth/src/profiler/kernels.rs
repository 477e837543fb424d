//! The profiling [`DeviceKernels`]: what [`kernels_for`](crate::device_kernels::kernels_for)
//! hands out while a profiler is active. It times each kernel call on the host (and, on CUDA
//! under activity `Cuda`, with events on the current stream), records it as an
//! [`OpRecord`], opens a `tracing` span for it (target `berth::profiler`, name `op`), then
//! calls the device's own kernels.

use super::device_time::{self, Target};
use super::record::{self, OpRecord};
use crate::device_kernels::interface::{DeviceKernels, RandomDist, SgdParam, View};
use crate::ops::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::{Device, Result, Storage, Tensor};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

/// A device's kernels seen through the profiler, for the front-end op `op`.
struct Profiled {
    inner: &'static dyn DeviceKernels,
    op: &'static str,
}

/// A device kind's kernels (by their [`DeviceKernels::kind`]: `cpu` or `cuda`) and an op name.
/// Not the kernels' address: both are zero-sized statics, which may share one.
type Key = (Device, &'static str);

/// The wrappers, one per (device kind, op name): a few dozen in all, made once and kept.
static WRAPPERS: OnceLock<Mutex<HashMap<Key, &'static Profiled>>> = OnceLock::new();

thread_local! {
    /// This thread's wrappers by (device kind, address and length of the op's name): a lookup
    /// without the global lock or hashing the name's bytes, on every op while profiling.
    static LOCAL: std::cell::RefCell<HashMap<(Device, usize, usize), &'static Profiled>> =
        std::cell::RefCell::new(HashMap::new());
}

/// `inner` for the front-end op `op`, profiled.
pub(crate) fn wrap(
    inner: &'static dyn DeviceKernels,
    op: &'static str,
) -> &'static dyn DeviceKernels {
    let local_key = (inner.kind(), op.as_ptr() as usize, op.len());
    // `try_with`: a storage freed while the thread's locals are torn down still finds its
    // wrapper, through the shared map.
    if let Ok(Some(w)) = LOCAL.try_with(|l| l.borrow().get(&local_key).copied()) {
        return w;
    }
    let w = wrap_shared(inner, op);
    let _ = LOCAL.try_with(|l| l.borrow_mut().insert(local_key, w));
    w
}

/// The process-wide wrapper of (`inner`'s kind, `op`), made on first use.
fn wrap_shared(inner: &'static dyn DeviceKernels, op: &'static str) -> &'static Profiled {
    let key = (inner.kind(), op);
    let map = WRAPPERS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = record::lock(map);
    let w: &'static Profiled = map
        .entry(key)
        .or_insert_with(|| Box::leak(Box::new(Profiled { inner, op })));
    w
}

fn numel(v: &View<'_>) -> u64 {
    v.layout.shape().iter().product::<usize>() as u64
}

fn bytes(v: &View<'_>) -> u64 {
    numel(v) * v.dtype.size_in_bytes() as u64
}

/// The op being timed: host start and, on CUDA, the stream and its start event.
struct Timing {
    start_ns: u64,
    device: Device,
    cuda: Option<(crate::cuda::Stream, device_time::Started)>,
    _span: tracing::span::EnteredSpan,
}

fn begin(name: &'static str, device: Device) -> Timing {
    record::open(name);
    let cuda = match device.index() {
        Some(i) if device.is_cuda() && record::PROFILE_CUDA.load(Ordering::Relaxed) => {
            device_time::start_current(usize::from(i))
        }
        _ => None,
    };
    let span = tracing::trace_span!(target: "berth::profiler", "op", name, device = %device);
    Timing {
        start_ns: record::now_ns(),
        device,
        cuda,
        _span: span.entered(),
    }
}

fn end(t: Timing, name: &'static str, out: Option<View<'_>>, inputs: &[View<'_>]) {
    end_many(t, name, out.as_slice(), inputs);
}

/// [`end`] for an op writing several outputs (`outs`; the record's dtype and output shape are
/// the first one's, its bytes written all of theirs).
fn end_many(t: Timing, name: &'static str, outs: &[View<'_>], inputs: &[View<'_>]) {
    let end_ns = record::now_ns();
    record::close();
    let shapes = record::RECORD_SHAPES.load(Ordering::Relaxed);
    let out = outs.first();
    let op = OpRecord {
        name,
        device: t.device,
        dtype: out.map_or(crate::DType::F32, |o| o.dtype),
        input_shapes: if shapes {
            inputs.iter().map(|v| v.layout.shape().to_vec()).collect()
        } else {
            Vec::new()
        },
        output_shape: match out {
            Some(o) if shapes => o.layout.shape().to_vec(),
            _ => Vec::new(),
        },
        bytes_read: inputs.iter().map(bytes).sum(),
        bytes_written: outs.iter().map(bytes).sum(),
        thread: record::thread_id(),
        start_ns: t.start_ns,
        end_ns,
        device_span: None,
    };
    let i = record::push_op(op);
    if let Some((stream, start)) = t.cuda {
        device_time::finish(Target::Op(i), &stream, start);
    }
}

/// The device of a kernel call: where its output lives.
fn device_of(v: &View<'_>) -> Device {
    v.storage.device_of()
}

impl Profiled {
    /// Runs `f` as one recorded op writing `dst` (in place when `dst` is also an input).
    fn run<R>(
        &self,
        dst: View<'_>,
        inputs: &[View<'_>],
        f: impl FnOnce(&dyn DeviceKernels) -> Result<R>,
    ) -> Result<R> {
        let t = begin(self.op, device_of(&dst));
        let r = f(self.inner);
        end(t, self.op, Some(dst), inputs);
        r
    }
}

impl DeviceKernels for Profiled {
    fn kind(&self) -> Device {
        self.inner.kind()
    }

    fn alloc(&self, device: Device, nbytes: usize) -> Result<Storage> {
        // Not an op: the allocator event is recorded where the storage is made.
        self.inner.alloc(device, nbytes)
    }

    fn copy(&self, dst: View<'_>, src: View<'_>) -> Result<()> {
        self.run(dst, &[src], |k| k.copy(dst, src))
    }

    fn fill(&self, dst: View<'_>, value: f64) -> Result<()> {
        self.run(dst, &[], |k| k.fill(dst, value))
    }

    fn unary(&self, op: UnaryOp, dst: View<'_>, src: Option<View<'_>>) -> Result<()> {
        let inputs = [src.unwrap_or(dst)];
        self.run(dst, &inputs, |k| k.unary(op, dst, src))
    }

    fn binary(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        lhs: Option<View<'_>>,
        rhs: View<'_>,
    ) -> Result<()> {
        let inputs = [lhs.unwrap_or(dst), rhs];
        self.run(dst, &inputs, |k| k.binary(op, dst, lhs, rhs))
    }

    fn scalar(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        src: Option<View<'_>>,
        scalar: f64,
        scalar_first: bool,
    ) -> Result<()> {
        let inputs = [src.unwrap_or(dst)];
        self.run(dst, &inputs, |k| {
            k.scalar(op, dst, src, scalar, scalar_first)
        })
    }

    fn compare(
        &self,
        op: CmpOp,
        dst: View<'_>,
        lhs: View<'_>,
        rhs: Option<View<'_>>,
        scalar: f64,
    ) -> Result<()> {
        let mut inputs = vec![lhs];
        inputs.extend(rhs);
        self.run(dst, &inputs, |k| k.compare(op, dst, lhs, rhs, scalar))
    }

    fn reduce(&self, op: ReduceOp, dst: View<'_>, src: View<'_>, dims: &[usize]) -> Result<()> {
        self.run(dst, &[src], |k| k.reduce(op, dst, src, dims))
    }

    fn matmul(&self, dst: View<'_>, lhs: View<'_>, rhs: View<'_>) -> Result<()> {
        self.run(dst, &[lhs, rhs], |k| k.matmul(dst, lhs, rhs))
    }

    fn softmax(&self, dst: View<'_>, src: View<'_>, log: bool) -> Result<()> {
        self.run(dst, &[src], |k| k.softmax(dst, src, log))
    }

    fn cross_entropy(&self, dst: View<'_>, logits: View<'_>, targets: View<'_>) -> Result<()> {
        self.run(dst, &[logits, targets], |k| {
            k.cross_entropy(dst, logits, targets)
        })
    }

    fn cross_entropy_backward(
        &self,
        dst: View<'_>,
        logits: View<'_>,
        targets: View<'_>,
    ) -> Result<()> {
        self.run(dst, &[logits, targets], |k| {
            k.cross_entropy_backward(dst, logits, targets)
        })
    }

    fn random(&self, dst: View<'_>, dist: RandomDist, seed: u64, offset: u64) -> Result<()> {
        self.run(dst, &[], |k| k.random(dst, dist, seed, offset))
    }

    fn add_scaled(&self, dst: View<'_>, src: View<'_>, alpha: f64) -> Result<()> {
        self.run(dst, &[dst, src], |k| k.add_scaled(dst, src, alpha))
    }

    fn relu_backward(&self, dst: View<'_>, grad: View<'_>, input: View<'_>) -> Result<()> {
        self.run(dst, &[grad, input], |k| k.relu_backward(dst, grad, input))
    }

    fn index_select(
        &self,
        dst: View<'_>,
        src: View<'_>,
        index: View<'_>,
        dims: [usize; 3],
    ) -> Result<()> {
        // What is read is the gathered slices (`dst`'s size) and the indices.
        self.run(dst, &[dst, index], |k| {
            k.index_select(dst, src, index, dims)
        })
    }

    fn sgd_momentum(
        &self,
        params: &[SgdParam<'_>],
        momentum: f64,
        lr: f64,
        first_step: bool,
    ) -> Result<()> {
        // One op for the whole multi-tensor update: it reads p, g (and v after the first
        // step) and writes p and v of every parameter.
        let Some(first) = params.first() else {
            return self.inner.sgd_momentum(params, momentum, lr, first_step);
        };
        let t = begin(self.op, device_of(&first.param));
        let r = self.inner.sgd_momentum(params, momentum, lr, first_step);
        let outs: Vec<View<'_>> = params.iter().flat_map(|p| [p.param, p.velocity]).collect();
        let inputs: Vec<View<'_>> = params
            .iter()
            .flat_map(|p| {
                let v = (!first_step).then_some(p.velocity);
                [Some(p.param), Some(p.grad), v].into_iter().flatten()
            })
            .collect();
        end_many(t, self.op, &outs, &inputs);
        r
    }

    fn transfer(&self, src: &Tensor, device: Device, non_blocking: bool) -> Result<Tensor> {
        // The op on the host track; its copies are recorded by the transfer code (with their
        // own device spans), so no events here.
        let start_ns = record::now_ns();
        record::open(self.op);
        let span = tracing::trace_span!(target: "berth::profiler", "op", name = self.op,
            device = %device)
        .entered();
        let r = self.inner.transfer(src, device, non_blocking);
        drop(span);
        record::close();
        let shapes = record::RECORD_SHAPES.load(Ordering::Relaxed);
        let nbytes = (src.numel() * src.dtype().size_in_bytes()) as u64;
        record::push_op(OpRecord {
            name: self.op,
            device,
            dtype: src.dtype(),
            input_shapes: if shapes {
                vec![src.shape().to_vec()]
            } else {
                Vec::new()
            },
            output_shape: if shapes {
                src.shape().to_vec()
            } else {
                Vec::new()
            },
            bytes_read: nbytes,
            bytes_written: if r.is_ok() { nbytes } else { 0 },
            thread: record::thread_id(),
            start_ns,
            end_ns: record::now_ns(),
            device_span: None,
        });
        r
    }
}
