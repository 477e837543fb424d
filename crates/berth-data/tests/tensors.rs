//! Tensor datasets and `default_collate`: views, stacking, numbers, containers, splits.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use berth::{DType, Device, Tensor};
use berth_data::{
    random_split, Collatable, CollateContext, DataError, DataLoader, Dataset, Generator,
    SplitLengths, Subset, TensorDataset, VecDataset,
};

fn arange(n: usize, dtype: DType) -> Tensor {
    Tensor::arange(0.0, n as f64, 1.0, dtype, Device::Cpu).unwrap()
}

fn ctx() -> CollateContext {
    CollateContext::default()
}

#[test]
fn tensor_dataset_items_are_views_sharing_storage() {
    let x = arange(12, DType::F32).reshape(&[4, 3]).unwrap();
    let y = arange(4, DType::I64);
    let ds = TensorDataset::new(vec![x.alias(), y.alias()]).unwrap();
    assert_eq!(ds.len(), 4);
    let item = ds.get(2).unwrap();
    assert!(item[0].shares_storage(&x) && item[1].shares_storage(&y));
    assert_eq!(item[0].to_vec::<f32>().unwrap(), vec![6.0, 7.0, 8.0]);
    assert_eq!(item[1].item::<i64>().unwrap(), 2);
    // A write through the dataset's tensor is seen by the item (same memory).
    x.fill_(5.0).unwrap();
    assert_eq!(item[0].to_vec::<f32>().unwrap(), vec![5.0; 3]);
    assert!(matches!(
        ds.get(4),
        Err(DataError::IndexOutOfRange { index: 4, len: 4 })
    ));
    let err = TensorDataset::new(vec![arange(4, DType::F32), arange(5, DType::F32)]).unwrap_err();
    assert!(
        err.to_string().starts_with("Size mismatch between tensors"),
        "{err}"
    );
}

#[test]
fn gathered_batches_equal_stacked_items() {
    let x = arange(30, DType::F32).reshape(&[10, 3]).unwrap();
    let y = arange(10, DType::I64);
    let ds = Arc::new(TensorDataset::new(vec![x, y]).unwrap());
    let dl = DataLoader::<TensorDataset>::builder(Arc::clone(&ds))
        .batch_size(4)
        .shuffle(true)
        .generator(Generator::new(3))
        .build()
        .unwrap();
    let mut seen = Vec::new();
    for b in &dl {
        let b: Vec<Tensor> = b.unwrap();
        assert_eq!(b[0].shape()[1..], [3]);
        let labels = b[1].to_vec::<i64>().unwrap();
        let rows = b[0].to_vec::<f32>().unwrap();
        for (r, &l) in labels.iter().enumerate() {
            let item = ds.get(l as usize).unwrap();
            assert_eq!(
                &rows[r * 3..r * 3 + 3],
                &item[0].to_vec::<f32>().unwrap()[..]
            );
            // The per-item path gives the same batch.
        }
        let items = labels
            .iter()
            .map(|&l| ds.get(l as usize).unwrap())
            .collect();
        let slow = <Vec<Tensor> as Collatable>::collate(items, &ctx()).unwrap();
        assert_eq!(slow[0].to_vec::<f32>().unwrap(), rows);
        seen.extend(labels);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..10).collect::<Vec<i64>>());
}

#[test]
fn default_collate_numbers_keep_their_kind() {
    let f = <f64 as Collatable>::collate(vec![1.5, 2.5], &ctx()).unwrap();
    assert_eq!((f.dtype(), f.shape()), (DType::F64, &[2usize][..]));
    let f = <f32 as Collatable>::collate(vec![1.5, 2.5], &ctx()).unwrap();
    assert_eq!(f.dtype(), DType::F32);
    let i = <usize as Collatable>::collate(vec![3, 4, 5], &ctx()).unwrap();
    assert_eq!(i.dtype(), DType::I64);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![3, 4, 5]);
    let b = <bool as Collatable>::collate(vec![true, false], &ctx()).unwrap();
    assert_eq!(b.dtype(), DType::Bool);
}

#[test]
fn default_collate_recurses_into_tuples_vecs_and_maps() {
    let t = |v: f32| Tensor::full(&[2], f64::from(v), DType::F32, Device::Cpu).unwrap();
    let (x, n, s) = <(Tensor, i64, String)>::collate(
        vec![(t(1.0), 7, "a".to_string()), (t(2.0), 8, "b".to_string())],
        &ctx(),
    )
    .unwrap();
    assert_eq!(x.shape(), &[2, 2]);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 2.0, 2.0]);
    assert_eq!(n.to_vec::<i64>().unwrap(), vec![7, 8]);
    assert_eq!(s, vec!["a".to_string(), "b".to_string()]);

    let v = <Vec<i64>>::collate(vec![vec![1, 2], vec![3, 4]], &ctx()).unwrap();
    assert_eq!(v[0].to_vec::<i64>().unwrap(), vec![1, 3]);
    assert_eq!(v[1].to_vec::<i64>().unwrap(), vec![2, 4]);
    let err = <Vec<i64>>::collate(vec![vec![1, 2], vec![3]], &ctx()).unwrap_err();
    assert!(
        err.to_string()
            .contains("each element in list of batch should be of equal size"),
        "{err}"
    );

    let m = |a: i64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), a * 10)]);
    let out = <BTreeMap<String, i64>>::collate(vec![m(1), m(2)], &ctx()).unwrap();
    assert_eq!(out["b"].to_vec::<i64>().unwrap(), vec![10, 20]);
    let h1 = HashMap::from([("k", 1i64)]);
    let h2 = HashMap::from([("j", 1i64)]);
    let err = <HashMap<&str, i64>>::collate(vec![h1, h2], &ctx()).unwrap_err();
    assert!(err.to_string().contains("has no key \"k\""), "{err}");

    let err = Tensor::collate(
        vec![t(1.0), Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap()],
        &ctx(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("stack expects each tensor to be equal size"),
        "{err}"
    );
}

