//! Iterable datasets in the DataLoader: exact batch lists for 0, 1, 2 and 4 workers (with and
//! without `drop_last`), sharding by `worker_info`, PyTorch's refusals, errors and panics in a
//! worker's stream, prefetch, persistent workers, timeout and pinning.
//!
//! Every expected list below is worked out by hand from PyTorch's rules: each worker batches its
//! own stream (`_IterableDatasetFetcher`), tasks go round-robin to the workers still active
//! (`_try_put_index`), batches come out in task order, and a worker whose stream has ended is
//! skipped from then on (`_next_data`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth::{DType, Device, Tensor};
use berth_data::{
    worker_info, CollateFn, DataError, Generator, IterableDataLoader, IterableDataLoaderBuilder,
    IterableDataset, SequentialSampler,
};

use crate::pinned::sim_pinned;
use crate::util::{collect_batches, gettid};

type Ident = fn(Vec<usize>) -> Result<Vec<usize>, DataError>;

fn ident(v: Vec<usize>) -> Result<Vec<usize>, DataError> {
    Ok(v)
}

fn builder<D: IterableDataset<Item = usize>>(
    ds: D,
) -> IterableDataLoaderBuilder<D, CollateFn<Ident>> {
    IterableDataLoaderBuilder::with_collate(ds, CollateFn(ident as Ident))
}

/// `0..n`, sharded by striding: worker `w` of `N` yields `w, w + N, w + 2N, …` (the whole range
/// on the main thread). Values listed in `fail` are `Err` items, in `panic` they panic.
struct Strided {
    n: usize,
    fail: Vec<usize>,
    panic: Vec<usize>,
}

fn strided(n: usize) -> Strided {
    Strided {
        n,
        fail: vec![],
        panic: vec![],
    }
}

impl IterableDataset for Strided {
    type Item = usize;
    fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
        let (id, n) = worker_info().map_or((0, 1), |w| (w.id, w.num_workers));
        Box::new((0..self.n).skip(id).step_by(n).map(move |v| {
            if self.fail.contains(&v) {
                return Err(DataError::item(v, format!("bad record {v}")));
            }
            if self.panic.contains(&v) {
                panic!("item {v} exploded");
            }
            Ok(v)
        }))
    }
    fn len_hint(&self) -> Option<usize> {
        Some(self.n)
    }
}

/// Worker `w` yields `100w, 100w + 1, …` (`lens[w]` items): streams of uneven length.
struct Uneven(Vec<usize>);

impl IterableDataset for Uneven {
    type Item = usize;
    fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
        let id = worker_info().map_or(0, |w| w.id);
        Box::new((100 * id..100 * id + self.0[id]).map(Ok))
    }
}

fn batches(ds: Strided, workers: isize, batch_size: usize, drop_last: bool) -> Vec<Vec<usize>> {
    let dl = builder(ds)
        .batch_size(batch_size)
        .drop_last(drop_last)
        .num_workers(workers)
        .build()
        .unwrap();
    collect_batches(&dl)
}

