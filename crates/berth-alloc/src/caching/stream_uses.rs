//! Cross-stream use: `record_stream`, deferred frees and event processing (PyTorch's
//! `recordStream`, `insert_events`, `process_events`, `synchronize_and_free_events`; kept apart
//! from block policy as in RMM's `stream_ordered_memory_resource`).

use super::private_pools::pool_index;
use super::state::{backend_err, State};
use crate::backend::{DevicePtr, MemoryBackend, StreamId};
use crate::error::AllocError;

impl<E> State<E> {
    /// `recordStream`: the allocated block at `ptr` is also used on `stream`.
    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        let Some(&i) = self.allocated.get(&ptr) else {
            return Err(AllocError::InvalidPointer {
                ptr: DevicePtr(ptr),
            });
        };
        let b = &mut self.blocks[i];
        if b.stream != stream && !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
        Ok(())
    }

    /// `insert_events`: records one event per stream the block was used on and queues
    /// (event, block); the block becomes reusable when all of them complete.
    pub fn insert_events<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        i: u32,
    ) -> Result<(), AllocError> {
        let mut uses = std::mem::take(&mut self.blocks[i].stream_uses);
        uses.sort_unstable();
        for stream in uses {
            let event = backend.record_fence(stream).map_err(backend_err(stream))?;
            self.blocks[i].event_count += 1;
            self.events.entry(stream).or_default().push_back((event, i));
        }
        Ok(())
    }

    /// `process_events`: per stream, completes queued frees in order up to the first event not
    /// yet reached. While a pool is being allocated to (a CUDA graph capture) nothing is queried
    /// or recorded, since an event call on a capturing stream breaks the capture; the frees
    /// deferred meanwhile get their events at the first call after it (PyTorch's
    /// `insert_events_deferred_until_no_capture`).
    pub fn process_events<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
    ) -> Result<(), AllocError> {
        if self.private.capturing() {
            return Ok(());
        }
        while let Some(i) = self.events_deferred.pop() {
            self.insert_events(backend, i)?;
        }
        if self.events.is_empty() {
            return Ok(());
        }
        let streams: Vec<StreamId> = self.events.keys().copied().collect();
        for stream in streams {
            while let Some(queue) = self.events.get_mut(&stream) {
                let Some((event, i)) = queue.front() else {
                    self.events.remove(&stream);
                    break;
                };
                let i = *i;
                if !backend.query_fence(event).map_err(backend_err(stream))? {
                    break;
                }
                queue.pop_front();
                self.event_done(i);
            }
        }
        Ok(())
    }

    fn event_done(&mut self, i: u32) {
        let b = &mut self.blocks[i];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(i);
        }
    }

    /// `synchronize_and_free_events`: waits for every pending event and completes those frees
    /// (counts `num_sync_all_streams`).
    pub fn synchronize_and_free_events<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
    ) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        let mut all = std::mem::take(&mut self.events).into_iter();
        while let Some((stream, mut queue)) = all.next() {
            while let Some((event, i)) = queue.pop_front() {
                if let Err(e) = backend.sync_fence(&event) {
                    queue.push_front((event, i));
                    self.events.insert(stream, queue);
                    self.events.extend(all);
                    return Err(backend_err(stream)(e));
                }
                self.event_done(i);
            }
        }
        Ok(())
    }

    /// Frees every unsplit cached block of every stream after syncing all events
    /// (`release_cached_blocks`, the full flush of `empty_cache` and step 4 of the fallback),
    /// in the general pool and in every freeable private pool; a freeable pool left without
    /// segments is forgotten (`Note [Private pools]`).
    pub fn release_cached_blocks<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
    ) -> Result<(), AllocError> {
        self.synchronize_and_free_events(backend)?;
        self.release_blocks(backend, 0)?;
        self.release_blocks(backend, 1)?;
        for pair in self.private.freeable() {
            self.release_pool_pair(backend, pair)?;
        }
        Ok(())
    }

    /// Frees the unsplit cached blocks of private pool pair `pair` (its two block pools), and
    /// forgets the pool when it is freeable and holds no segment any more.
    pub fn release_pool_pair<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        pair: u16,
    ) -> Result<(), AllocError> {
        self.release_blocks(backend, pool_index(pair, false))?;
        self.release_blocks(backend, pool_index(pair, true))?;
        if self
            .private
            .get_mut(pair)
            .is_some_and(|p| p.use_count == 0 && p.segments == 0)
        {
            if let Some(source) = self.private.forget(pair) {
                self.source_calls.drop_later(source);
            }
        }
        Ok(())
    }
}
