//! Gathering rows of a host tensor into one batch buffer, with streaming stores for large
//! batches (Note [Streaming stores for large batches]).
//!
//! # Note [Streaming stores for large batches]
//! A batch of `TensorDataset` rows is one `memcpy` per row into a fresh output buffer that no
//! core will read again soon: a worker writes it, and then the GPU's copy engine (pinned
//! batches) or another thread reads it. Written with ordinary stores, every cache line of the
//! output is first read from memory (the store misses, so the core fetches the line to own it),
//! then written back when it is evicted: each output byte costs two bytes of memory traffic on
//! top of the byte read from the dataset. Streaming stores (`movntdq`) write whole lines without
//! reading them, so the gather moves two bytes per output byte instead of three. glibc's
//! `memcpy` does the same for a single large copy (above its non-temporal threshold), which is
//! why a plain parallel `memcpy` of the dataset, the yardstick of `berth bench dataloader`, is
//! faster than a gather of 12 KiB rows with ordinary stores; and with 16 workers gathering,
//! the read-for-ownership traffic also competes with the copy engine reading pinned batches.
//! On the other hand, a small batch (Fashion-MNIST's 64 × 784 f32 is 200 KB) is read right
//! away by the training step from the cache it was written into; streaming it to memory would
//! make that step read it back from DRAM. So rows are streamed only when the batch is at least
//! [`STREAMING_MIN_BYTES`] (larger than a core's L2 cache, so an ordinary gather would not
//! keep it there anyway) and each row at least 64 bytes; the part of a row before its first
//! 16-byte boundary and the tail under 64 bytes use ordinary copies. A store fence ends the
//! gather, because streaming stores are weakly ordered: without it the buffer could be handed
//! to another thread (or a DMA) before all its bytes are visible. `BERTH_STREAMING_STORES=0`
//! turns them off, to measure what they change.
//! Intel's description of the instructions and of the fence: <https://www.intel.com/content/www/us/en/docs/intrinsics-guide/index.html#text=_mm_stream_si128>.

/// Output buffers of at least this many bytes are written with streaming stores (1 MiB; see
/// Note [Streaming stores for large batches]).
pub(crate) const STREAMING_MIN_BYTES: usize = 1 << 20;

/// Rows shorter than this many bytes are copied with ordinary stores whatever the batch size.
const STREAMING_MIN_ROW: usize = 64;

/// Copies row `indices[k]` of `src` (rows of `row` bytes) into row `k` of `dst`.
///
/// # Panics
/// When `dst.len() != row * indices.len()` or a row `indices[k]` does not lie inside `src`: the
/// callers check their indices against the dataset's length first.
pub(crate) fn gather_rows(dst: &mut [u8], src: &[u8], row: usize, indices: &[usize]) {
    let streaming = dst.len() >= STREAMING_MIN_BYTES && row >= STREAMING_MIN_ROW && enabled();
    gather_rows_with(dst, src, row, indices, streaming);
}

/// Whether streaming stores may be used: yes unless `BERTH_STREAMING_STORES=0` (read once; for
/// measuring what they change, as `berth bench dataloader` on the GPU host does).
fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED
        .get_or_init(|| std::env::var("BERTH_STREAMING_STORES").map_or(true, |v| v.trim() != "0"))
}

