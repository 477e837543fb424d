//! Known PyTorch DataLoader surprises (shared worker seeds, option validation, pinning custom
//! batches, hung workers, shuffle order coupled to a global RNG, device work in workers), each
//! test named after the behaviour it checks, with the public bug report above it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::{DType, Device, Tensor};
use berth_data::{
    impl_collate, worker_info, worker_rng, CollateFn, DataError, DataLoader, DataLoaderBuilder,
    Dataset, Generator, MapTensors, PinTarget, Result,
};

use crate::pinned::sim_pinned;
use crate::util::{collect_batches, range, Flaky};

/// 8 items; item i is (i, a draw from the worker's generator, a draw from berth's global RNG,
/// the worker's seed − id).
struct Draws;

impl Dataset for Draws {
    type Item = Vec<u64>;
    fn len(&self) -> usize {
        8
    }
    fn get(&self, i: usize) -> Result<Vec<u64>> {
        let w = worker_info().expect("inside a worker");
        let own = worker_rng().next_u64();
        let global = berth::random::with_global(|g| g.next_f64().to_bits());
        Ok(vec![
            i as u64,
            own,
            global,
            w.seed.wrapping_sub(w.id as u64),
        ])
    }
}

type DrawsFn = fn(Vec<Vec<u64>>) -> Result<Vec<Vec<u64>>>;
type DrawsLoader = DataLoader<Draws, CollateFn<DrawsFn>>;

fn draws(dl: &DrawsLoader) -> Vec<Vec<u64>> {
    dl.iter().map(|b| b.unwrap().remove(0)).collect()
}

fn draws_loader(persistent: bool, seed: u64) -> DrawsLoader {
    let f: DrawsFn = Ok;
    DataLoaderBuilder::with_collate(Draws, CollateFn(f))
        .num_workers(4)
        .persistent_workers(persistent)
        .generator(Generator::new(seed))
        .build()
        .unwrap()
}

/// Workers never share one random seed:
/// <https://github.com/pytorch/pytorch/issues/5059>
#[test]
fn workers_get_distinct_seeds_and_new_draws_each_epoch() {
    for persistent in [false, true] {
        let dl = draws_loader(persistent, 5);
        let e1 = draws(&dl);
        let e2 = draws(&dl);
        assert_eq!(
            e1.iter().map(|d| d[0]).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        let mut own: Vec<u64> = e1.iter().map(|d| d[1]).collect();
        own.sort_unstable();
        own.dedup();
        assert_eq!(
            own.len(),
            8,
            "8 distinct draws from the workers' generators"
        );
        let mut global: Vec<u64> = e1.iter().map(|d| d[2]).collect();
        global.sort_unstable();
        global.dedup();
        assert_eq!(
            global.len(),
            8,
            "8 distinct draws from the shared global RNG"
        );
        for e in [&e1, &e2] {
            assert!(
                e.iter().all(|d| d[3] == e[0][3]),
                "seed - id is one base seed per epoch"
            );
        }
        for (a, b) in e1.iter().zip(&e2) {
            assert_ne!(a[1], b[1], "epoch 2 draws differ (persistent={persistent})");
        }
        if persistent {
            assert_eq!(e1[0][3], e2[0][3], "persistent workers are not reseeded");
        } else {
            assert_ne!(e1[0][3], e2[0][3], "a new base seed every epoch");
        }
        // Same loader generator, same draws.
        let again = draws_loader(persistent, 5);
        let r1 = draws(&again);
        assert_eq!(
            r1.iter().map(|d| d[1]).collect::<Vec<_>>(),
            e1.iter().map(|d| d[1]).collect::<Vec<_>>()
        );
    }
}

/// Bad option combinations fail at construction with PyTorch's messages:
/// <https://github.com/pytorch/pytorch/issues/68576>
#[test]
fn option_validation_messages_are_pytorchs() {
    let msg = |b: DataLoaderBuilder<_, _>| -> String {
        let r: Result<DataLoader<_, _>> = b.build();
        r.unwrap_err().to_string()
    };
    let b = || DataLoaderBuilder::with_collate(range(10), CollateFn(|v: Vec<usize>| Ok(v)));
    assert_eq!(
        msg(b().num_workers(0).persistent_workers(true)),
        "persistent_workers option needs num_workers > 0"
    );
    assert!(msg(b().num_workers(0).prefetch_factor(2))
        .starts_with("prefetch_factor option could only be specified in multiprocessing."));
    assert_eq!(
        msg(b().num_workers(2).prefetch_factor(-1)),
        "prefetch_factor option should be non-negative"
    );
    assert_eq!(
        msg(b().num_workers(-1)),
        "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing."
    );
    // 100,000 worker threads aborted the process (no memory for a stack guard page: no error
    // to catch), so the builder refuses more than MAX_WORKERS.
    for n in [1025, 100_000, isize::MAX] {
        let m = msg(b().num_workers(n));
        assert!(
            m.starts_with(&format!("num_workers={n}: at most 1024 worker threads (each is a thread of this process; this machine has ")),
            "{m}"
        );
    }
    assert!(b().num_workers(1024).build().is_ok());
    assert_eq!(
        msg(b().timeout(-1.0)),
        "timeout option should be non-negative"
    );
    assert_eq!(
        msg(b().num_workers(1).timeout(f64::NAN)),
        "timeout option should be non-negative"
    );
    for huge in [1e20, f64::INFINITY] {
        assert_eq!(
            msg(b().num_workers(1).timeout(huge)),
            "timeout option is too large: at most u64::MAX seconds; use 0 for no limit"
        );
    }
    assert_eq!(
        msg(b()
            .shuffle(true)
            .sampler(berth_data::SequentialSampler::new(10))),
        "sampler option is mutually exclusive with shuffle"
    );
    let bs =
        || berth_data::BatchSampler::new(berth_data::SequentialSampler::new(10), 2, false).unwrap();
    assert_eq!(
        msg(b().batch_sampler(bs()).batch_size(2)),
        "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
    );
    assert_eq!(
        msg(b().batch_size(0)),
        "batch_size should be a positive integer value, but got batch_size=0"
    );
    let err = b()
        .num_workers(0)
        .persistent_workers(true)
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        DataError::InvalidOption {
            option: "persistent_workers",
            ..
        }
    ));
    // Defaults.
    let d0 = b().build().unwrap();
    assert_eq!(d0.prefetch_factor(), None);
    let d2 = b().num_workers(2).build().unwrap();
    assert_eq!(d2.prefetch_factor(), Some(2));
    assert!(b().num_workers(0).persistent_workers(false).build().is_ok());
    // Lengths.
    let dl = b().batch_size(3).build().unwrap();
    assert_eq!(dl.len(), 4);
    assert_eq!(
        collect_batches(&dl),
        vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
    );
    assert_eq!(b().batch_size(3).drop_last(true).build().unwrap().len(), 3);
}

