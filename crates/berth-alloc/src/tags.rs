//! Allocation tags: which part of a program an allocation belongs to (`"weights"`, `"kv_cache"`),
//! so that the `paged` policy can put one part to sleep and wake it later
//! (`Note [Sleep and wake]` in [`crate::paged`]; the Python side will be
//! `berth_torch.region(tag)`, after vLLM's `CuMemAllocator.use_memory_pool(tag)`,
//! <https://github.com/vllm-project/vllm/blob/main/vllm/device_allocator/cumem.py>, and
//! sglang's `torch_memory_saver.region(tag)`).
//!
//! The reports of sleep and wake ([`SleepReport`], [`WakeReport`], [`SleepStats`]) live here
//! too, beside [`crate::DeviceAllocator`]'s methods that return them.
//!
//! The tag is per thread: every allocation a thread makes while a [`TagGuard`] is alive carries
//! that guard's tag; with none alive it is untagged. Guards nest, and dropping one restores the
//! tag that was current when it was made.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::error::AllocError;

thread_local! {
    /// The tag of this thread's allocations; `None`: untagged.
    static CURRENT: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// While alive, this thread's allocations carry its tag (`berth_torch.region(tag)` in Python).
/// Not `Send`: a tag belongs to the thread that set it.
///
/// ```
/// use berth_alloc::tags::{current_tag, TagGuard};
/// assert_eq!(current_tag(), None);
/// {
///     let _weights = TagGuard::new("weights")?;
///     assert_eq!(current_tag().as_deref(), Some("weights"));
///     {
///         let _kv = TagGuard::new("kv_cache")?;
///         assert_eq!(current_tag().as_deref(), Some("kv_cache"));
///     }
///     assert_eq!(current_tag().as_deref(), Some("weights"));
/// }
/// assert_eq!(current_tag(), None);
/// # Ok::<(), berth_alloc::AllocError>(())
/// ```
#[must_use = "the tag applies only while the guard is alive"]
#[derive(Debug)]
pub struct TagGuard {
    prev: Option<Arc<str>>,
    _not_send: PhantomData<*const ()>,
}

impl TagGuard {
    /// Makes `tag` this thread's tag until the guard is dropped.
    ///
    /// # Errors
    /// [`AllocError::InvalidTag`] for an empty name (untagged memory has no name and cannot be
    /// put to sleep).
    pub fn new(tag: &str) -> Result<TagGuard, AllocError> {
        if tag.is_empty() {
            return Err(AllocError::InvalidTag {
                given: String::new(),
            });
        }
        let prev = CURRENT.with(|c| c.replace(Some(Arc::from(tag))));
        Ok(TagGuard {
            prev,
            _not_send: PhantomData,
        })
    }
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

/// What a `sleep` did, and where its time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SleepReport {
    /// Device memory unmapped and given back, in bytes.
    pub released_bytes: u64,
    /// Live bytes copied to host memory (the offloaded tags' live blocks, 512-byte rounded).
    pub offloaded_bytes: u64,
    /// Time spent waiting for the device's queued work before anything was copied.
    pub synchronize_time: Duration,
    /// Time spent getting the host memory of the backups before the first copy is queued.
    /// On the CUDA backend a new buffer is page-locked in chunks while the copies run, so
    /// most of the locking shows in `copy_and_release_time`.
    pub host_memory_time: Duration,
    /// Time of the copies to the host and the unmapping, which overlap: a unit is unmapped as
    /// soon as the copies of its blocks are complete.
    pub copy_and_release_time: Duration,
}

/// What a `wake` did, and where its time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeReport {
    /// Device memory mapped back, in bytes.
    pub mapped_bytes: u64,
    /// Bytes copied back from host memory into blocks still live.
    pub restored_bytes: u64,
    /// Time of mapping and of the copies back, which overlap: a block's copy is queued as
    /// soon as the units under it are mapped.
    pub map_and_copy_time: Duration,
    /// Time spent freeing the backups' host memory afterwards, or handing it to a thread that
    /// frees it after the wake returns (berth's CUDA backup memory does that).
    pub free_host_memory_time: Duration,
}

/// The sleeping figures of an allocator, apart from [`crate::MemoryStats`] (`Note [Sleep and
/// wake]` in [`crate::paged`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SleepStats {
    /// SIZE: device memory released by sleeping tags and not mapped back yet, in bytes.
    pub sleeping_bytes: u64,
    /// SIZE: live blocks of sleeping tags (512-byte rounded), in bytes.
    pub sleeping_allocated_bytes: u64,
    /// SIZE: host memory holding the sleeping tags' backups, in bytes.
    pub offloaded_bytes: u64,
    /// The sleeping tags, sorted.
    pub sleeping_tags: Vec<String>,
}

/// This thread's current tag; `None` when untagged.
pub fn current_tag() -> Option<Arc<str>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Runs `f` with this thread's current tag (`None`: untagged), without cloning it.
pub(crate) fn with_current<R>(f: impl FnOnce(Option<&str>) -> R) -> R {
    CURRENT.with(|c| f(c.borrow().as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_per_thread() {
        let _g = TagGuard::new("main").unwrap();
        let other = std::thread::spawn(current_tag).join().unwrap();
        assert_eq!(other, None);
        assert_eq!(current_tag().as_deref(), Some("main"));
        assert_eq!(
            TagGuard::new("").unwrap_err(),
            AllocError::InvalidTag {
                given: String::new()
            }
        );
        assert_eq!(
            current_tag().as_deref(),
            Some("main"),
            "a refused guard changes nothing"
        );
    }
}
