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

/// One live block's contents in host memory, at `offset` in its tag's buffer.
pub(super) struct Backup {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) offset: u64,
}

/// A sleeping tag.
pub(super) struct Sleeping {
    /// The mapping units it released, with the stream each was mapped for.
    pub(super) units: Vec<(u64, u64, StreamId)>,
    /// Its live blocks' backups, by address, all in `buf`.
    pub(super) backups: Vec<Backup>,
    /// The one host buffer of the tag's backups and its size in bytes (one allocation per
    /// tag, not per block: page-locking is paid once, and the copies are large).
    pub(super) buf: Option<(HostBuf, u64)>,
    /// Where `buf` lives.
    pub(super) host: Option<Arc<dyn BackupMemory>>,
}

impl Sleeping {
    pub(super) fn unit_bytes(&self) -> u64 {
        self.units.iter().map(|&(a, b, _)| b - a).sum()
    }

    /// Host memory holding backups, in bytes.
    pub(super) fn backup_bytes(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.1)
    }

    /// Where backup `b` lives.
    pub(super) fn backup_ptr(&self, b: &Backup) -> Option<NonNull<u8>> {
        let (buf, _) = self.buf.as_ref()?;
        // SAFETY: `offset + size` is within the buffer: `sleep` lays the backups out in it.
        NonNull::new(unsafe { buf.0.as_ptr().add(b.offset as usize) })
    }

    /// Frees the backups' buffer; the failure, as a stream-less backend error.
    pub(super) fn free_backups(&mut self) -> Vec<AllocError> {
        self.backups.clear();
        let (Some(host), Some((buf, bytes))) = (&self.host, self.buf.take()) else {
            return Vec::new();
        };
        // SAFETY: 1. the buffer came from `host.alloc_backup(bytes)` and is freed once (it was
        // taken). 2. Every copy using it was waited for before the tag went to sleep or woke.
        match unsafe { host.free_backup(buf.0, bytes as usize) } {
            Ok(()) => Vec::new(),
            Err(source) => vec![AllocError::Backend {
                stream: StreamId::DEFAULT,
                source,
            }],
        }
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
