//! The replay: the start state restored into a [`CachingAllocator`] on a [`TraceDevice`],
//! then every request of the window fed through it, step by step, comparing its segment
//! decisions with the recorded ones.

// Keyed by block addresses, looked up once or twice per entry: SipHash was a tenth of a
// replay.
use foldhash::HashMap;

use memsnap_format::{Action, Snapshot, TraceEntry};
use memsnap_recorder::{AllocatorConfig, CachingAllocator, Error as AllocError, Stream};
use serde::Serialize;

use crate::device::{SegmentAction, SegmentDecision, TraceDevice};
use crate::error::{Result, SimulateError};
use crate::settings;
use crate::start::{self, StartState};

/// Capacity used when the file does not imply one and none is given: 80 GiB, or twice the
/// recorded reserved peak when that is more.
pub const DEFAULT_CAPACITY: u64 = 80 << 30;

/// A stream no real trace uses: frees whose completion the trace shows later are recorded
/// as used on it, so the block waits for an event the replay completes at `free_completed`.
const DEFERRED_STREAM: Stream = Stream(i64::MIN + 7);

/// Differences kept per device (the count is exact).
pub const MAX_DIFFERENCES: usize = 50;

/// What to simulate.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Settings to replay under; `None`: the file's own.
    pub config: Option<AllocatorConfig>,
    /// Device memory; `None`: what the file implies (an `oom` entry), else a big default.
    pub memory_limit: Option<u64>,
    /// Only this device; `None`: every device with a trace.
    pub device: Option<i64>,
}

/// The result of one simulation.
#[derive(Clone, Debug, Serialize)]
pub struct Simulation {
    /// The settings replayed, as a `PYTORCH_CUDA_ALLOC_CONF` string (empty: the defaults).
    pub alloc_conf: String,
    /// Where the settings came from.
    pub settings_source: String,
    pub devices: Vec<DeviceReport>,
}

/// Where the device capacity came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// `--memory-limit`.
    Limit,
    /// The file's `oom` entry: its `device_free` plus the reserved bytes then.
    OomEntry,
    /// Nothing implied one: [`DEFAULT_CAPACITY`] or twice the recorded peak.
    Default,
}

/// Where the replay ran out of memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomAt {
    /// Trace index of the request that failed.
    pub event: usize,
    /// The request (bytes, unrounded for `alloc`, rounded for a recorded `oom`).
    pub requested: u64,
    pub stream: i64,
    /// Whether PyTorch ran out of memory at this event too.
    pub recorded: bool,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
}

/// What the file itself shows over the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Recorded {
    pub reserved_at_start_bytes: u64,
    pub reserved_peak_bytes: u64,
    pub reserved_at_end_bytes: u64,
    /// `segment_alloc` + `segment_map` entries.
    pub device_mallocs: u64,
    /// `segment_free` + `segment_unmap` entries.
    pub device_frees: u64,
    /// First `oom` entry: its index and `device_free`.
    pub oom_event: Option<usize>,
    pub oom_device_free: Option<u64>,
}

/// One step where the replay's segment decisions differ from the recorded ones.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Difference {
    /// Trace index of the step (the request, or the first entry of a release run).
    pub event: usize,
    /// What the step was: `alloc 4194304 B on stream 0`, `empty_cache`, ...
    pub step: String,
    /// The recorded decisions (action, bytes).
    pub pytorch: Vec<(SegmentAction, u64)>,
    /// The replay's.
    pub replay: Vec<(SegmentAction, u64)>,
}

/// How closely the replay follows the recording.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Fidelity {
    /// Recorded segment decisions in the window.
    pub segment_decisions: u64,
    /// Of those, made by the replay at the same step with the same action and size.
    pub reproduced: u64,
    /// Decisions the replay made that the recording does not have.
    pub extra: u64,
    /// Allocations replayed, and of those placed at the recorded address.
    pub allocations: u64,
    pub placed_at_recorded_address: u64,
    /// The first allocation placed elsewhere: (event, recorded address, replay's address).
    pub first_misplaced: Option<(usize, u64, u64)>,
    /// Steps whose decisions differ (exact), and the first [`MAX_DIFFERENCES`] of them.
    pub difference_count: u64,
    pub differences: Vec<Difference>,
}

