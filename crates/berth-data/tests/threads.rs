//! Stress: 500 `DataLoader`s with worker threads, each dropped part way through an epoch (some
//! persistent, some with slow items, some over tensors), leave the process's thread count
//! where it started.
//!
//! This is the one test of its own binary (not a module of `tests/tests.rs`): the count read
//! from `/proc/self/status` is the whole process's, so no other test may start or end threads
//! while it runs. Linux only (elsewhere it is ignored, saying why). `BERTH_STRESS_SECS`
//! lengthens it: loaders keep coming until that many seconds have passed (at least 500).

use std::time::{Duration, Instant};

use berth::{DType, Device, Tensor};
use berth_data::{DataError, DataLoader, DataLoaderBuilder, Dataset, TensorDataset};

const LOADERS: usize = 500;

/// The process's thread count (`Threads:` of `/proc/self/status`), `None` where unreadable.
fn threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Waits up to five seconds for the thread count to come down to `want`: the kernel drops a
/// joined thread's task a moment after `join` returns. Returns the last count read.
fn settle(want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = threads().expect("/proc/self/status");
        if n <= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `len` numbers; every item sleeps `sleep_us` microseconds, so workers are busy when the
/// loader goes away.
struct Numbers {
    len: usize,
    sleep_us: u64,
}

impl Dataset for Numbers {
    type Item = usize;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<usize, DataError> {
        if self.sleep_us > 0 {
            std::thread::sleep(Duration::from_micros(self.sleep_us));
        }
        Ok(index)
    }
}

/// Marsaglia's xorshift64 from a non-zero seed: the loaders' random shapes.
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

type Ident = fn(Vec<usize>) -> Result<Vec<usize>, DataError>;

fn ident(v: Vec<usize>) -> Result<Vec<usize>, DataError> {
    Ok(v)
}

/// Takes `take` batches of one epoch (or all there are), then drops the iterator. Returns the
/// most threads seen while the workers ran.
fn partial_epoch<I: Iterator<Item = Result<B, DataError>>, B>(it: I, take: usize) -> usize {
    let mut most = 0;
    for b in it.take(take) {
        b.expect("batch");
        most = most.max(threads().unwrap_or(0));
    }
    most
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "counts threads through /proc/self/status (Linux only)"
)]
fn five_hundred_loaders_dropped_mid_epoch_leave_the_thread_count_where_it_started() {
    let Some(before) = threads() else {
        println!("skipping: /proc/self/status has no Threads: line here");
        return;
    };
    let secs = std::env::var("BERTH_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(0.0);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let rows = Tensor::from_slice(
        &(0..256 * 8).map(|v| v as f32).collect::<Vec<_>>(),
        &[256, 8],
        Device::Cpu,
    )
    .unwrap();
    let labels = Tensor::zeros(&[256], DType::I64, Device::Cpu).unwrap();
    let tensors = std::sync::Arc::new(TensorDataset::new(vec![rows, labels]).unwrap());
    let mut next = xorshift(0x5851_F42D_4C95_7F2D);
    let (start, mut made, mut peak) = (Instant::now(), 0, before);
    while made < LOADERS || Instant::now() < until {
        let r = next();
        let workers = 1 + (r % 4) as isize;
        let prefetch = 1 + ((r >> 4) % 3) as isize;
        let persistent = (r >> 8).is_multiple_of(3);
        let batch = 1 + ((r >> 12) % 8) as usize;
        let take = ((r >> 20) % 12) as usize;
        if (r >> 28).is_multiple_of(2) {
            // Numbers, a quarter of them slow (workers mid-item at the drop).
            let sleep_us = if (r >> 32).is_multiple_of(4) { 500 } else { 0 };
            let dl = DataLoaderBuilder::with_collate(
                Numbers {
                    len: 64 + ((r >> 36) % 192) as usize,
                    sleep_us,
                },
                berth_data::CollateFn(ident as Ident),
            )
            .batch_size(batch)
            .num_workers(workers)
            .prefetch_factor(prefetch)
            .persistent_workers(persistent)
            .shuffle((r >> 44).is_multiple_of(2))
            .build()
            .unwrap();
            peak = peak.max(partial_epoch(dl.iter(), take));
            if persistent {
                peak = peak.max(partial_epoch(dl.iter(), take / 2));
            }
        } else {
            let dl = DataLoader::<TensorDataset>::builder(tensors.clone())
                .batch_size(batch)
                .num_workers(workers)
                .prefetch_factor(prefetch)
                .persistent_workers(persistent)
                .shuffle((r >> 44).is_multiple_of(2))
                .build()
                .unwrap();
            peak = peak.max(partial_epoch(dl.iter(), take));
            if persistent {
                peak = peak.max(partial_epoch(dl.iter(), take / 2));
            }
        }
        made += 1;
    }
    let after = settle(before);
    println!(
        "{made} loaders in {:.1?}: threads {before} before, at most {peak} while workers ran, \
         {after} after",
        start.elapsed()
    );
    assert!(peak > before, "no worker thread was ever seen");
    assert_eq!(
        after, before,
        "thread count after {made} loaders dropped mid-epoch"
    );
}
