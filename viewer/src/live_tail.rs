//! What a live recording received after the document on screen, free of UI.
//!
//! A live document is rebuilt whole (the replay, curves and drawing indexes of every entry),
//! so at millions of entries a new one comes about once a second. Between two rebuilds the
//! receiver keeps a [`LiveTail`]: the entries that arrived after the shown document's last
//! one, as the running change of active bytes (PyTorch's "Active Memory Timeline": `alloc`
//! adds a block's bytes, `free_completed` takes them back). The timeline draws it as a line
//! past the document's end, published at the receiver's status rate (20 a second), so the
//! picture grows as fast as the counts whatever the size of the run; the next document
//! replaces it with the full picture (bands, steps, phases).
//!
//! The tail keeps at most [`TAIL_POINTS`] points, each the highest change over `stride`
//! entries: when it fills, neighbours merge and the stride doubles, so a tail of any length
//! costs O(1) amortised per entry and its peak is never lost between points.

use memsnap_format::{Action, TraceEntry};

/// Most points a tail keeps (a line finer than a wide plot's pixel columns).
pub const TAIL_POINTS: usize = 2048;

/// One point of a [`LiveTail`]: the entries through its last one, and the highest change
/// of active bytes over its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailPoint {
    /// Entries after the document's last one, through this point's last entry.
    pub entries: u64,
    /// The time of the newest entry with one, up to this point's last entry (µs).
    pub time_us: Option<i64>,
    /// The highest change of active bytes since the document's last entry, over the
    /// point's entries.
    pub max_delta: i64,
}

/// The entries received after a live document's last one: see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveTail {
    /// The device whose trace the recording streams.
    pub device: i64,
    /// Trace entries (of that device) in the document the tail continues.
    pub after_entries: u64,
    /// Entries received after those.
    pub entries: u64,
    /// The change of active bytes over all of them.
    pub delta: i64,
    /// Entries per point (the last point may hold fewer).
    pub stride: u64,
    /// Oldest first.
    pub points: Vec<TailPoint>,
    /// The time of the newest entry that had one.
    time_us: Option<i64>,
}

impl LiveTail {
    /// An empty tail after a document with `after_entries` entries on `device`.
    pub fn new(device: i64, after_entries: u64) -> Self {
        LiveTail {
            device,
            after_entries,
            entries: 0,
            delta: 0,
            stride: 1,
            points: Vec::new(),
            time_us: None,
        }
    }

    /// Adds the next entry received. O(1) amortised.
    pub fn push(&mut self, entry: &TraceEntry) {
        self.delta = self.delta.saturating_add(active_change(entry));
        if let Some(time) = entry.time_us() {
            self.time_us = Some(time);
        }
        self.entries += 1;
        let bucket = (self.entries - 1) / self.stride;
        match self.points.last_mut() {
            Some(last) if (last.entries - 1) / self.stride == bucket => {
                last.entries = self.entries;
                last.time_us = self.time_us;
                last.max_delta = last.max_delta.max(self.delta);
            }
            _ => {
                self.points.push(TailPoint {
                    entries: self.entries,
                    time_us: self.time_us,
                    max_delta: self.delta,
                });
                if self.points.len() > TAIL_POINTS {
                    self.halve();
                }
            }
        }
    }

    /// Merges each pair of points into one and doubles the stride. Points stay aligned to
    /// the stride (the first starts at the first entry), so a pair is always the two halves
    /// of one doubled point.
    fn halve(&mut self) {
        let merged = self
            .points
            .chunks(2)
            .map(|pair| {
                let last = pair[pair.len() - 1];
                TailPoint {
                    max_delta: pair.iter().map(|p| p.max_delta).max().unwrap_or(0),
                    ..last
                }
            })
            .collect();
        self.points = merged;
        self.stride *= 2;
    }

    /// Whether the tail continues `document`'s trace of `device` (the document shown is the
    /// one it was started after).
    pub fn continues(&self, document: &memsnap_format::Snapshot, device: i64) -> bool {
        device == self.device
            && usize::try_from(device)
                .ok()
                .and_then(|d| document.traces().get(d))
                .is_some_and(|t| t.len() as u64 == self.after_entries)
    }

    /// The highest change of active bytes over the tail (0 when it is empty).
    pub fn max_delta(&self) -> i64 {
        self.points.iter().map(|p| p.max_delta).max().unwrap_or(0)
    }
}

/// How an entry changes the active bytes.
fn active_change(entry: &TraceEntry) -> i64 {
    let size = i64::try_from(entry.size).unwrap_or(i64::MAX);
    match entry.action {
        Action::Alloc => size,
        Action::FreeCompleted | Action::Free => -size,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two allocations then a free of the last one, sized in a cycle of 37, with a spike of
    /// 1 GiB every 1,001 entries: a sawtooth that rises overall.
    fn entry(i: u64) -> TraceEntry {
        let size_of =
            |j: u64| 512 * (1 + j % 37) + if j.is_multiple_of(1001) { 1 << 30 } else { 0 };
        let (action, size) = if i % 3 == 2 {
            (Action::FreeCompleted, size_of(i - 1))
        } else {
            (Action::Alloc, size_of(i))
        };
        let mut e = TraceEntry::new(action, 0x1000 + i * 512, size, 0);
        e.set_time_us(Some(1_000_000 + i as i64 * 3));
        e
    }

    /// However many entries arrive, each point is exactly the highest running change over
    /// the entries it covers, the points stay within the bound, and the last one ends at
    /// the newest entry.
    #[test]
    fn every_point_is_the_exact_peak_of_the_entries_it_covers() {
        for n in [0u64, 1, 5, 2048, 2049, 10_000, 100_003] {
            let mut tail = LiveTail::new(0, 7);
            let mut running = Vec::new();
            let mut delta = 0i64;
            for i in 0..n {
                let e = entry(i);
                tail.push(&e);
                delta += active_change(&e);
                running.push(delta);
            }
            assert_eq!(tail.entries, n);
            assert_eq!(tail.delta, delta);
            assert!(
                tail.points.len() <= TAIL_POINTS,
                "{n}: {}",
                tail.points.len()
            );
            let mut from = 0usize;
            for p in &tail.points {
                let to = p.entries as usize;
                assert!(to - from <= tail.stride as usize);
                let peak = running[from..to].iter().copied().max().expect("entries");
                assert_eq!(p.max_delta, peak, "{n}: entries {from}..{to}");
                assert_eq!(p.time_us, Some(1_000_000 + (to as i64 - 1) * 3));
                from = to;
            }
            assert_eq!(from as u64, n);
            assert_eq!(tail.max_delta(), running.iter().copied().max().unwrap_or(0));
        }
    }
}
