//! berth's warning channel: a setting that is accepted but has no effect, or a combination
//! known to misbehave, is said once per process (PyTorch's `TORCH_WARN_ONCE`,
//! <https://github.com/pytorch/pytorch/blob/main/c10/util/Exception.h>).
//!
//! Every crate of the workspace warns through [`warn_once`], the one home of the concept. What
//! is said goes to a `tracing` event at `warn` level (target `berth`) when the program installed
//! a `tracing` subscriber, and to standard error (`berth: warning: …`) when it did not, so a
//! warning is never lost for want of a subscriber. [`said`] lists everything said so far in the
//! process: tests assert on it, and `berth_torch` hands it to Python's `warnings.warn` (and
//! turns standard error off with [`set_stderr`], so a Python user sees each warning once).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// Whether a warning said without a `tracing` subscriber goes to standard error.
static TO_STDERR: AtomicBool = AtomicBool::new(true);

/// Turns the standard-error copy of warnings on or off (on by default); a host that shows
/// [`said`] its own way (Python's `warnings`) turns it off. Warnings are still kept for
/// [`said`] and still go to a `tracing` subscriber.
pub fn set_stderr(enabled: bool) {
    TO_STDERR.store(enabled, Ordering::Relaxed);
}

/// One warning as it was said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The stable name of the condition (for example `alloc-conf-ignored-key`): a condition is
    /// said once per process, whatever its message.
    pub key: &'static str,
    /// The text said: what was wrong and what would be right.
    pub message: String,
}

/// What has been said, in order, and the keys already used.
struct Channel {
    keys: HashSet<&'static str>,
    said: Vec<Warning>,
}

static CHANNEL: Mutex<Option<Channel>> = Mutex::new(None);

/// Says `message()` the first time `key` is used in this process and returns `true`; later
/// calls with the same key say nothing, do not build the message, and return `false`.
pub fn warn_once(key: &'static str, message: impl FnOnce() -> String) -> bool {
    let mut guard = CHANNEL.lock().unwrap_or_else(PoisonError::into_inner);
    let channel = guard.get_or_insert_with(|| Channel {
        keys: HashSet::new(),
        said: Vec::new(),
    });
    if !channel.keys.insert(key) {
        return false;
    }
    let message = message();
    if tracing::dispatcher::has_been_set() {
        tracing::warn!(target: "berth", key, "{message}");
    } else if TO_STDERR.load(Ordering::Relaxed) {
        eprintln!("berth: warning: {message}");
    }
    channel.said.push(Warning { key, message });
    true
}

/// Every warning said so far in this process, oldest first.
pub fn said() -> Vec<Warning> {
    let guard = CHANNEL.lock().unwrap_or_else(PoisonError::into_inner);
    guard.as_ref().map(|c| c.said.clone()).unwrap_or_default()
}

/// The message said under `key`, if it was said.
pub fn said_for(key: &str) -> Option<String> {
    said().into_iter().find(|w| w.key == key).map(|w| w.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_said_once_and_kept() {
        let mut built = 0;
        assert!(warn_once("warnings-test-key", || {
            built += 1;
            "first".into()
        }));
        assert!(!warn_once("warnings-test-key", || {
            built += 1;
            "second".into()
        }));
        assert_eq!(built, 1, "the second message is never built");
        assert_eq!(said_for("warnings-test-key").as_deref(), Some("first"));
        assert_eq!(
            said()
                .iter()
                .filter(|w| w.key == "warnings-test-key")
                .count(),
            1
        );
    }
}