/// Two items `ones(2)`.
struct Ones;
impl Dataset for Ones {
    type Item = Tensor;
    fn len(&self) -> usize {
        2
    }
    fn get(&self, _: usize) -> Result<Tensor> {
        Ok(Tensor::ones(&[2], DType::F32, Device::Cpu)?)
    }
}

fn stack(items: Vec<Tensor>) -> Result<Tensor> {
    let refs: Vec<&Tensor> = items.iter().collect();
    Ok(Tensor::stack(&refs, 0)?)
}

/// A named tuple of two tensors.
struct Pair {
    x: Tensor,
    y: Tensor,
}
impl_collate!(Pair { x, y });

/// An object holding a tensor, with no pinning (no tensor traversal) of its own.
struct Plain {
    t: Tensor,
}
impl MapTensors for Plain {}

/// An object with its own `pin_memory()`: its own tensor traversal, which pinning goes through.
struct Custom {
    t: Tensor,
    calls: Arc<AtomicUsize>,
}
impl MapTensors for Custom {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Custom {
            t: f(self.t)?,
            calls: self.calls,
        })
    }
}

fn pinned_batch<B: MapTensors + Send + 'static>(
    target: &PinTarget,
    f: impl Fn(Vec<Tensor>) -> Result<B> + Send + Sync + 'static,
) -> B {
    let dl = DataLoaderBuilder::with_collate(Ones, CollateFn(f))
        .batch_size(2)
        .num_workers(1)
        .pin_memory_target(target.clone())
        .pin_memory(true)
        .build()
        .unwrap();
    assert!(dl.pin_memory());
    let mut it = dl.iter();
    it.next().unwrap().unwrap()
}