impl Fidelity {
    /// Whether every recorded decision was reproduced and none added.
    pub fn exact(&self) -> bool {
        self.difference_count == 0
    }
}

/// The simulation of one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    pub device: i64,
    /// Trace entries in the window.
    pub events: usize,
    /// Trace entries replayed (all, unless the replay ran out of memory where PyTorch did
    /// not: the run would have ended there).
    pub events_replayed: usize,
    pub capacity_bytes: u64,
    pub capacity_source: CapacitySource,
    /// The replay's segment decisions in order: (`segment_alloc` | `segment_free` |
    /// `segment_map` | `segment_unmap`, bytes).
    pub segment_events: Vec<(SegmentAction, u64)>,
    pub reserved_peak_bytes: u64,
    pub allocated_peak_bytes: u64,
    /// Reserved minus allocated at the reserved peak.
    pub fragmentation_bytes: u64,
    /// The event after which the reserved peak was first reached (`None`: at the start).
    pub reserved_peak_event: Option<usize>,
    /// `cudaMalloc`s plus maps, `cudaFree`s plus unmaps.
    pub device_mallocs: u64,
    pub device_frees: u64,
    /// The first out-of-memory of the replay.
    pub oom: Option<OomAt>,
    /// Every out-of-memory of the replay (event indices).
    pub oom_events: Vec<usize>,
    pub recorded: Recorded,
    pub fidelity: Fidelity,
    /// Reserved bytes after each replayed event (index: trace index; `events_replayed` long).
    /// A step's device calls count at its request, so a `cudaMalloc` shows one event later
    /// than the recorded `segment_alloc` that precedes the request. Not in the JSON output.
    #[serde(skip)]
    pub reserved_curve: Vec<u64>,
    /// Allocated bytes (the blocks handed out, as the allocator rounds them) after each
    /// replayed event, like `reserved_curve`. Not in the JSON output.
    #[serde(skip)]
    pub allocated_curve: Vec<u64>,
    /// Reserved bytes after each event as the file records them (`events` long).
    #[serde(skip)]
    pub recorded_reserved_curve: Vec<u64>,
    /// The start state: segments, reserved bytes, blocks allocated before the window.
    pub start_segments: usize,
    pub start_reserved_bytes: u64,
    pub start_allocated_blocks: u64,
    pub start_estimated_blocks: u64,
    /// Inconsistencies of the file the replay absorbed (first few; the count is exact).
    pub anomalies: Vec<String>,
    pub anomaly_count: u64,
}

/// Replays every device of `snapshot` with a trace (see [`Options`]).
pub fn simulate(snapshot: &Snapshot, options: &Options) -> Result<Simulation> {
    let (config, settings_source) = replayed_config(snapshot, options);
    let with_trace: Vec<i64> = snapshot
        .traces()
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(d, _)| d as i64)
        .collect();
    if with_trace.is_empty() {
        return Err(SimulateError::NoTrace);
    }
    let devices = match options.device {
        Some(d) if with_trace.contains(&d) => vec![d],
        Some(d) => {
            return Err(SimulateError::NoSuchDevice {
                device: d,
                available: with_trace,
            })
        }
        None => with_trace,
    };
    let mut reports = Vec::with_capacity(devices.len());
    for device in devices {
        let trace = usize::try_from(device)
            .ok()
            .and_then(|d| snapshot.traces().get(d))
            .map_or(&[][..], Vec::as_slice);
        reports.push(replay_device(
            snapshot,
            device,
            trace,
            &config,
            options.memory_limit,
        )?);
    }
    Ok(Simulation {
        alloc_conf: settings::conf_string(&config),
        settings_source,
        devices: reports,
    })
}

/// Replays `trace` as `device`'s trace of `snapshot`: the start state, the settings and the
/// device memory the file implies are the snapshot's, the requests are `trace`'s. This is
/// [`simulate`] of one device for a trace edited outside the snapshot (memsnap-advise replays
/// a dozen edits of a 10M-entry trace: a copy of the snapshot to hold each would cost more
/// than the edit). `options.device` is not used. O(n log s), as [`simulate`].
pub fn replay_trace(
    snapshot: &Snapshot,
    device: i64,
    trace: &[TraceEntry],
    options: &Options,
) -> Result<DeviceReport> {
    if trace.is_empty() {
        return Err(SimulateError::NoTrace);
    }
    let (config, _) = replayed_config(snapshot, options);
    replay_device(snapshot, device, trace, &config, options.memory_limit)
}

