//! Sleep and wake of tagged memory in [`super::PagedBestFit`]: give a tag's physical memory
//! back to the device and take it again at the same addresses (vLLM's sleep mode,
//! <https://github.com/vllm-project/vllm/blob/main/vllm/device_allocator/cumem.py>; sglang's
//! `torch_memory_saver`, <https://github.com/fzyzcjy/torch_memory_saver>).
//!
//! # Note [Sleep and wake]
//! Every allocation carries the tag current on its thread when it was made
//! ([`crate::tags::TagGuard`]; untagged memory is tag 0 and never sleeps). Arenas belong to one
//! tag as they belong to one stream and one pool (`Note [Private pools in paged]` in
//! [`super::pools`]), so cached free memory is reused only within its tag and a tag's mapping
//! units hold no other tag's bytes: its pages can be released without touching another's.
//!
//! `sleep(tags, offload, host)`:
//! 1. refuses, changing nothing, a tag never used ([`AllocError::UnknownTag`]), one already
//!    asleep ([`AllocError::AlreadyAsleep`]), an offload of a tag not put to sleep, an offload
//!    without host memory, and any call during a capture;
//! 2. completes pending frees and synchronizes every stream of the policy (and every stream a
//!    block of the tags was used on), so no queued work touches what goes;
//! 3. for the tags in `offload`, allocates host memory for every live block first, then copies
//!    the blocks out ([`crate::VirtualMemoryBackend::copy_to_host`]): if host memory runs out
//!    ([`AllocError::OffloadFailed`]) or a copy fails, the backups made are freed and nothing
//!    is released;
//! 4. unmaps every mapping unit of the tags' arenas, live blocks or not, and remembers the
//!    units. Virtual ranges stay reserved, so pointers, tensors and CUDA graphs taken before
//!    keep their addresses. Blocks of tags not offloaded lose their contents.
//!
//! While a tag sleeps, allocating in it is [`AllocError::TagAsleep`], naming the tag; freeing its
//! blocks works (their backups are then not copied back). Its units are in no list that
//! step 3 of `Note [Paged best fit]`, the out-of-memory retry or `empty_cache` look at.
//!
//! `wake(tags)` refuses a tag that is awake ([`AllocError::NotAsleep`]); maps every unit back
//! exactly as it was (same addresses, same unit boundaries, so later unmaps never split a
//! mapping), first unmapping free cached units elsewhere when the device's free memory is
//! short; then copies the backups of blocks still live back and frees them. All or nothing:
//! if a map or a copy fails, the units mapped by this call are unmapped again and every tag
//! stays asleep with its backups ([`AllocError::WakeFailed`]).
//!
//! Statistics: `reserved_bytes` drops by what sleep released (each unit is a `segment_unmap`
//! in the history) and rises again on wake; `allocated_bytes` keeps counting the live blocks
//! of sleeping tags (they exist: their owners still hold them), so it can exceed
//! `reserved_bytes` while a tag sleeps. [`SleepStats`] gives the sleeping figures apart.
//! Snapshots show only mapped memory: a sleeping tag's blocks are absent from them.
//!
//! If the allocator is dropped while a tag sleeps, the backups' host memory is freed.

use std::collections::HashMap;
use std::sync::Arc;

use super::state::{backend_err, vm, State};
use super::tag_table::{Backup, HostBuf, Sleeping};
use crate::backend::{DevicePtr, MemoryBackend, StreamId};
use crate::error::AllocError;
use crate::host::BackupMemory;
use crate::tags::{SleepReport, SleepStats, WakeReport};

impl<E> State<E> {
    /// The arena slots of tag `tag`.
    fn tag_arenas(&self, tag: u32) -> Vec<usize> {
        (0..self.arenas.len())
            .filter(|&i| self.arenas[i].tag == tag && !self.arenas[i].reservations.is_empty())
            .collect()
    }

