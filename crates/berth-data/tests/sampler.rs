//! Samplers and batch samplers: exact orders, seeding, `drop_last`.

use berth_data::{
    BatchSampler, BatchSampling, Generator, RandomSampler, Sampler, SequentialSampler,
    SubsetRandomSampler, WeightedRandomSampler,
};

#[test]
fn sequential_is_zero_to_n() {
    let mut s = SequentialSampler::new(5);
    assert_eq!(s.epoch(), vec![0, 1, 2, 3, 4]);
    assert_eq!(s.epoch(), vec![0, 1, 2, 3, 4]);
    assert_eq!(s.len(), 5);
}

#[test]
fn random_same_seed_same_order_next_epoch_differs() {
    let mut a = RandomSampler::new(10, Some(Generator::new(0)));
    let mut b = RandomSampler::new(10, Some(Generator::new(0)));
    let (a1, b1) = (a.epoch(), b.epoch());
    assert_eq!(a1, b1);
    let mut sorted = a1.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    let a2 = a.epoch();
    assert_ne!(a1, a2, "epoch 2 must reshuffle");
    assert_eq!(a2, b.epoch());
    let mut c = RandomSampler::new(10, Some(Generator::new(1)));
    assert_ne!(c.epoch(), a1, "another seed, another order");
}

#[test]
fn random_without_replacement_more_samples_than_items() {
    let mut s = RandomSampler::new(4, Some(Generator::new(3)))
        .with_num_samples(10)
        .unwrap();
    let e = s.epoch();
    assert_eq!(e.len(), 10);
    // two full permutations, then a prefix of a third
    for chunk in [&e[0..4], &e[4..8]] {
        let mut c = chunk.to_vec();
        c.sort_unstable();
        assert_eq!(c, vec![0, 1, 2, 3]);
    }
    let mut tail = e[8..].to_vec();
    tail.dedup();
    assert_eq!(tail.len(), 2);
}

#[test]
fn random_with_replacement_repeats_and_stays_in_range() {
    let mut s = RandomSampler::new(3, Some(Generator::new(5)))
        .with_replacement(true)
        .with_num_samples(300)
        .unwrap();
    let e = s.epoch();
    assert_eq!(e.len(), 300);
    assert!(e.iter().all(|&i| i < 3));
    for k in 0..3 {
        let c = e.iter().filter(|&&i| i == k).count();
        assert!((60..140).contains(&c), "index {k} drawn {c} times of 300");
    }
}

#[test]
fn random_zero_num_samples_is_pytorch_error() {
    let err = RandomSampler::new(3, None).with_num_samples(0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "num_samples should be a positive integer value, but got num_samples=0"
    );
}

#[test]
fn subset_random_permutes_the_subset() {
    let mut s = SubsetRandomSampler::new(vec![10, 20, 30, 40], Some(Generator::new(9)));
    let mut e = s.epoch();
    e.sort_unstable();
    assert_eq!(e, vec![10, 20, 30, 40]);
}

#[test]
fn weighted_follows_weights() {
    let mut s =
        WeightedRandomSampler::new(vec![0.0, 1.0, 3.0], 4000, true, Some(Generator::new(2)))
            .unwrap();
    let e = s.epoch();
    assert_eq!(
        e.iter().filter(|&&i| i == 0).count(),
        0,
        "zero weight is never drawn"
    );
    let ones = e.iter().filter(|&&i| i == 1).count();
    assert!(
        (800..1200).contains(&ones),
        "weight 1/4 drawn {ones} of 4000"
    );
    let mut no_rep =
        WeightedRandomSampler::new(vec![1.0, 1.0, 5.0, 0.0], 3, false, Some(Generator::new(2)))
            .unwrap();
    let mut e = no_rep.epoch();
    e.sort_unstable();
    assert_eq!(e, vec![0, 1, 2]);
    let err = WeightedRandomSampler::new(vec![1.0, 0.0], 2, false, None).unwrap_err();
    assert!(err
        .to_string()
        .starts_with("cannot sample n_sample > prob_dist.size(-1) samples without replacement"));
    let err = WeightedRandomSampler::new(vec![0.0, 0.0], 2, true, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid multinomial distribution (sum of probabilities <= 0)"
    );
}

#[test]
fn batch_sampler_drop_last_counts() {
    let mut keep = BatchSampler::new(SequentialSampler::new(10), 3, false).unwrap();
    assert_eq!(keep.len(), 4);
    assert_eq!(
        keep.epoch(),
        vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
    );
    let mut drop = BatchSampler::new(SequentialSampler::new(10), 3, true).unwrap();
    assert_eq!(drop.len(), 3);
    assert_eq!(
        drop.epoch(),
        vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]
    );
    let exact = BatchSampler::new(SequentialSampler::new(9), 3, true).unwrap();
    assert_eq!(exact.len(), 3);
    let err = BatchSampler::new(SequentialSampler::new(9), 0, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch_size should be a positive integer value, but got batch_size=0"
    );
}
