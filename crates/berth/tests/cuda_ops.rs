//! GPU tests of berth's CUDA kernels against CPU references computed here, within 1e-5
//! relative in f32 and 1e-2 in bf16/f16 (issue 6 item 6). Ignored unless run with
//! `--include-ignored`; then skipped with a message without a GPU unless `BERTH_REQUIRE_GPU=1`.

use berth::alloc::{DevicePtr, MemoryBackend, StreamId};
use berth::cuda::blas::{self, MatrixView};
use berth::cuda::kernels::{self, contiguous_strides, BinaryOp, DeviceView, Reduction, UnaryOp};
use berth::cuda::rand as crand;
use berth::cuda::{CudaBackend, Stream};
use berth::ops::CmpOp;
use berth::DType;
use berth_cuda::copy::{copy_dtoh_async, copy_htod_async};

/// Device buffer (`cuMemAlloc`) freed on drop (test helper; berth's caching allocators are not
/// needed here): its address, its size in bytes, and the backend that allocated it.
struct Buf(u64, usize, CudaBackend);

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated by `self.2.malloc` in `upload`, freed once; `cuMemFree`
        // synchronises the device first.
        let _ = unsafe { self.2.free(DevicePtr(self.0), self.1, StreamId::DEFAULT) };
    }
}

