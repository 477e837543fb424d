//! Views share storage: reshape/view, transpose/t, permute, narrow, select, unsqueeze,
//! squeeze, expand — with PyTorch's strides.

use berth::{DType, Device, Tensor};

use crate::util::{t, v};

fn arange6() -> Tensor {
    Tensor::arange(0.0, 6.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap()
}

#[test]
fn reshape_and_view_share_storage_and_have_dense_strides() {
    let x = arange6();
    assert_eq!(x.strides(), &[3, 1]);
    let y = x.view(&[3, 2]).unwrap();
    assert!(y.shares_storage(&x));
    assert_eq!(y.strides(), &[2, 1]);
    y.add_scalar_(10.0).unwrap();
    assert_eq!(v(&x), vec![10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
    assert!(x.reshape(&[4]).is_err());
}

#[test]
fn transpose_is_a_strided_view_and_view_of_it_fails_but_reshape_copies() {
    let x = arange6();
    let tt = x.t().unwrap();
    assert_eq!(
        (tt.shape(), tt.strides()),
        (&[3usize, 2][..], &[1usize, 3][..])
    );
    assert!(!tt.is_contiguous() && tt.shares_storage(&x));
    assert_eq!(v(&tt), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let e = tt.view(&[6]).unwrap_err();
    assert!(e.to_string().contains("use .reshape"), "{e}");
    let r = tt.reshape(&[6]).unwrap();
    assert!(!r.shares_storage(&x));
    assert_eq!(v(&r), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    // A view through a non-contiguous tensor when strides allow it (split a dim).
    let p = Tensor::zeros(&[4, 6], DType::F32, Device::Cpu)
        .unwrap()
        .t()
        .unwrap(); // [6,4] strides [1,6]
    let q = p.view(&[2, 3, 4]).unwrap();
    assert_eq!(q.strides(), &[3, 1, 6]);
}

#[test]
fn permute_narrow_select_unsqueeze_squeeze_expand() {
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3, 4])
        .unwrap();
    let p = x.permute(&[2, 0, 1]).unwrap();
    assert_eq!(
        (p.shape(), p.strides()),
        (&[4usize, 2, 3][..], &[1usize, 12, 4][..])
    );
    assert!(x.permute(&[0, 0, 1]).is_err());
    let n = x.narrow(2, 1, 2).unwrap();
    assert_eq!((n.shape(), n.storage_offset()), (&[2usize, 3, 2][..], 1));
    assert_eq!(
        v(&n.select(0, 1).unwrap().select(0, 2).unwrap()),
        vec![21.0, 22.0]
    );
    let e = x.narrow(2, 3, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "narrow: start (3) + length (2) exceeds dimension size ({}) of dimension 2.",
            x.shape()[2]
        ),
        "the start and length as given, as PyTorch words it"
    );
    assert!(x.select(1, 3).is_err());
    let u = x.unsqueeze(-1).unwrap();
    assert_eq!(
        (u.shape(), u.strides()),
        (&[2usize, 3, 4, 1][..], &[12usize, 4, 1, 1][..])
    );
    assert_eq!(u.squeeze().shape(), &[2, 3, 4]);
    assert_eq!(u.squeeze_dim(0).unwrap().shape(), &[2, 3, 4, 1]);
    let row = t(&[1.0, 2.0, 3.0], &[3]);
    let e = row.expand(&[2, 3]).unwrap();
    assert_eq!(
        (e.strides(), v(&e)),
        (&[0usize, 1][..], vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0])
    );
    assert!(e.shares_storage(&row));
    assert!(row.expand(&[2, 4]).is_err());
}

#[test]
fn out_of_range_dims_are_typed_errors() {
    let x = arange6();
    let e = x.transpose(0, 2).unwrap_err();
    assert!(
        matches!(
            e,
            berth::Error::DimOutOfRange {
                dim: 2,
                rank: 2,
                ..
            }
        ),
        "{e:?}"
    );
    // PyTorch's message.
    assert!(
        e.to_string()
            .contains("Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
        "{e}"
    );
    assert!(x.unsqueeze(3).is_err());
    assert!(x.reshape_infer(&[-1, -1]).is_err());
    assert_eq!(x.reshape_infer(&[-1, 2]).unwrap().shape(), &[3, 2]);
    assert_eq!(x.flatten(0, -1).unwrap().shape(), &[6]);
}

#[test]
fn views_of_zero_size_tensors_follow_compute_stride() {
    let z = Tensor::zeros(&[2, 0], DType::F32, Device::Cpu).unwrap();
    assert!(z.is_contiguous());
    // The same shape keeps the strides; another gets resize's strides (a size 0 counts as 1).
    let same = z.view(&[2, 0]).unwrap();
    assert_eq!(
        (same.shape(), same.strides()),
        (&[2usize, 0][..], &[1usize, 1][..])
    );
    assert!(same.shares_storage(&z));
    let other = z.view(&[0, 5]).unwrap();
    assert_eq!(
        (other.shape(), other.strides()),
        (&[0usize, 5][..], &[5usize, 1][..])
    );
    assert_eq!(z.view(&[0]).unwrap().shape(), &[0]);
    // Through a transpose (strides no longer row-major) as well.
    let zt = z.t().unwrap();
    assert_eq!(zt.view(&[0, 3]).unwrap().shape(), &[0, 3]);
    assert_eq!(zt.reshape(&[3, 0, 1]).unwrap().shape(), &[3, 0, 1]);
    assert!(zt.reshape(&[0]).unwrap().shares_storage(&z));
    // The element count must still match.
    assert!(z.view(&[1]).is_err());
}

#[track_caller]
fn overlap(r: berth::Result<()>, op: &str) {
    let e = r.unwrap_err();
    assert!(
        matches!(&e, berth::Error::InternalOverlap { op: o, shape, strides }
            if *o == op && shape == &[4usize, 3] && strides == &[0usize, 1]),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{op}: unsupported operation: more than one element of the written-to tensor refers \
             to a single memory location. Please clone() the tensor before performing the \
             operation. (shape [4, 3], strides [0, 1])"
        )
    );
}

#[test]
fn in_place_writes_through_an_expanded_view_are_refused() {
    let b = Tensor::zeros(&[3], DType::F32, Device::Cpu).unwrap();
    let e = b.unsqueeze(0).unwrap().expand(&[4, 3]).unwrap();
    let ones = Tensor::ones(&[4, 3], DType::F32, Device::Cpu).unwrap();
    overlap(e.add_scalar_(1.0), "add");
    overlap(e.mul_scalar_(2.0), "mul");
    overlap(e.add_(&ones), "add");
    overlap(e.sub_(&ones), "sub");
    overlap(e.mul_(&ones), "mul");
    overlap(e.div_(&ones), "div");
    overlap(e.add_scaled_(&ones, 0.5), "add");
    overlap(e.copy_(&ones), "copy_");
    overlap(e.copy_(&ones.to_dtype(DType::F64).unwrap()), "copy_");
    // Nothing was written (before: b became [4, 4, 4]).
    assert_eq!(v(&b), vec![0.0, 0.0, 0.0]);
    // The same check on meta.
    let m = Tensor::zeros(&[3], DType::F32, Device::Meta).unwrap();
    let me = m.unsqueeze(0).unwrap().expand(&[4, 3]).unwrap();
    overlap(me.add_scalar_(1.0), "add");
    // fill_ is idempotent, so PyTorch allows it on overlapping memory, and so does berth.
    e.fill_(2.0).unwrap();
    assert_eq!(v(&b), vec![2.0, 2.0, 2.0]);
    // A size-1 dimension with stride 0 is no overlap; the clone() is writable.
    let one = b.unsqueeze(0).unwrap().expand(&[1, 3]).unwrap();
    one.add_scalar_(1.0).unwrap();
    assert_eq!(v(&b), vec![3.0, 3.0, 3.0]);
    let c = e.clone().unwrap();
    c.add_scalar_(1.0).unwrap();
    assert_eq!(v(&c), vec![4.0; 12]);
}

#[test]
fn zero_dim_tensors_take_dims_0_and_minus_1_as_torch() {
    let s = t(&[5.0], &[]);
    // squeeze/transpose accept [-1, 0] on a 0-d tensor and leave it as it is.
    assert_eq!(s.squeeze_dim(0).unwrap().shape(), &[] as &[usize]);
    assert_eq!(s.squeeze_dim(-1).unwrap().shape(), &[] as &[usize]);
    assert_eq!(v(&s.transpose(0, -1).unwrap()), vec![5.0]);
    // torch.tensor(5.).squeeze(5): "Dimension out of range (expected to be in range of
    // [-1, 0], but got 5)".
    for e in [
        s.squeeze_dim(5).unwrap_err(),
        s.transpose(0, 1).unwrap_err(),
        s.index_select(1, &Tensor::from_slice(&[0i64], &[1], Device::Cpu).unwrap())
            .unwrap_err(),
    ] {
        assert!(
            matches!(e, berth::Error::DimOutOfRange { rank: 0, .. }),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("Dimension out of range (expected to be in range of [-1, 0], but got"),
            "{e}"
        );
    }
    // narrow and select have no dimension to index: PyTorch's messages.
    let e = s.narrow(0, 0, 1).unwrap_err();
    assert!(
        e.to_string()
            .contains("narrow() cannot be applied to a 0-dim tensor."),
        "{e}"
    );
    let e = s.select(0, 0).unwrap_err();
    assert!(
        e.to_string()
            .contains("select() cannot be applied to a 0-dim tensor."),
        "{e}"
    );
    // index_select of a 0-d tensor with the one index 0 is 0-d, as PyTorch.
    let i0 = Tensor::from_slice(&[0i64], &[1], Device::Cpu).unwrap();
    let r = s.index_select(-1, &i0).unwrap();
    assert_eq!((r.shape(), v(&r)), (&[] as &[usize], vec![5.0]));
    let two = Tensor::from_slice(&[0i64, 0], &[2], Device::Cpu).unwrap();
    let e = s.index_select(0, &two).unwrap_err();
    assert!(
        e.to_string()
            .contains("Index to scalar can have only 1 value, got 2 value(s)"),
        "{e}"
    );
    let i1 = Tensor::from_slice(&[1i64], &[1], Device::Cpu).unwrap();
    assert!(s.index_select(0, &i1).is_err());
}
