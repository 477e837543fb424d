//! The CPU store communicator and DDP's reducer, with ranks on threads (no GPU): sums that
//! are the same on every rank (chunked values included), broadcasts, gradients averaged over
//! the ranks, buckets launched in reverse parameter order as gradients become ready, and the
//! reducer's errors.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth::{DType, Device, Tensor};
use berth_distributed::bucket::BucketOptions;
use berth_distributed::testing::{run_store_ranks, Recording};
use berth_distributed::{broadcast_parameters, Communicator, DistError, Reducer};

const TIMEOUT: Duration = Duration::from_secs(30);

fn t(v: Vec<f32>) -> Tensor {
    let n = v.len();
    Tensor::from_vec(v, &[n], Device::Cpu).unwrap()
}

#[test]
fn all_reduce_sums_in_rank_order_and_every_rank_gets_the_same_bits() {
    // 300,000 elements: two store chunks of at most 262,144.
    let n = 300_000;
    let out = run_store_ranks(3, TIMEOUT, |c| {
        let r = c.rank() as f32;
        let x = t((0..n).map(|i| 0.1 * (i % 97) as f32 + r / 3.0).collect());
        c.all_reduce_sum(&x)?;
        // A second collective reuses nothing of the first (its keys are deleted).
        let y = t(vec![r + 1.0; 5]);
        c.all_reduce_sum(&y)?;
        Ok((x.to_vec::<f32>()?, y.to_vec::<f32>()?))
    })
    .unwrap();
    for i in [0usize, 1, 262_143, 262_144, n - 1] {
        let want = (0..3).fold(0.0f32, |acc, r| {
            acc + (0.1 * (i % 97) as f32 + r as f32 / 3.0)
        });
        assert_eq!(out[0].0[i], want, "element {i}");
    }
    assert_eq!(out[0].0, out[1].0);
    assert_eq!(out[0].0, out[2].0);
    for (_, y) in &out {
        assert_eq!(y, &vec![6.0; 5]);
    }
}

#[test]
fn broadcast_copies_rank_0s_parameters() {
    let out = run_store_ranks(2, TIMEOUT, |c| {
        let r = c.rank() as f32;
        let w = Tensor::from_vec(vec![r, r + 1.0, r + 2.0, r + 3.0], &[2, 2], Device::Cpu)?;
        let b = t(vec![10.0 * r]);
        broadcast_parameters(c, &[&w, &b])?;
        Ok((w.to_vec::<f32>()?, b.to_vec::<f32>()?))
    })
    .unwrap();
    for (w, b) in out {
        assert_eq!(w, [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(b, [0.0]);
    }
}

#[test]
fn a_cuda_tensor_or_a_bad_source_rank_is_a_typed_error() {
    let out = run_store_ranks(1, TIMEOUT, |c| {
        let x = Tensor::zeros(&[2], DType::F64, Device::Cpu)?;
        let dtype = c.all_reduce_sum(&x).unwrap_err();
        let src = c.broadcast(&t(vec![1.0]), 3).unwrap_err();
        Ok((dtype.to_string(), src.to_string()))
    })
    .unwrap();
    assert!(out[0].0.contains("contiguous f32"), "{}", out[0].0);
    assert!(out[0].1.contains("source rank 3"), "{}", out[0].1);
}

#[test]
fn buckets_launch_in_reverse_parameter_order_as_gradients_become_ready() {
    // A 4-parameter model: [100] [100, 100] [10, 100] [10] f32 (400, 40,000, 4,000 and 40
    // bytes). With bucket_cap_mb = 4,040 / 2^20 MiB (4,040 bytes), buckets in reverse order,
    // each closed once it reaches the limit: [3, 2] (4,040 B), [1] (40,000 B), [0].
    let shapes: [&[usize]; 4] = [&[100], &[100, 100], &[10, 100], &[10]];
    let options = BucketOptions {
        bucket_cap_mb: Some(4040.0 / (1 << 20) as f64),
        first_bucket_bytes: None,
    };
    let out = run_store_ranks(2, TIMEOUT, |c| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let rec = Recording::new(c, log.clone());
        let params: Vec<Tensor> = shapes
            .iter()
            .map(|s| Tensor::zeros(s, DType::F32, Device::Cpu).unwrap())
            .collect();
        let refs: Vec<&Tensor> = params.iter().collect();
        let mut reducer = Reducer::new(&rec, &refs, options)?;
        let buckets: Vec<Vec<usize>> = reducer.buckets().iter().map(|b| b.params.clone()).collect();
        let r = c.rank() as f32;
        let mut averaged = Vec::new();
        for step in 0..2 {
            // Backward's order: the last layer first.
            for i in (0..4).rev() {
                let n: usize = shapes[i].iter().product();
                let g = Tensor::from_vec(
                    (0..n)
                        .map(|k| (k + i) as f32 + 2.0 * r + step as f32)
                        .collect(),
                    shapes[i],
                    Device::Cpu,
                )?;
                log.lock().unwrap().push(format!("ready {i}"));
                reducer.mark_ready(i, &g)?;
            }
            let grads = reducer.finish()?;
            averaged = grads.iter().map(|g| g.to_vec::<f32>().unwrap()).collect();
        }
        let log = log.lock().unwrap().clone();
        Ok((buckets, log, averaged))
    })
    .unwrap();
    for (rank, (buckets, log, averaged)) in out.iter().enumerate() {
        assert_eq!(buckets, &[vec![3, 2], vec![1], vec![0]], "rank {rank}");
        let one_step = [
            "ready 3",
            "ready 2",
            "launch 1010 elements",
            "ready 1",
            "launch 10000 elements",
            "ready 0",
            "launch 100 elements",
        ];
        let want: Vec<&str> = one_step.iter().chain(&one_step).copied().collect();
        assert_eq!(log, &want, "rank {rank}");
        // The mean of rank 0's (k + i + step) and rank 1's (k + i + 2 + step), step 1.
        for (i, g) in averaged.iter().enumerate() {
            for (k, v) in g.iter().enumerate() {
                assert_eq!(
                    *v,
                    (k + i) as f32 + 1.0 + 1.0,
                    "rank {rank}, param {i}[{k}]"
                );
            }
        }
    }
}

#[test]
fn the_reducer_refuses_a_second_mark_a_wrong_shape_and_an_early_finish() {
    let out = run_store_ranks(1, TIMEOUT, |c| {
        let w = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu)?;
        let b = Tensor::zeros(&[2], DType::F32, Device::Cpu)?;
        let mut reducer = Reducer::new(c, &[&w, &b], BucketOptions::default())?;
        let shape = reducer.mark_ready(0, &b).unwrap_err();
        reducer.mark_ready(1, &b)?;
        let twice = reducer.mark_ready(1, &b).unwrap_err();
        let early = reducer.finish().unwrap_err();
        let none = Reducer::new(c, &[], BucketOptions::default()).unwrap_err();
        Ok([shape, twice, early, none].map(|e| {
            assert!(matches!(e, DistError::Reduction { .. }), "{e}");
            e.to_string()
        }))
    })
    .unwrap();
    let [shape, twice, early, none] = &out[0];
    assert!(
        shape.contains("shape [2]; the parameter has shape [2, 3]"),
        "{shape}"
    );
    assert!(twice.contains("marked ready twice"), "{twice}");
    assert!(early.contains("parameter(s) [0]"), "{early}");
    assert!(none.contains("no parameters"), "{none}");
}
