//! The mappings of a virtual-memory backend that lie under an address range, and what one of
//! them looks like once exported for another process (`Note [Sharing mapped memory]` in
//! `ipc.rs`). A leaf: the backend finds and exports them, `ipc` sends them.

use std::collections::BTreeMap;

/// One mapping exported by this process: its start address, size in bytes and descriptor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exported {
    pub(crate) addr: u64,
    pub(crate) bytes: usize,
    pub(crate) fd: i32,
}

/// The entries of `mapped` (start address → mapping, of length `len(mapping)`) that cover
/// `[addr, addr + bytes)`: adjacent, in address order, the first holding `addr`; `None` when
/// some byte of the range is not mapped or `bytes` is 0.
pub(crate) fn covering<M>(
    mapped: &BTreeMap<u64, M>,
    len: impl Fn(&M) -> usize,
    addr: u64,
    bytes: usize,
) -> Option<Vec<(u64, &M)>> {
    let end = addr.checked_add(bytes as u64)?;
    let (&first, m) = mapped.range(..=addr).next_back()?;
    if bytes == 0 || first + len(m) as u64 <= addr {
        return None;
    }
    let mut found = vec![(first, m)];
    let mut at = first + len(m) as u64;
    for (&a, m) in mapped.range(at..) {
        if at >= end {
            break;
        }
        if a != at {
            return None;
        }
        found.push((a, m));
        at = a + len(m) as u64;
    }
    (at >= end).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_takes_the_whole_adjacent_mappings_under_a_range() {
        // Mappings at 0 (4 KiB), 4 KiB (8 KiB), then a gap, then 16 KiB (4 KiB).
        let mapped: BTreeMap<u64, usize> = [(0, 4096), (4096, 8192), (16384, 4096)].into();
        let starts = |a: u64, n: usize| {
            covering(&mapped, |&m| m, a, n)
                .map(|v| v.into_iter().map(|(a, _)| a).collect::<Vec<_>>())
        };
        assert_eq!(starts(100, 10), Some(vec![0]));
        assert_eq!(starts(4000, 200), Some(vec![0, 4096]));
        assert_eq!(starts(4096, 8192), Some(vec![4096]));
        assert_eq!(starts(5000, 7000), Some(vec![4096]));
        assert_eq!(starts(16384, 4096), Some(vec![16384]));
        // Into the gap, inside the gap, past the end, empty.
        assert_eq!(starts(8192, 8192), None);
        assert_eq!(starts(12288, 10), None);
        assert_eq!(starts(16384, 4097), None);
        assert_eq!(starts(100, 0), None);
        assert_eq!(starts(u64::MAX, 2), None);
    }
}