fn upload<T: Copy>(data: &[T]) -> Buf {
    berth::cuda::bind_context(0).unwrap();
    let bytes = std::mem::size_of_val(data).max(1);
    let backend = CudaBackend::new(0).unwrap();
    let ptr = backend.malloc(bytes, StreamId::DEFAULT).unwrap().0;
    if !data.is_empty() {
        let stream = Stream::default_stream(0).unwrap();
        // SAFETY: `data` lives and is unwritten until the stream is synchronised below; the
        // copy covers exactly the allocation.
        unsafe {
            copy_htod_async(
                ptr,
                data.as_ptr().cast(),
                std::mem::size_of_val(data),
                &stream,
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
    }
    Buf(ptr, bytes, backend)
}

fn zeros<T: Copy + Default>(n: usize) -> Buf {
    upload(&vec![T::default(); n])
}

fn download<T: Copy + Default>(b: &Buf, n: usize) -> Vec<T> {
    berth::cuda::synchronize(0).unwrap();
    let mut out = vec![T::default(); n];
    let stream = Stream::default_stream(0).unwrap();
    // SAFETY: `b` holds at least `n` elements of `T`; `out` lives and is untouched until the
    // stream is synchronised below.
    unsafe {
        copy_dtoh_async(
            out.as_mut_ptr().cast(),
            b.0,
            std::mem::size_of_val(out.as_slice()),
            &stream,
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    out
}

/// Deterministic pseudo-random values in [-2, 2).
fn values(n: usize, seed: u64) -> Vec<f32> {
    crand::uniform_f32_reference(seed, 99, n, -2.0, 2.0)
}

fn assert_close(got: &[f32], want: &[f32], rtol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rtol * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn stream() -> kernels::RawStream {
    std::ptr::null_mut()
}

/// A binary kernel op and its CPU reference.
type BinaryCase = (BinaryOp, fn(f32, f32) -> f32);

/// A unary kernel op and its CPU reference.
type UnaryCase = (UnaryOp, fn(f32) -> f32);

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_ops_elementwise_broadcast_and_inplace_match_cpu() {
    if !berth::cuda::testing::require_gpu("cuda_ops_elementwise_broadcast_and_inplace_match_cpu") {
        return;
    }
    let (r, c) = (37, 129);
    let a = values(r * c, 1);
    let b = values(c, 2); // broadcast over rows
    let (da, db, dout) = (upload(&a), upload(&b), zeros::<f32>(r * c));
    let shape = [r, c];
    let cs = contiguous_strides(&shape);
    let bs = [0isize, 1];
    let v = |p: &Buf, s: &[isize]| DeviceView::new(p.0, DType::F32, s).strides.to_vec();
    let _ = v;
    let cases: [BinaryCase; 5] = [
        (BinaryOp::Add, |x, y| x + y),
        (BinaryOp::Sub, |x, y| x - y),
        (BinaryOp::Mul, |x, y| x * y),
        (BinaryOp::Div, |x, y| x / y),
        (BinaryOp::Maximum, f32::max),
    ];
    for (op, f) in cases {
        // SAFETY: buffers hold r*c (a, out) and c (b) f32 elements.
        unsafe {
            kernels::binary(
                0,
                stream(),
                op,
                &shape,
                DeviceView::new(dout.0, DType::F32, &cs),
                DeviceView::new(da.0, DType::F32, &cs),
                DeviceView::new(db.0, DType::F32, &bs),
            )
        }
        .unwrap();
        let want: Vec<f32> = (0..r * c).map(|i| f(a[i], b[i % c])).collect();
        assert_close(&download(&dout, r * c), &want, 1e-5, &format!("{op:?}"));
    }
    let unary: [UnaryCase; 6] = [
        (UnaryOp::Neg, |x| -x),
        (UnaryOp::Relu, |x| x.max(0.0)),
        (UnaryOp::Exp, f32::exp),
        (UnaryOp::Abs, f32::abs),
        (UnaryOp::MulScalar(2.5), |x| x * 2.5),
        (UnaryOp::PowScalar(2.0), |x| x.powf(2.0)),
    ];
    for (op, f) in unary {
        // SAFETY: as above.
        unsafe {
            kernels::unary(
                0,
                stream(),
                op,
                &shape,
                DeviceView::new(dout.0, DType::F32, &cs),
                DeviceView::new(da.0, DType::F32, &cs),
            )
        }
        .unwrap();
        let want: Vec<f32> = a.iter().map(|&x| f(x)).collect();
        assert_close(&download(&dout, r * c), &want, 1e-5, &format!("{op:?}"));
    }
    // In place on a transposed view: a^T += 0.5 * a^T (add_scaled_), then fill_.
    let t_shape = [c, r];
    let t_strides = [1isize, c as isize];
    let tv = DeviceView::new(da.0, DType::F32, &t_strides);
    // SAFETY: `tv` covers the r*c elements of `da` exactly once.
    unsafe { kernels::binary(0, stream(), BinaryOp::AddScaled(0.5), &t_shape, tv, tv, tv) }
        .unwrap();
    let want: Vec<f32> = a.iter().map(|&x| x + 0.5 * x).collect();
    assert_close(&download(&da, r * c), &want, 1e-5, "add_scaled_");
    // SAFETY: as above.
    unsafe { kernels::fill(0, stream(), &t_shape, tv, 3.25) }.unwrap();
    assert!(download::<f32>(&da, r * c).iter().all(|&x| x == 3.25));
    // Comparisons against a tensor and a scalar.
    let dmask = zeros::<u8>(r * c);
    let dvals = upload(&a);
    // SAFETY: bool output of r*c bytes.
    unsafe {
        kernels::compare(
            0,
            stream(),
            CmpOp::Gt,
            &shape,
            DeviceView::new(dmask.0, DType::Bool, &cs),
            DeviceView::new(dvals.0, DType::F32, &cs),
            Some(DeviceView::new(db.0, DType::F32, &bs)),
            0.0,
        )
    }
    .unwrap();
    let want: Vec<u8> = (0..r * c).map(|i| u8::from(a[i] > b[i % c])).collect();
    assert_eq!(download::<u8>(&dmask, r * c), want);
    // SAFETY: as above.
    unsafe {
        kernels::compare(
            0,
            stream(),
            CmpOp::Le,
            &shape,
            DeviceView::new(dmask.0, DType::Bool, &cs),
            DeviceView::new(dvals.0, DType::F32, &cs),
            None,
            0.5,
        )
    }
    .unwrap();
    let want: Vec<u8> = a.iter().map(|&x| u8::from(x <= 0.5)).collect();
    assert_eq!(download::<u8>(&dmask, r * c), want);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_ops_copy_casts_strided_to_contiguous() {
    if !berth::cuda::testing::require_gpu("cuda_ops_copy_casts_strided_to_contiguous") {
        return;
    }
    let (r, c) = (33, 65);
    let a = values(r * c, 3);
    let da = upload(&a);
    let t_shape = [c, r];
    let t_strides = [1isize, c as isize];
    let out_strides = contiguous_strides(&t_shape);
    let src = DeviceView::new(da.0, DType::F32, &t_strides);
    let transposed: Vec<f32> = (0..c * r).map(|i| a[(i % r) * c + i / r]).collect();
    // f32 -> bf16, f16, i32, bool, f64.
    let dbf = zeros::<u16>(r * c);
    let dh = zeros::<u16>(r * c);
    let di = zeros::<i32>(r * c);
    let db = zeros::<u8>(r * c);
    let dd = zeros::<f64>(r * c);
    for (buf, dt) in [
        (&dbf, DType::BF16),
        (&dh, DType::F16),
        (&di, DType::I32),
        (&db, DType::Bool),
        (&dd, DType::F64),
    ] {
        // SAFETY: each output holds r*c elements of its dtype.
        unsafe {
            kernels::copy(
                0,
                stream(),
                &t_shape,
                DeviceView::new(buf.0, dt, &out_strides),
                src,
            )
        }
        .unwrap();
    }
    let bf: Vec<f32> = download::<u16>(&dbf, r * c)
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect();
    let want_bf: Vec<f32> = transposed
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect();
    assert_eq!(
        bf, want_bf,
        "f32 -> bf16 rounds to nearest even like the half crate"
    );
    let h: Vec<f32> = download::<u16>(&dh, r * c)
        .iter()
        .map(|&b| half::f16::from_bits(b).to_f32())
        .collect();
    let want_h: Vec<f32> = transposed
        .iter()
        .map(|&x| half::f16::from_f32(x).to_f32())
        .collect();
    assert_eq!(h, want_h);
    let want_i: Vec<i32> = transposed.iter().map(|&x| x as i32).collect();
    assert_eq!(download::<i32>(&di, r * c), want_i);
    let want_b: Vec<u8> = transposed.iter().map(|&x| u8::from(x != 0.0)).collect();
    assert_eq!(download::<u8>(&db, r * c), want_b);
    let want_d: Vec<f64> = transposed.iter().map(|&x| f64::from(x)).collect();
    assert_eq!(download::<f64>(&dd, r * c), want_d);
    // bf16 -> f32 back is exact.
    let back = zeros::<f32>(r * c);
    // SAFETY: as above.
    unsafe {
        kernels::copy(
            0,
            stream(),
            &t_shape,
            DeviceView::new(back.0, DType::F32, &out_strides),
            DeviceView::new(dbf.0, DType::BF16, &out_strides),
        )
    }
    .unwrap();
    assert_eq!(download::<f32>(&back, r * c), want_bf);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_ops_reductions_match_cpu() {
    if !berth::cuda::testing::require_gpu("cuda_ops_reductions_match_cpu") {
        return;
    }
    let (r, c) = (300, 257);
    let a = values(r * c, 4);
    let da = upload(&a);
    let shape = [r, c];
    let cs = contiguous_strides(&shape);
    let inp = DeviceView::new(da.0, DType::F32, &cs);
    let row_sums: Vec<f32> = (0..r)
        .map(|i| {
            a[i * c..(i + 1) * c]
                .iter()
                .map(|&x| f64::from(x))
                .sum::<f64>() as f32
        })
        .collect();
    let col_sums: Vec<f32> = (0..c)
        .map(|j| (0..r).map(|i| f64::from(a[i * c + j])).sum::<f64>() as f32)
        .collect();
    let total: f64 = a.iter().map(|&x| f64::from(x)).sum();
    let out_r = zeros::<f32>(r);
    let out_c = zeros::<f32>(c);
    let out_1 = zeros::<f32>(1);
    // SAFETY: outputs hold r, c and 1 f32.
    unsafe {
        kernels::sum(
            0,
            stream(),
            &shape,
            inp,
            &[1],
            false,
            DeviceView::new(out_r.0, DType::F32, &[1]),
        )
        .unwrap();
        kernels::sum(
            0,
            stream(),
            &shape,
            inp,
            &[0],
            true,
            DeviceView::new(out_c.0, DType::F32, &[1]),
        )
        .unwrap();
        kernels::sum(
            0,
            stream(),
            &shape,
            inp,
            &[0, 1],
            false,
            DeviceView::new(out_1.0, DType::F32, &[]),
        )
        .unwrap();
    }
    // Sums of signed values: compare with a tolerance relative to the sum of magnitudes.
    let got_r = download::<f32>(&out_r, r);
    for (i, (&g, &w)) in got_r.iter().zip(&row_sums).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * 2.0 * c as f32,
            "row sum {i}: {g} vs {w}"
        );
    }
    let got_c = download::<f32>(&out_c, c);
    for (j, (&g, &w)) in got_c.iter().zip(&col_sums).enumerate() {
        let w = w / r as f32;
        assert!((g - w).abs() <= 1e-5 * 2.0, "col mean {j}: {g} vs {w}");
    }
    let got_1 = download::<f32>(&out_1, 1)[0];
    assert!(
        (f64::from(got_1) - total).abs() <= 1e-5 * 2.0 * (r * c) as f64,
        "{got_1} vs {total}"
    );
    // argmax over dim 1, max over all, argmin over dim 0.
    let idx = zeros::<i64>(r);
    let mx = zeros::<f32>(1);
    let idx0 = zeros::<i64>(c);
    // SAFETY: as above.
    unsafe {
        kernels::arg_reduce(
            0,
            stream(),
            kernels::ArgReduce::Max,
            &shape,
            inp,
            &[1],
            None,
            Some(DeviceView::new(idx.0, DType::I64, &[1])),
        )
        .unwrap();
        kernels::arg_reduce(
            0,
            stream(),
            kernels::ArgReduce::Max,
            &shape,
            inp,
            &[0, 1],
            Some(DeviceView::new(mx.0, DType::F32, &[])),
            None,
        )
        .unwrap();
        kernels::arg_reduce(
            0,
            stream(),
            kernels::ArgReduce::Min,
            &shape,
            inp,
            &[0],
            None,
            Some(DeviceView::new(idx0.0, DType::I64, &[1])),
        )
        .unwrap();
    }
    let first_max = |s: &[f32]| {
        let m = s.iter().copied().fold(f32::MIN, f32::max);
        s.iter().position(|&x| x == m).unwrap() as i64
    };
    let want: Vec<i64> = (0..r).map(|i| first_max(&a[i * c..(i + 1) * c])).collect();
    assert_eq!(download::<i64>(&idx, r), want);
    assert_eq!(
        download::<f32>(&mx, 1)[0],
        a.iter().copied().fold(f32::MIN, f32::max)
    );
    let want0: Vec<i64> = (0..c)
        .map(|j| {
            let col: Vec<f32> = (0..r).map(|i| -a[i * c + j]).collect();
            first_max(&col)
        })
        .collect();
    assert_eq!(download::<i64>(&idx0, c), want0);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_ops_softmax_and_cross_entropy_match_cpu() {
    if !berth::cuda::testing::require_gpu("cuda_ops_softmax_and_cross_entropy_match_cpu") {
        return;
    }
    let (n, k) = (64, 10);
    let x: Vec<f32> = values(n * k, 5).iter().map(|v| v * 4.0).collect();
    let t: Vec<i64> = (0..n).map(|i| (i * 7 % k) as i64).collect();
    let (dx, dt) = (upload(&x), upload(&t));
    let (dsm, dlsm, dloss, dgrad) = (
        zeros::<f32>(n * k),
        zeros::<f32>(n * k),
        zeros::<f32>(1),
        zeros::<f32>(n * k),
    );
    // SAFETY: contiguous buffers of the stated sizes.
    unsafe {
        kernels::softmax(0, stream(), DType::F32, &[n, k], 1, false, dx.0, dsm.0).unwrap();
        kernels::softmax(0, stream(), DType::F32, &[n, k], 1, true, dx.0, dlsm.0).unwrap();
        kernels::cross_entropy(
            0,
            stream(),
            DType::F32,
            n,
            k,
            dx.0,
            dt.0,
            Reduction::Mean,
            dloss.0,
        )
        .unwrap();
        kernels::cross_entropy_backward(
            0,
            stream(),
            DType::F32,
            n,
            k,
            dx.0,
            dt.0,
            Reduction::Mean,
            0,
            dgrad.0,
        )
        .unwrap();
    }
    let mut sm = vec![0f32; n * k];
    let mut lsm = vec![0f32; n * k];
    let mut loss = 0f64;
    let mut grad = vec![0f32; n * k];
    for i in 0..n {
        let row = &x[i * k..(i + 1) * k];
        let m = row.iter().copied().fold(f32::MIN, f32::max);
        let s: f32 = row.iter().map(|&v| (v - m).exp()).sum();
        for j in 0..k {
            sm[i * k + j] = (row[j] - m).exp() / s;
            lsm[i * k + j] = row[j] - m - s.ln();
            grad[i * k + j] = (sm[i * k + j] - if j as i64 == t[i] { 1.0 } else { 0.0 }) / n as f32;
        }
        loss -= f64::from(lsm[i * k + t[i] as usize]);
    }
    assert_close(&download(&dsm, n * k), &sm, 1e-5, "softmax");
    assert_close(&download(&dlsm, n * k), &lsm, 1e-5, "log_softmax");
    assert_close(
        &download(&dloss, 1),
        &[(loss / n as f64) as f32],
        1e-5,
        "cross_entropy",
    );
    assert_close(
        &download(&dgrad, n * k),
        &grad,
        1e-5,
        "cross_entropy_backward",
    );
}

fn cpu_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|l| f64::from(a[i * k + l]) * f64::from(b[l * n + j]))
                .sum::<f64>() as f32;
        }
    }
    c
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_ops_matmul_f32_bf16_transposed_and_batched_match_cpu() {
    if !berth::cuda::testing::require_gpu(
        "cuda_ops_matmul_f32_bf16_transposed_and_batched_match_cpu",
    ) {
        return;
    }
    assert!(!blas::allow_tf32(), "TF32 is off by default");
    let (m, k, n) = (65, 130, 33);
    let a = values(m * k, 6);
    let w = values(n * k, 7); // W [n, k]; compute a @ W^T (nn.Linear)
    let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
    let want = cpu_matmul(&a, &wt, m, k, n);
    let (da, dw, dc) = (upload(&a), upload(&w), zeros::<f32>(m * n));
    let av = MatrixView {
        ptr: da.0,
        batch_stride: 0,
        row_stride: k as i64,
        col_stride: 1,
    };
    let bv = MatrixView {
        ptr: dw.0,
        batch_stride: 0,
        row_stride: 1,
        col_stride: k as i64,
    };
    let cv = MatrixView {
        ptr: dc.0,
        batch_stride: 0,
        row_stride: n as i64,
        col_stride: 1,
    };
    // SAFETY: buffers of m*k, n*k and m*n f32.
    unsafe { blas::matmul(0, stream(), DType::F32, 1, m, n, k, av, bv, cv) }.unwrap();
    let got = download::<f32>(&dc, m * n);
    for (i, (&g, &wv)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - wv).abs() <= 1e-5 * 4.0 * k as f32 / 10.0,
            "f32 matmul [{i}]: {g} vs {wv}"
        );
    }
    // bf16: inputs rounded to bf16, f32 accumulation, output rounded to bf16.
    let to_bf = |v: &[f32]| {
        v.iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect::<Vec<u16>>()
    };
    let (ab, wb) = (to_bf(&a), to_bf(&w));
    let a_r: Vec<f32> = ab
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect();
    let wt_r: Vec<f32> = (0..k * n)
        .map(|i| half::bf16::from_bits(wb[(i % n) * k + i / n]).to_f32())
        .collect();
    let want_b = cpu_matmul(&a_r, &wt_r, m, k, n);
    let (dab, dwb, dcb) = (upload(&ab), upload(&wb), zeros::<u16>(m * n));
    // SAFETY: as above, in bf16.
    unsafe {
        blas::matmul(
            0,
            stream(),
            DType::BF16,
            1,
            m,
            n,
            k,
            MatrixView { ptr: dab.0, ..av },
            MatrixView { ptr: dwb.0, ..bv },
            MatrixView { ptr: dcb.0, ..cv },
        )
    }
    .unwrap();
    let got_b: Vec<f32> = download::<u16>(&dcb, m * n)
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect();
    for (i, (&g, &wv)) in got_b.iter().zip(&want_b).enumerate() {
        assert!(
            (g - wv).abs() <= 1e-2 * wv.abs().max(1.0),
            "bf16 matmul [{i}]: {g} vs {wv}"
        );
    }
    // Batched with a broadcast right operand: [3, m, k] @ [k, n].
    let batch = 3;
    let a3 = values(batch * m * k, 8);
    let b2 = values(k * n, 9);
    let (da3, db2, dc3) = (upload(&a3), upload(&b2), zeros::<f32>(batch * m * n));
    // SAFETY: buffers of batch*m*k, k*n and batch*m*n f32.
    unsafe {
        blas::matmul(
            0,
            stream(),
            DType::F32,
            batch,
            m,
            n,
            k,
            MatrixView {
                ptr: da3.0,
                batch_stride: (m * k) as i64,
                row_stride: k as i64,
                col_stride: 1,
            },
            MatrixView {
                ptr: db2.0,
                batch_stride: 0,
                row_stride: n as i64,
                col_stride: 1,
            },
            MatrixView {
                ptr: dc3.0,
                batch_stride: (m * n) as i64,
                row_stride: n as i64,
                col_stride: 1,
            },
        )
    }
    .unwrap();
    let got3 = download::<f32>(&dc3, batch * m * n);
    for bi in 0..batch {
        let want = cpu_matmul(&a3[bi * m * k..(bi + 1) * m * k], &b2, m, k, n);
        for (i, (&g, &wv)) in got3[bi * m * n..(bi + 1) * m * n]
            .iter()
            .zip(&want)
            .enumerate()
        {
            assert!(
                (g - wv).abs() <= 1e-5 * 4.0 * k as f32 / 10.0,
                "batched [{bi}, {i}]: {g} vs {wv}"
            );
        }
    }
    // Integer matmul is a typed error, as in PyTorch.
    // SAFETY: rejected before any device access.
    let e = unsafe { blas::matmul(0, stream(), DType::I64, 1, m, n, k, av, bv, cv) }.unwrap_err();
    assert!(
        e.to_string()
            .contains("not implemented on CUDA for dtype i64"),
        "{e}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_ops_philox_rand_matches_cpu_reference_bit_for_bit() {
    if !berth::cuda::testing::require_gpu("cuda_ops_philox_rand_matches_cpu_reference_bit_for_bit")
    {
        return;
    }
    let n = 100_003;
    let d = zeros::<f32>(n);
    let dist = berth::device_kernels::RandomDist::Uniform {
        low: -1.0,
        high: 3.0,
    };
    // SAFETY: `d` holds n f32.
    unsafe { crand::fill_random_with(0, stream(), DType::F32, n, dist, d.0, 1234, 7) }.unwrap();
    let got = download::<f32>(&d, n);
    assert_eq!(got, crand::uniform_f32_reference(1234, 7, n, -1.0, 3.0));
    // Normal: moments of 100k draws, and the generator advances between calls.
    crand::manual_seed(0, 42);
    let normal = berth::device_kernels::RandomDist::Normal {
        mean: 1.0,
        std: 2.0,
    };
    // SAFETY: as above.
    let (s1, o1) = unsafe { crand::fill_random(0, stream(), DType::F32, n, normal, d.0) }.unwrap();
    let z = download::<f32>(&d, n);
    let mean = z.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
    let var = z
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n as f64;
    assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
    assert!((var.sqrt() - 2.0).abs() < 0.03, "std {}", var.sqrt());
    // SAFETY: as above.
    let (s2, o2) = unsafe { crand::fill_random(0, stream(), DType::F32, n, normal, d.0) }.unwrap();
    assert_eq!((s1, o1, s2, o2), (42, 0, 42, 1));
    assert_ne!(download::<f32>(&d, n), z);
}
