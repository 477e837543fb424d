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
//! 3. for the tags in `offload`, allocates one host buffer per tag for all its live blocks
//!    first (page-locking is paid once per tag, not per block): if host memory runs out
//!    ([`AllocError::OffloadFailed`]) the buffers made are freed and nothing is released;
//!    then queues the copies by address on the backend's copy queue
//!    ([`crate::VirtualMemoryBackend::queue_copy_to_host`]), one per run of adjacent blocks,
//!    cut at unit ends (`Note [Copies cut at unit ends]`);
//! 4. unmaps every mapping unit of the tags' arenas, live blocks or not, by address, and
//!    remembers the units; a unit of an offloaded tag is unmapped as soon as the copies of
//!    every block on it are complete, so unmapping overlaps the copies still running.
//!    Virtual ranges stay reserved, so pointers, tensors and CUDA graphs taken before keep
//!    their addresses. Blocks of tags not offloaded lose their contents. If a copy or an
//!    unmap fails, every tag named sleeps with what was released so far (wake maps it back)
//!    and keeps the backups known complete; the blocks of the others are still on the device.
//!
//! While a tag sleeps, allocating in it is [`AllocError::TagAsleep`], naming the tag; freeing its
//! blocks works (their backups are then not copied back). Its units are in no list that
//! step 3 of `Note [Paged best fit]`, the out-of-memory retry or `empty_cache` look at.
//!
//! `wake(tags)` refuses a tag that is awake ([`AllocError::NotAsleep`]); maps every unit back
//! exactly as it was (same addresses, same unit boundaries, so later unmaps never split a
//! mapping), by address, first unmapping free cached units elsewhere when the device's free
//! memory is short; after each unit it queues the copies back of the live blocks' pieces
//! that end below it ([`crate::VirtualMemoryBackend::queue_copy_from_host`]; runs of
//! adjacent blocks cut at unit ends), so mapping overlaps the copies; then waits for them and frees the backups. All or nothing: if a map or a copy
//! fails, the units mapped by this call are unmapped again and every tag stays asleep with
//! its backups ([`AllocError::WakeFailed`]).
//!
//! Statistics: `reserved_bytes` drops by what sleep released (each unit is a `segment_unmap`
//! in the history) and rises again on wake; `allocated_bytes` keeps counting the live blocks
//! of sleeping tags (they exist: their owners still hold them), so it can exceed
//! `reserved_bytes` while a tag sleeps. [`SleepStats`] gives the sleeping figures apart.
//! Snapshots list mapped memory in their segments and the sleeping tags apart
//! ([`crate::snapshot::MemorySnapshot::sleeping`]: released, live and offloaded bytes per tag).
//!
//! If the allocator is dropped while a tag sleeps, the backups' host memory is freed.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::{backend_err, vm, State};
use super::tag_table::{Backup, HostBuf, Sleeping};
use crate::backend::{CopyTicket, DevicePtr, MemoryBackend, StreamId};
use crate::error::{AllocError, BackendError};
use crate::host::BackupMemory;
use crate::snapshot::SleepingTag;
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
        let started = Instant::now();
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

        let synchronize_time = started.elapsed();

        // 3. Every backup's host memory first, so that running out releases nothing: one
        // buffer per tag, the blocks laid out in it by address.
        let timer = Instant::now();
        let mut blocks: Vec<(u32, u64, u64)> = self
            .live
            .iter()
            .filter_map(|(&a, l)| {
                let arena = &self.arenas[l.arena];
                off.contains(&arena.tag).then_some((arena.tag, a, l.size))
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
                    buf: None,
                    host: off.contains(&t).then(|| host.clone()).flatten(),
                };
                (t, s)
            })
            .collect();
        for &(tag, addr, size) in &blocks {
            let s = sleeping.get_mut(&tag).expect("slept tag");
            let offset = s.backups.last().map_or(0, |b| b.offset + b.size);
            s.backups.push(Backup { addr, size, offset });
        }
        if let Some(h) = &host {
            for &t in &off {
                let s = sleeping.get_mut(&t).expect("slept tag");
                let bytes: u64 = s.backups.iter().map(|b| b.size).sum();
                if bytes == 0 {
                    continue;
                }
                match h.alloc_backup(bytes as usize) {
                    Ok(p) => s.buf = Some((HostBuf(p), bytes)),
                    // Dropping `sleeping` frees the buffers made so far.
                    Err(source) => {
                        return Err(AllocError::OffloadFailed {
                            tag: self.tags.name(t),
                            bytes: need,
                            source,
                        })
                    }
                }
            }
        }
        let host_memory_time = timer.elapsed();

        // The units of the tags, by address: (tag, start, end, stream).
        let timer = Instant::now();
        let mut units: Vec<(u32, u64, u64, StreamId)> = Vec::new();
        for &t in &ids {
            for i in self.tag_arenas(t) {
                let stream = self.arenas[i].stream;
                for &(b, n) in &self.arenas[i].reservations {
                    units.extend(
                        self.units
                            .within(b, b + n)
                            .into_iter()
                            .map(|(a, e)| (t, a, e, stream)),
                    );
                }
            }
        }
        units.sort_unstable_by_key(|u| u.1);
        let unit_ends: Vec<u64> = units.iter().map(|u| u.2).collect();

        // Queue the copies by address, one per run of adjacent blocks of one tag (adjacent
        // in its buffer too), cut at unit ends (`Note [Copies cut at unit ends]`); `done[i]`:
        // (start of piece `i`, the ticket of its copy).
        let mut runs: Vec<(u32, u64, u64, NonNull<u8>)> = Vec::new(); // (tag, start, end, dst)
        for &(tag, addr, size) in &blocks {
            match runs.last_mut() {
                Some(r) if r.0 == tag && r.2 == addr => r.2 = addr + size,
                _ => {
                    let s = &sleeping[&tag];
                    let b = &s.backups[s.backups.partition_point(|b| b.addr < addr)];
                    let dst = s.backup_ptr(b).expect("offloaded tags have a buffer");
                    runs.push((tag, addr, addr + size, dst));
                }
            }
        }
        let pieces = cut_at_unit_ends(&runs, &unit_ends);
        let mut done: Vec<(u64, CopyTicket)> = Vec::with_capacity(pieces.len());
        for &(_, start, end, dst) in &pieces {
            // SAFETY: 1. the piece's blocks are adjacent in the tag's buffer from `dst` on
            // (laid out by address), which lives until the copies are waited for (every path
            // below waits before dropping `sleeping`). 2. Every stream was synchronized above,
            // the lock keeps new work from being allocated here, and a unit is unmapped only
            // after the copies of every block on it are complete.
            let queued = unsafe {
                vm(backend).queue_copy_to_host(DevicePtr(start), dst, (end - start) as usize)
            };
            match queued {
                Ok(t) => done.push((start, t)),
                Err(source) => {
                    if let Some(&(_, t)) = done.last() {
                        // Nothing may still write the buffers when they are freed.
                        let _ = vm(backend).wait_copies(t);
                    }
                    return Err(AllocError::Backend {
                        stream: StreamId::DEFAULT,
                        source,
                    });
                }
            }
        }

        // 4. Release every unit of the tags, live blocks or not, by address; a unit of an
        // offloaded tag once the copies of every block on it are complete: those of the
        // pieces that start below its end, or below the end of a block that runs past it.
        let mut report = SleepReport {
            released_bytes: 0,
            offloaded_bytes: need,
            synchronize_time,
            host_memory_time,
            copy_and_release_time: Duration::ZERO,
        };
        let mut confirmed = 0; // runs whose copies are known complete
        let mut failure = None;
        for &(t, a, e, stream) in &units {
            if off.contains(&t) {
                let k = blocks.partition_point(|b| b.1 < e);
                let reach = match k.checked_sub(1).map(|i| blocks[i]) {
                    Some((_, addr, size)) if addr + size > e => addr + size,
                    _ => e,
                };
                let upto = done.partition_point(|&(addr, _)| addr < reach);
                if upto > confirmed {
                    if let Err(source) = vm(backend).wait_copies(done[upto - 1].1) {
                        failure = Some(AllocError::Backend {
                            stream: StreamId::DEFAULT,
                            source,
                        });
                        break;
                    }
                    confirmed = upto;
                }
            }
            if let Err(err) = self.unmap_run(backend, a, e, stream) {
                failure = Some(err);
                break;
            }
            sleeping
                .get_mut(&t)
                .expect("slept tag")
                .units
                .push((a, e, stream));
            report.released_bytes += e - a;
        }
        if failure.is_none() {
            if let Some(&(_, t)) = done.last() {
                // Blocks above the last unit of an offloaded tag (none in practice: every
                // block lies in its tag's units) are waited for here.
                if let Err(source) = vm(backend).wait_copies(t) {
                    failure = Some(AllocError::Backend {
                        stream: StreamId::DEFAULT,
                        source,
                    });
                } else {
                    confirmed = done.len();
                }
            }
        }
        if failure.is_some() {
            if let Some(&(_, t)) = done.last() {
                // Nothing may still write the buffers when they are freed.
                let _ = vm(backend).wait_copies(t);
            }
            // Backups not known complete are dropped: their blocks lie in units not released
            // (a unit goes only once every block on it is copied), whose contents are still
            // on the device.
            let below = done.get(confirmed).map_or(u64::MAX, |&(start, _)| start);
            for s in sleeping.values_mut() {
                s.backups.retain(|b| b.addr + b.size <= below);
            }
        }
        // Every tag sleeps with what it released (after a failure too: wake maps it back).
        for (t, s) in sleeping {
            self.tags.asleep.insert(t, s);
        }
        report.copy_and_release_time = timer.elapsed();
        match failure {
            Some(err) => Err(err),
            None => Ok(report),
        }
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
        let mut units: Vec<(u32, u64, u64, StreamId)> = ids
            .iter()
            .flat_map(|&t| {
                self.tags.asleep[&t]
                    .units
                    .iter()
                    .map(move |&(a, b, s)| (t, a, b, s))
            })
            .collect();
        units.sort_unstable_by_key(|u| u.1);
        let need: u64 = units.iter().map(|u| u.2 - u.1).sum();
        // Free cached units elsewhere first when the device is short.
        if let Ok(info) = backend.mem_info() {
            if need > info.free_bytes {
                self.reclaim(backend, need - info.free_bytes, (0, 0))?;
            }
        }
        // The backups of blocks still live (a block freed while asleep has no owner left),
        // by address: (tag, addr, end, source).
        let timer = Instant::now();
        let mut restores: Vec<(u32, u64, u64, NonNull<u8>)> = Vec::new();
        for &t in &ids {
            let s = &self.tags.asleep[&t];
            for bk in &s.backups {
                if self.live.get(&bk.addr).is_some_and(|l| l.size == bk.size) {
                    let src = s.backup_ptr(bk).expect("a tag with backups has a buffer");
                    restores.push((t, bk.addr, bk.addr + bk.size, src));
                }
            }
        }
        restores.sort_unstable_by_key(|r| r.1);
        // One copy per run of blocks adjacent both on the device and in the buffer.
        restores.dedup_by(|next, run| {
            let adjacent = run.0 == next.0
                && run.2 == next.1
                && run.3.as_ptr().wrapping_add((run.2 - run.1) as usize) == next.3.as_ptr();
            if adjacent {
                run.2 = next.2;
            }
            adjacent
        });
        // Cut at unit ends, so the copy of a unit's part of a run starts once that unit is
        // mapped (`Note [Copies cut at unit ends]`).
        let unit_ends: Vec<u64> = units.iter().map(|u| u.2).collect();
        let restores = cut_at_unit_ends(&restores, &unit_ends);
        // Map by address; after each unit, queue the copies of the pieces that end below it.
        let mut mapped: Vec<(u64, u64, StreamId)> = Vec::with_capacity(units.len());
        let mut failed = None;
        let mut queued = 0;
        let mut last = None;
        let mut restored = 0;
        'map: for &(t, a, b, s) in &units {
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
            while let Some(&(rt, addr, end, src)) = restores.get(queued) {
                if end > b {
                    break;
                }
                // SAFETY: 1. `src` holds `end - addr` bytes of the tag's backup buffer, freed
                // only after the copies are waited for below. 2. The units under the piece
                // were just mapped; no work was queued on them since.
                match unsafe {
                    vm(backend).queue_copy_from_host(DevicePtr(addr), src, (end - addr) as usize)
                } {
                    Ok(ticket) => last = Some(ticket),
                    Err(source) => {
                        failed = Some((rt, source));
                        break 'map;
                    }
                }
                restored += end - addr;
                queued += 1;
            }
        }
        if failed.is_none() && queued < restores.len() {
            // A block not covered by its tag's units: the table is inconsistent.
            failed = Some((
                restores[queued].0,
                BackendError::Other {
                    op: "wake",
                    message: format!(
                        "the backup at {:#x} lies outside the units of its tag",
                        restores[queued].1
                    ),
                },
            ));
        }
        if let Some(t) = last {
            if let Err(source) = vm(backend).wait_copies(t) {
                failed = failed.or(Some((restores[0].0, source)));
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
        let map_and_copy_time = timer.elapsed();
        let timer = Instant::now();
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
                map_and_copy_time,
                free_host_memory_time: timer.elapsed(),
            },
            errors,
        ))
    }

    /// The sleeping tags, by name, for a snapshot.
    pub(crate) fn sleeping_tags(&self) -> Vec<SleepingTag> {
        let mut out: Vec<SleepingTag> = self
            .tags
            .asleep
            .iter()
            .map(|(&t, s)| SleepingTag {
                tag: self.tags.name(t),
                released_bytes: s.unit_bytes(),
                allocated_bytes: self
                    .live
                    .iter()
                    .filter(|(_, l)| self.arenas[l.arena].tag == t)
                    .map(|(_, l)| l.size)
                    .sum(),
                offloaded_bytes: s.backup_bytes(),
            })
            .collect();
        out.sort_by(|a, b| a.tag.cmp(&b.tag));
        out
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
            offloaded_bytes: self.tags.asleep.values().map(Sleeping::backup_bytes).sum(),
            sleeping_tags: tags,
        }
    }
}

