//! DataLoader: order across worker counts, errors, timeouts, shutdown, seeds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_data::{CollateFn, DataError, DataLoader, DataLoaderBuilder, Dataset, Generator};

use crate::util::{collect_batches, gettid, range, seq, thread_alive, thread_gone, Flaky};

type Ident = fn(Vec<usize>) -> Result<Vec<usize>, DataError>;

fn ident(v: Vec<usize>) -> Result<Vec<usize>, DataError> {
    Ok(v)
}

fn builder<D: Dataset<Item = usize>>(ds: D) -> DataLoaderBuilder<D, CollateFn<Ident>> {
    DataLoaderBuilder::with_collate(ds, CollateFn(ident as Ident))
}

#[test]
fn sequential_batches_exact() {
    let dl = builder(range(10)).batch_size(3).build().unwrap();
    assert_eq!(dl.len(), 4);
    assert_eq!(
        collect_batches(&dl),
        vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
    );
    let dl = builder(range(10))
        .batch_size(3)
        .drop_last(true)
        .build()
        .unwrap();
    assert_eq!(dl.len(), 3);
    assert_eq!(collect_batches(&dl).len(), 3);
}

#[test]
fn seeded_shuffle_same_seed_same_order_next_epoch_differs() {
    let mk = |seed| {
        builder(range(20))
            .batch_size(5)
            .shuffle(true)
            .generator(Generator::new(seed))
            .build()
            .unwrap()
    };
    let (a, b) = (mk(42), mk(42));
    let (a1, b1) = (collect_batches(&a), collect_batches(&b));
    assert_eq!(a1, b1);
    let mut flat: Vec<usize> = a1.concat();
    assert_ne!(flat, seq(20));
    flat.sort_unstable();
    assert_eq!(flat, seq(20));
    let a2 = collect_batches(&a);
    assert_ne!(a1, a2);
    assert_eq!(a2, collect_batches(&b));
    assert_ne!(collect_batches(&mk(43)), a1);
}

#[test]
fn zero_one_four_workers_identical_batches_in_order() {
    let run = |workers| {
        let dl = builder(Flaky {
            len: 103,
            fail: vec![],
            panic: vec![],
            sleep_ms: 0,
        })
        .batch_size(4)
        .shuffle(true)
        .num_workers(workers)
        .generator(Generator::new(7))
        .build()
        .unwrap();
        (collect_batches(&dl), collect_batches(&dl))
    };
    let zero = run(0);
    assert_eq!(zero.0.len(), 26);
    assert_eq!(run(1), zero);
    assert_eq!(run(4), zero);
}

#[test]
fn order_holds_when_workers_finish_out_of_order() {
    // Item 0 is slow, so worker 0's first batch arrives after later batches of other workers.
    struct Slow0;
    impl Dataset for Slow0 {
        type Item = usize;
        fn len(&self) -> usize {
            16
        }
        fn get(&self, i: usize) -> Result<usize, DataError> {
            if i == 0 {
                std::thread::sleep(Duration::from_millis(150));
            }
            Ok(i)
        }
    }
    let dl = builder(Slow0).batch_size(2).num_workers(4).build().unwrap();
    let got = collect_batches(&dl);
    assert_eq!(
        got,
        (0..8).map(|b| vec![2 * b, 2 * b + 1]).collect::<Vec<_>>()
    );
}