/// The device's memory as the file states it, or `None` when it does not: only an `oom`
/// entry does, with the device's free bytes then; the memory is those plus what was reserved
/// at that moment (the start state's segments and the segment entries before the first
/// `oom`). A replay without a memory limit sizes an OOM file's device this way
/// ([`CapacitySource::OomEntry`]). O(n + s) in the device's trace entries and segments.
pub fn device_memory(snapshot: &Snapshot, device: i64) -> Option<u64> {
    let trace = snapshot.traces().get(usize::try_from(device).ok()?)?;
    let at = trace.iter().position(|e| e.action == Action::Oom)?;
    let free = trace[at].device_free()?;
    let reserved_at_start = start::ranges_at_start(snapshot, device, trace).reserved_bytes;
    Some(free.saturating_add(reserved_before(trace, reserved_at_start, at)))
}

/// The settings to replay under and where they came from: the given ones, else the file's.
fn replayed_config(snapshot: &Snapshot, options: &Options) -> (AllocatorConfig, String) {
    match &options.config {
        Some(c) => (c.clone(), "given".to_string()),
        None => {
            let (file_config, source) = settings::file_config(snapshot);
            (file_config, source.to_string())
        }
    }
}

/// What the trace shows: reserved bytes over the window, device calls, the first OOM.
fn recorded(trace: &[TraceEntry], reserved_at_start: u64) -> (Recorded, Vec<u64>) {
    let mut r = Recorded {
        reserved_at_start_bytes: reserved_at_start,
        reserved_peak_bytes: reserved_at_start,
        ..Default::default()
    };
    let mut reserved = reserved_at_start;
    let mut curve = Vec::with_capacity(trace.len());
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                reserved = reserved.saturating_add(e.size);
                r.device_mallocs += 1;
                r.reserved_peak_bytes = r.reserved_peak_bytes.max(reserved);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                reserved = reserved.saturating_sub(e.size);
                r.device_frees += 1;
            }
            Action::Oom if r.oom_event.is_none() => {
                r.oom_event = Some(i);
                r.oom_device_free = e.device_free();
            }
            _ => {}
        }
        curve.push(reserved);
    }
    r.reserved_at_end_bytes = reserved;
    (r, curve)
}

/// Reserved bytes just before trace index `at`.
fn reserved_before(trace: &[TraceEntry], reserved_at_start: u64, at: usize) -> u64 {
    trace[..at.min(trace.len())]
        .iter()
        .fold(reserved_at_start, |r, e| match e.action {
            Action::SegmentAlloc | Action::SegmentMap => r.saturating_add(e.size),
            Action::SegmentFree | Action::SegmentUnmap => r.saturating_sub(e.size),
            _ => r,
        })
}

fn segment_action(action: Action) -> Option<SegmentAction> {
    match action {
        Action::SegmentAlloc => Some(SegmentAction::SegmentAlloc),
        Action::SegmentFree => Some(SegmentAction::SegmentFree),
        Action::SegmentMap => Some(SegmentAction::SegmentMap),
        Action::SegmentUnmap => Some(SegmentAction::SegmentUnmap),
        _ => None,
    }
}

struct Driver<'a> {
    device: i64,
    alloc: CachingAllocator<TraceDevice>,
    /// Recorded block address -> the replay's pointer.
    ptrs: HashMap<u64, u64>,
    /// Recorded address of a free whose completion is later -> the event it waits on.
    deferred: HashMap<u64, memsnap_recorder::Event>,
    report: &'a mut DeviceReport,
    fragmentation_at_peak: u64,
}

