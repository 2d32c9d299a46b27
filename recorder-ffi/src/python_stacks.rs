//! Python stacks of the C ABI's allocations, kept beside the allocator's own history and
//! merged into the snapshot when it is written.
//!
//! The caching allocator records native stacks as instruction pointers; Python frames are not
//! instruction pointers. So [`PythonStacks`] logs, for every `memsnap_alloc`/`memsnap_free`,
//! the Python stack captured at the call, in the same order as the allocator's trace (the C
//! ABI holds this log's lock across the allocator call). When a snapshot is built, the newest
//! `alloc`/`free_requested` entries of each device are paired with the newest log events, from
//! the end, as long as action and address agree; each paired entry's frames become the native
//! frames with the Python frames spliced in ([`crate::python::merge_stacks`]).

use std::collections::{HashMap, VecDeque};

use memsnap_format::{Action, BlockState, Frame, Snapshot, StackId};
use rustc_hash::FxHashMap;

use crate::python::{frames as python_frames, merge_stacks, PyFrameRef};

/// Index of a Python stack in [`PythonStacks`].
type PyStackId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventKind {
    Alloc,
    Free,
}

#[derive(Clone, Copy, Debug)]
pub struct Event {
    kind: EventKind,
    addr: u64,
    stack: PyStackId,
    /// The live numbers of the trace entries the call recorded (`start..end`), when a device
    /// was published live then (see [`PythonStacks::paired`]).
    seqs: Option<(u64, u64)>,
}

/// The log of one process: per device, the newest events (at most `capacity`), and the Python
/// stack of every live allocation.
#[derive(Debug)]
pub struct PythonStacks {
    capacity: usize,
    stacks: Vec<Box<[PyFrameRef]>>,
    index: FxHashMap<Box<[PyFrameRef]>, PyStackId>,
    events: Vec<VecDeque<Event>>,
    live: HashMap<(usize, u64), PyStackId>,
}

impl PythonStacks {
    /// A log keeping the newest `capacity` events per device (the allocator's `max_entries`;
    /// the allocator's ring buffer then never holds an alloc or free older than the log).
    pub fn new(capacity: usize) -> Self {
        PythonStacks {
            capacity: capacity.max(1),
            stacks: Vec::new(),
            index: FxHashMap::default(),
            events: Vec::new(),
            live: HashMap::new(),
        }
    }

    /// Drops every event (recording was turned off or restarted).
    pub fn clear(&mut self, capacity: usize) {
        *self = PythonStacks::new(capacity);
    }

