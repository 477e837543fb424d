//! Bad input, tried as a new user would: typed errors, never a panic, a hang or a wrong answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_data::{
    random_split, CollateFn, DataError, DataLoader, Dataset, Generator, IterableDataLoaderBuilder,
    IterableDataset, RandomSampler, Result, Sampler, SplitLengths, VecDataset,
    WeightedRandomSampler, PREFETCH_LIMIT,
};

use crate::util::range;

/// A dataset of `len` items that are their own index, with no storage (so it can be huge).
#[derive(Debug)]
struct Indices(usize);

impl Dataset for Indices {
    type Item = usize;
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, index: usize) -> Result<usize> {
        Ok(index)
    }
}

#[test]
fn random_split_fractions_whose_floors_exceed_the_length_are_split_lengths() {
    // 0.6 + 0.4000009 is within the 1e-6 tolerance, but floor(1e7 × 0.4000009) = 4_000_009,
    // so the floors alone are 10_000_009 > 10_000_000 (it used to underflow `n − sum`).
    let err = random_split(
        Arc::new(Indices(10_000_000)),
        SplitLengths::Fractions(vec![0.6, 0.4000009]),
        &Generator::new(0),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            DataError::SplitLengths {
                sum: 10_000_009,
                len: 10_000_000
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "Sum of input lengths does not equal the length of the input dataset! (lengths sum to 10000009, dataset has 10000000 items)"
    );
    // Fractions that fit: floors 3, 3 of 7, the remainder 1 dealt to the first part ...
    let parts = random_split(
        Arc::new(Indices(7)),
        SplitLengths::Fractions(vec![0.5, 0.5]),
        &Generator::new(0),
    )
    .unwrap();
    assert_eq!(parts.iter().map(Dataset::len).collect::<Vec<_>>(), [4, 3]);
    // ... and a remainder larger than the number of parts (a sum just under 1) goes round
    // more than once: floors 2_500_000, 2_500_000, 4_999_995, remainder 5 → +2, +2, +1.
    let parts = random_split(
        Arc::new(Indices(10_000_000)),
        SplitLengths::Fractions(vec![0.25, 0.25, 0.4999995]),
        &Generator::new(0),
    )
    .unwrap();
    assert_eq!(
        parts.iter().map(Dataset::len).collect::<Vec<_>>(),
        [2_500_002, 2_500_002, 4_999_996]
    );
}

#[test]
fn random_split_counts_that_overflow_are_split_lengths_with_the_true_sum() {
    let err = random_split(
        Arc::new(range(3)),
        SplitLengths::Counts(vec![usize::MAX, 4]),
        &Generator::new(0),
    )
    .unwrap_err();
    let want = u128::from(u64::try_from(usize::MAX).unwrap()) + 4;
    assert!(
        matches!(err, DataError::SplitLengths { sum, len: 3 } if sum == want),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("Sum of input lengths does not equal the length of the input dataset! (lengths sum to {want}, dataset has 3 items)")
    );
}

#[test]
fn huge_prefetch_factor_neither_overflows_nor_spins() {
    // `prefetch_factor × num_workers` used to overflow (a panic in debug builds) ...
    let dl = DataLoader::builder(VecDataset::new(vec![1.0f64; 4]))
        .num_workers(3)
        .prefetch_factor(isize::MAX)
        .build()
        .unwrap();
    let batches: Vec<f64> = dl
        .iter()
        .map(|b| b.unwrap().to_vec::<f64>().unwrap()[0])
        .collect();
    assert_eq!(batches, [1.0; 4]);
    // ... and 2^40 primed tasks spun for minutes (no-op sends past the last batch).
    let t0 = Instant::now();
    let dl = DataLoader::builder(VecDataset::new(vec![1.0f64; 4]))
        .num_workers(1)
        .prefetch_factor(1 << 40)
        .build()
        .unwrap();
    assert_eq!(dl.iter().count(), 4);
    assert_eq!(dl.iter().size_hint(), (0, Some(4)));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// An endless stream of 1s that counts the items taken.
struct Endless(Arc<AtomicUsize>);

impl IterableDataset for Endless {
    type Item = usize;
    fn iter(&self) -> Box<dyn Iterator<Item = Result<usize>> + Send + '_> {
        Box::new(std::iter::repeat_with(|| {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        }))
    }
}

type Ident = fn(Vec<usize>) -> Result<Vec<usize>>;

#[test]
fn huge_prefetch_factor_on_a_stream_requests_a_bounded_number_of_batches() {
    let taken = Arc::new(AtomicUsize::new(0));
    let f: Ident = Ok;
    let dl = IterableDataLoaderBuilder::with_collate(Endless(Arc::clone(&taken)), CollateFn(f))
        .num_workers(2)
        .prefetch_factor(1 << 40)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut it = dl.iter();
    assert_eq!(it.next().unwrap().unwrap(), vec![1]);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // 2 × PREFETCH_LIMIT requested ahead, one more for the batch handed out.
    let want = 2 * PREFETCH_LIMIT + 1;
    let deadline = Instant::now() + Duration::from_secs(10);
    while taken.load(Ordering::SeqCst) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(taken.load(Ordering::SeqCst), want);
}

#[test]
fn huge_weights_are_drawn_in_proportion() {
    // 1e308 + 1e308 overflows to inf: every weight / inf was 0 and index 2 was always drawn.
    let mut s = WeightedRandomSampler::new(
        vec![1e308, 1e308, 1.0],
        10_000,
        true,
        Some(Generator::new(0)),
    )
    .unwrap();
    let e = s.epoch();
    let count = |k: usize| e.iter().filter(|&&i| i == k).count();
    assert_eq!(count(2), 0, "a weight 1e-308 of the total is never drawn");
    assert!((4700..5300).contains(&count(0)), "{}", count(0));
    assert_eq!(count(0) + count(1), 10_000);
    // f64::MAX weights, 1 : 3 (the largest three-quarters of f64::MAX).
    let big = f64::MAX / 4.0;
    let mut s =
        WeightedRandomSampler::new(vec![big, 3.0 * big], 8000, true, Some(Generator::new(1)))
            .unwrap();
    let ones = s.epoch().iter().filter(|&&i| i == 1).count();
    assert!(
        (5800..6200).contains(&ones),
        "weight 3/4 drawn {ones} of 8000"
    );
    // Without replacement, the first draw of three equal huge weights is uniform (it was
    // always index 2).
    let mut s = WeightedRandomSampler::new(
        vec![f64::MAX, f64::MAX, f64::MAX],
        3,
        false,
        Some(Generator::new(2)),
    )
    .unwrap();
    let mut first = [0usize; 3];
    for _ in 0..3000 {
        let e = s.epoch();
        let mut sorted = e.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2]);
        first[e[0]] += 1;
    }
    assert!(first.iter().all(|&c| (850..1150).contains(&c)), "{first:?}");
}

