//! Test helpers.

use berth_data::{DataError, Dataset, VecDataset};

/// `0..n` as a dataset of `usize`.
pub fn range(n: usize) -> VecDataset<usize> {
    VecDataset::new((0..n).collect())
}

/// `0..n` as a `Vec`.
pub fn seq(n: usize) -> Vec<usize> {
    (0..n).collect()
}

/// Flattens a loader's batches of `Vec<usize>` (from the identity collate) into `Vec<Vec<usize>>`.
pub fn collect_batches<I: IntoIterator<Item = Result<Vec<usize>, DataError>>>(
    it: I,
) -> Vec<Vec<usize>> {
    it.into_iter().map(|b| b.expect("batch")).collect()
}

/// The OS thread id of the calling thread (Linux).
pub fn gettid() -> u64 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

/// Whether thread `tid` of this process still exists as a loader worker (its name, which
/// the kernel truncates to 15 bytes, starts with `berth-data-work`; another thread that got the
/// same id later does not count).
pub fn thread_alive(tid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .is_ok_and(|name| name.starts_with("berth-data-work"))
}

/// Whether thread `tid` is gone within two seconds. A joined thread has finished its work, but
/// the kernel removes its task entry a moment after `join` returns (the joiner is woken while
/// the thread is still exiting), so a check made at once can race with that.
pub fn thread_gone(tid: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while thread_alive(tid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

/// A dataset whose `get` fails for the listed indices and panics for others listed.
pub struct Flaky {
    pub len: usize,
    pub fail: Vec<usize>,
    pub panic: Vec<usize>,
    pub sleep_ms: u64,
}

impl Dataset for Flaky {
    type Item = usize;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<usize, DataError> {
        if self.sleep_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.sleep_ms));
        }
        if self.fail.contains(&index) {
            return Err(DataError::item(index, format!("bad record {index}")));
        }
        if self.panic.contains(&index) {
            panic!("item {index} exploded");
        }
        Ok(index)
    }
}
