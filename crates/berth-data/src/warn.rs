//! One-time warnings on stderr (PyTorch's `warnings.warn`, shown once per call site).

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Prints `message` on stderr the first time `key` is seen in this process.
pub(crate) fn warn_once(key: &'static str, message: &str) {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    if seen.get_or_insert_with(HashSet::new).insert(key) {
        eprintln!("berth-data: warning: {message}");
    }
}
