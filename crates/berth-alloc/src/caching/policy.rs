//! Sizes: rounding, pool choice and segment sizes (`CUDACachingAllocator.cpp`: `round_size`,
//! `roundup_power2_next_division`, `get_pool`, `get_allocation_size`). Pure functions.

use crate::config::AllocatorConfig;

/// `kMinBlockSize`: every request is rounded up to a multiple of 512 bytes.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: requests of at most 1 MiB (after rounding) use the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: segment size of the small pool (2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kLargeBuffer`: segment size for 1–10 MiB requests (20 MiB), page size of large-pool
/// expandable segments.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kMinLargeAlloc`: large requests below 10 MiB get a [`LARGE_BUFFER`] segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kRoundLarge`: segments for requests of 10 MiB and more are rounded up to 2 MiB.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Requests of at least this many bytes fail as "more than 1EB" (PyTorch).
pub const MAX_REQUEST: u64 = 1 << 60;

/// `roundup_power2_next_division`: rounds `size` up to the next of `divisions` equal steps
/// between the surrounding powers of two; a power of two is kept, a step of 0 gives the next
/// power of two.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded = size & !(step - 1);
    if rounded == size {
        size
    } else {
        rounded + step
    }
}

/// `round_size`: the block size handed out for a request of `size` bytes (`size < 2^60`).
pub fn round_size(size: u64, cfg: &AllocatorConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = cfg.divisions_for(size);
    if divisions > 1
        && MIN_BLOCK_SIZE
            .checked_mul(divisions)
            .is_some_and(|m| size > m)
    {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// Whether a rounded size belongs to the small pool (≤ 1 MiB; exactly 1 MiB is small).
pub fn is_small(rounded: u64) -> bool {
    rounded <= SMALL_SIZE
}

/// `get_allocation_size`: the segment size asked of the backend when no cached block fits.
pub fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing: 2^55 divisions overflowed `512 × divisions`. The largest division
    /// count the parser accepts (2^32) leaves sizes below 2 TiB rounded to 512 bytes only.
    #[test]
    fn the_largest_division_count_rounds_to_512_bytes() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:4294967296").unwrap();
        assert_eq!(round_size(3 << 30 | 1, &c), (3 << 30) + 512);
    }

    #[test]
    fn rounding_follows_pytorch() {
        let cfg = AllocatorConfig::default();
        assert_eq!(round_size(0, &cfg), 512);
        assert_eq!(round_size(516, &cfg), 1024);
        assert_eq!(
            round_size(64_000_000, &cfg),
            64_000_000_u64.div_ceil(512) * 512
        );
        let cfg4 = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        // At most 512 × divisions bytes, plain 512-byte rounding applies.
        assert_eq!(round_size(1200, &cfg4), 1536);
        assert_eq!(round_size(3 << 20 | 1, &cfg4), 3584 << 10);
        assert_eq!(roundup_power2_next_division(1 << 20, 4), 1 << 20);
    }

    #[test]
    fn segment_sizes_follow_pytorch() {
        assert_eq!(allocation_size(512), 2 << 20);
        assert_eq!(allocation_size(1 << 20), 2 << 20);
        assert_eq!(allocation_size((1 << 20) + 512), 20 << 20);
        assert_eq!(allocation_size(10 << 20), 10 << 20);
        assert_eq!(allocation_size((10 << 20) + 512), 12 << 20);
    }
}