    /// Puts `tags` to sleep, backing up the live blocks of `offload` into `host` first
    /// (`Note [Sleep and wake]`).
    ///
    /// # Errors
    /// Those of `Note [Sleep and wake]`, step 1 and 3; [`AllocError::Backend`] when a
    /// synchronization, a copy or an unmap fails (after an unmap failure the tag sleeps with
    /// what was released; wake maps it back).
    pub(crate) fn sleep<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        tags: &[&str],
        offload: &[&str],
        host: Option<Arc<dyn BackupMemory>>,
    ) -> Result<SleepReport, AllocError> {
        if self.private.capturing() {
            return Err(AllocError::SleepDuringCapture { op: "sleep" });
        }
        let ids = self.tags.resolve(tags)?;
        if let Some(&t) = ids.iter().find(|&&t| self.tags.is_asleep(t)) {
            return Err(AllocError::AlreadyAsleep {
                tag: self.tags.name(t),
            });
        }
        if let Some(t) = offload.iter().find(|t| !tags.contains(t)) {
            return Err(AllocError::OffloadNotSlept { tag: (*t).into() });
        }
        let off = self.tags.resolve(offload)?;
        if !off.is_empty() && host.is_none() {
            return Err(AllocError::NoBackupMemory {
                tags: off.iter().map(|&t| self.tags.name(t)).collect(),
            });
        }

        // 2. Nothing queued may still touch what goes.
        self.sync_pending(backend)?;
        let mut streams: Vec<StreamId> = self.arenas.iter().map(|a| a.stream).collect();
        for (_, l) in self.live.iter() {
            if ids.contains(&self.arenas[l.arena].tag) {
                streams.extend(&l.uses);
            }
        }
        streams.sort_unstable();
        streams.dedup();
        for s in streams {
            let ev = backend.record_fence(s).map_err(backend_err(s))?;
            backend.sync_fence(&ev).map_err(backend_err(s))?;
        }

        // 3. Every backup's host memory first, so that running out releases nothing.
        let mut blocks: Vec<(u32, u64, u64, StreamId)> = self
            .live
            .iter()
            .filter_map(|(&a, l)| {
                let arena = &self.arenas[l.arena];
                off.contains(&arena.tag)
                    .then_some((arena.tag, a, l.size, arena.stream))
            })
            .collect();
        blocks.sort_unstable_by_key(|b| b.1);
        let need: u64 = blocks.iter().map(|b| b.2).sum();
        let mut sleeping: HashMap<u32, Sleeping> = ids
            .iter()
            .map(|&t| {
                let s = Sleeping {
                    units: Vec::new(),
                    backups: Vec::new(),
                    host: off.contains(&t).then(|| host.clone()).flatten(),
                };
                (t, s)
            })
            .collect();
        if let Some(h) = &host {
            for &(tag, addr, size, _) in &blocks {
                match h.alloc_backup(size as usize) {
                    Ok(p) => sleeping
                        .get_mut(&tag)
                        .expect("slept tag")
                        .backups
                        .push(Backup {
                            addr,
                            size,
                            buf: HostBuf(p),
                        }),
                    // Dropping `sleeping` frees the backups made so far.
                    Err(source) => {
                        return Err(AllocError::OffloadFailed {
                            tag: self.tags.name(tag),
                            bytes: need,
                            source,
                        })
                    }
                }
            }
        }
        for s in sleeping.values() {
            for b in &s.backups {
                let stream = self.arenas[self.live.get(&b.addr).expect("live").arena].stream;
                // SAFETY: 1. `b.buf` holds `b.size` bytes. 2. Every stream was synchronized
                // above and the lock keeps new work from being allocated here.
                unsafe { vm(backend).copy_to_host(DevicePtr(b.addr), b.buf.0, b.size as usize) }
                    .map_err(backend_err(stream))?;
            }
        }

        // 4. Release every unit of the tags, live blocks or not.
        let mut report = SleepReport {
            released_bytes: 0,
            offloaded_bytes: need,
        };
        for &t in &ids {
            let mut units = Vec::new();
            for i in self.tag_arenas(t) {
                let stream = self.arenas[i].stream;
                for &(b, n) in &self.arenas[i].reservations {
                    units.extend(
                        self.units
                            .within(b, b + n)
                            .into_iter()
                            .map(|(a, e)| (a, e, stream)),
                    );
                }
            }
            let mut s = sleeping.remove(&t).expect("slept tag");
            for (a, e, stream) in units {
                if let Err(err) = self.unmap_run(backend, a, e, stream) {
                    self.tags.asleep.insert(t, s);
                    return Err(err);
                }
                s.units.push((a, e, stream));
                report.released_bytes += e - a;
            }
            self.tags.asleep.insert(t, s);
        }
        Ok(report)
    }

    /// Wakes `tags`: maps their units back and restores their backups
    /// (`Note [Sleep and wake]`). Returns the report and the failures to free backups (the
    /// tags are awake all the same).
    ///
    /// # Errors
    /// [`AllocError::SleepDuringCapture`], [`AllocError::InvalidTag`],
    /// [`AllocError::UnknownTag`], [`AllocError::NotAsleep`] (nothing done);
    /// [`AllocError::WakeFailed`] when a map or a copy fails (every tag stays asleep with its
    /// backups).
    pub(crate) fn wake<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        tags: &[&str],
    ) -> Result<(WakeReport, Vec<AllocError>), AllocError> {
        if self.private.capturing() {
            return Err(AllocError::SleepDuringCapture { op: "wake" });
        }
        let ids = self.tags.resolve(tags)?;
        if let Some(&t) = ids.iter().find(|&&t| !self.tags.is_asleep(t)) {
            return Err(AllocError::NotAsleep {
                tag: self.tags.name(t),
            });
        }
        let units: Vec<(u32, u64, u64, StreamId)> = ids
            .iter()
            .flat_map(|&t| {
                self.tags.asleep[&t]
                    .units
                    .iter()
                    .map(move |&(a, b, s)| (t, a, b, s))
            })
            .collect();
        let need: u64 = units.iter().map(|u| u.2 - u.1).sum();
        // Free cached units elsewhere first when the device is short.
        if let Ok(info) = backend.mem_info() {
            if need > info.free_bytes {
                self.reclaim(backend, need - info.free_bytes, (0, 0))?;
            }
        }
        let mut mapped: Vec<(u64, u64, StreamId)> = Vec::with_capacity(units.len());
        let mut failed = None;
        for &(t, a, b, s) in &units {
            match vm(backend).map(DevicePtr(a), (b - a) as usize, s) {
                Ok(()) => {
                    self.note_mapped(a, b, s);
                    mapped.push((a, b, s));
                }
                Err(source) => {
                    failed = Some((t, source));
                    break;
                }
            }
        }
        let mut restored = 0;
        if failed.is_none() {
            'copy: for &t in &ids {
                for bk in &self.tags.asleep[&t].backups {
                    if self.live.get(&bk.addr).is_none_or(|l| l.size != bk.size) {
                        continue; // freed while asleep
                    }
                    // SAFETY: 1. `bk.buf` holds `bk.size` bytes. 2. The units under the block
                    // were just mapped; no work was queued on them since.
                    let r = unsafe {
                        vm(backend).copy_from_host(DevicePtr(bk.addr), bk.buf.0, bk.size as usize)
                    };
                    if let Err(source) = r {
                        failed = Some((t, source));
                        break 'copy;
                    }
                    restored += bk.size;
                }
            }
        }
        if let Some((t, source)) = failed {
            // All or nothing: what this call mapped goes again; every tag stays asleep.
            for (a, b, s) in mapped {
                self.unmap_run(backend, a, b, s)?;
            }
            return Err(AllocError::WakeFailed {
                tag: self.tags.name(t),
                bytes: need,
                source,
            });
        }
        let mut errors = Vec::new();
        for t in ids {
            if let Some(mut s) = self.tags.asleep.remove(&t) {
                errors.extend(s.free_backups());
            }
        }
        Ok((
            WakeReport {
                mapped_bytes: need,
                restored_bytes: restored,
            },
            errors,
        ))
    }

    /// The sleeping figures.
    pub(crate) fn sleep_stats(&self) -> SleepStats {
        let mut tags: Vec<String> = self
            .tags
            .asleep
            .keys()
            .map(|&t| self.tags.name(t))
            .collect();
        tags.sort();
        let sleeping_allocated_bytes = if self.tags.asleep.is_empty() {
            0
        } else {
            self.live
                .iter()
                .filter(|(_, l)| self.tags.is_asleep(self.arenas[l.arena].tag))
                .map(|(_, l)| l.size)
                .sum()
        };
        SleepStats {
            sleeping_bytes: self.tags.asleep.values().map(Sleeping::unit_bytes).sum(),
            sleeping_allocated_bytes,
            offloaded_bytes: self
                .tags
                .asleep
                .values()
                .flat_map(|s| &s.backups)
                .map(|b| b.size)
                .sum(),
            sleeping_tags: tags,
        }
    }
}
