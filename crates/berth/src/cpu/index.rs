//! Host `index_select`: whole slices copied by index along one dimension.

use super::with_repr;
use crate::device_kernels::interface::View;
use crate::Result;

/// `dst[q, j, i] = src[q, index[j], i]` over contiguous `src` `[outer, size, inner]`, i64
/// `index` `[len]` and `dst` `[outer, len, inner]` (the
/// [`DeviceKernels::index_select`](crate::device_kernels::DeviceKernels::index_select)
/// contract). An index outside `[0, size)` gives a zero slice, as on CUDA (the front-end
/// checks host indices first, so that is never reached from [`crate::Tensor::index_select`]).
///
/// # Errors
/// Storage access errors (none for host tensors).
pub(crate) fn index_select(
    dst: View<'_>,
    src: View<'_>,
    index: View<'_>,
    [outer, size, inner]: [usize; 3],
) -> Result<()> {
    let len = index.layout.numel();
    if outer * len * inner == 0 {
        // An empty result reads nothing (the views may start past their storage).
        return Ok(());
    }
    let ir = index.storage.read_host("index_select")?;
    let idx = &ir.typed::<i64>()[index.layout.offset()..index.layout.offset() + len];
    let sr = src.storage.read_host("index_select")?;
    let mut dw = dst.storage.write_host("index_select")?;
    with_repr!(dst.dtype, T => {
        let s = &sr.typed::<T>()[src.layout.offset()..src.layout.offset() + outer * size * inner];
        let d0 = dst.layout.offset();
        let d = &mut dw.typed_mut::<T>()[d0..d0 + outer * len * inner];
        for q in 0..outer {
            for (j, &k) in idx.iter().enumerate() {
                let out = &mut d[(q * len + j) * inner..(q * len + j + 1) * inner];
                match usize::try_from(k).ok().filter(|&k| k < size) {
                    Some(k) => out.copy_from_slice(&s[(q * size + k) * inner..(q * size + k + 1) * inner]),
                    None => out.fill(T::default()),
                }
            }
        }
    });
    Ok(())
}