    /// Keeps at most `capacity` events per device from now on (the newest when shrinking).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        for log in &mut self.events {
            while log.len() > self.capacity {
                log.pop_front();
            }
        }
    }

    /// Whether any event is logged.
    pub fn has_events(&self) -> bool {
        self.events.iter().any(|log| !log.is_empty())
    }

    fn intern(&mut self, frames: Vec<PyFrameRef>) -> PyStackId {
        if let Some(&id) = self.index.get(frames.as_slice()) {
            return id;
        }
        let id = self.stacks.len() as PyStackId;
        let frames: Box<[PyFrameRef]> = frames.into_boxed_slice();
        self.stacks.push(frames.clone());
        self.index.insert(frames, id);
        id
    }

    fn push(&mut self, device: usize, event: Event) {
        if self.events.len() <= device {
            self.events.resize_with(device + 1, VecDeque::new);
        }
        let log = &mut self.events[device];
        if log.len() == self.capacity {
            log.pop_front();
        }
        log.push_back(event);
    }

    /// Logs an allocation the allocator just recorded (`seqs`: see [`Event`]).
    pub fn record_alloc(
        &mut self,
        device: usize,
        addr: u64,
        frames: Vec<PyFrameRef>,
        seqs: Option<(u64, u64)>,
    ) {
        let stack = self.intern(frames);
        self.live.insert((device, addr), stack);
        self.push(
            device,
            Event {
                kind: EventKind::Alloc,
                addr,
                stack,
                seqs,
            },
        );
    }

    /// Logs a free the allocator just recorded. `free_site` is the stack of the free call
    /// (context "all"); `None` reuses the allocation's stack (context "alloc").
    pub fn record_free(
        &mut self,
        device: usize,
        addr: u64,
        free_site: Option<Vec<PyFrameRef>>,
        seqs: Option<(u64, u64)>,
    ) {
        let alloc_stack = self.live.remove(&(device, addr));
        let stack = match free_site {
            Some(frames) => self.intern(frames),
            None => match alloc_stack {
                Some(stack) => stack,
                None => self.intern(Vec::new()),
            },
        };
        self.push(
            device,
            Event {
                kind: EventKind::Free,
                addr,
                stack,
                seqs,
            },
        );
    }

    /// The numbered events of `device` whose entries lie in the live numbers `from..to`, in
    /// order. O(log n + k) for k events given.
    pub fn window(&self, device: usize, from: u64, to: u64) -> Vec<Event> {
        let Some(log) = self.events.get(device) else {
            return Vec::new();
        };
        // Numbered events come after the unnumbered ones, in the trace's order.
        let first = log.partition_point(|e| e.seqs.is_none_or(|(_, end)| end <= from));
        log.range(first..)
            .take_while(|e| e.seqs.is_some_and(|(start, _)| start < to))
            .copied()
            .collect()
    }

    /// For each of `entries` (numbered from `first_seq`), the Python stack of the `alloc` or
    /// `free_requested` that `window` ([`PythonStacks::window`]) logged for it: the event
    /// whose call recorded that number, with the same kind and address. O(entries + window).
    pub fn paired(window: &[Event], first_seq: u64, entries: &[(Action, u64)]) -> Vec<Option<u32>> {
        let mut events = window.iter().peekable();
        entries
            .iter()
            .enumerate()
            .map(|(i, &(action, addr))| {
                let seq = first_seq + i as u64;
                let kind = match action {
                    Action::Alloc => EventKind::Alloc,
                    Action::FreeRequested => EventKind::Free,
                    _ => return None,
                };
                while events
                    .peek()
                    .is_some_and(|e| e.seqs.is_none_or(|(_, end)| end <= seq))
                {
                    events.next();
                }
                let event = events.peek()?;
                let (start, end) = event.seqs?;
                (start <= seq && seq < end && event.kind == kind && event.addr == addr)
                    .then_some(event.stack)
            })
            .collect()
    }

    /// The frames of Python stack `id`.
    pub fn stack(&self, id: u32) -> Option<Box<[PyFrameRef]>> {
        self.stacks.get(id as usize).cloned()
    }

    /// Splices the logged Python frames into the snapshot's trace entries and live blocks.
    /// `blocks_too` is false when the context level records no block stacks.
    pub fn merge_into(&self, snapshot: &mut Snapshot, blocks_too: bool) {
        let mut merged: HashMap<(Option<StackId>, PyStackId), StackId> = HashMap::new();
        let mut merge = |snapshot: &mut Snapshot, native: Option<StackId>, py: PyStackId| {
            if let Some(&id) = merged.get(&(native, py)) {
                return id;
            }
            let native_frames: Vec<Frame> = native
                .map(|id| snapshot.stack_frames(id).cloned().collect())
                .unwrap_or_default();
            let python = python_frames(&self.stacks[py as usize]);
            let id = snapshot.intern_stack(merge_stacks(native_frames, python));
            merged.insert((native, py), id);
            id
        };

        let mut traces = snapshot.device_traces.take().unwrap_or_default();
        for (device, trace) in traces.iter_mut().enumerate() {
            let Some(log) = self.events.get(device) else {
                continue;
            };
            // Pair from the newest: the trace may have lost old entries, the log too.
            let mut paired: Vec<(usize, PyStackId)> = Vec::new();
            let mut events = log.iter().rev();
            for (i, entry) in trace.iter().enumerate().rev() {
                let kind = match entry.action {
                    Action::Alloc => EventKind::Alloc,
                    Action::FreeRequested => EventKind::Free,
                    _ => continue,
                };
                match events.next() {
                    Some(event) if event.kind == kind && event.addr == entry.addr => {
                        paired.push((i, event.stack));
                    }
                    _ => break,
                }
            }
            // A free_completed gets the stack of the free_requested at its address.
            let mut free_stacks: HashMap<u64, PyStackId> = HashMap::new();
            let paired: HashMap<usize, PyStackId> = paired.into_iter().collect();
            for (i, entry) in trace.iter_mut().enumerate() {
                let py = match entry.action {
                    Action::FreeCompleted => free_stacks.remove(&entry.addr),
                    _ => paired.get(&i).copied(),
                };
                let Some(py) = py else {
                    continue;
                };
                if entry.action == Action::FreeRequested {
                    free_stacks.insert(entry.addr, py);
                }
                entry.frames = Some(merge(snapshot, entry.frames, py));
            }
        }
        snapshot.device_traces = Some(traces);

        if !blocks_too {
            return;
        }
        let mut segments = std::mem::take(&mut snapshot.segments);
        for segment in &mut segments {
            let Ok(device) = usize::try_from(segment.device) else {
                continue;
            };
            let mut next = segment.address;
            for block in &mut segment.blocks {
                let addr = block.address.unwrap_or(next);
                next = addr.wrapping_add(block.size);
                if block.state == BlockState::Inactive {
                    continue;
                }
                if let Some(&py) = self.live.get(&(device, addr)) {
                    block.frames = Some(merge(snapshot, block.frames, py));
                }
            }
        }
        snapshot.segments = segments;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{Block, Segment, TraceEntry};

    fn py(name: &str, line: i32) -> PyFrameRef {
        PyFrameRef {
            code: crate::python::code_for_test(name, "/src/model.py"),
            line,
        }
    }

    fn names(snapshot: &Snapshot, id: Option<StackId>) -> Vec<String> {
        id.map(|id| snapshot.stack_frames(id).map(|f| f.name.clone()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn logged_python_frames_are_spliced_into_matching_entries_and_blocks() {
        let mut snapshot = Snapshot::new(1);
        let native = snapshot.intern_stack([
            Frame::new("memsnap_alloc", "", 0),
            Frame::new("_PyEval_EvalFrameDefault", "", 0),
            Frame::new("main", "", 0),
        ]);
        let mut entries = vec![
            TraceEntry::new(Action::SegmentAlloc, 0x1000, 2 << 20, 0),
            TraceEntry::new(Action::Alloc, 0x1000, 512, 0),
            TraceEntry::new(Action::Alloc, 0x1200, 512, 0),
            TraceEntry::new(Action::FreeRequested, 0x1000, 512, 0),
            TraceEntry::new(Action::FreeCompleted, 0x1000, 512, 0),
        ];
        for e in &mut entries {
            if e.action != Action::SegmentAlloc {
                e.frames = Some(native);
            }
        }
        snapshot.device_traces = Some(vec![entries]);
        let mut segment = Segment::new(0, 0x1000, 1024, 0);
        for (addr, state) in [
            (0x1000, BlockState::Inactive),
            (0x1200, BlockState::ActiveAllocated),
        ] {
            segment.blocks.push(Block {
                address: Some(addr),
                size: 512,
                requested_size: Some(512),
                state,
                frames: Some(native),
                forward_frames: None,
                history: None,
                extra: Vec::new(),
                exact: Default::default(),
            });
        }
        snapshot.segments.push(segment);

        let mut log = PythonStacks::new(100);
        log.record_alloc(0, 0x1000, vec![py("forward", 54)], None);
        log.record_alloc(0, 0x1200, vec![py("backward", 80)], None);
        log.record_free(0, 0x1000, Some(vec![py("step", 99)]), None);
        log.merge_into(&mut snapshot, true);

        let trace = &snapshot.traces()[0];
        assert_eq!(names(&snapshot, trace[0].frames), Vec::<String>::new());
        assert_eq!(
            names(&snapshot, trace[1].frames),
            ["memsnap_alloc", "forward", "main"]
        );
        assert_eq!(
            names(&snapshot, trace[2].frames),
            ["memsnap_alloc", "backward", "main"]
        );
        assert_eq!(
            names(&snapshot, trace[3].frames),
            ["memsnap_alloc", "step", "main"]
        );
        assert_eq!(
            names(&snapshot, trace[4].frames),
            ["memsnap_alloc", "step", "main"]
        );
        let blocks = &snapshot.segments[0].blocks;
        assert_eq!(
            names(&snapshot, blocks[0].frames),
            ["memsnap_alloc", "_PyEval_EvalFrameDefault", "main"]
        );
        assert_eq!(
            names(&snapshot, blocks[1].frames),
            ["memsnap_alloc", "backward", "main"]
        );
    }

    #[test]
    fn a_mismatch_stops_the_pairing_instead_of_mislabelling() {
        let mut snapshot = Snapshot::new(1);
        snapshot.device_traces = Some(vec![vec![
            TraceEntry::new(Action::Alloc, 0x1000, 512, 0),
            TraceEntry::new(Action::Alloc, 0x2000, 512, 0),
        ]]);
        let mut log = PythonStacks::new(100);
        log.record_alloc(0, 0x3000, vec![py("old", 1)], None);
        log.record_alloc(0, 0x2000, vec![py("new", 2)], None);
        log.merge_into(&mut snapshot, true);
        let trace = &snapshot.traces()[0];
        assert_eq!(
            trace[0].frames, None,
            "0x1000 was paired with an event at 0x3000"
        );
        assert_eq!(names(&snapshot, trace[1].frames), ["new"]);
    }

    #[test]
    fn the_log_keeps_only_the_newest_events() {
        let mut log = PythonStacks::new(2);
        for addr in 0..5u64 {
            log.record_alloc(0, addr, vec![py("f", addr as i32)], None);
        }
        let addrs: Vec<u64> = log.events[0].iter().map(|e| e.addr).collect();
        assert_eq!(addrs, [3, 4]);
    }

    #[test]
    fn live_entries_get_the_python_stack_of_the_call_that_recorded_them() {
        let mut log = PythonStacks::new(100);
        // Logged before the device was published: no numbers, never paired by number.
        log.record_alloc(0, 0x10, vec![py("before", 1)], None);
        // Entries 5 (segment_alloc) and 6 (alloc) from the first call, 7 (alloc) from the
        // second, 8 and 9 (free_requested, free_completed) from the free.
        log.record_alloc(0, 0x1000, vec![py("forward", 2)], Some((5, 7)));
        log.record_alloc(0, 0x2000, vec![py("backward", 3)], Some((7, 8)));
        log.record_free(0, 0x1000, Some(vec![py("step", 4)]), Some((8, 10)));
        let entries = [
            (Action::SegmentAlloc, 0x1000),
            (Action::Alloc, 0x1000),
            (Action::Alloc, 0x2000),
            (Action::FreeRequested, 0x1000),
            (Action::FreeCompleted, 0x1000),
        ];
        let window = log.window(0, 5, 10);
        assert_eq!(window.len(), 3);
        let names = |ids: Vec<Option<u32>>| -> Vec<Option<String>> {
            ids.into_iter()
                .map(|id| {
                    let stack = log.stack(id?)?;
                    Some(python_frames(&stack)[0].name.clone())
                })
                .collect()
        };
        assert_eq!(
            names(PythonStacks::paired(&window, 5, &entries)),
            [
                None,
                Some("forward".into()),
                Some("backward".into()),
                Some("step".into()),
                None
            ]
        );
        // A batch that starts later gets only its own calls.
        let window = log.window(0, 7, 9);
        assert_eq!(
            names(PythonStacks::paired(&window, 7, &entries[2..4])),
            [Some("backward".into()), Some("step".into())]
        );
        // An entry that is not the call's (another address) is not given its stack.
        let window = log.window(0, 6, 7);
        assert_eq!(
            PythonStacks::paired(&window, 6, &[(Action::Alloc, 0x3000)]),
            [None]
        );
        // Numbers past the log: nothing.
        assert!(log.window(0, 10, 20).is_empty());
        assert!(log.window(3, 0, 20).is_empty());
    }
}