/// `copies` (tag, device start, device end, host address), sorted by start and not
/// overlapping, cut at every unit end strictly inside them (`ends` sorted): each piece lies
/// in one unit, its host address advanced by its offset in the copy.
///
/// # Note [Copies cut at unit ends]
/// A run of adjacent blocks is one copy, and a whole model's weights are often one run
/// (GPT-2's 148 tensors are one run over 54 units). Sleep may release a unit only once the
/// copies of its blocks are done, and wake may copy into a unit only once it is mapped; with
/// one copy per run, sleep would release nothing until the whole run is copied and wake
/// would copy nothing until every unit is mapped, so the ~50 µs of each unit's unmap or map
/// would add up after or before the copy instead of running under it. Cut at unit ends, the
/// copies are as long as the units (up to 32 MiB: at the link's full speed) and the mapping
/// work of one unit overlaps the copy of the next. Sleep still releases a unit only once
/// every block on it is copied whole: a block is restored whole or not at all.
fn cut_at_unit_ends(
    copies: &[(u32, u64, u64, NonNull<u8>)],
    ends: &[u64],
) -> Vec<(u32, u64, u64, NonNull<u8>)> {
    let mut out = Vec::with_capacity(copies.len() + ends.len());
    for &(tag, start, end, host) in copies {
        let mut at = start;
        let first = ends.partition_point(|&e| e <= start);
        for &cut in ends[first..].iter().take_while(|&&e| e < end) {
            out.push((tag, at, cut, offset(host, at - start)));
            at = cut;
        }
        out.push((tag, at, end, offset(host, at - start)));
    }
    out
}