#[test]
fn exact_batches_for_0_1_2_4_workers_with_and_without_drop_last() {
    // 0..10, batch_size 3.
    // 0 workers: the main thread batches the whole stream; 1 worker: its share is everything.
    let whole = vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]];
    assert_eq!(batches(strided(10), 0, 3, false), whole);
    assert_eq!(batches(strided(10), 1, 3, false), whole);
    assert_eq!(batches(strided(10), 0, 3, true), whole[..3].to_vec());
    assert_eq!(batches(strided(10), 1, 3, true), whole[..3].to_vec());
    // 2 workers: w0 = 0 2 4 6 8 -> [0 2 4] [6 8]; w1 = 1 3 5 7 9 -> [1 3 5] [7 9].
    // Round-robin: w0, w1, w0, w1. drop_last drops each worker's partial batch.
    assert_eq!(
        batches(strided(10), 2, 3, false),
        vec![vec![0, 2, 4], vec![1, 3, 5], vec![6, 8], vec![7, 9]]
    );
    assert_eq!(
        batches(strided(10), 2, 3, true),
        vec![vec![0, 2, 4], vec![1, 3, 5]]
    );
    // 4 workers: w0 = 0 4 8, w1 = 1 5 9, w2 = 2 6, w3 = 3 7: one batch each, two of them
    // partial.
    assert_eq!(
        batches(strided(10), 4, 3, false),
        vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6], vec![3, 7]]
    );
    assert_eq!(
        batches(strided(10), 4, 3, true),
        vec![vec![0, 4, 8], vec![1, 5, 9]]
    );
    // 4 workers, batch_size 2: w0 -> [0 4] [8]; w1 -> [1 5] [9]; w2 -> [2 6]; w3 -> [3 7].
    // Second round: w0, w1, then w2 and w3 have ended and are skipped.
    assert_eq!(
        batches(strided(10), 4, 2, false),
        vec![
            vec![0, 4],
            vec![1, 5],
            vec![2, 6],
            vec![3, 7],
            vec![8],
            vec![9]
        ]
    );
    assert_eq!(
        batches(strided(10), 4, 2, true),
        vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
    );
}

#[test]
fn ended_workers_are_skipped_and_the_others_go_on() {
    // Streams of 3, 0, 5 and 1 items, batch_size 2:
    // w0 -> [0 1] [2]; w1 -> nothing; w2 -> [200 201] [202 203] [204]; w3 -> [300].
    // Round 1: w0, (w1 ended), w2, w3. Round 2: w0, w2 (w3 ended). Round 3: w2.
    let run = |drop_last, prefetch| {
        let dl = builder(Uneven(vec![3, 0, 5, 1]))
            .batch_size(2)
            .drop_last(drop_last)
            .num_workers(4)
            .prefetch_factor(prefetch)
            .build()
            .unwrap();
        collect_batches(&dl)
    };
    for prefetch in [1, 2, 5] {
        assert_eq!(
            run(false, prefetch),
            vec![
                vec![0, 1],
                vec![200, 201],
                vec![300],
                vec![2],
                vec![202, 203],
                vec![204]
            ],
            "prefetch_factor {prefetch}"
        );
        // drop_last: w0 keeps [0 1]; w2 keeps [200 201] [202 203]; w3's only batch is partial.
        assert_eq!(
            run(true, prefetch),
            vec![vec![0, 1], vec![200, 201], vec![202, 203]],
            "prefetch_factor {prefetch}"
        );
    }
    // Two workers, streams of 2 and 7: w0's stream ends after one batch, w1 goes on alone.
    let dl = builder(Uneven(vec![2, 7]))
        .batch_size(2)
        .num_workers(2)
        .build()
        .unwrap();
    assert_eq!(
        collect_batches(&dl),
        vec![
            vec![0, 1],
            vec![100, 101],
            vec![102, 103],
            vec![104, 105],
            vec![106]
        ]
    );
}

/// Records which worker yielded each item: `(worker id, value)`; shards by striding only when
/// `shard`.
struct Tagged {
    n: usize,
    shard: bool,
}

impl IterableDataset for Tagged {
    type Item = (usize, usize);
    fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<(usize, usize)>> + Send + '_> {
        let info = worker_info().expect("inside a worker");
        let me = info
            .dataset::<Tagged>()
            .expect("worker_info carries the dataset");
        assert!(std::ptr::eq(&*me, self), "the loader's dataset itself");
        let (id, n) = (info.id, info.num_workers);
        let step = if self.shard { n } else { 1 };
        let skip = if self.shard { id } else { 0 };
        Box::new(
            (0..self.n)
                .skip(skip)
                .step_by(step)
                .map(move |v| Ok((id, v))),
        )
    }
}

type TagFn = fn(Vec<(usize, usize)>) -> Result<Vec<(usize, usize)>, DataError>;

