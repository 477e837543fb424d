//! `DistributedSampler`: PyTorch's exact index lists, its errors, and the forgotten-`set_epoch`
//! warning. Every expected list was printed by PyTorch 2.15:
//!
//! ```python
//! from torch.utils.data.distributed import DistributedSampler
//! s = DistributedSampler(list(range(n)), num_replicas=R, rank=r, shuffle=sh, seed=seed,
//!                        drop_last=dl)
//! s.set_epoch(ep)
//! list(s)
//! ```

use berth_data::{DataError, DataLoader, DistributedSampler, Sampler, VecDataset};

/// Every rank's list for one configuration, through `Sampler::epoch` after `set_epoch`.
fn all_ranks(
    n: usize,
    r: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    ep: u64,
) -> Vec<Vec<usize>> {
    (0..r)
        .map(|rank| {
            let mut s = DistributedSampler::new(n, r, rank)
                .unwrap()
                .shuffle(shuffle)
                .seed(seed)
                .drop_last(drop_last);
            s.set_epoch(ep);
            let got = s.epoch();
            assert_eq!(got.len(), s.len(), "len() agrees with the pass");
            assert_eq!(got, s.indices_for_epoch(ep));
            got
        })
        .collect()
}

#[test]
fn unshuffled_pads_from_the_start_and_interleaves_ranks() {
    assert_eq!(
        all_ranks(10, 3, false, 0, false, 0),
        [vec![0, 3, 6, 9], vec![1, 4, 7, 0], vec![2, 5, 8, 1]]
    );
}

#[test]
fn unshuffled_drop_last_cuts_the_tail() {
    assert_eq!(
        all_ranks(10, 3, false, 0, true, 0),
        [vec![0, 3, 6], vec![1, 4, 7], vec![2, 5, 8]]
    );
    // An even split drops nothing.
    assert_eq!(
        all_ranks(12, 4, false, 0, true, 0),
        [vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 10], vec![3, 7, 11]]
    );
}

#[test]
fn fewer_items_than_replicas() {
    assert_eq!(
        all_ranks(2, 4, false, 0, false, 0),
        [vec![0], vec![1], vec![0], vec![1]]
    );
    // drop_last: ceil((2 - 4) / 4) = 0 samples per rank.
    assert_eq!(
        all_ranks(2, 4, false, 0, true, 0),
        [Vec::<usize>::new(), vec![], vec![], vec![]]
    );
    // Padding longer than the data repeats it whole (PyTorch's second padding branch).
    assert_eq!(
        all_ranks(5, 8, false, 0, false, 0),
        [
            vec![0],
            vec![1],
            vec![2],
            vec![3],
            vec![4],
            vec![0],
            vec![1],
            vec![2]
        ]
    );
    assert_eq!(
        all_ranks(0, 2, false, 0, false, 0),
        [Vec::<usize>::new(), vec![]]
    );
}

#[test]
fn shuffled_matches_pytorch_with_and_without_set_epoch() {
    // Epoch 0 is what a sampler never given set_epoch deals.
    assert_eq!(
        all_ranks(10, 3, true, 0, false, 0),
        [vec![4, 5, 0, 2], vec![1, 3, 8, 4], vec![7, 9, 6, 1]]
    );
    assert_eq!(
        all_ranks(10, 3, true, 0, false, 1),
        [vec![5, 2, 9, 4], vec![6, 0, 3, 5], vec![1, 8, 7, 6]]
    );
    assert_eq!(
        all_ranks(10, 3, true, 0, true, 1),
        [vec![5, 2, 9], vec![6, 0, 3], vec![1, 8, 7]]
    );
    assert_eq!(
        all_ranks(11, 2, true, 42, false, 0),
        [vec![6, 9, 1, 0, 3, 4], vec![8, 2, 10, 7, 5, 6]]
    );
    assert_eq!(
        all_ranks(11, 2, true, 42, false, 3),
        [vec![7, 9, 6, 8, 10, 3], vec![0, 1, 4, 5, 2, 7]]
    );
    assert_eq!(
        all_ranks(3, 5, true, 7, false, 2),
        [vec![1], vec![0], vec![2], vec![1], vec![0]]
    );
}

#[test]
fn without_set_epoch_every_pass_repeats_epoch_zero_and_warns_once() {
    let mut s = DistributedSampler::new(10, 3, 0).unwrap();
    assert_eq!(s.epoch(), [4, 5, 0, 2]);
    assert_eq!(
        s.epoch(),
        [4, 5, 0, 2],
        "PyTorch's semantics: the order repeats"
    );
    let warned: Vec<_> = berth::alloc::warnings::said()
        .into_iter()
        .filter(|w| w.key == berth_data::SET_EPOCH_WARNING)
        .collect();
    assert_eq!(warned.len(), 1);
    assert!(
        warned[0].message.contains("set_epoch"),
        "{}",
        warned[0].message
    );
}

#[test]
fn a_clone_given_to_the_loader_follows_set_epoch() {
    let sampler = DistributedSampler::new(10, 3, 1).unwrap();
    let loader = DataLoader::builder(VecDataset::new((0..10usize).collect()))
        .batch_size(4)
        .sampler(sampler.clone())
        .collate_fn(|rows: Vec<usize>| Ok(rows))
        .build()
        .unwrap();
    sampler.set_epoch(1);
    let batches: Vec<Vec<usize>> = loader.iter().map(|b| b.unwrap()).collect();
    assert_eq!(batches, [vec![6, 0, 3, 5]]);
    assert_eq!(sampler.current_epoch(), 1);
}

#[test]
fn a_bad_rank_is_pytorchs_value_error() {
    let err = DistributedSampler::new(3, 2, 2).unwrap_err();
    assert!(matches!(
        err,
        DataError::InvalidOption { option: "rank", .. }
    ));
    assert_eq!(
        err.to_string(),
        "Invalid rank 2, rank should be in the interval [0, 1]"
    );
    let err = DistributedSampler::new(3, 0, 0).unwrap_err();
    assert!(matches!(
        err,
        DataError::InvalidOption {
            option: "num_replicas",
            ..
        }
    ));
}
