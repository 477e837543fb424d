//! Epochs are drawn lazily (Note [Lazy epochs], newcomer defect 2) and batches requested ahead
//! are capped for both loader kinds (newcomer defect 22).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_data::{
    CollateFn, DataLoader, DataLoaderBuilder, Dataset, Generator, RandomSampler, Result, Sampler,
    SequentialSampler, EAGER_EPOCH_LIMIT, PREFETCH_LIMIT,
};

/// `len` items that are their own index, with no storage; counts the items fetched.
struct Huge {
    len: usize,
    fetched: Arc<AtomicUsize>,
}

impl Dataset for Huge {
    type Item = usize;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<usize> {
        self.fetched.fetch_add(1, Ordering::SeqCst);
        Ok(index)
    }
}

type Ident = fn(Vec<usize>) -> Result<Vec<usize>>;

fn loader(len: usize, shuffle: bool, workers: isize) -> DataLoader<Huge, CollateFn<Ident>> {
    let f: Ident = Ok;
    let huge = Huge {
        len,
        fetched: Arc::new(AtomicUsize::new(0)),
    };
    let b = DataLoaderBuilder::with_collate(huge, CollateFn(f))
        .batch_size(64)
        .shuffle(shuffle)
        .generator(Generator::new(7));
    let b = if workers > 0 {
        b.num_workers(workers).prefetch_factor(2)
    } else {
        b
    };
    b.build().unwrap()
}

#[test]
fn a_dataset_of_two_to_the_forty_items_yields_its_first_batch_at_once() {
    // The reproducer (bigseq.rs) aborted at 2^40 and took 4.8 GB for 3·10^8.
    let n = 1usize << 40;
    let t0 = Instant::now();
    let dl = loader(n, false, 0);
    let mut it = dl.iter();
    assert_eq!(it.remaining(), n / 64);
    assert_eq!(it.next().unwrap().unwrap(), (0..64).collect::<Vec<_>>());
    assert_eq!(it.next().unwrap().unwrap(), (64..128).collect::<Vec<_>>());
    assert_eq!(it.remaining(), n / 64 - 2);

    let dl = loader(n, true, 0);
    let first = dl.iter().next().unwrap().unwrap();
    assert_eq!(first.len(), 64);
    assert!(first.iter().all(|&i| i < n));
    assert_eq!(first.iter().collect::<HashSet<_>>().len(), 64, "{first:?}");
    assert_ne!(first, (0..64).collect::<Vec<_>>());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn a_shuffled_huge_epoch_with_workers_is_the_same_as_without() {
    let n = 1usize << 40;
    let take = |workers| -> Vec<Vec<usize>> {
        loader(n, true, workers)
            .iter()
            .take(3)
            .map(|b| b.unwrap())
            .collect()
    };
    let single = take(0);
    assert_eq!(single.len(), 3);
    // The workers' base seed is drawn before the epoch's keys in both modes.
    assert_eq!(take(2), single);
}

#[test]
fn a_random_epoch_past_the_eager_limit_is_a_permutation() {
    let n = EAGER_EPOCH_LIMIT + 5;
    let mut s = RandomSampler::new(n, Some(Generator::new(3)));
    let mut seen = vec![false; n];
    let mut count = 0;
    for i in s.epoch_iter() {
        assert!(!seen[i], "{i} twice");
        seen[i] = true;
        count += 1;
    }
    assert_eq!(count, n);
    // More samples than items, lazily: whole permutations then a prefix.
    let mut s = RandomSampler::new(1000, Some(Generator::new(3)))
        .with_num_samples(EAGER_EPOCH_LIMIT + 10)
        .unwrap();
    let e: Vec<usize> = s.epoch_iter().collect();
    assert_eq!(e.len(), EAGER_EPOCH_LIMIT + 10);
    let mut first: Vec<usize> = e[..1000].to_vec();
    first.sort_unstable();
    assert_eq!(first, (0..1000).collect::<Vec<_>>());
    // With replacement: in range.
    let mut s = RandomSampler::new(3, Some(Generator::new(3)))
        .with_replacement(true)
        .with_num_samples(EAGER_EPOCH_LIMIT + 1)
        .unwrap();
    assert!(s.epoch_iter().all(|i| i < 3));
}

#[test]
fn small_random_epochs_keep_the_eager_order() {
    let mut a = RandomSampler::new(10, Some(Generator::new(0)));
    let mut b = RandomSampler::new(10, Some(Generator::new(0)));
    assert_eq!(a.epoch_iter().collect::<Vec<_>>(), b.epoch());
    let mut s = SequentialSampler::new(usize::MAX);
    assert_eq!(s.epoch_iter().take(3).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn a_huge_prefetch_factor_on_a_huge_map_style_epoch_requests_a_bounded_number_of_batches() {
    let fetched = Arc::new(AtomicUsize::new(0));
    let f: Ident = Ok;
    let huge = Huge {
        len: 1 << 40,
        fetched: Arc::clone(&fetched),
    };
    let dl = DataLoaderBuilder::with_collate(huge, CollateFn(f))
        .batch_size(4)
        .num_workers(2)
        .prefetch_factor(isize::MAX)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut it = dl.iter();
    assert_eq!(it.next().unwrap().unwrap(), vec![0, 1, 2, 3]);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // 2 × PREFETCH_LIMIT batches of 4 requested ahead, one more for the batch handed out.
    let want = 4 * (2 * PREFETCH_LIMIT + 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fetched.load(Ordering::SeqCst) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(fetched.load(Ordering::SeqCst), want);
}
