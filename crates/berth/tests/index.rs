//! `Tensor::index_select` on the CPU (the GPU version is compared with it in `cuda_index.rs`).

use berth::{DType, Device, Error, Tensor};

fn arange(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|v| v as f32).collect(), shape, Device::Cpu).unwrap()
}

fn idx(v: &[i64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu).unwrap()
}

#[test]
fn index_select_gathers_slices_along_any_dim() {
    let x = arange(&[4, 3]);
    let rows = x.index_select(0, &idx(&[3, 0, 3])).unwrap();
    assert_eq!(rows.shape(), &[3, 3]);
    assert_eq!(
        rows.to_vec::<f32>().unwrap(),
        vec![9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 9.0, 10.0, 11.0]
    );
    let cols = x.index_select(-1, &idx(&[2, 1])).unwrap();
    assert_eq!(cols.shape(), &[4, 2]);
    assert_eq!(
        cols.to_vec::<f32>().unwrap(),
        vec![2.0, 1.0, 5.0, 4.0, 8.0, 7.0, 11.0, 10.0]
    );
    // A non-contiguous source and index view, a middle dimension, an empty index.
    let y = arange(&[2, 3, 2]);
    let t = y.transpose(0, 2).unwrap(); // [2, 3, 2]
    let i = idx(&[9, 2, 9, 0]).narrow(0, 1, 3).unwrap(); // [2, 9, 0]: only 2 and 0 are kept below
    let i = i.index_select(0, &idx(&[0, 2])).unwrap();
    let mid = t.index_select(1, &i).unwrap();
    let want = t.contiguous().unwrap().to_vec::<f32>().unwrap();
    let got = mid.to_vec::<f32>().unwrap();
    for a in 0..2 {
        for (j, k) in [2usize, 0].iter().enumerate() {
            for c in 0..2 {
                assert_eq!(got[(a * 2 + j) * 2 + c], want[(a * 3 + k) * 2 + c]);
            }
        }
    }
    assert_eq!(x.index_select(0, &idx(&[])).unwrap().shape(), &[0, 3]);
    // Any dtype: i64 labels, as the resident batches gather them.
    let labels = idx(&[7, 8, 9]);
    assert_eq!(
        labels
            .index_select(0, &idx(&[2, 2, 0]))
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![9, 9, 7]
    );
}

#[test]
fn index_select_rejects_bad_indices_with_typed_errors() {
    let x = arange(&[4, 3]);
    let e = x.index_select(0, &idx(&[1, 4])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                dim: 0,
                index: 4,
                size: 4,
                ..
            }
        ),
        "{e}"
    );
    let e = x.index_select(0, &idx(&[-1])).unwrap_err();
    assert!(e.to_string().contains("index -1 is negative"), "{e}");
    let e = x.index_select(2, &idx(&[0])).unwrap_err();
    assert!(matches!(e, Error::DimOutOfRange { .. }), "{e}");
    let f = Tensor::zeros(&[1], DType::F32, Device::Cpu).unwrap();
    let e = x.index_select(0, &f).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    let e = x
        .index_select(0, &idx(&[0, 1]).reshape(&[1, 2]).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("must be 1-D"), "{e}");
    // Meta: the shape only.
    let m = Tensor::zeros(&[5, 2], DType::F32, Device::Meta).unwrap();
    let mi = Tensor::zeros(&[3], DType::I64, Device::Meta).unwrap();
    assert_eq!(m.index_select(0, &mi).unwrap().shape(), &[3, 2]);
}