/// `host` advanced by `bytes`, inside the copy it starts.
fn offset(host: NonNull<u8>, bytes: u64) -> NonNull<u8> {
    // SAFETY: `bytes` is less than the length of the copy from `host`, which lies in one
    // backup buffer.
    unsafe { host.add(bytes as usize) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_cut_at_the_unit_ends_inside_them() {
        let mut buf = vec![0u8; 4096];
        let h = NonNull::new(buf.as_mut_ptr()).unwrap();
        let at = |p: NonNull<u8>| p.as_ptr() as usize - h.as_ptr() as usize;
        let ends = [100, 200, 300, 400];
        // A copy over 150..350 of tag 1 (host from 0) and one inside a unit (host from 1000).
        let copies = [(1, 150, 350, h), (2, 410, 420, offset(h, 1000))];
        let cut: Vec<(u32, u64, u64, usize)> = cut_at_unit_ends(&copies, &ends)
            .into_iter()
            .map(|(t, a, e, p)| (t, a, e, at(p)))
            .collect();
        assert_eq!(
            cut,
            vec![
                (1, 150, 200, 0),
                (1, 200, 300, 50),
                (1, 300, 350, 150),
                (2, 410, 420, 1000)
            ]
        );
        // A copy that ends on a unit end is not cut there.
        let whole = cut_at_unit_ends(&[(1, 100, 200, h)], &ends);
        assert_eq!(whole.len(), 1);
        assert_eq!((whole[0].1, whole[0].2), (100, 200));
    }
}
