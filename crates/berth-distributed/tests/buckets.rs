//! DDP bucket assignment: sizes, order, limits, a parameter larger than a bucket. Expected
//! lists were printed by PyTorch 2.15's `torch.distributed._compute_bucket_assignment_by_size`
//! (tensors of `torch.uint8` whose byte counts are the sizes below); for DDP's order the
//! tensors were passed reversed and the indices mapped back.

use berth_distributed::bucket::{assign_buckets, ddp_buckets, BucketOptions, MIB};
use berth_distributed::DistError;

fn params(b: &[berth_distributed::bucket::Bucket]) -> Vec<Vec<usize>> {
    b.iter().map(|b| b.params.clone()).collect()
}

fn limits(b: &[berth_distributed::bucket::Bucket]) -> Vec<usize> {
    b.iter().map(|b| b.limit_bytes).collect()
}

#[test]
fn small_first_bucket_then_25_mib() {
    // PyTorch: ([[0, 1], [2, 3, 4, 5], [6], [7]], [1 MiB, 25 MiB, 25 MiB, 25 MiB]).
    let sizes = [
        MIB / 2,
        MIB / 2,
        MIB,
        10 * MIB,
        10 * MIB,
        10 * MIB,
        30 * MIB,
        4,
    ];
    let b = assign_buckets(&sizes, &[MIB, 25 * MIB]).unwrap();
    assert_eq!(params(&b), [vec![0, 1], vec![2, 3, 4, 5], vec![6], vec![7]]);
    assert_eq!(limits(&b), [MIB, 25 * MIB, 25 * MIB, 25 * MIB]);
    assert_eq!(
        b.iter().map(|b| b.size_bytes).collect::<Vec<_>>(),
        [MIB, 31 * MIB, 30 * MIB, 4]
    );
}

#[test]
fn a_parameter_larger_than_a_bucket() {
    // Alone when it opens a bucket: PyTorch ([[0], [1], [2]], ...).
    let b = assign_buckets(&[4 * MIB, 30 * MIB, 4], &[MIB, 25 * MIB]).unwrap();
    assert_eq!(params(&b), [vec![0], vec![1], vec![2]]);
    assert_eq!(b[1].size_bytes, 30 * MIB);
    // After smaller ones it closes their bucket: PyTorch ([[0, 1], [2, 3]], ...).
    let b = assign_buckets(&[100, 30 * MIB, 100, 100], &[MIB, 25 * MIB]).unwrap();
    assert_eq!(params(&b), [vec![0, 1], vec![2, 3]]);
    assert_eq!(b[0].size_bytes, 30 * MIB + 100);
}

#[test]
fn one_limit_repeats() {
    // PyTorch: ([[0, 1, 2], [3, 4, 5]], [25 MiB, 25 MiB]).
    let b = assign_buckets(&[12 * MIB; 6], &[25 * MIB]).unwrap();
    assert_eq!(params(&b), [vec![0, 1, 2], vec![3, 4, 5]]);
    assert_eq!(limits(&b), [25 * MIB, 25 * MIB]);
    // Empty parameters join the open bucket: PyTorch ([[0, 1, 2], [3]], ...).
    let b = assign_buckets(&[0, 0, MIB, 0], &[MIB, 25 * MIB]).unwrap();
    assert_eq!(params(&b), [vec![0, 1, 2], vec![3]]);
    assert!(assign_buckets(&[], &[MIB]).unwrap().is_empty());
}

#[test]
fn ddp_order_is_reverse_definition_order() {
    // A 784-512-512-10 MLP in f32. PyTorch: [[5, 4, 3, 2], [1, 0]], [1 MiB, 25 MiB].
    let mlp = [
        784 * 512 * 4,
        512 * 4,
        512 * 512 * 4,
        512 * 4,
        512 * 10 * 4,
        10 * 4,
    ];
    let b = ddp_buckets(&mlp, BucketOptions::default()).unwrap();
    assert_eq!(params(&b), [vec![5, 4, 3, 2], vec![1, 0]]);
    assert_eq!(limits(&b), [MIB, 25 * MIB]);
    // PyTorch: [[7, 6], [5, 4], [3, 2], [1, 0]]: the 30 MiB parameter 2 shares a bucket
    // with the 4-byte parameter 3, which opened it.
    let big = [
        8 * MIB,
        4,
        30 * MIB,
        4,
        20 * MIB,
        20 * MIB,
        600 * 1024,
        600 * 1024,
    ];
    let b = ddp_buckets(&big, BucketOptions::default()).unwrap();
    assert_eq!(params(&b), [vec![7, 6], vec![5, 4], vec![3, 2], vec![1, 0]]);
    assert_eq!(limits(&b), [MIB, 25 * MIB, 25 * MIB, 25 * MIB]);
    // bucket_cap_mb=10 given: no small first bucket. PyTorch: [[7, 6, 5], [4], [3, 2], [1, 0]].
    let ten = BucketOptions {
        bucket_cap_mb: Some(10.0),
        ..BucketOptions::default()
    };
    let b = ddp_buckets(&big, ten).unwrap();
    assert_eq!(params(&b), [vec![7, 6, 5], vec![4], vec![3, 2], vec![1, 0]]);
    assert_eq!(limits(&b), [10 * MIB; 4]);
}

#[test]
fn limits_follow_pytorchs_rule() {
    assert_eq!(
        BucketOptions::default().limits_bytes().unwrap(),
        [MIB, 25 * MIB]
    );
    let o = BucketOptions {
        bucket_cap_mb: Some(0.5),
        first_bucket_bytes: None,
    };
    assert_eq!(o.limits_bytes().unwrap(), [MIB / 2]);
    let o = BucketOptions {
        bucket_cap_mb: Some(50.0),
        first_bucket_bytes: Some(2 * MIB),
    };
    assert_eq!(o.limits_bytes().unwrap(), [2 * MIB, 50 * MIB]);
}

#[test]
fn bad_options_are_typed_errors() {
    for cap in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let o = BucketOptions {
            bucket_cap_mb: Some(cap),
            first_bucket_bytes: None,
        };
        let err = o.limits_bytes().unwrap_err();
        assert!(
            matches!(
                err,
                DistError::InvalidBucketOption {
                    option: "bucket_cap_mb",
                    ..
                }
            ),
            "{err}"
        );
    }
    let o = BucketOptions {
        bucket_cap_mb: None,
        first_bucket_bytes: Some(0),
    };
    assert!(o.limits_bytes().is_err());
    assert!(assign_buckets(&[1], &[]).is_err());
    assert!(assign_buckets(&[1], &[MIB, 0]).is_err());
}