fn tagged(shard: bool, workers: isize) -> Vec<Vec<(usize, usize)>> {
    let f: TagFn = Ok;
    let dl = IterableDataLoaderBuilder::with_collate(Tagged { n: 11, shard }, CollateFn(f))
        .batch_size(2)
        .num_workers(workers)
        .build()
        .unwrap();
    dl.iter().map(|b| b.unwrap()).collect()
}

#[test]
fn worker_info_sharding_yields_the_dataset_once() {
    for workers in [1, 2, 3, 4] {
        let got = tagged(true, workers);
        let n = workers as usize;
        for batch in &got {
            let w = batch[0].0;
            assert!(
                batch.iter().all(|&(id, v)| id == w && v % n == w),
                "{got:?}"
            );
        }
        let mut values: Vec<usize> = got.iter().flatten().map(|&(_, v)| v).collect();
        values.sort_unstable();
        assert_eq!(values, (0..11).collect::<Vec<_>>(), "{workers} workers");
    }
    // Unsharded, every worker runs the whole stream: each item comes out once per worker.
    let got = tagged(false, 3);
    let mut values: Vec<usize> = got.iter().flatten().map(|&(_, v)| v).collect();
    values.sort_unstable();
    let thrice: Vec<usize> = (0..11).flat_map(|v| [v, v, v]).collect();
    assert_eq!(values, thrice);
}

#[test]
fn worker_info_gives_id_count_seed_and_dataset() {
    let infos = Arc::new(Mutex::new(Vec::new()));
    struct Spy(Arc<Mutex<Vec<berth_data::WorkerInfo>>>);
    impl IterableDataset for Spy {
        type Item = usize;
        fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
            self.0.lock().unwrap().push(worker_info().unwrap());
            Box::new(std::iter::empty())
        }
    }
    let dl = builder(Spy(Arc::clone(&infos)))
        .num_workers(3)
        .generator(Generator::new(9))
        .build()
        .unwrap();
    let it = dl.iter();
    let base = it.base_seed();
    assert_eq!(it.count(), 0);
    let mut infos = infos.lock().unwrap().clone();
    infos.sort_by_key(|i| i.id);
    assert_eq!(infos.len(), 3);
    for (w, info) in infos.iter().enumerate() {
        assert_eq!((info.id, info.num_workers), (w, 3));
        assert_eq!(info.seed, base.wrapping_add(w as u64));
        let ds = info.dataset::<Spy>().unwrap();
        assert!(Arc::ptr_eq(&ds, dl.dataset()));
        assert!(info.dataset::<Strided>().is_none());
    }
    assert_eq!(base, Generator::new(9).next_u64());
}

fn refused(b: IterableDataLoaderBuilder<Strided, CollateFn<Ident>>) -> (&'static str, String) {
    match b.build() {
        Err(DataError::InvalidOption { option, message }) => (option, message),
        other => panic!("expected InvalidOption, got {other:?}"),
    }
}