#[test]
fn failing_item_error_arrives_at_its_batch_and_next_batch_comes() {
    for workers in [0, 2] {
        let dl = builder(Flaky {
            len: 12,
            fail: vec![5],
            panic: vec![],
            sleep_ms: 0,
        })
        .batch_size(3)
        .num_workers(workers)
        .build()
        .unwrap();
        let out: Vec<_> = dl.iter().collect();
        assert_eq!(out.len(), 4, "{workers} workers");
        assert_eq!(out[0].as_ref().unwrap(), &vec![0, 1, 2]);
        let err = out[1].as_ref().unwrap_err();
        match (workers, err) {
            (0, DataError::InBatch { batch_index: 1, .. }) => {}
            (
                2,
                DataError::InWorker {
                    batch_index: 1,
                    worker_id: 1,
                    ..
                },
            ) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            matches!(err.original(), DataError::Item { index: 5, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("bad record 5"), "{err}");
        assert_eq!(out[2].as_ref().unwrap(), &vec![6, 7, 8]);
        assert_eq!(out[3].as_ref().unwrap(), &vec![9, 10, 11]);
    }
}

#[test]
fn panicking_item_is_caught_and_reported_and_the_worker_goes_on() {
    let dl = builder(Flaky {
        len: 8,
        fail: vec![],
        panic: vec![2],
        sleep_ms: 0,
    })
    .batch_size(2)
    .num_workers(2)
    .build()
    .unwrap();
    let out: Vec<_> = dl.iter().collect();
    assert_eq!(out.len(), 4);
    let err = out[1].as_ref().unwrap_err();
    assert!(
        matches!(
            err,
            DataError::WorkerPanicked {
                worker_id: 1,
                batch_index: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("Caught panic in DataLoader worker thread 1 (batch 1).\n"),
        "{msg}"
    );
    assert!(msg.contains("item 2 exploded"), "{msg}");
    assert_eq!(out[3].as_ref().unwrap(), &vec![6, 7]);
}

#[test]
fn timeout_names_the_worker_and_fires_near_the_limit() {
    let dl = builder(Flaky {
        len: 2,
        fail: vec![],
        panic: vec![],
        sleep_ms: 1500,
    })
    .batch_size(1)
    .num_workers(1)
    .timeout(0.3)
    .build()
    .unwrap();
    let mut it = dl.iter();
    let t0 = Instant::now();
    let err = it.next().unwrap().unwrap_err();
    let waited = t0.elapsed();
    assert!(
        matches!(
            err,
            DataError::Timeout {
                batch_index: 0,
                worker_id: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "DataLoader timed out after 0.3 seconds (waiting for batch 0 from worker 0)"
    );
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1400),
        "{waited:?}"
    );
}

#[test]
fn drop_mid_epoch_with_four_workers_leaves_no_thread() {
    let tids = Arc::new(Mutex::new(Vec::new()));
    let t2 = Arc::clone(&tids);
    let dl = builder(Flaky {
        len: 400,
        fail: vec![],
        panic: vec![],
        sleep_ms: 1,
    })
    .batch_size(2)
    .num_workers(4)
    .worker_init_fn(move |_| t2.lock().unwrap().push(gettid()))
    .build()
    .unwrap();
    let mut it = dl.iter();
    assert_eq!(it.next().unwrap().unwrap(), vec![0, 1]);
    assert_eq!(it.next().unwrap().unwrap(), vec![2, 3]);
    // Workers 2 and 3 may still be starting (their `worker_init_fn` not yet run) when the first
    // two batches arrive: wait until all four have registered.
    let deadline = Instant::now() + Duration::from_secs(5);
    while tids.lock().unwrap().len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let seen = tids.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|&t| thread_alive(t)));
    let t0 = Instant::now();
    drop(it);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert!(
        seen.iter().all(|&t| thread_gone(t)),
        "a worker thread is still running"
    );
}

#[test]
fn persistent_workers_survive_epochs_and_die_with_the_loader() {
    let tids = Arc::new(Mutex::new(Vec::new()));
    let t2 = Arc::clone(&tids);
    let dl = builder(range(10))
        .batch_size(3)
        .num_workers(2)
        .persistent_workers(true)
        .worker_init_fn(move |_| t2.lock().unwrap().push(gettid()))
        .build()
        .unwrap();
    let e1 = collect_batches(&dl);
    let e2 = collect_batches(&dl);
    assert_eq!(e1, e2);
    // Abandon an epoch half way, then run a full one: no stale batch leaks in.
    let mut it = dl.iter();
    it.next();
    drop(it);
    assert_eq!(collect_batches(&dl), e1);
    let seen = tids.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "the pool was started once");
    assert!(seen.iter().all(|&t| thread_alive(t)));
    drop(dl);
    assert!(seen.iter().all(|&t| thread_gone(t)));
}

#[test]
fn non_persistent_workers_restart_every_epoch_and_finish_at_the_end() {
    let tids = Arc::new(Mutex::new(Vec::new()));
    let t2 = Arc::clone(&tids);
    let dl = builder(range(6))
        .batch_size(2)
        .num_workers(2)
        .worker_init_fn(move |_| t2.lock().unwrap().push(gettid()))
        .build()
        .unwrap();
    collect_batches(&dl);
    let first = tids.lock().unwrap().clone();
    assert!(
        first.iter().all(|&t| thread_gone(t)),
        "workers joined at the end of the epoch"
    );
    collect_batches(&dl);
    assert_eq!(tids.lock().unwrap().len(), 4);
}

#[test]
fn per_worker_seeds_differ_and_share_a_base() {
    let infos = Arc::new(Mutex::new(Vec::new()));
    let i2 = Arc::clone(&infos);
    let dl = builder(range(8))
        .num_workers(4)
        .generator(Generator::new(11))
        .worker_init_fn(move |_| i2.lock().unwrap().push(berth_data::worker_info().unwrap()))
        .build()
        .unwrap();
    let it = dl.iter();
    let base = it.base_seed();
    drop(it);
    let mut infos = infos.lock().unwrap().clone();
    infos.sort_by_key(|i| i.id);
    assert_eq!(infos.len(), 4);
    for (w, info) in infos.iter().enumerate() {
        assert_eq!(info.id, w);
        assert_eq!(info.num_workers, 4);
        assert_eq!(info.seed, base.wrapping_add(w as u64));
    }
    assert_eq!(
        base,
        Generator::new(11).next_u64(),
        "base_seed is the generator's first draw"
    );
    assert!(
        berth_data::worker_info().is_none(),
        "no worker info on the main thread"
    );
}

#[test]
fn custom_batch_sampler_and_len() {
    struct Pairs;
    impl berth_data::BatchSampling for Pairs {
        fn len(&self) -> usize {
            2
        }
        fn epoch(&mut self) -> Vec<Vec<usize>> {
            vec![vec![4, 0], vec![2]]
        }
    }
    let dl = builder(range(5))
        .batch_sampler(Pairs)
        .num_workers(1)
        .build()
        .unwrap();
    assert_eq!(dl.len(), 2);
    assert_eq!(collect_batches(&dl), vec![vec![4, 0], vec![2]]);
}

#[test]
fn a_loader_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<DataLoader<berth_data::VecDataset<usize>, CollateFn<Ident>>>();
}
