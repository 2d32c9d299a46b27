//! Streams other than a block's own: `record_stream` notes them, and a freed block used on
//! them stays pending until an event recorded on each has completed (PyTorch's
//! `stream_uses`, `insert_events`, `process_events`).

use std::collections::VecDeque;

use super::State;
use crate::allocator::arena::Idx;
use crate::device::{Device, Stream};
use crate::error::DeviceError;
use crate::stacks::RawStackId;

impl State {
    /// `recordStream`: the allocated block at `ptr` is also used on `stream`, so its free will
    /// wait for the work queued there. Unknown pointers and the block's own stream are ignored.
    pub fn record_stream(&mut self, ptr: u64, stream: Stream) {
        if let Some(&idx) = self.live.get(&ptr) {
            let b = &mut self.blocks[idx];
            if stream.0 != b.stream && !b.stream_uses.contains(&stream.0) {
                b.stream_uses.push(stream.0);
            }
        }
    }

    /// Records an event on every stream the block was used on; the block stays pending until
    /// they complete. An event that cannot be recorded is treated as complete.
    pub(super) fn insert_events<D: Device>(&mut self, device: &D, idx: Idx) {
        let streams = std::mem::take(&mut self.blocks[idx].stream_uses);
        for s in streams {
            if let Ok(event) = device.record_event(Stream(s)) {
                self.blocks[idx].event_count += 1;
                self.stream_events
                    .entry(s)
                    .or_default()
                    .push_back((event, idx));
            }
        }
    }

    /// `process_events`: frees blocks whose events have all completed. Inlined: every malloc
    /// calls it, and nearly always finds no events.
    #[inline]
    pub(super) fn process_events<D: Device>(
        &mut self,
        device: &D,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        if self.stream_events.is_empty() {
            return Ok(());
        }
        let streams: Vec<i64> = self.stream_events.keys().copied().collect();
        for s in streams {
            while let Some(&(event, idx)) = self.stream_events.get(&s).and_then(|q| q.front()) {
                if !device.query_event(event)? {
                    break;
                }
                if let Some(q) = self.stream_events.get_mut(&s) {
                    q.pop_front();
                }
                device.destroy_event(event);
                self.complete_event(idx, ctx);
            }
            if self.stream_events.get(&s).is_some_and(VecDeque::is_empty) {
                self.stream_events.remove(&s);
            }
        }
        Ok(())
    }

    pub(super) fn complete_event(&mut self, idx: Idx, ctx: RawStackId) {
        let b = &mut self.blocks[idx];
        b.event_count = b.event_count.saturating_sub(1);
        if b.event_count == 0 {
            self.free_block(idx, ctx);
        }
    }

    /// `synchronize_and_free_events`.
    pub(super) fn synchronize_and_free_events<D: Device>(
        &mut self,
        device: &D,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        self.stats.num_sync_all_streams += 1;
        while let Some((s, mut queue)) = self.stream_events.pop_first() {
            while let Some((event, idx)) = queue.pop_front() {
                if let Err(e) = device.synchronize_event(event) {
                    queue.push_front((event, idx));
                    self.stream_events.insert(s, queue);
                    return Err(e);
                }
                device.destroy_event(event);
                self.complete_event(idx, ctx);
            }
        }
        Ok(())
    }
}
