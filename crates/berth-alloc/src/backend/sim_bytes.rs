//! The contents of [`super::sim::SimBackend`]'s mapped memory, so that tests can check what a
//! copy moved (sleep and wake of the `paged` policy: `Note [Sleep and wake]` in
//! `crate::paged`). Sparse: a chunk of [`CHUNK`] bytes exists once something was written into
//! it; unwritten memory reads as zero; unmapping forgets the chunks of the range, as releasing
//! physical memory does.

use std::collections::BTreeMap;

/// Bytes per chunk (a divisor of the simulator's 2 MiB mapping granularity).
pub(crate) const CHUNK: u64 = 64 << 10;

/// Written bytes by chunk start address.
#[derive(Debug, Default)]
pub(crate) struct SimBytes {
    chunks: BTreeMap<u64, Box<[u8]>>,
}

impl SimBytes {
    /// Writes `data` at `addr`.
    pub(crate) fn write(&mut self, addr: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let at = addr + done as u64;
            let (base, off) = (at - at % CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK as usize - off).min(data.len() - done);
            let chunk = self
                .chunks
                .entry(base)
                .or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            chunk[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Reads `out.len()` bytes at `addr` (zero where nothing was written).
    pub(crate) fn read(&self, addr: u64, out: &mut [u8]) {
        let mut done = 0usize;
        while done < out.len() {
            let at = addr + done as u64;
            let (base, off) = (at - at % CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK as usize - off).min(out.len() - done);
            match self.chunks.get(&base) {
                Some(chunk) => out[done..done + n].copy_from_slice(&chunk[off..off + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
    }

    /// Forgets `[addr, addr + bytes)` (whole chunks: unmapped ranges are granularity-aligned).
    pub(crate) fn forget(&mut self, addr: u64, bytes: u64) {
        let gone: Vec<u64> = self
            .chunks
            .range(addr..addr.saturating_add(bytes))
            .map(|(&a, _)| a)
            .collect();
        for a in gone {
            self.chunks.remove(&a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_read_back_across_chunks_and_forget_zeroes() {
        let mut m = SimBytes::default();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        m.write(CHUNK - 7, &data);
        let mut out = vec![1u8; data.len()];
        m.read(CHUNK - 7, &mut out);
        assert_eq!(out, data);
        let mut before = [9u8; 4];
        m.read(CHUNK - 11, &mut before);
        assert_eq!(before, [0, 0, 0, 0]);
        m.forget(0, 2 * CHUNK);
        m.read(CHUNK - 7, &mut out[..10]);
        assert_eq!(&out[..10], &[0; 10]);
        m.read(2 * CHUNK, &mut out[..3]);
        let k = (2 * CHUNK - (CHUNK - 7)) as usize;
        assert_eq!(&out[..3], &data[k..k + 3]);
    }
}
