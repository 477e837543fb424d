//! `LocalGroup`, one process driving several GPUs: the refusals of `LocalGroup::new` without a
//! GPU (the device count faked where one is needed), and every collective with exact values
//! over `[0]` and, where two GPUs are visible, `[0, 1]` (ignored without a GPU).

use berth::{DType, Device, Tensor};
use berth_cuda::CudaError;
use berth_distributed::{DistError, LocalGroup, ReduceOp};

fn cuda_err(r: Result<LocalGroup, DistError>) -> CudaError {
    match r.unwrap_err() {
        DistError::Cuda(e) => e,
        other => panic!("expected DistError::Cuda, got {other:?}"),
    }
}

#[test]
fn new_refuses_an_empty_list_a_repeated_device_and_a_missing_device() {
    let err = cuda_err(LocalGroup::new(&[]));
    assert!(
        matches!(
            err,
            CudaError::InvalidArgument {
                op: "ncclCommInitAll",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("the device list is empty"),
        "{err}"
    );
    // A device count without a GPU: checks that need one see 2 devices on this thread.
    let _two = berth_cuda::testing::fake_device_count(2);
    let err = cuda_err(LocalGroup::new(&[0, 1, 0]));
    assert_eq!(
        err.to_string(),
        "ncclCommInitAll: invalid argument: cuda:0 is listed twice (positions 0 and 2); list each device once"
    );
    let err = cuda_err(LocalGroup::new(&[1, 2]));
    assert_eq!(err, CudaError::InvalidDevice { index: 2, count: 2 });
}

#[test]
fn without_a_gpu_or_nccl_new_is_a_typed_error() {
    if berth::cuda::is_available() && berth_cuda::nccl::nccl_unavailable_reason().is_none() {
        println!("a GPU and NCCL are present: the error path is not reachable here");
        return;
    }
    let err = cuda_err(LocalGroup::new(&[0]));
    assert!(
        matches!(
            err,
            CudaError::Unavailable { .. } | CudaError::NcclUnavailable { .. }
        ),
        "{err}"
    );
    println!("{err}");
}

/// Rank `r`'s values: `(r + 1) · 1000 + i`, exact in f32.
fn values(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((r + 1) * 1000 + i) as f32).collect()
}

fn on(devices: &[usize], len: usize) -> Vec<Tensor> {
    devices
        .iter()
        .enumerate()
        .map(|(r, &d)| Tensor::from_slice(&values(r, len), &[len], Device::Cuda(d as u16)).unwrap())
        .collect()
}

fn zeros(devices: &[usize], len: usize) -> Vec<Tensor> {
    devices
        .iter()
        .map(|&d| Tensor::zeros(&[len], DType::F32, Device::Cuda(d as u16)).unwrap())
        .collect()
}

fn read(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Every collective over `devices`, each result compared with the value computed on the host.
fn run_every_collective(devices: &[usize]) {
    let g = LocalGroup::new(devices).unwrap();
    let n = devices.len();
    assert_eq!((g.devices(), g.world_size()), (devices, n));
    let len = 1024;
    let sum: Vec<f32> = (0..len)
        .map(|i| (0..n).map(|r| values(r, len)[i]).sum())
        .collect();

    let ts = on(devices, len);
    g.all_reduce(&ts, ReduceOp::Sum).unwrap().wait().unwrap();
    for (r, t) in ts.iter().enumerate() {
        assert_eq!(read(t), sum, "all_reduce(sum) over {devices:?}, rank {r}");
    }
    let ts = on(devices, len);
    g.all_reduce(&ts, ReduceOp::Max).unwrap().wait().unwrap();
    for t in &ts {
        assert_eq!(
            read(t),
            values(n - 1, len),
            "all_reduce(max) over {devices:?}"
        );
    }
    let ts = on(devices, len);
    g.all_reduce(&ts, ReduceOp::Avg).unwrap().wait().unwrap();
    let avg: Vec<f32> = sum.iter().map(|s| s / n as f32).collect();
    for t in &ts {
        assert_eq!(read(t), avg, "all_reduce(avg) over {devices:?}");
    }

    let root = n - 1;
    let ts = on(devices, len);
    g.broadcast(&ts, root).unwrap().wait().unwrap();
    for t in &ts {
        assert_eq!(read(t), values(root, len), "broadcast from rank {root}");
    }

    let ins = on(devices, len);
    let outs = zeros(devices, n * len);
    g.all_gather(&outs, &ins).unwrap().wait().unwrap();
    let gathered: Vec<f32> = (0..n).flat_map(|r| values(r, len)).collect();
    for t in &outs {
        assert_eq!(
            read(t),
            gathered,
            "all_gather over {devices:?}, in rank order"
        );
    }

    let ins = on(devices, n * len);
    let outs = zeros(devices, len);
    g.reduce_scatter(&outs, &ins, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    let full: Vec<f32> = (0..n * len)
        .map(|i| (0..n).map(|r| values(r, n * len)[i]).sum())
        .collect();
    for (r, t) in outs.iter().enumerate() {
        assert_eq!(
            read(t),
            full[r * len..(r + 1) * len],
            "reduce_scatter(sum) over {devices:?}: rank {r} keeps its share"
        );
    }
    let w = g.all_reduce(&on(devices, len), ReduceOp::Sum).unwrap();
    g.barrier().unwrap();
    assert!(
        w.is_completed().unwrap(),
        "a barrier waits earlier collectives"
    );
    w.wait().unwrap();

    // Refusals, before anything is queued.
    let cpu: Vec<Tensor> = (0..n)
        .map(|r| Tensor::from_slice(&values(r, len), &[len], Device::Cpu).unwrap())
        .collect();
    assert!(matches!(
        g.all_reduce(&cpu, ReduceOp::Sum).unwrap_err(),
        DistError::InvalidTensor {
            op: "all_reduce",
            ..
        }
    ));
    let ts = on(devices, len);
    assert!(matches!(
        g.all_reduce(&ts[..n - 1], ReduceOp::Sum).unwrap_err(),
        DistError::InvalidTensor {
            op: "all_reduce",
            ..
        }
    ));
    assert!(matches!(
        g.broadcast(&ts, n).unwrap_err(),
        DistError::Cuda(CudaError::InvalidArgument {
            op: "broadcast",
            ..
        })
    ));
    // Outputs of `len / 2` elements, where an all-gather needs `n × len`.
    let short = zeros(devices, len / 2);
    assert!(matches!(
        g.all_gather(&short, &ts).unwrap_err(),
        DistError::InvalidTensor {
            op: "all_gather",
            ..
        }
    ));
    if n >= 2 {
        let swapped: Vec<Tensor> = ts.iter().rev().map(Tensor::alias).collect();
        let err = g.all_reduce(&swapped, ReduceOp::Sum).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "all_reduce: tensor 0 is on cuda:{}; it must be on cuda:{}, device 0 of the group {devices:?}",
                devices[n - 1],
                devices[0]
            )
        );
    }
    // The group still works after its refusals.
    let ts = on(devices, len);
    g.all_reduce(&ts, ReduceOp::Sum).unwrap().wait().unwrap();
    assert_eq!(read(&ts[0]), sum, "all_reduce after the refusals");
}

#[test]
#[ignore = "needs a CUDA GPU and NCCL: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without a GPU)"]
fn one_device_runs_every_collective() {
    if !berth_cuda::nccl::require_nccl("local group one_device_runs_every_collective") {
        return;
    }
    run_every_collective(&[0]);
}

#[test]
#[ignore = "needs two CUDA GPUs and NCCL: run with --include-ignored (skips with one GPU; BERTH_REQUIRE_GPU=1 fails without any)"]
fn two_devices_run_every_collective() {
    if !berth_cuda::nccl::require_nccl("local group two_devices_run_every_collective") {
        return;
    }
    let count = berth::cuda::device_count();
    if count < 2 {
        println!(
            "skipping local group two_devices_run_every_collective: {count} GPU visible, it needs 2"
        );
        return;
    }
    run_every_collective(&[0, 1]);
    // Rank order follows the list, not the device numbers.
    run_every_collective(&[1, 0]);
}