/// Pinning keeps custom batch types:
/// <https://github.com/pytorch/pytorch/issues/70158>
#[test]
fn pin_memory_keeps_custom_batch_types() {
    let (target, _) = sim_pinned();
    // Named struct: same type, each tensor pinned.
    let p: Pair = pinned_batch(&target, |v| {
        let x = stack(v)?;
        let y = x.clone()?;
        Ok(Pair { x, y })
    });
    assert!(p.x.is_pinned() && p.y.is_pinned());
    assert_eq!(p.x.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    // Map: the same map type, pinned.
    let m: BTreeMap<String, Tensor> = pinned_batch(&target, |v| {
        Ok(BTreeMap::from([("x".to_string(), stack(v)?)]))
    });
    assert!(m["x"].is_pinned());
    // Plain object: returned unchanged, not pinned (documented; a one-time warning).
    let plain: Plain = pinned_batch(&target, |v| Ok(Plain { t: stack(v)? }));
    assert!(!plain.t.is_pinned());
    assert_eq!(plain.t.shape(), &[2, 2]);
    // Own pin_memory(): called once, its result returned.
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = Arc::clone(&calls);
    let c: Custom = pinned_batch(&target, move |v| {
        Ok(Custom {
            t: stack(v)?,
            calls: Arc::clone(&c2),
        })
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(c.t.is_pinned());
}

/// Pinned batches keep their types and are collated straight into pinned memory:
/// <https://github.com/pytorch/pytorch/issues/70158>
#[test]
fn default_collate_writes_straight_into_pinned_buffers() {
    let (target, host) = sim_pinned();
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[6, 4])
        .unwrap();
    let y = Tensor::arange(0.0, 6.0, 1.0, DType::I64, Device::Cpu).unwrap();
    let ds = berth_data::TensorDataset::new(vec![x, y]).unwrap();
    let dl = DataLoader::builder(ds)
        .batch_size(4)
        .num_workers(2)
        .pin_memory_target(target)
        .pin_memory(true)
        .build()
        .unwrap();
    let batches: Vec<Vec<Tensor>> = dl.iter().map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 2);
    for b in &batches {
        assert!(b.iter().all(Tensor::is_pinned));
    }
    assert_eq!(
        batches[1][0].to_vec::<f32>().unwrap(),
        (16..24).map(|v| v as f32).collect::<Vec<_>>()
    );
    assert_eq!(batches[1][1].to_vec::<i64>().unwrap(), vec![4, 5]);
    assert_eq!(
        host.buffers.load(Ordering::SeqCst),
        4,
        "one pinned buffer per tensor per batch, no second copy"
    );
}

/// Without an accelerator, `pin_memory` warns and loads unpinned batches (never silently):
/// <https://github.com/ultralytics/yolov3/issues/1713>
#[test]
fn pin_memory_without_accelerator_warns_and_loads() {
    if berth::cuda::is_available() {
        eprintln!("skipped: a CUDA device is present");
        return;
    }
    let x = Tensor::ones(&[4, 2], DType::F32, Device::Cpu).unwrap();
    let dl = DataLoader::builder(berth_data::TensorDataset::new(vec![x]).unwrap())
        .batch_size(2)
        .pin_memory(true)
        .build()
        .unwrap();
    assert!(!dl.pin_memory());
    let b: Vec<Vec<Tensor>> = dl.iter().map(|b| b.unwrap()).collect();
    assert_eq!(b.len(), 2);
    assert!(!b[0][0].is_pinned());
}

/// `pin_memory_device` follows PyTorch's rule (1.13–2.5): alone it pins nothing (a warning);
/// with `pin_memory` it names the accelerator the pinned batches are for; a device that is not
/// an accelerator pins nothing (a warning).
#[test]
fn pin_memory_device_needs_pin_memory_and_an_accelerator() {
    let (target, _) = sim_pinned();
    let cuda0: Device = "cuda:0".parse().unwrap();
    let build = |pin: bool, device: Device| {
        let x = Tensor::ones(&[4, 2], DType::F32, Device::Cpu).unwrap();
        DataLoader::builder(berth_data::TensorDataset::new(vec![x]).unwrap())
            .batch_size(2)
            .pin_memory_target(target.clone())
            .pin_memory_device(device)
            .pin_memory(pin)
            .build()
            .unwrap()
    };
    let alone = build(false, cuda0);
    assert!(!alone.pin_memory());
    assert_eq!(alone.pin_memory_device(), None);
    assert!(!alone.iter().next().unwrap().unwrap()[0].is_pinned());

    let pinned = build(true, cuda0);
    assert!(pinned.pin_memory());
    assert_eq!(pinned.pin_memory_device(), Some(cuda0));
    assert!(pinned.iter().next().unwrap().unwrap()[0].is_pinned());

    let on_cpu = build(true, Device::Cpu);
    assert!(!on_cpu.pin_memory());
    assert!(!on_cpu.iter().next().unwrap().unwrap()[0].is_pinned());
}

/// A stuck worker times out and a dead one is reported, never a hang:
/// <https://github.com/pytorch/pytorch/issues/2474>,
/// <https://github.com/pytorch/pytorch/issues/1355>
#[test]
fn stuck_worker_times_out_and_dead_worker_is_reported() {
    // (a) stuck: get sleeps 2.5 s, timeout 1 s.
    let dl = DataLoaderBuilder::with_collate(
        Flaky {
            len: 1,
            fail: vec![],
            panic: vec![],
            sleep_ms: 2500,
        },
        CollateFn(|v: Vec<usize>| Ok(v)),
    )
    .num_workers(1)
    .timeout(1.0)
    .build()
    .unwrap();
    let mut it = dl.iter();
    let t0 = Instant::now();
    let err = it.next().unwrap().unwrap_err();
    let waited = t0.elapsed();
    drop(it); // joins the worker once its item is done
    assert!(
        err.to_string()
            .starts_with("DataLoader timed out after 1 seconds"),
        "{err}"
    );
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_millis(2400),
        "{waited:?}"
    );
    // (a) with timeout 0: the item is waited for.
    let dl = DataLoaderBuilder::with_collate(
        Flaky {
            len: 1,
            fail: vec![],
            panic: vec![],
            sleep_ms: 300,
        },
        CollateFn(|v: Vec<usize>| Ok(v)),
    )
    .num_workers(1)
    .build()
    .unwrap();
    assert_eq!(dl.iter().next().unwrap().unwrap(), vec![0]);
    // (b) a worker whose setup fails: a prompt error with the cause, no hang. (A worker
    // thread that dies is reported too: `worker_failures::worker_thread_that_dies_is_reported_not_hung`.)
    let dl = DataLoaderBuilder::with_collate(range(4), CollateFn(|v: Vec<usize>| Ok(v)))
        .num_workers(1)
        .worker_init_fn(|_| panic!("worker died"))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let err = dl.iter().next().unwrap().unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(
        err.to_string(),
        "Caught panic in DataLoader worker thread 0 in worker_init_fn (batch 0 not loaded: a worker whose worker_init_fn panicked loads nothing).\nOriginal panic message: worker died"
    );
}