/// [`gather_rows`] with the choice of stores made by the caller (the tests use both on small
/// buffers).
fn gather_rows_with(dst: &mut [u8], src: &[u8], row: usize, indices: &[usize], streaming: bool) {
    assert_eq!(
        dst.len(),
        row * indices.len(),
        "gather_rows: the output holds {} bytes, not {} rows of {row}",
        dst.len(),
        indices.len()
    );
    if row == 0 {
        return;
    }
    let rows = dst.chunks_exact_mut(row).zip(indices);
    if streaming && stream::AVAILABLE {
        for (d, &i) in rows {
            stream::copy(d, &src[i * row..(i + 1) * row]);
        }
        stream::fence();
    } else {
        for (d, &i) in rows {
            d.copy_from_slice(&src[i * row..(i + 1) * row]);
        }
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod stream {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// SSE2 is part of every x86-64 processor.
    pub(super) const AVAILABLE: bool = true;

    /// Copies `s` into `d` (same length), the 16-byte-aligned middle of `d` with streaming
    /// stores, 64 bytes at a time.
    pub(super) fn copy(d: &mut [u8], s: &[u8]) {
        debug_assert_eq!(d.len(), s.len());
        let head = d.as_ptr().align_offset(16).min(d.len());
        d[..head].copy_from_slice(&s[..head]);
        let body = (d.len() - head) / 64 * 64;
        let dp = d[head..].as_mut_ptr();
        let sp = s[head..].as_ptr();
        let mut off = 0;
        while off < body {
            // SAFETY: `off + 64 <= body <= d.len() - head == s.len() - head`, so the four
            // 16-byte loads read inside `s[head..]` (unaligned loads allow any address) and the
            // four stores write inside `d[head..]`; `dp` is 16-byte aligned (`head` is `d`'s
            // offset to its first 16-byte boundary) and `off` a multiple of 64, as
            // `_mm_stream_si128` requires; `d` and `s` are distinct slices (one `&mut`).
            // SSE2 is present on every x86-64 processor.
            unsafe {
                let a = _mm_loadu_si128(sp.add(off).cast::<__m128i>());
                let b = _mm_loadu_si128(sp.add(off + 16).cast::<__m128i>());
                let c = _mm_loadu_si128(sp.add(off + 32).cast::<__m128i>());
                let e = _mm_loadu_si128(sp.add(off + 48).cast::<__m128i>());
                _mm_stream_si128(dp.add(off).cast::<__m128i>(), a);
                _mm_stream_si128(dp.add(off + 16).cast::<__m128i>(), b);
                _mm_stream_si128(dp.add(off + 32).cast::<__m128i>(), c);
                _mm_stream_si128(dp.add(off + 48).cast::<__m128i>(), e);
            }
            off += 64;
        }
        let rest = head + body;
        d[rest..].copy_from_slice(&s[rest..]);
    }

    /// Orders every streaming store before later stores (and so before the batch is handed
    /// on).
    pub(super) fn fence() {
        // SAFETY: `sfence` has no preconditions; SSE is present on every x86-64 processor.
        unsafe { _mm_sfence() }
    }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
mod stream {
    /// No streaming stores on this target: ordinary copies only.
    pub(super) const AVAILABLE: bool = false;

    pub(super) fn copy(d: &mut [u8], s: &[u8]) {
        d.copy_from_slice(s);
    }

    pub(super) fn fence() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(src: &[u8], row: usize, indices: &[usize]) -> Vec<u8> {
        indices
            .iter()
            .flat_map(|&i| src[i * row..(i + 1) * row].iter().copied())
            .collect()
    }

    /// Both kinds of store give exactly the naive gather, for rows shorter than, equal to and
    /// longer than one 64-byte step, and for outputs starting off any 16-byte boundary.
    #[test]
    fn streaming_and_ordinary_gathers_equal_a_naive_gather() {
        let n = 37;
        for row in [1, 15, 16, 63, 64, 65, 100, 128, 12288 + 3] {
            let src: Vec<u8> = (0..n * row).map(|k| (k * 7 % 251) as u8).collect();
            let indices: Vec<usize> = (0..50).map(|k| (k * 13 + 5) % n).collect();
            let want = naive(&src, row, &indices);
            for shift in [0, 1, 8, 15] {
                for streaming in [false, true] {
                    let mut buf = vec![0xAAu8; row * indices.len() + shift];
                    let dst = &mut buf[shift..];
                    gather_rows_with(dst, &src, row, &indices, streaming);
                    assert_eq!(
                        dst,
                        &want[..],
                        "row {row}, shift {shift}, streaming {streaming}"
                    );
                }
            }
        }
    }

    /// The public entry point picks streaming stores above the threshold and gets the same bytes.
    #[test]
    fn a_large_gather_is_exact() {
        let row = 3072 * 4;
        let n = 200;
        let src: Vec<u8> = (0..n * row).map(|k| (k % 253) as u8).collect();
        let indices: Vec<usize> = (0..256).map(|k| (k * 71 + 3) % n).collect();
        assert!(row * indices.len() >= STREAMING_MIN_BYTES);
        let mut dst = vec![0u8; row * indices.len()];
        gather_rows(&mut dst, &src, row, &indices);
        assert_eq!(dst, naive(&src, row, &indices));
    }

    #[test]
    fn zero_width_rows_copy_nothing() {
        let mut dst: Vec<u8> = Vec::new();
        gather_rows(&mut dst, &[], 0, &[0, 5, 9]);
        assert!(dst.is_empty());
    }

    #[test]
    #[should_panic(expected = "gather_rows: the output holds")]
    fn a_wrong_output_length_panics_with_the_lengths() {
        let mut dst = vec![0u8; 5];
        gather_rows(&mut dst, &[0; 40], 4, &[0, 1]);
    }
}
