//! The data-parallel path without a GPU: ranks on threads over the store communicator
//! (`berth_distributed::testing`), against training in one process on the same global
//! batches.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth::nn::Module;
use berth::{DType, Device, Generator, Tensor};
use berth_data::DistributedSampler;
use berth_distributed::testing::{run_store_ranks, Recording};
use berth_distributed::Communicator;

use super::ddp::{ddp_model, ddp_step, write_checkpoint};
use super::mlp::INPUTS;
use super::report::{MemoryReport, TrainReport};
use super::{train_step, Mlp, Sgd};

const TIMEOUT: Duration = Duration::from_secs(60);
const HIDDEN: usize = 16;
const SEED: u64 = 5;
const GLOBAL_BATCH: usize = 64;
const STEPS: usize = 12;

/// Step `s`'s global batch: `x [64, 784]` f32 from `randn`, `y [64]` i64 labels in 0..10.
fn global_batch(s: usize) -> (Tensor, Tensor) {
    let mut g = Generator::new(1000 + s as u64);
    let x = Tensor::randn_with(&[GLOBAL_BATCH, INPUTS], DType::F32, Device::Cpu, &mut g).unwrap();
    let y: Vec<i64> = (0..GLOBAL_BATCH)
        .map(|i| ((i * 7 + s * 3) % 10) as i64)
        .collect();
    (
        x,
        Tensor::from_vec(y, &[GLOBAL_BATCH], Device::Cpu).unwrap(),
    )
}

/// Rank `rank`'s share of `(x, y)`: the rows a `DistributedSampler` without shuffling deals
/// it (rank, rank + world, …), as the sharded loader does.
fn shard(x: &Tensor, y: &Tensor, world: usize, rank: usize) -> (Tensor, Tensor) {
    let rows: Vec<i64> = DistributedSampler::new(GLOBAL_BATCH, world, rank)
        .unwrap()
        .shuffle(false)
        .indices_for_epoch(0)
        .into_iter()
        .map(|i| i as i64)
        .collect();
    let n = rows.len();
    let idx = Tensor::from_vec(rows, &[n], Device::Cpu).unwrap();
    (
        x.index_select(0, &idx).unwrap(),
        y.index_select(0, &idx).unwrap(),
    )
}

fn params_of(model: &Mlp) -> Vec<Vec<f32>> {
    model.params().iter().map(|p| p.to_vec().unwrap()).collect()
}

/// Training in one process: `train_step` on each whole global batch.
fn single_process() -> Vec<Vec<f32>> {
    let mut g = Generator::new(SEED);
    let model = Mlp::new(HIDDEN, Device::Cpu, &mut g).unwrap();
    let mut opt = Sgd::new(0.05, 0.9);
    let loss = Tensor::zeros(&[], DType::F32, Device::Cpu).unwrap();
    for s in 0..STEPS {
        let (x, y) = global_batch(s);
        train_step(&model, &mut opt, &x, &y, &loss).unwrap();
    }
    params_of(&model)
}

/// Each rank of a `world`-rank job trains on its shard of the same global batches; returns
/// every rank's parameters. Rank 1 starts from different parameters, which the broadcast from
/// rank 0 replaces.
fn data_parallel(world: usize, bucket_cap_mb: Option<f64>) -> Vec<Vec<Vec<f32>>> {
    run_store_ranks(world, TIMEOUT, |c| {
        let seed = if c.rank() == 0 { SEED } else { SEED + 99 };
        let (model, mut reducer) =
            ddp_model(c, HIDDEN, seed, bucket_cap_mb, Device::Cpu).map_err(to_dist)?;
        let mut opt = Sgd::new(0.05, 0.9);
        let loss = Tensor::zeros(&[], DType::F32, Device::Cpu)?;
        for s in 0..STEPS {
            let (x, y) = global_batch(s);
            let (x, y) = shard(&x, &y, world, c.rank());
            ddp_step(&model, &mut opt, &mut reducer, &x, &y, &loss).map_err(to_dist)?;
        }
        Ok(params_of(&model))
    })
    .unwrap()
}

fn to_dist(e: anyhow::Error) -> berth_distributed::DistError {
    berth_distributed::DistError::Reduction {
        what: format!("{e:#}"),
    }
}

