//! [`AddrMap`]: a map keyed by device address, for the allocators' hot paths (`paged`'s live
//! blocks and free-extent neighbours, the PyTorch policy's allocated blocks).
//!
//! One insert and one remove per allocation make it part of the hot path, so it is a small
//! open-addressing table rather than `std`'s `HashMap`: linear probing from a Fibonacci hash of
//! the address (addresses are 512-byte aligned and differ mostly in their middle bits; the
//! multiply carries those into the top bits the slot is taken from), at most half full, and
//! deletion by shifting the following entries back, so no tombstones build up under the
//! allocate/free churn.

/// Marks an empty slot: no block address is odd.
const EMPTY: u64 = u64::MAX;

/// 2^64 / the golden ratio (Fibonacci hashing).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// A map from device address (never `u64::MAX`) to `V`. See the module documentation.
#[derive(Debug)]
pub(crate) struct AddrMap<V> {
    /// Key of each slot, [`EMPTY`] when free; the length is a power of two.
    keys: Vec<u64>,
    /// Value of each slot; `V::default()` in free slots.
    vals: Vec<V>,
    len: usize,
    /// 64 − log2(slots): a key's home slot is the top bits of its hash.
    shift: u32,
}

impl<V: Default> Default for AddrMap<V> {
    fn default() -> Self {
        Self::with_slots(16)
    }
}

impl<V: Default> AddrMap<V> {
    fn with_slots(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two() && slots >= 2);
        AddrMap {
            keys: vec![EMPTY; slots],
            vals: std::iter::repeat_with(V::default).take(slots).collect(),
            len: 0,
            shift: 64 - slots.trailing_zeros(),
        }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(K) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.keys.len() - 1
    }

    /// The slot holding `key`.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        // `EMPTY` is never a key, but a caller may look it up (a user's pointer `0xffff..ff`):
        // without this it would match the first free slot (found by fuzzing: `raw_delete` of
        // it removed a free slot, and `record_stream` on it succeeded).
        if key == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            match self.keys[i] {
                k if k == key => return Some(i),
                EMPTY => return None,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Inserts `value` at `key`, returning the value it replaces.
    #[inline]
    pub(crate) fn insert(&mut self, key: u64, value: V) -> Option<V> {
        debug_assert_ne!(key, EMPTY, "AddrMap: u64::MAX is not an address");
        if 2 * (self.len + 1) > self.keys.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            match self.keys[i] {
                EMPTY => {
                    self.keys[i] = key;
                    self.vals[i] = value;
                    self.len += 1;
                    return None;
                }
                k if k == key => return Some(std::mem::replace(&mut self.vals[i], value)),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The value at `key`.
    #[inline]
    pub(crate) fn get(&self, key: &u64) -> Option<&V> {
        let i = self.find(*key)?;
        Some(&self.vals[i])
    }

    /// The value at `key`, mutable.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: &u64) -> Option<&mut V> {
        let i = self.find(*key)?;
        Some(&mut self.vals[i])
    }

    /// Removes and returns the value at `key`.
    #[inline]
    pub(crate) fn remove(&mut self, key: &u64) -> Option<V> {
        let mut hole = self.find(*key)?;
        let value = std::mem::take(&mut self.vals[hole]);
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.keys[j];
            if k == EMPTY {
                break;
            }
            // An entry may move back into the hole unless its home lies cyclically in
            // (hole, j]: then it would sit before its home and never be found.
            let home = self.home(k);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.keys[hole] = k;
                self.vals[hole] = std::mem::take(&mut self.vals[j]);
                hole = j;
            }
        }
        self.keys[hole] = EMPTY;
        self.len -= 1;
        Some(value)
    }

    /// Doubles the slots.
    #[cold]
    fn grow(&mut self) {
        let mut bigger = Self::with_slots(2 * self.keys.len());
        let keys = std::mem::take(&mut self.keys);
        for (k, v) in keys.into_iter().zip(std::mem::take(&mut self.vals)) {
            if k != EMPTY {
                bigger.insert(k, v);
            }
        }
        *self = bigger;
    }

    /// Every `(key, value)`, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &V)> + '_ {
        self.keys
            .iter()
            .zip(&self.vals)
            .filter(|(&k, _)| k != EMPTY)
    }

    /// How many keys there are.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_empty_marker_is_never_found() {
        let mut m: AddrMap<u64> = AddrMap::default();
        assert_eq!(m.get(&EMPTY), None);
        m.insert(512, 1);
        assert_eq!(m.get_mut(&EMPTY), None);
        assert_eq!(m.remove(&EMPTY), None);
        assert_eq!((m.len(), m.get(&512)), (1, Some(&1)));
    }

    #[test]
    fn matches_std_hash_map_under_churn() {
        let mut m: AddrMap<u64> = AddrMap::default();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let mut rand = move |n: u64| next() % n;
        for step in 0..200_000u64 {
            // Aligned addresses clustered in a few regions, as block addresses are.
            let key = (rand(4) << 40) + 512 * rand(3000);
            match rand(3) {
                0 => assert_eq!(m.insert(key, step), model.insert(key, step), "step {step}"),
                1 => assert_eq!(m.remove(&key), model.remove(&key), "step {step}"),
                _ => assert_eq!(m.get_mut(&key), model.get_mut(&key), "step {step}"),
            }
            assert_eq!(m.len(), model.len());
        }
        let mut got: Vec<(u64, u64)> = m.iter().map(|(&k, &v)| (k, v)).collect();
        let mut want: Vec<(u64, u64)> = model.into_iter().collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