#[test]
fn huge_and_tiny_weights_without_replacement_draw_every_positive_weight_once() {
    // 5e-324 / 1e308 underflows to 0: the second draw must still take index 1, not repeat 0.
    let mut s =
        WeightedRandomSampler::new(vec![1e308, 5e-324], 2, false, Some(Generator::new(3))).unwrap();
    for _ in 0..100 {
        assert_eq!(s.epoch(), [0, 1]);
    }
}

#[test]
fn random_sampler_num_samples_of_an_empty_dataset_is_refused() {
    for replacement in [false, true] {
        let err = RandomSampler::new(0, None)
            .with_replacement(replacement)
            .with_num_samples(5)
            .unwrap_err();
        assert!(
            matches!(
                err,
                DataError::InvalidOption {
                    option: "num_samples",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "num_samples=5 cannot be drawn from an empty dataset: RandomSampler needs at least one item (PyTorch fails on the first draw: random_ expects 'from' to be less than 'to', but got from=0 >= to=0)"
        );
    }
    // Without num_samples, an empty sampler is empty: len() and the epoch agree.
    let mut s = RandomSampler::new(0, None);
    assert_eq!((s.len(), s.epoch()), (0, vec![]));
}

#[test]
fn a_user_collate_fn_can_return_a_collate_error() {
    let dl = DataLoader::builder(range(4))
        .batch_size(2)
        .collate_fn(|items: Vec<usize>| {
            if items.contains(&3) {
                return Err(DataError::collate(format!(
                    "item 3 has no label; expected every item to have one (items {items:?})"
                )));
            }
            Ok(items)
        })
        .build()
        .unwrap();
    let out: Vec<_> = dl.iter().collect();
    assert_eq!(out[0].as_ref().unwrap(), &vec![0, 1]);
    let err = out[1].as_ref().unwrap_err();
    assert!(
        matches!(err.original(), DataError::Collate { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "batch 1: collate: item 3 has no label; expected every item to have one (items [2, 3])"
    );
}