#[test]
fn sampler_options_are_refused_with_pytorchs_messages() {
    assert_eq!(
        refused(builder(strided(4)).shuffle(true)),
        (
            "shuffle",
            "DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle=True"
                .to_string()
        )
    );
    assert_eq!(
        refused(builder(strided(4)).sampler(SequentialSampler::new(4))),
        (
            "sampler",
            "DataLoader with IterableDataset: expected unspecified sampler option, but got sampler=berth_data::sampler::SequentialSampler"
                .to_string()
        )
    );
    struct Pairs;
    impl berth_data::BatchSampling for Pairs {
        fn len(&self) -> usize {
            1
        }
        fn epoch(&mut self) -> Vec<Vec<usize>> {
            vec![vec![0, 1]]
        }
    }
    let (option, message) = refused(builder(strided(4)).batch_sampler(Pairs));
    assert_eq!(option, "batch_sampler");
    assert!(
        message.starts_with(
            "DataLoader with IterableDataset: expected unspecified batch_sampler option, but got batch_sampler="
        ),
        "{message}"
    );
    assert!(message.ends_with("::Pairs"), "{message}");
    // PyTorch's order: shuffle before sampler; the worker options before either.
    assert_eq!(
        refused(
            builder(strided(4))
                .sampler(SequentialSampler::new(4))
                .shuffle(true)
        )
        .0,
        "shuffle"
    );
    assert_eq!(
        refused(builder(strided(4)).shuffle(true).num_workers(-1)).0,
        "num_workers"
    );
    // The options shared with map-style loaders keep their messages.
    assert_eq!(
        refused(builder(strided(4)).persistent_workers(true)).1,
        "persistent_workers option needs num_workers > 0"
    );
    assert_eq!(
        refused(builder(strided(4)).batch_size(0)).1,
        "batch_size should be a positive integer value, but got batch_size=0"
    );
    // shuffle(false) is "unspecified" (PyTorch accepts shuffle=False).
    assert!(builder(strided(4)).shuffle(false).build().is_ok());
}

#[test]
fn len_follows_the_datasets_length() {
    let len = |drop_last| {
        builder(strided(10))
            .batch_size(3)
            .drop_last(drop_last)
            .build()
            .unwrap()
            .len()
    };
    assert_eq!(len(false), Some(4));
    assert_eq!(len(true), Some(3));
    assert_eq!(builder(Uneven(vec![1])).build().unwrap().len(), None);
}

