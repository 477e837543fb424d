//! The tag table of [`super::PagedBestFit`]: the tags its allocations carried, and the sleeping
//! ones with their released units and backups (`Note [Sleep and wake]` in [`super::sleep`],
//! which does the sleeping and waking).

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::backend::StreamId;
use crate::error::AllocError;
use crate::host::BackupMemory;

/// A backup's host memory.
pub(super) struct HostBuf(pub(super) NonNull<u8>);

// SAFETY: the buffer belongs to one backup and is only touched under the policy's lock.
unsafe impl Send for HostBuf {}
// SAFETY: as for `Send`: no shared access happens outside the lock.
unsafe impl Sync for HostBuf {}

/// One live block's contents in host memory.
pub(super) struct Backup {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) buf: HostBuf,
}

/// A sleeping tag.
pub(super) struct Sleeping {
    /// The mapping units it released, with the stream each was mapped for.
    pub(super) units: Vec<(u64, u64, StreamId)>,
    pub(super) backups: Vec<Backup>,
    /// Where `backups` live.
    pub(super) host: Option<Arc<dyn BackupMemory>>,
}

impl Sleeping {
    pub(super) fn unit_bytes(&self) -> u64 {
        self.units.iter().map(|&(a, b, _)| b - a).sum()
    }

    /// Frees every backup; the failures, by stream-less backend errors.
    pub(super) fn free_backups(&mut self) -> Vec<AllocError> {
        let mut errors = Vec::new();
        let Some(host) = &self.host else {
            return errors;
        };
        for b in self.backups.drain(..) {
            // SAFETY: 1. the buffer came from `host.alloc_backup(b.size)` and is freed once (it
            // is drained). 2. Copies are synchronous: none still uses it.
            if let Err(source) = unsafe { host.free_backup(b.buf.0, b.size as usize) } {
                errors.push(AllocError::Backend {
                    stream: StreamId::DEFAULT,
                    source,
                });
            }
        }
        errors
    }
}

impl Drop for Sleeping {
    fn drop(&mut self) {
        // The allocator is going away with the tag asleep: nobody is left to read an error.
        drop(self.free_backups());
    }
}

/// The tags an allocator has seen, and which of them sleep.
#[derive(Default)]
pub(crate) struct TagTable {
    /// Tag `i` (from 1) is `names[i - 1]`; 0 is untagged.
    names: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
    pub(super) asleep: HashMap<u32, Sleeping>,
}

impl TagTable {
    /// The tag of this thread's allocation now (registered if new).
    ///
    /// # Errors
    /// [`AllocError::TagAsleep`] when it sleeps.
    #[inline]
    pub(super) fn current(&mut self) -> Result<u32, AllocError> {
        crate::tags::with_current(|name| {
            let Some(name) = name else {
                return Ok(0);
            };
            let i = match self.index.get(name) {
                Some(&i) => i,
                None => {
                    let name: Arc<str> = Arc::from(name);
                    self.names.push(Arc::clone(&name));
                    let i = self.names.len() as u32;
                    self.index.insert(name, i);
                    i
                }
            };
            if self.asleep.contains_key(&i) {
                return Err(AllocError::TagAsleep { tag: name.into() });
            }
            Ok(i)
        })
    }

    /// Whether tag `i` sleeps.
    pub(super) fn is_asleep(&self, i: u32) -> bool {
        !self.asleep.is_empty() && self.asleep.contains_key(&i)
    }

    pub(super) fn name(&self, i: u32) -> String {
        self.names[i as usize - 1].to_string()
    }

    /// The distinct tags named, in the order given.
    ///
    /// # Errors
    /// [`AllocError::InvalidTag`] for `""`; [`AllocError::UnknownTag`] for a tag never used.
    pub(super) fn resolve(&self, tags: &[&str]) -> Result<Vec<u32>, AllocError> {
        let mut ids = Vec::with_capacity(tags.len());
        for &t in tags {
            if t.is_empty() {
                return Err(AllocError::InvalidTag { given: t.into() });
            }
            let Some(&i) = self.index.get(t) else {
                let mut known: Vec<String> = self.names.iter().map(|n| n.to_string()).collect();
                known.sort();
                return Err(AllocError::UnknownTag {
                    tag: t.into(),
                    known,
                });
            };
            if !ids.contains(&i) {
                ids.push(i);
            }
        }
        Ok(ids)
    }
}