#[test]
fn two_ranks_end_where_one_process_ends_on_the_same_global_batches() {
    let reference = single_process();
    // Small buckets, so that several all-reduces run per step.
    let ranks = data_parallel(2, Some(0.001));
    assert_eq!(
        ranks[0], ranks[1],
        "the ranks' parameters are bit-identical"
    );
    let mut worst = 0.0f32;
    for (p, (got, want)) in ranks[0].iter().zip(&reference).enumerate() {
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            let d = (a - b).abs();
            assert!(
                d <= 1e-6 + 1e-5 * b.abs(),
                "param {p}[{i}]: data-parallel {a}, one process {b}"
            );
            worst = worst.max(d);
        }
    }
    // The runs trained: the parameters moved from their initial values.
    let mut g = Generator::new(SEED);
    let init = params_of(&Mlp::new(HIDDEN, Device::Cpu, &mut g).unwrap());
    let moved: f32 = init[2]
        .iter()
        .zip(&ranks[0][2])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        moved > 1e-3,
        "fc2.weight moved at most {moved}; worst difference {worst}"
    );
}

#[test]
fn one_rank_through_the_ddp_path_is_bit_identical_to_one_process() {
    // World size 1: no scaling, a sum over one rank; the same kernels as train_step.
    assert_eq!(data_parallel(1, None)[0], single_process());
}

#[test]
fn buckets_launch_during_backward_in_reverse_parameter_order() {
    // hidden 16: fc1.weight 50,176 B, fc1.bias 64 B, fc2.weight 640 B, fc2.bias 40 B. With
    // 700-byte buckets, in reverse order: [fc2.bias, fc2.weight, fc1.bias] (744 B), [fc1.weight].
    let cap = 700.0 / (1 << 20) as f64;
    let logs = run_store_ranks(2, TIMEOUT, |c| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let rec = Recording::new(c, log.clone());
        let (model, mut reducer) =
            ddp_model(&rec, HIDDEN, SEED, Some(cap), Device::Cpu).map_err(to_dist)?;
        let buckets: Vec<Vec<usize>> = reducer.buckets().iter().map(|b| b.params.clone()).collect();
        let (x, y) = global_batch(0);
        let (x, y) = shard(&x, &y, 2, rec.rank());
        let acts = model.forward_train(&x)?;
        model.backward_with(&x, &acts, &y, |i, g| {
            log.lock().unwrap().push(format!("ready {i}"));
            reducer.mark_ready(i, g)
        })?;
        reducer.finish()?;
        let log = log.lock().unwrap().clone();
        Ok((buckets, log))
    })
    .unwrap();
    for (buckets, log) in logs {
        assert_eq!(buckets, [vec![3, 2, 1], vec![0]]);
        assert_eq!(
            log,
            [
                "ready 3",
                "ready 2",
                "ready 1",
                "launch 186 elements",
                "ready 0",
                "launch 12544 elements"
            ]
        );
    }
}

#[test]
fn rank_0_alone_writes_the_checkpoint() {
    let dir = std::env::temp_dir().join(format!("berth-ddp-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut g = Generator::new(SEED);
    let model = Mlp::new(HIDDEN, Device::Cpu, &mut g).unwrap();
    let report = TrainReport {
        device: Device::Cpu,
        epochs: Vec::new(),
        memory: MemoryReport::start(Device::Cpu)
            .unwrap()
            .finish(Device::Cpu)
            .unwrap(),
        implicit_syncs_per_step: 0.0,
        state_dict: model.state_dict().unwrap(),
        ranks: Vec::new(),
    };
    let one = dir.join("rank1.safetensors");
    assert_eq!(write_checkpoint(1, Some(&one), &report).unwrap(), None);
    assert!(!one.exists(), "rank 1 wrote {}", one.display());
    let zero = dir.join("rank0.safetensors");
    assert_eq!(
        write_checkpoint(0, Some(&zero), &report).unwrap(),
        Some(zero.clone())
    );
    let back = berth::nn::load_state_dict_file(&zero).unwrap();
    assert_eq!(
        back["fc2.bias"].to_vec::<f32>().unwrap(),
        model.params()[3].to_vec::<f32>().unwrap()
    );
    std::fs::remove_dir_all(&dir).ok();
}