#[test]
fn worker_error_reads_like_pytorchs_and_keeps_its_source() {
    // Map-style: batch 1 = [3 4 5] goes to worker 1; item 5 fails.
    let dl = berth_data::DataLoaderBuilder::with_collate(
        crate::util::Flaky {
            len: 12,
            fail: vec![5],
            panic: vec![],
            sleep_ms: 0,
        },
        CollateFn(ident as Ident),
    )
    .batch_size(3)
    .num_workers(2)
    .build()
    .unwrap();
    let out: Vec<_> = dl.iter().collect();
    let err = out[1].as_ref().unwrap_err();
    assert_eq!(
        err.to_string(),
        "Caught DataError::Item in DataLoader worker thread 1 (batch 1).\nOriginal error: item 5: bad record 5"
    );
    check_source(err, 5);

    // Iterable, 2 workers, batch_size 2: w0 -> [0 2] [4 6] [8]; w1 -> [1 3], then 5 and the
    // failing 7 (the batch fails, 5 is dropped with it), then [9].
    let ds = Strided {
        n: 10,
        fail: vec![7],
        panic: vec![],
    };
    let dl = builder(ds).batch_size(2).num_workers(2).build().unwrap();
    let out: Vec<_> = dl.iter().collect();
    assert_eq!(out.len(), 6);
    let ok = |i: usize| out[i].as_ref().unwrap().clone();
    assert_eq!(
        [ok(0), ok(1), ok(2), ok(4), ok(5)],
        [vec![0, 2], vec![1, 3], vec![4, 6], vec![8], vec![9]]
    );
    let err = out[3].as_ref().unwrap_err();
    assert!(
        matches!(
            err,
            DataError::InWorker {
                worker_id: 1,
                batch_index: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "Caught DataError::Item in DataLoader worker thread 1 (batch 3).\nOriginal error: item 7: bad record 7"
    );
    check_source(err, 7);

    // Iterable without workers: the main thread's stream is 0..10; batch 3 = [6, 7] fails.
    let ds = Strided {
        n: 10,
        fail: vec![7],
        panic: vec![],
    };
    let dl = builder(ds).batch_size(2).build().unwrap();
    let out: Vec<_> = dl.iter().collect();
    assert_eq!(out.len(), 5);
    let err = out[3].as_ref().unwrap_err();
    assert!(
        matches!(err, DataError::InBatch { batch_index: 3, .. }),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "batch 3: item 7: bad record 7");
    assert_eq!(out[4].as_ref().unwrap(), &vec![8, 9]);
}

/// `err`'s source is the original `DataError::Item`, whose source is the dataset's own error.
fn check_source(err: &DataError, index: usize) {
    use std::error::Error as _;
    let src = err.source().expect("a source");
    let original = src.downcast_ref::<DataError>().expect("a DataError");
    assert!(
        matches!(original, DataError::Item { index: i, .. } if *i == index),
        "{original:?}"
    );
    assert!(std::ptr::eq(original, err.original()));
    assert_eq!(
        original.source().unwrap().to_string(),
        format!("bad record {index}")
    );
}

#[test]
fn panicking_stream_is_caught_reported_and_ends_only_that_stream() {
    // 2 workers, batch_size 2: w1's stream panics on 5, in its second batch (task 3); it is not
    // polled again, and w0 goes on: [0 2] [1 3] [4 6] panic [8].
    let ds = Strided {
        n: 10,
        fail: vec![],
        panic: vec![5],
    };
    let dl = builder(ds)
        .batch_size(2)
        .num_workers(2)
        .persistent_workers(true)
        .build()
        .unwrap();
    for epoch in 0..2 {
        // The pool survives the panic: the second epoch starts fresh streams in the same threads.
        let out: Vec<_> = dl.iter().collect();
        assert_eq!(out.len(), 5, "epoch {epoch}");
        let ok = |i: usize| out[i].as_ref().unwrap().clone();
        assert_eq!(
            [ok(0), ok(1), ok(2), ok(4)],
            [vec![0, 2], vec![1, 3], vec![4, 6], vec![8]]
        );
        let err = out[3].as_ref().unwrap_err();
        assert!(
            matches!(
                err,
                DataError::WorkerPanicked {
                    worker_id: 1,
                    batch_index: 3,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "Caught panic in DataLoader worker thread 1 (batch 3).\nOriginal panic message: item 5 exploded"
        );
    }
}

#[test]
fn panic_in_iter_itself_is_caught() {
    struct BadStart;
    impl IterableDataset for BadStart {
        type Item = usize;
        fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
            if worker_info().is_some_and(|w| w.id == 0) {
                panic!("cannot open shard 0");
            }
            Box::new((0..2usize).map(Ok))
        }
    }
    let dl = builder(BadStart)
        .batch_size(2)
        .num_workers(2)
        .build()
        .unwrap();
    let out: Vec<_> = dl.iter().collect();
    assert_eq!(out.len(), 2);
    assert!(
        matches!(
            out[0],
            Err(DataError::WorkerPanicked {
                worker_id: 0,
                batch_index: 0,
                ..
            })
        ),
        "{:?}",
        out[0]
    );
    assert_eq!(out[1].as_ref().unwrap(), &vec![0, 1]);
}

/// An endless stream of 1s that counts the items taken.
struct Counting(Arc<AtomicUsize>);

impl IterableDataset for Counting {
    type Item = usize;
    fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
        Box::new(std::iter::repeat_with(|| {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        }))
    }
}

#[test]
fn prefetch_factor_bounds_the_batches_requested_ahead() {
    for (workers, prefetch) in [(2, 1), (2, 3), (3, 2)] {
        let taken = Arc::new(AtomicUsize::new(0));
        let dl = builder(Counting(Arc::clone(&taken)))
            .batch_size(1)
            .num_workers(workers)
            .prefetch_factor(prefetch)
            .build()
            .unwrap();
        let mut it = dl.iter();
        let ahead = (workers * prefetch) as usize;
        settle_at(&taken, ahead);
        it.next().unwrap().unwrap();
        settle_at(&taken, ahead + 1); // one batch out, one more requested
    }
}

/// Waits (up to 10 s, for a loaded machine) until `count` reaches `want`, then checks that it
/// stays there: the loader requests no more.
fn settle_at(count: &AtomicUsize, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while count.load(Ordering::SeqCst) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(count.load(Ordering::SeqCst), want);
}

/// `0..4` sharded by striding, recording the thread that started each stream.
struct Threads(Arc<Mutex<HashSet<u64>>>);

impl IterableDataset for Threads {
    type Item = usize;
    fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
        self.0.lock().unwrap().insert(gettid());
        let w = worker_info().unwrap();
        Box::new((0..4).skip(w.id).step_by(w.num_workers).map(Ok))
    }
}

#[test]
fn persistent_workers_restart_the_stream_each_epoch_in_the_same_threads() {
    for persistent in [true, false] {
        let tids = Arc::new(Mutex::new(HashSet::new()));
        let dl = builder(Threads(Arc::clone(&tids)))
            .batch_size(2)
            .num_workers(2)
            .persistent_workers(persistent)
            .build()
            .unwrap();
        for _ in 0..3 {
            assert_eq!(collect_batches(&dl), vec![vec![0, 2], vec![1, 3]]);
        }
        let threads = tids.lock().unwrap().len();
        assert_eq!(
            threads,
            if persistent { 2 } else { 6 },
            "persistent {persistent}"
        );
    }
    // An epoch dropped half-way leaves the next one complete.
    let dl = builder(strided(10))
        .batch_size(2)
        .num_workers(2)
        .persistent_workers(true)
        .build()
        .unwrap();
    let mut it = dl.iter();
    assert_eq!(it.next().unwrap().unwrap(), vec![0, 2]);
    drop(it);
    assert_eq!(
        collect_batches(&dl),
        vec![
            vec![0, 2],
            vec![1, 3],
            vec![4, 6],
            vec![5, 7],
            vec![8],
            vec![9]
        ]
    );
}

#[test]
fn timeout_fires_for_a_stuck_stream() {
    struct Stuck;
    impl IterableDataset for Stuck {
        type Item = usize;
        fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
            Box::new(std::iter::once_with(|| {
                std::thread::sleep(Duration::from_millis(1500));
                Ok(0)
            }))
        }
    }
    let dl = builder(Stuck).num_workers(1).timeout(0.2).build().unwrap();
    let t0 = Instant::now();
    let mut it = dl.iter();
    let err = it.next().unwrap().unwrap_err();
    assert!(t0.elapsed() < Duration::from_millis(1200));
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
    assert!(err
        .to_string()
        .starts_with("DataLoader timed out after 0.2 seconds"));
    assert!(it.next().is_none(), "a timeout ends the epoch");
}