fn replay_device(
    snapshot: &Snapshot,
    device: i64,
    trace: &[TraceEntry],
    config: &AllocatorConfig,
    memory_limit: Option<u64>,
) -> Result<DeviceReport> {
    let (file_config, _) = settings::file_config(snapshot);
    let ranges = start::ranges_at_start(snapshot, device, trace);
    let (recorded, recorded_reserved_curve) = recorded(trace, ranges.reserved_bytes);
    let (capacity, capacity_source) = match (memory_limit, recorded.oom_event) {
        (Some(limit), _) => (limit, CapacitySource::Limit),
        (None, Some(at)) => {
            let free = recorded.oom_device_free.unwrap_or(0);
            (
                free.saturating_add(reserved_before(trace, ranges.reserved_bytes, at)),
                CapacitySource::OomEntry,
            )
        }
        (None, None) => (
            DEFAULT_CAPACITY.max(recorded.reserved_peak_bytes.saturating_mul(2)),
            CapacitySource::Default,
        ),
    };
    // The start state is the recorded one, laid out with the file's rounding.
    let start = start::layout(snapshot, device, trace, ranges, &file_config, capacity);

    let fallback = highest_address(snapshot, trace)
        .saturating_add(1 << 40)
        .min(u64::MAX / 2);
    let alloc = CachingAllocator::with_config(TraceDevice::new(capacity, fallback), config.clone())
        .with_device_index(device);

    let mut report = DeviceReport {
        device,
        events: trace.len(),
        events_replayed: 0,
        capacity_bytes: capacity,
        capacity_source,
        segment_events: Vec::new(),
        reserved_peak_bytes: 0,
        allocated_peak_bytes: 0,
        fragmentation_bytes: 0,
        reserved_peak_event: None,
        device_mallocs: 0,
        device_frees: 0,
        oom: None,
        oom_events: Vec::new(),
        recorded,
        fidelity: Fidelity::default(),
        reserved_curve: Vec::with_capacity(trace.len()),
        allocated_curve: Vec::with_capacity(trace.len()),
        recorded_reserved_curve,
        start_segments: start.segments.len() + start.reservations.len(),
        start_reserved_bytes: start.reserved_bytes,
        start_allocated_blocks: start.allocated_blocks,
        start_estimated_blocks: start.estimated_blocks,
        anomalies: Vec::new(),
        anomaly_count: 0,
    };
    let mut driver = Driver {
        device,
        alloc,
        ptrs: HashMap::default(),
        deferred: HashMap::default(),
        report: &mut report,
        fragmentation_at_peak: 0,
    };
    driver.restore(&start);
    driver.run(trace)?;
    Ok(report)
}

fn highest_address(snapshot: &Snapshot, trace: &[TraceEntry]) -> u64 {
    let segs = snapshot
        .segments
        .iter()
        .map(|s| s.address.saturating_add(s.total_size));
    let entries = trace
        .iter()
        .filter(|e| e.has_addr())
        .map(|e| e.addr.saturating_add(e.size));
    segs.chain(entries).max().unwrap_or(0)
}

