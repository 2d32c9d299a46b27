//! What a live listener needs from the allocator, copied under the lock: the state at
//! connect, then the entries recorded since it last looked (see `crate::live`).

use std::collections::HashSet;
use std::sync::Arc;

use memsnap_format::Frame;

use super::snapshot;
use super::CachingAllocator;
use crate::device::Device;
use crate::history::{RawAnnotation, RawEntry};
use crate::stacks::{symbolize, RawStackId, NO_STACK};

/// Entries taken from the ring for a listener.
pub(crate) struct Tail {
    /// The number of `entries[0]` (greater than asked when the ring dropped some).
    pub first_seq: u64,
    pub entries: Vec<RawEntry>,
    /// Stacks of `entries` the listener has not had, symbolised (outside the lock).
    pub new_stacks: Vec<(RawStackId, Vec<Frame>)>,
    /// The number of `annotations[0]` (greater than asked when the ring dropped some).
    pub first_annotation_seq: u64,
    pub annotations: Vec<RawAnnotation>,
    /// Converts an entry's clock reading to microseconds since the Unix epoch.
    pub manual_epoch_us: Option<i64>,
}

impl Tail {
    pub fn time_us(&self, time_ns: u64) -> i64 {
        match self.manual_epoch_us {
            Some(start) => start.saturating_add((time_ns / 1000) as i64),
            None => crate::history::epoch_micros(time_ns),
        }
    }
}

/// The allocator's state at a live listener's connect (see `crate::live`): the snapshot, the
/// number of the first entry after its trace and of the first annotation after its
/// `external_annotations`.
pub struct LiveState {
    pub snapshot: memsnap_format::Snapshot,
    pub next_seq: u64,
    pub next_annotation: u64,
}

enum RawStack {
    Given(Arc<[Frame]>),
    Native(Vec<usize>),
}

impl<D: Device> CachingAllocator<D> {
    /// The snapshot a listener starts from, the number of the first entry not in its trace
    /// and of the first annotation not in its `external_annotations`. Unlike
    /// [`CachingAllocator::snapshot`] it records no `snapshot` entry.
    pub(crate) fn live_state(&self) -> LiveState {
        let (raw, next_seq, next_annotation) = {
            let mut st = self.state.lock();
            let raw = snapshot::collect_quietly(&mut st, false);
            (
                raw,
                st.history.live_recorded(),
                st.history.annotations_recorded(),
            )
        };
        LiveState {
            snapshot: snapshot::build(raw, self.device_index),
            next_seq,
            next_annotation,
        }
    }

    /// Up to `max` entries from number `seq` on, and up to `max` annotations from number
    /// `annotation_seq` on. The lock is held for the copy only (O(recorded − seq) slot
    /// reads, O(max) copies); stacks are symbolised after it.
    pub(crate) fn live_tail(
        &self,
        seq: u64,
        annotation_seq: u64,
        max: usize,
        sent: &HashSet<RawStackId>,
    ) -> Tail {
        let mut entries = Vec::new();
        let mut annotations = Vec::new();
        let mut raw_stacks: Vec<(RawStackId, RawStack)> = Vec::new();
        let (first_seq, first_annotation_seq, manual_epoch_us) = {
            let st = self.state.lock();
            let first = st.history.entries_since(seq, max, &mut entries);
            let first_annotation =
                st.history
                    .annotations_since(annotation_seq, max, &mut annotations);
            let mut seen = HashSet::new();
            for e in &entries {
                let id = e.stack;
                if id == NO_STACK || sent.contains(&id) || !seen.insert(id) {
                    continue;
                }
                let raw = match st.given_stacks.get(id) {
                    Some(frames) => RawStack::Given(frames.clone()),
                    None => RawStack::Native(st.stacks.get(id).to_vec()),
                };
                raw_stacks.push((id, raw));
            }
            (first, first_annotation, st.manual_epoch_us)
        };
        let new_stacks = raw_stacks
            .into_iter()
            .map(|(id, raw)| {
                let frames = match raw {
                    RawStack::Given(frames) => frames.to_vec(),
                    RawStack::Native(ips) => symbolize(&ips),
                };
                (id, frames)
            })
            .collect();
        Tail {
            first_seq,
            entries,
            new_stacks,
            first_annotation_seq,
            annotations,
            manual_epoch_us,
        }
    }
}