/// Worker `w` yields two `[2]` tensors filled with `w`.
struct Tensors;

impl IterableDataset for Tensors {
    type Item = Tensor;
    fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<Tensor>> + Send + '_> {
        let w = worker_info().map_or(0, |w| w.id) as f64;
        Box::new((0..2).map(move |_| Ok(Tensor::full(&[2], w, DType::F32, Device::Cpu)?)))
    }
}

#[test]
fn default_collate_and_pin_memory_work_for_streams() {
    let (target, host) = sim_pinned();
    let dl = IterableDataLoader::builder(Tensors)
        .batch_size(2)
        .num_workers(2)
        .pin_memory_target(target)
        .pin_memory(true)
        .build()
        .unwrap();
    assert!(dl.pin_memory());
    let out: Vec<Tensor> = dl.iter().map(|b| b.unwrap()).collect();
    assert_eq!(out.len(), 2);
    for (w, t) in out.iter().enumerate() {
        assert_eq!(t.shape(), &[2, 2]);
        assert!(t.is_pinned(), "batch {w} is pinned");
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![w as f32; 4]);
    }
    assert_eq!(
        host.buffers.load(Ordering::SeqCst),
        2,
        "collated straight into pinned buffers"
    );
}

#[test]
fn an_iterable_loader_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<IterableDataLoader<Strided, CollateFn<Ident>>>();
}