#[test]
fn named_struct_batches_keep_their_type() {
    struct Sample {
        x: Tensor,
        label: i64,
    }
    struct SampleBatch {
        x: Tensor,
        label: Tensor,
    }
    berth_data::impl_collate!(Sample { x, label } => SampleBatch);
    let s = |v: f64, l| Sample {
        x: Tensor::full(&[3], v, DType::F32, Device::Cpu).unwrap(),
        label: l,
    };
    let b: SampleBatch = Sample::collate(vec![s(1.0, 4), s(2.0, 5)], &ctx()).unwrap();
    assert_eq!(b.x.shape(), &[2, 3]);
    assert_eq!(b.label.to_vec::<i64>().unwrap(), vec![4, 5]);
}

#[test]
fn random_split_is_seeded_disjoint_and_complete() {
    let ds = Arc::new(VecDataset::new((0..10).collect::<Vec<usize>>()));
    let parts = random_split(
        Arc::clone(&ds),
        SplitLengths::Counts(vec![7, 3]),
        &Generator::new(1),
    )
    .unwrap();
    let again = random_split(
        Arc::clone(&ds),
        SplitLengths::Counts(vec![7, 3]),
        &Generator::new(1),
    )
    .unwrap();
    assert_eq!(parts[0].indices(), again[0].indices());
    let other = random_split(
        Arc::clone(&ds),
        SplitLengths::Counts(vec![7, 3]),
        &Generator::new(2),
    )
    .unwrap();
    assert_ne!(parts[0].indices(), other[0].indices());
    let mut all: Vec<usize> = parts
        .iter()
        .flat_map(|p| (0..p.len()).map(|i| p.get(i).unwrap()))
        .collect();
    assert_eq!(all.len(), 10);
    all.sort_unstable();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    let fr = random_split(
        Arc::clone(&ds),
        SplitLengths::Fractions(vec![0.25, 0.25, 0.5]),
        &Generator::new(1),
    )
    .unwrap();
    assert_eq!(
        fr.iter().map(Subset::len).collect::<Vec<_>>(),
        vec![3, 2, 5]
    );
    let err = random_split(ds, SplitLengths::Counts(vec![5, 3]), &Generator::new(1)).unwrap_err();
    assert!(err
        .to_string()
        .starts_with("Sum of input lengths does not equal the length of the input dataset!"));
}

#[test]
fn subset_maps_indices_and_checks_them() {
    let ds = Arc::new(VecDataset::new(vec!["a", "b", "c", "d"]));
    let s = Subset::new(Arc::clone(&ds), vec![3, 1]).unwrap();
    assert_eq!(
        (s.len(), s.get(0).unwrap(), s.get(1).unwrap()),
        (2, "d", "b")
    );
    assert!(matches!(
        s.get(2),
        Err(DataError::IndexOutOfRange { index: 2, len: 2 })
    ));
    assert!(matches!(
        Subset::new(ds, vec![4]),
        Err(DataError::IndexOutOfRange { index: 4, len: 4 })
    ));
}

/// Zero-width rows (a `[5, 0]` tensor) collate into `[batch, 0]` batches, through the loader's
/// gather path and the per-item stacking path alike (this panicked slicing storage bytes).
#[test]
fn zero_width_rows_collate_into_empty_batches() {
    let x = Tensor::zeros(&[5, 0], DType::F32, Device::Cpu).unwrap();
    let ds = Arc::new(TensorDataset::new(vec![x]).unwrap());
    for drop_last in [false, true] {
        let dl = DataLoader::<TensorDataset>::builder(Arc::clone(&ds))
            .batch_size(2)
            .drop_last(drop_last)
            .build()
            .unwrap();
        let shapes: Vec<Vec<usize>> = dl.iter().map(|b| b.unwrap()[0].shape().to_vec()).collect();
        let mut want = vec![vec![2, 0], vec![2, 0]];
        if !drop_last {
            want.push(vec![1, 0]);
        }
        assert_eq!(shapes, want, "drop_last {drop_last}");
    }
    let items = (0..2).map(|i| ds.get(i).unwrap()).collect();
    let stacked = <Vec<Tensor> as Collatable>::collate(items, &ctx()).unwrap();
    assert_eq!(stacked[0].shape(), &[2, 0]);
    assert_eq!(stacked[0].numel(), 0);
}
