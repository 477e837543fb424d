//! The NCCL process group with one rank: every collective through NCCL's real code paths on
//! one GPU (ignored without one), and the typed error without a GPU or NCCL.

use std::time::Duration;

use berth::{Device, Tensor};
use berth_distributed::{DistError, ProcessGroup, ReduceOp, RendezvousEnv};

fn world_of_one() -> RendezvousEnv {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    RendezvousEnv {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: port,
    }
}

#[test]
fn without_a_gpu_or_nccl_init_is_a_typed_error() {
    if berth::cuda::is_available() && berth_cuda::nccl::nccl_unavailable_reason().is_none() {
        println!("a GPU and NCCL are present: the error path is not reachable here");
        return;
    }
    let err = ProcessGroup::init(world_of_one(), Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, DistError::Cuda(_)), "{err}");
    println!("{err}");
}

#[test]
#[ignore = "needs a CUDA GPU and NCCL: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without a GPU)"]
fn world_size_one_runs_every_collective() {
    if !berth_cuda::nccl::require_nccl("process group world_size_one_runs_every_collective") {
        return;
    }
    let pg = ProcessGroup::init(world_of_one(), Duration::from_secs(30)).unwrap();
    assert_eq!((pg.rank(), pg.world_size(), pg.device()), (0, 1, 0));
    let gpu = Device::Cuda(0);
    let data: Vec<f32> = (0..4096).map(|i| i as f32 - 100.0).collect();
    let t = Tensor::from_slice(&data, &[4096], gpu).unwrap();

    pg.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        data,
        "all_reduce(sum) of one rank"
    );
    pg.all_reduce(&t, ReduceOp::Avg).unwrap().wait().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), data, "all_reduce(avg)");
    pg.broadcast(&t, 0).unwrap().wait().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), data, "broadcast from rank 0");

    let out = Tensor::zeros(&[4096], berth::DType::F32, gpu).unwrap();
    pg.all_gather(&out, &t).unwrap().wait().unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), data, "all_gather");
    let out = Tensor::zeros(&[4096], berth::DType::F32, gpu).unwrap();
    pg.reduce_scatter(&out, &t, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), data, "reduce_scatter");
    pg.barrier().unwrap();

    // Refusals before anything is queued.
    let cpu = Tensor::from_slice(&data, &[4096], Device::Cpu).unwrap();
    assert!(matches!(
        pg.all_reduce(&cpu, ReduceOp::Sum).unwrap_err(),
        DistError::InvalidTensor {
            op: "all_reduce",
            ..
        }
    ));
    let short = Tensor::zeros(&[10], berth::DType::F32, gpu).unwrap();
    assert!(matches!(
        pg.all_gather(&short, &t).unwrap_err(),
        DistError::InvalidTensor {
            op: "all_gather",
            ..
        }
    ));
    assert!(matches!(
        pg.broadcast(&t, 1).unwrap_err(),
        DistError::Cuda(_)
    ));
    pg.finish().unwrap();
}