impl Driver<'_> {
    fn note(&mut self, what: String) {
        self.report.anomaly_count += 1;
        if self.report.anomalies.len() < 50 {
            self.report.anomalies.push(what);
        }
    }

    /// Restores the start state into the allocator and the device.
    fn restore(&mut self, start: &StartState) {
        for a in &start.anomalies {
            self.note(a.clone());
        }
        self.report.anomaly_count += start.anomaly_count - start.anomalies.len() as u64;
        for seg in &start.segments {
            if self.alloc.restore_segment(seg)
                && self
                    .alloc
                    .device()
                    .adopt_segment(seg.address, seg.total_size)
            {
                self.adopt_blocks(std::slice::from_ref(seg));
            } else {
                self.note(format!(
                    "segment at {:#x} ({} bytes) of the start state could not be restored",
                    seg.address, seg.total_size
                ));
            }
        }
        for r in &start.reservations {
            let mapped: u64 = r.mapped.iter().map(|s| s.total_size).sum();
            if self
                .alloc
                .restore_expandable_segment(r.base, r.size, &r.mapped)
                && self
                    .alloc
                    .device()
                    .adopt_reservation(r.base, r.size, mapped)
            {
                self.adopt_blocks(&r.mapped);
            } else {
                self.note(format!(
                    "expandable segment at {:#x} of the start state could not be restored",
                    r.base
                ));
            }
        }
        self.after_step(None);
    }

    fn adopt_blocks(&mut self, segments: &[memsnap_format::Segment]) {
        for seg in segments {
            for (addr, b) in seg.block_addresses() {
                if b.state.is_active() {
                    self.ptrs.insert(addr, addr);
                }
            }
        }
    }

    /// Updates peaks after a step (`None`: the start).
    fn after_step(&mut self, event: Option<usize>) {
        let stats = self.alloc.stats();
        let reserved = stats.reserved_bytes();
        let allocated = stats.allocated_bytes();
        if reserved > self.report.reserved_peak_bytes || event.is_none() {
            self.report.reserved_peak_bytes = reserved;
            self.report.reserved_peak_event = event;
            self.fragmentation_at_peak = reserved.saturating_sub(allocated);
        }
        self.report.allocated_peak_bytes = self.report.allocated_peak_bytes.max(allocated);
        if let Some(event) = event {
            // Events folded into this step (a free's completion, a release run) share its value.
            let curve = &mut self.report.reserved_curve;
            curve.resize(curve.len().max(event + 1), reserved);
            let curve = &mut self.report.allocated_curve;
            curve.resize(curve.len().max(event + 1), allocated);
        }
    }

    /// Compares the step's decisions with the recorded ones.
    fn compare(
        &mut self,
        event: usize,
        step: impl FnOnce() -> String,
        recorded: &[SegmentDecision],
    ) {
        let ours = self.alloc.device().take_log();
        for d in &ours {
            self.report.segment_events.push((d.action, d.size));
            if d.action.grows() {
                self.report.device_mallocs += 1;
            } else {
                self.report.device_frees += 1;
            }
        }
        let f = &mut self.report.fidelity;
        f.segment_decisions += recorded.len() as u64;
        let a: Vec<(SegmentAction, u64)> = recorded.iter().map(|d| (d.action, d.size)).collect();
        let b: Vec<(SegmentAction, u64)> = ours.iter().map(|d| (d.action, d.size)).collect();
        if a == b {
            f.reproduced += a.len() as u64;
            return;
        }
        let matched = common_subsequence(&a, &b);
        f.reproduced += matched;
        f.extra += b.len() as u64 - matched;
        f.difference_count += 1;
        if f.differences.len() < MAX_DIFFERENCES {
            f.differences.push(Difference {
                event,
                step: step(),
                pytorch: a,
                replay: b,
            });
        }
    }

    fn run(&mut self, trace: &[TraceEntry]) -> Result<()> {
        let mut pending: Vec<SegmentDecision> = Vec::new();
        let mut i = 0;
        while i < trace.len() {
            let e = &trace[i];
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    if let Some(action) = segment_action(e.action) {
                        pending.push(SegmentDecision {
                            action,
                            addr: e.addr,
                            size: e.size,
                        });
                    }
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    // A release run: `empty_cache()` or the OOM retry's release of the
                    // cache, which free the same blocks; replayed as `empty_cache()`.
                    if !pending.is_empty() {
                        self.compare(i, || "segment events without a request".into(), &pending);
                        pending.clear();
                    }
                    let mut j = i;
                    let mut run = Vec::new();
                    while let Some(action) = trace.get(j).and_then(|e| segment_action(e.action)) {
                        if action.grows() {
                            break;
                        }
                        run.push(SegmentDecision {
                            action,
                            addr: trace[j].addr,
                            size: trace[j].size,
                        });
                        j += 1;
                    }
                    self.alloc
                        .empty_cache()
                        .map_err(|source| self.error(i, source))?;
                    self.compare(i, || "empty_cache (a run of segment releases)".into(), &run);
                    self.after_step(Some(j - 1));
                    i = j;
                    continue;
                }
                Action::Alloc => {
                    self.alloc.device().set_hints(&pending);
                    let result = self.alloc.malloc(e.size, Stream(e.stream));
                    let size = e.size;
                    let stream = e.stream;
                    self.compare(
                        i,
                        || format!("alloc of {size} B on stream {stream}"),
                        &pending,
                    );
                    pending.clear();
                    match result {
                        Ok(ptr) => {
                            self.report.fidelity.allocations += 1;
                            let f = &mut self.report.fidelity;
                            if ptr == e.addr {
                                f.placed_at_recorded_address += 1;
                            } else if f.first_misplaced.is_none() {
                                f.first_misplaced = Some((i, e.addr, ptr));
                            }
                            if self.ptrs.insert(e.addr, ptr).is_some() {
                                self.note(format!(
                                    "event {i}: alloc at {:#x}, which is still allocated",
                                    e.addr
                                ));
                            }
                        }
                        Err(AllocError::OutOfMemory(_)) => {
                            self.out_of_memory(i, e, false);
                            self.after_step(Some(i));
                            self.report.events_replayed = i + 1;
                            return Ok(());
                        }
                        Err(source) => return Err(self.error(i, source)),
                    }
                }
                Action::Oom => {
                    self.alloc.device().set_hints(&pending);
                    let result = self.alloc.malloc(e.size.max(1), Stream(e.stream));
                    let size = e.size;
                    self.compare(
                        i,
                        || format!("request of {size} B that ran out of memory"),
                        &pending,
                    );
                    pending.clear();
                    match result {
                        Ok(ptr) => {
                            // The replay had room: the tensor's later life is unknown, so it is
                            // given back at once.
                            let _ = self.alloc.free(ptr);
                        }
                        Err(AllocError::OutOfMemory(_)) => self.out_of_memory(i, e, true),
                        Err(source) => return Err(self.error(i, source)),
                    }
                }
                Action::FreeRequested => {
                    let immediate = trace
                        .get(i + 1)
                        .is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr);
                    match self.ptrs.remove(&e.addr) {
                        Some(ptr) => {
                            if !immediate {
                                self.alloc.record_stream(ptr, DEFERRED_STREAM);
                            }
                            if self.alloc.free(ptr).is_err() {
                                self.note(format!("event {i}: free of {:#x} failed", e.addr));
                            } else if !immediate {
                                if let Some(ev) = self.alloc.device().take_last_event() {
                                    self.deferred.insert(e.addr, ev);
                                }
                            }
                        }
                        None => self.note(format!(
                            "event {i}: free of {:#x}, which the replay does not hold",
                            e.addr
                        )),
                    }
                    if immediate {
                        self.compare(i, || "free".into(), &[]);
                        self.after_step(Some(i + 1));
                        i += 2;
                        continue;
                    }
                }
                Action::FreeCompleted | Action::Free => {
                    if let Some(ev) = self.deferred.remove(&e.addr) {
                        self.alloc.device().complete_event(ev);
                    } else if let Some(ptr) = self.ptrs.remove(&e.addr) {
                        // Requested before the window (or a merged `free`).
                        if self.alloc.free(ptr).is_err() {
                            self.note(format!("event {i}: free of {:#x} failed", e.addr));
                        }
                    } else {
                        self.note(format!(
                            "event {i}: free of {:#x}, which the replay does not hold",
                            e.addr
                        ));
                    }
                }
                _ => {}
            }
            if !matches!(e.action, Action::SegmentAlloc | Action::SegmentMap) {
                self.compare(i, || "free".into(), &[]);
            }
            self.after_step(Some(i));
            i += 1;
        }
        if !pending.is_empty() {
            self.compare(trace.len(), || "end of the trace".into(), &pending);
        }
        self.report.events_replayed = trace.len();
        self.report.fragmentation_bytes = self.fragmentation_at_peak;
        let stats = self.alloc.stats();
        let (reserved, allocated) = (stats.reserved_bytes(), stats.allocated_bytes());
        self.report.reserved_curve.resize(trace.len(), reserved);
        self.report.allocated_curve.resize(trace.len(), allocated);
        Ok(())
    }

    fn out_of_memory(&mut self, event: usize, e: &TraceEntry, recorded: bool) {
        self.report.oom_events.push(event);
        if self.report.oom.is_none() {
            let stats = self.alloc.stats();
            self.report.oom = Some(OomAt {
                event,
                requested: e.size,
                stream: e.stream,
                recorded,
                reserved_bytes: stats.reserved_bytes(),
                allocated_bytes: stats.allocated_bytes(),
            });
        }
        self.report.fragmentation_bytes = self.fragmentation_at_peak;
    }

    fn error(&self, event: usize, source: AllocError) -> SimulateError {
        SimulateError::Allocator {
            device: self.device,
            event,
            source,
        }
    }
}

/// Length of the longest common subsequence (positional when the step is huge).
fn common_subsequence<T: PartialEq>(a: &[T], b: &[T]) -> u64 {
    if a.len().saturating_mul(b.len()) > 4_000_000 {
        return a.iter().zip(b).filter(|(x, y)| x == y).count() as u64;
    }
    let mut prev = vec![0u32; b.len() + 1];
    let mut cur = vec![0u32; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y {
                prev[j] + 1
            } else {
                cur[j].max(prev[j + 1])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    u64::from(prev[b.len()])
}