/// A loader's shuffle order does not depend on other loaders (no global RNG):
/// <https://github.com/pytorch/pytorch/issues/11062>
#[test]
fn shuffle_order_does_not_depend_on_other_loaders() {
    let first_batch = |k: usize, seed: u64| {
        berth::manual_seed(0);
        let val = DataLoaderBuilder::with_collate(range(10), CollateFn(|v: Vec<usize>| Ok(v)))
            .batch_size(10)
            .build()
            .unwrap();
        for _ in 0..k {
            collect_batches(&val);
        }
        let global_after = berth::random::with_global(|g| g.next_f64().to_bits());
        let train = DataLoaderBuilder::with_collate(range(10), CollateFn(|v: Vec<usize>| Ok(v)))
            .batch_size(10)
            .shuffle(true)
            .generator(Generator::new(seed))
            .build()
            .unwrap();
        let e1 = collect_batches(&train).remove(0);
        let e2 = collect_batches(&train).remove(0);
        (e1, e2, global_after)
    };
    let (p0, p0_next, g0) = first_batch(0, 0);
    for k in [1, 2] {
        let (p, p_next, g) = first_batch(k, 0);
        assert_eq!(p, p0, "k = {k}");
        assert_eq!(p_next, p0_next);
        assert_eq!(
            g, g0,
            "iterating a loader never draws from berth's global RNG"
        );
    }
    assert_ne!(p0, p0_next, "epoch 2 differs");
    assert_ne!(first_batch(0, 1).0, p0, "another seed, another permutation");
    let mut sorted = p0.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
}

/// A dataset whose `get` allocates on `cuda:0`.
struct OnDevice;
impl Dataset for OnDevice {
    type Item = usize;
    fn len(&self) -> usize {
        1
    }
    fn get(&self, i: usize) -> Result<usize> {
        let t = Tensor::zeros(&[2], DType::F32, "cuda:0".parse::<Device>().unwrap())?;
        Ok(i + t.numel())
    }
}

/// Device work in a worker behaves as on the main thread (no "cannot re-initialize CUDA"):
/// <https://github.com/pytorch/pytorch/issues/40403>
#[test]
fn device_work_in_a_worker_behaves_as_on_the_main_thread() {
    // Workers are threads of this process (Note [Workers are threads]): there is no fork, so no
    // "Cannot re-initialize CUDA in forked subprocess". Device work in a worker succeeds when it
    // succeeds on the main thread, and otherwise fails with the same typed error.
    let run = || {
        let dl = DataLoaderBuilder::with_collate(OnDevice, CollateFn(|v: Vec<usize>| Ok(v)))
            .num_workers(1)
            .build()
            .unwrap();
        let mut it = dl.iter();
        it.next().unwrap()
    };
    let before = run(); // the main thread has not touched the device yet
    let main = OnDevice.get(0); // now it has
    let after = run();
    for r in [&before, &after] {
        match (&main, r) {
            (Ok(_), Ok(b)) => assert_eq!(b, &vec![2]),
            (Err(m), Err(w)) => {
                assert!(
                    matches!(
                        w,
                        DataError::InWorker {
                            worker_id: 0,
                            batch_index: 0,
                            ..
                        }
                    ),
                    "{w:?}"
                );
                assert!(matches!(w.original(), DataError::Tensor(_)), "{w:?}");
                assert_eq!(w.original().to_string(), m.to_string());
                assert!(!w.to_string().contains("fork"), "{w}");
            }
            other => panic!("worker and main thread disagree: {other:?}"),
        }
    }
}
