//! [`DeviceTimeline`]: everything derived from one device's history, computed once.

use std::sync::OnceLock;

use foldhash::{HashMap, HashSet};

use memsnap_format::Snapshot;
use serde::Serialize;

use crate::curve::{Curve, CurveKind, CurveMinMax, Curves, TimeAxis};
use crate::error::{AnalysisError, Result};
use crate::instant::Instant;
use crate::join;
use crate::layout::{Layout, LayoutRequest};
use crate::ranges::{named_ranges, NamedRange};
use crate::replay::{AllocId, Lifetime, Replay};
use crate::sites::{GroupBy, ModulePaths, SiteKey, SiteKeyer};
use crate::steps::{find_steps, StackEvidence, StepAnalysis, StepOptions};

/// The highest point of a curve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Peak {
    pub bytes: u64,
    /// The first event reaching it (0 when the trace is empty or the peak is the state
    /// before the first event).
    pub event: u32,
    pub time_us: Option<i64>,
}

/// Allocations sharing a site, live at one instant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveGroup {
    pub key: SiteKey,
    pub bytes: u64,
    pub count: u64,
    pub largest: u64,
    /// Alloc event of the oldest member (`None` if one predates the window).
    pub first_alloc_event: Option<u32>,
    /// The members, largest first.
    pub allocations: Vec<AllocId>,
}

/// One site over the whole run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteStats {
    pub key: SiteKey,
    /// Bytes of the site live at the peak.
    pub bytes_at_peak: u64,
    pub count_at_peak: u64,
    /// Bytes of every allocation from this site (traced or from before the window).
    pub total_bytes: u64,
    pub count: u64,
}

/// Usage of one segment at an instant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SegmentUsage {
    pub addr: u64,
    /// Reserved bytes.
    pub size: u64,
    pub stream: i64,
    /// Requested bytes of the allocations live in it.
    pub allocated_bytes: u64,
    /// Those allocations' block sizes (requests rounded up to 512 bytes, the allocator's
    /// minimum granularity; larger roundings are not known from the trace).
    pub block_bytes: u64,
    pub allocations: u64,
    /// `size - block_bytes`.
    pub free_bytes: u64,
    /// The largest gap between blocks (including before the first and after the last).
    pub largest_free_block: u64,
}

/// An allocation's extents, in [`DeviceTimeline::by_size_desc`] order (16 bytes: one per
/// allocation; the size is the allocation's). Aligned as the `(u64, u32)` pairs it is made
/// from, so collecting them in place keeps the pairs' allocation (with another alignment
/// `std` moves the result to a new one, a copy of 53 MB at 10M entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[repr(align(8))]
pub struct SizeOrdered {
    pub id: AllocId,
    pub start: u32,
    pub end_allocated: u32,
    pub end_active: u32,
}

/// Distinct sizes up to which [`DrawingIndex::by_size_desc`] counts rather than sorts (a map
/// of this many stays in a core's cache; small in the unit tests, so that they take both ways).
const COUNTED_SIZES: usize = if cfg!(test) { 4 } else { 1 << 14 };

impl SizeOrdered {
    pub fn end(&self, lifetime: Lifetime) -> u32 {
        match lifetime {
            Lifetime::Allocated => self.end_allocated,
            Lifetime::Active => self.end_active,
        }
    }
}

/// Everything derived from one device's history, computed once (O(n log n) in the trace
/// length) and then queried. `Send + Sync`: build it on a worker thread.
///
/// Costs below: `n` the device's trace entries, `m` its allocations, `k` those live at the
/// instant asked about, `s` segments, `a` annotations. The first query at [`Instant::Peak`]
/// adds the O(n) of finding the peak ([`DeviceTimeline::peak`]).
#[derive(Clone, Debug)]
pub struct DeviceTimeline {
    replay: Replay,
    curves: Curves,
    time: TimeAxis,
    ranges: Vec<NamedRange>,
    evidence: StackEvidence,
    /// Built on first use: only drawing (the layout, curve envelopes) needs it, and a
    /// summary is done sooner without.
    drawing: OnceLock<DrawingIndex>,
    /// Made on first use ([`DeviceTimeline::module_paths`]).
    module_paths: OnceLock<ModulePaths>,
    /// Each curve's highest point ([`DeviceTimeline::peak`]), found on first use: finding it
    /// is O(n), and a window asks for the peaks every frame (the device summary: 3 scans of
    /// 10M values took 8–12 % of a frame's time).
    peaks: [OnceLock<Peak>; 3],
}

/// The indexes the layout and the curve envelopes query.
#[derive(Clone, Debug)]
struct DrawingIndex {
    /// Allocations by size, largest first (ties in stacking order), with their extents
    /// inline so the layout scans them sequentially instead of jumping through `allocations`.
    by_size_desc: Vec<SizeOrdered>,
    allocated_minmax: CurveMinMax,
    active_minmax: CurveMinMax,
    reserved_minmax: CurveMinMax,
}

impl DrawingIndex {
    fn build(replay: &Replay, curves: &Curves) -> DrawingIndex {
        Self::with_minmax(Self::by_size_desc(replay), curves)
    }

    /// Allocations by size, largest first, ties in stacking order (`id` ascending), as a
    /// stable sort by size would leave them.
    ///
    /// A run has few distinct sizes (a model allocates the same tensors every step): each
    /// size's place in the order is counted, and the allocations are put there in one pass in
    /// stacking order, which keeps the ties in order (O(n) with a map of the sizes that stays
    /// in cache). Past [`COUNTED_SIZES`] distinct sizes the pairs are sorted instead
    /// (O(n log n)). Counting was 4-5x faster than the sort on one giant step (4M
    /// allocations, 0.5 s of its way to the first picture).
    fn by_size_desc(replay: &Replay) -> Vec<SizeOrdered> {
        Self::by_size_desc_counted(replay, COUNTED_SIZES)
            .unwrap_or_else(|| Self::by_size_desc_sorted(replay))
    }

    /// [`Self::by_size_desc`] by counting, `None` past `max_sizes` distinct sizes.
    fn by_size_desc_counted(replay: &Replay, max_sizes: usize) -> Option<Vec<SizeOrdered>> {
        let axis = replay.axis_len();
        let mut place: HashMap<u64, usize> = HashMap::default();
        for a in &replay.allocations {
            *place.entry(a.size).or_insert(0) += 1;
            if place.len() > max_sizes {
                return None;
            }
        }
        let mut sizes: Vec<(u64, usize)> = place.iter().map(|(&s, &n)| (s, n)).collect();
        sizes.sort_unstable_by_key(|&(size, _)| std::cmp::Reverse(size));
        let mut at = 0;
        for (size, count) in sizes {
            place.insert(size, at);
            at += count;
        }
        let unset = SizeOrdered {
            id: AllocId(0),
            start: 0,
            end_allocated: 0,
            end_active: 0,
        };
        let mut order = vec![unset; replay.allocations.len()];
        for (id, a) in replay.allocations.iter().enumerate() {
            // Every size was counted above.
            let next = place.get_mut(&a.size)?;
            order[*next] = SizeOrdered {
                id: AllocId(id as u32),
                start: a.start(),
                end_allocated: a.end(Lifetime::Allocated, axis),
                end_active: a.end(Lifetime::Active, axis),
            };
            *next += 1;
        }
        Some(order)
    }

    /// [`Self::by_size_desc`] by sorting: (size, id) pairs are sorted, then turned in place
    /// into the extents (without a stable sort's scratch copy, and faster).
    fn by_size_desc_sorted(replay: &Replay) -> Vec<SizeOrdered> {
        let axis = replay.axis_len();
        let mut order: Vec<(u64, u32)> = replay
            .allocations
            .iter()
            .enumerate()
            .map(|(i, a)| (a.size, i as u32))
            .collect();
        order.sort_unstable_by_key(|&(size, id)| (std::cmp::Reverse(size), id));
        // Both 16 bytes: collected in the sorted vector's memory, no second vector.
        order
            .into_iter()
            .map(|(_, id)| {
                let a = &replay.allocations[id as usize];
                SizeOrdered {
                    id: AllocId(id),
                    start: a.start(),
                    end_allocated: a.end(Lifetime::Allocated, axis),
                    end_active: a.end(Lifetime::Active, axis),
                }
            })
            .collect()
    }

    fn with_minmax(by_size_desc: Vec<SizeOrdered>, curves: &Curves) -> DrawingIndex {
        let (allocated_minmax, (active_minmax, reserved_minmax)) = std::thread::scope(|scope| {
            let allocated = scope.spawn(|| CurveMinMax::build(&curves.allocated));
            let rest = (
                CurveMinMax::build(&curves.active),
                CurveMinMax::build(&curves.reserved),
            );
            (join(allocated), rest)
        });
        DrawingIndex {
            by_size_desc,
            allocated_minmax,
            active_minmax,
            reserved_minmax,
        }
    }
}

impl DeviceTimeline {
    /// Replays `device` and precomputes curves, the time axis and named ranges (the indexes
    /// the layout uses follow on first use).
    ///
    /// O(n + s log s + a log a), plus each of the file's stacks classified once for the
    /// stack evidence (see [`Replay::build`]: the snapshot's segments of every device are
    /// read to find this device's).
    pub fn build(snapshot: &Snapshot, device: i64) -> Result<DeviceTimeline> {
        Self::build_inner(snapshot, device, false)
    }

    /// [`DeviceTimeline::build`] with the drawing indexes built too, each part on its own
    /// thread as soon as what it reads is there (the allocations' size order, the largest
    /// part after the curves, only needs the replay): what a viewer calls before its first
    /// picture. [`DeviceTimeline::build`] plus the size order, O(m log m).
    pub fn build_for_drawing(snapshot: &Snapshot, device: i64) -> Result<DeviceTimeline> {
        Self::build_inner(snapshot, device, true)
    }

    /// [`DeviceTimeline::build`] for a caller done with the parts of the snapshot it reads
    /// (`memsnap summary`): the device's trace entries are dropped once the replay and the
    /// time axis have read them, and the annotations (when `annotations_too`: no device
    /// built later needs them) once the named ranges are made, so neither is held beside
    /// the curves, and the annotations not beside the replay; nor the time axis, which is
    /// built for the named ranges and again after the replay. The parts are built one after
    /// the other (the curves after the entries are gone), not side by side. The same
    /// timeline as [`DeviceTimeline::build`], O(n log n) as it.
    pub fn build_releasing(
        snapshot: &mut Snapshot,
        device: i64,
        annotations_too: bool,
    ) -> Result<DeviceTimeline> {
        // The time axis places the annotations' ranges, then goes while the replay is built
        // and is built again after it: one giant step's replay (4M allocations live at once)
        // is the summary's peak, and 40 MB of it was this axis at 10M events.
        let ranges = named_ranges(snapshot, device, &TimeAxis::build(snapshot, device));
        if annotations_too {
            snapshot.external_annotations = None;
        }
        let replay = Replay::build(snapshot, device)?;
        let time = TimeAxis::build(snapshot, device);
        let (evidence, python_only) = crate::phases::allocation_evidence(snapshot, &replay);
        let trace = usize::try_from(device)
            .ok()
            .and_then(|d| snapshot.device_traces.as_mut()?.get_mut(d));
        if let Some(trace) = trace {
            *trace = Vec::new();
        }
        let curves = Curves::build(&replay);
        Ok(DeviceTimeline {
            replay,
            curves,
            time,
            ranges,
            evidence: StackEvidence {
                evidence,
                python_only,
            },
            drawing: OnceLock::new(),
            module_paths: OnceLock::new(),
            peaks: Default::default(),
        })
    }

    fn build_inner(snapshot: &Snapshot, device: i64, drawing: bool) -> Result<DeviceTimeline> {
        // The time axis and the named ranges read the entries' times and the annotations,
        // not the replay: built beside it (a run of 1.2M annotations spends a fifth of its
        // path to the picture pairing them). The curves, the size order and the stack
        // evidence read the replay: built side by side after it.
        let (replay, (time, ranges)) = std::thread::scope(|scope| {
            let time_and_ranges = scope.spawn(|| {
                let time = TimeAxis::build(snapshot, device);
                let ranges = named_ranges(snapshot, device, &time);
                (time, ranges)
            });
            (Replay::build(snapshot, device), join(time_and_ranges))
        });
        let replay = replay?;
        let (curves, by_size, (evidence, python_only)) = std::thread::scope(|scope| {
            let curves = scope.spawn(|| Curves::build(&replay));
            let by_size = drawing.then(|| scope.spawn(|| DrawingIndex::by_size_desc(&replay)));
            let evidence = crate::phases::allocation_evidence(snapshot, &replay);
            (join(curves), by_size.map(join), evidence)
        });
        let drawing = match by_size {
            Some(by_size) => OnceLock::from(DrawingIndex::with_minmax(by_size, &curves)),
            None => OnceLock::new(),
        };
        Ok(DeviceTimeline {
            replay,
            curves,
            time,
            ranges,
            evidence: StackEvidence {
                evidence,
                python_only,
            },
            drawing,
            module_paths: OnceLock::new(),
            peaks: Default::default(),
        })
    }

    fn drawing(&self) -> &DrawingIndex {
        self.drawing
            .get_or_init(|| DrawingIndex::build(&self.replay, &self.curves))
    }

    /// The device a view opens on when none is named, as PyTorch's viewer does: the one with
    /// the longest trace (the lowest on a tie), else the lowest device with segments; `None`
    /// for an empty snapshot. `memsnap plot` and the viewer use it (`memsnap top` and the
    /// profile exports show the highest peak instead: [`crate::live::highest_peak_timeline`]).
    /// O(d + s).
    pub fn default_device(snapshot: &Snapshot) -> Option<i64> {
        let longest = snapshot
            .traces()
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .max_by_key(|(i, t)| (t.len(), std::cmp::Reverse(*i)))
            .map(|(i, _)| i as i64);
        longest.or_else(|| snapshot.segments.iter().map(|s| s.device).min())
    }

    /// Devices worth showing: those with trace entries or segments, ascending.
    ///
    /// O(d log d + s) in the devices and segments (a scan of the segments per device was
    /// O(d × s): a file can name a device per segment, or list thousands of empty traces).
    pub fn devices(snapshot: &Snapshot) -> Vec<i64> {
        let with_segments: HashSet<i64> = snapshot.segments.iter().map(|s| s.device).collect();
        snapshot
            .devices()
            .into_iter()
            .filter(|&d| {
                let traced = usize::try_from(d)
                    .ok()
                    .and_then(|i| snapshot.traces().get(i))
                    .is_some_and(|t| !t.is_empty());
                traced || with_segments.contains(&d)
            })
            .collect()
    }

    pub fn device(&self) -> i64 {
        self.replay.device
    }

    pub fn replay(&self) -> &Replay {
        &self.replay
    }

    pub fn curves(&self) -> &Curves {
        &self.curves
    }

    /// The curves the source records, for views that list counters: an import whose source
    /// does not know allocated bytes (a rocprofv3 trace: driver allocations only) or reserved
    /// bytes (`export_memory_timeline` data) leaves that curve out rather than showing a zero
    /// or a copy of another. O(1).
    pub fn known_curves(&self) -> impl Iterator<Item = (CurveKind, &Curve)> {
        let replay = &self.replay;
        CurveKind::ALL.into_iter().filter_map(move |kind| {
            let known = match kind {
                CurveKind::Allocated | CurveKind::Active => replay.allocated_known,
                CurveKind::Reserved => replay.reserved_known(),
            };
            known.then(|| (kind, self.curves.get(kind)))
        })
    }

    pub fn time(&self) -> &TimeAxis {
        &self.time
    }

    /// Each allocation's `memsnap.module: PATH` range ([`ModulePaths`]), made once, on first
    /// use: O(n + r log r).
    pub fn module_paths(&self) -> &ModulePaths {
        self.module_paths
            .get_or_init(|| ModulePaths::build(&self.ranges, &self.replay))
    }

    /// `record_function` ranges of this device.
    pub fn named_ranges(&self) -> &[NamedRange] {
        &self.ranges
    }

    /// Allocations by size, largest first (built on first use, or up front by
    /// [`DeviceTimeline::build_for_drawing`]).
    pub fn by_size_desc(&self) -> &[SizeOrdered] {
        &self.drawing().by_size_desc
    }

    pub(crate) fn minmax(&self, lifetime: Lifetime) -> &CurveMinMax {
        let drawing = self.drawing();
        match lifetime {
            Lifetime::Allocated => &drawing.allocated_minmax,
            Lifetime::Active => &drawing.active_minmax,
        }
    }

    /// The peak of a curve: O(n) the first time (O(changes) for the reserved curve), O(1)
    /// after.
    pub fn peak(&self, kind: CurveKind) -> Peak {
        let slot = match kind {
            CurveKind::Allocated => &self.peaks[0],
            CurveKind::Active => &self.peaks[1],
            CurveKind::Reserved => &self.peaks[2],
        };
        *slot.get_or_init(|| {
            let (bytes, event) = self.curves.get(kind).max();
            let event = event.unwrap_or(0);
            Peak {
                bytes,
                event,
                time_us: self.time.time_of(event),
            }
        })
    }

    /// The event an instant refers to, clamped to the trace: an event past the end is the
    /// last, a time before the first event (or any time in a trace without times) the first.
    /// O(log n), O(n) for the first [`Instant::Peak`].
    pub fn resolve(&self, at: Instant) -> u32 {
        let last = self.replay.axis_len() - 1;
        let at_time = |t: i64| self.time.last_event_at_or_before(t).unwrap_or(0).min(last);
        match at {
            Instant::Event(e) => e.min(last),
            Instant::Peak => self.peak(CurveKind::Active).event,
            Instant::End => last,
            Instant::TimeUs(t) => at_time(t),
            Instant::AfterStartUs(dt) => {
                at_time(self.time.time_of(0).unwrap_or(0).saturating_add(dt))
            }
        }
    }

    /// The event an instant refers to, or why this trace cannot answer it: an event past
    /// its end, a time before its first entry, a time asked of entries without `time_us`
    /// (what `--at` reports). O(log n), O(n) for the first [`Instant::Peak`].
    pub fn resolve_exact(&self, at: Instant) -> Result<u32> {
        let device = self.replay.device;
        let last = self.replay.axis_len() - 1;
        let first_time = || {
            self.time
                .time_of(0)
                .ok_or(AnalysisError::NoTimes { device })
        };
        let at_time = |time_us: i64| -> Result<u32> {
            let first = first_time()?;
            self.time
                .last_event_at_or_before(time_us)
                .ok_or(AnalysisError::BeforeFirstEntry {
                    time_us,
                    device,
                    first,
                })
        };
        match at {
            Instant::Peak => Ok(self.peak(CurveKind::Active).event),
            Instant::End => Ok(last),
            Instant::Event(event) if event <= last => Ok(event),
            Instant::Event(event) => Err(AnalysisError::EventPastEnd {
                event,
                device,
                len: self.replay.trace_len,
            }),
            Instant::TimeUs(t) => at_time(t),
            Instant::AfterStartUs(dt) => at_time(first_time()?.saturating_add(dt)),
        }
    }

    /// Allocations live at an instant, in stacking order. O(m) (the allocations started by
    /// then, found by binary search, each checked once).
    pub fn live_at(&self, at: Instant, lifetime: Lifetime) -> Vec<AllocId> {
        self.replay.live_at(self.resolve(at), lifetime)
    }

    /// The live set at an instant grouped by site, biggest group first. Allocations smaller
    /// than `min_size` are left out.
    ///
    /// O(m + k log k): the live set, one hash lookup per member (each stack's site found
    /// once), the members sorted within their groups and the groups sorted.
    pub fn live_groups(
        &self,
        snapshot: &Snapshot,
        at: Instant,
        lifetime: Lifetime,
        by: GroupBy,
        min_size: u64,
    ) -> Vec<LiveGroup> {
        let mut keyer = SiteKeyer::new(snapshot, by);
        let mut groups: HashMap<SiteKey, LiveGroup> = HashMap::default();
        for id in self.live_at(at, lifetime) {
            let a = &self.replay.allocations[id.0 as usize];
            if a.size < min_size {
                continue;
            }
            let key = keyer.key_of(a);
            let g = groups.entry(key.clone()).or_insert_with(|| LiveGroup {
                key,
                bytes: 0,
                count: 0,
                largest: 0,
                first_alloc_event: a.alloc_event(),
                allocations: Vec::new(),
            });
            g.bytes = g.bytes.saturating_add(a.size);
            g.count += 1;
            g.largest = g.largest.max(a.size);
            g.first_alloc_event = match (g.first_alloc_event, a.alloc_event()) {
                (Some(x), Some(y)) => Some(x.min(y)),
                _ => None,
            };
            g.allocations.push(id);
        }
        let mut out: Vec<LiveGroup> = groups.into_values().collect();
        for g in &mut out {
            g.allocations
                .sort_by_key(|id| std::cmp::Reverse(self.replay.allocations[id.0 as usize].size));
        }
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
        out
    }

    /// Allocation sites over the run, by bytes live at the peak (of the active curve), then
    /// by total bytes allocated.
    ///
    /// By [`GroupBy::Module`], an allocation made inside a `memsnap.module: PATH` range is
    /// grouped under that path ([`SiteKey::ModulePath`], see [`crate::sites::ModulePaths`]),
    /// the others by their stack's chain.
    ///
    /// O(n + m + g log g) for `g` sites: one hash lookup per allocation (each stack's site
    /// found once), then the sites sorted; by module, plus one sweep over the ranges.
    pub fn top_sites(&self, snapshot: &Snapshot, by: GroupBy) -> Vec<SiteStats> {
        let peak = self.peak(CurveKind::Active).event;
        let axis = self.replay.axis_len();
        let mut keyer = SiteKeyer::new(snapshot, by);
        // By module, the module ranges a run recorded name the module before the stack does.
        let named = (by == GroupBy::Module).then(|| self.module_paths());
        let mut sites: HashMap<SiteKey, SiteStats> = HashMap::default();
        for (i, a) in self.replay.allocations.iter().enumerate() {
            let key = match named.and_then(|n| n.of(i)) {
                Some(path) => SiteKey::ModulePath(path.to_owned()),
                None => keyer.key_of(a),
            };
            let s = sites.entry(key.clone()).or_insert_with(|| SiteStats {
                key,
                bytes_at_peak: 0,
                count_at_peak: 0,
                total_bytes: 0,
                count: 0,
            });
            s.total_bytes = s.total_bytes.saturating_add(a.size);
            s.count += 1;
            if a.is_live_at(peak, Lifetime::Active, axis) {
                s.bytes_at_peak = s.bytes_at_peak.saturating_add(a.size);
                s.count_at_peak += 1;
            }
        }
        let mut out: Vec<SiteStats> = sites.into_values().collect();
        out.sort_by(|a, b| {
            (b.bytes_at_peak, b.total_bytes)
                .cmp(&(a.bytes_at_peak, a.total_bytes))
                .then_with(|| a.key.cmp(&b.key))
        });
        out
    }

    /// Bytes live at every event from allocations smaller than `min_size`: the residual band
    /// of the size filter. The live allocations of at least `min_size` plus this curve equal
    /// the lifetime's curve at every event. O(n + m).
    pub fn residual_curve(&self, min_size: u64, lifetime: Lifetime) -> crate::curve::Curve {
        let small = self.replay.allocations.iter().filter(|a| a.size < min_size);
        crate::curve::allocation_curve(small, self.replay.trace_len as usize, lifetime)
    }

    /// Segment usage at an instant (segments reserved then, by address).
    ///
    /// O(m + s log s + k log k): each live allocation's segment found by binary search, each
    /// segment's blocks sorted once.
    pub fn fragmentation(&self, at: Instant) -> Vec<SegmentUsage> {
        let e = self.resolve(at);
        let axis = self.replay.axis_len();
        let mut segs: Vec<SegmentUsage> = self
            .replay
            .segments
            .iter()
            .filter(|s| s.start() <= e && e < s.end(axis))
            .map(|s| SegmentUsage {
                addr: s.addr,
                size: s.size,
                stream: s.stream,
                allocated_bytes: 0,
                block_bytes: 0,
                allocations: 0,
                free_bytes: 0,
                largest_free_block: 0,
            })
            .collect();
        segs.sort_by_key(|s| s.addr);
        let mut blocks: Vec<Vec<(u64, u64)>> = vec![Vec::new(); segs.len()];
        for id in self.replay.live_at(e, Lifetime::Active) {
            let a = &self.replay.allocations[id.0 as usize];
            let i = segs.partition_point(|s| s.addr <= a.addr);
            if i == 0 || a.addr >= segs[i - 1].addr.saturating_add(segs[i - 1].size) {
                continue;
            }
            let block = a.size.max(1).div_ceil(512).saturating_mul(512);
            let seg = &mut segs[i - 1];
            seg.allocated_bytes = seg.allocated_bytes.saturating_add(a.size);
            seg.block_bytes = seg.block_bytes.saturating_add(block);
            seg.allocations += 1;
            blocks[i - 1].push((a.addr, block));
        }
        for (seg, mut blocks) in segs.iter_mut().zip(blocks) {
            blocks.sort_unstable();
            let mut cursor = seg.addr;
            let mut largest = 0u64;
            for (addr, len) in blocks {
                largest = largest.max(addr.saturating_sub(cursor));
                cursor = cursor.max(addr.saturating_add(len));
            }
            let end = seg.addr.saturating_add(seg.size);
            largest = largest.max(end.saturating_sub(cursor));
            seg.largest_free_block = largest;
            seg.free_bytes = seg.size.saturating_sub(seg.block_bytes);
        }
        segs
    }

    /// Training steps, their phases, the allocations' categories and drift, on the active
    /// curve (see [`find_steps`] for the cost).
    pub fn steps(&self, options: &StepOptions) -> StepAnalysis {
        find_steps(
            &self.curves.active,
            &self.time,
            &self.ranges,
            &self.replay,
            &self.evidence,
            options,
        )
    }

    /// What each allocation's stack says about the phase that made it (computed by
    /// [`DeviceTimeline::build`]).
    pub fn evidence(&self) -> &StackEvidence {
        &self.evidence
    }

    /// The stacked layout of a range at a pixel width (see [`crate::layout`] for the cost).
    pub fn layout(&self, request: &LayoutRequest) -> Result<Layout> {
        crate::layout::compute(self, request)
    }

    /// Min and max of a curve in each of `columns` equal slices of the event range
    /// `[start, end)` (for drawing curves at any zoom).
    ///
    /// O(columns) queries, each answered from the range min/max table in O(1) plus a scan of
    /// at most two partial 256-event blocks at its ends (a binary search for a curve kept as
    /// changes).
    pub fn curve_envelope(
        &self,
        kind: CurveKind,
        start: u32,
        end: u32,
        columns: u32,
    ) -> Result<Vec<(u64, u64)>> {
        if columns == 0 || start >= end {
            return Err(AnalysisError::InvalidRequest {
                what: "curve_envelope needs columns > 0 and start < end".into(),
            });
        }
        let curve = self.curves.get(kind);
        let drawing = self.drawing();
        let minmax = match kind {
            CurveKind::Allocated => &drawing.allocated_minmax,
            CurveKind::Active => &drawing.active_minmax,
            CurveKind::Reserved => &drawing.reserved_minmax,
        };
        let span = f64::from(end - start);
        Ok((0..columns)
            .map(|c| {
                let lo = start as usize + (span * f64::from(c) / f64::from(columns)) as usize;
                let hi = (start as usize + (span * f64::from(c + 1) / f64::from(columns)) as usize)
                    .max(lo + 1);
                // Past the trace's end the curve keeps its last value.
                minmax.query(curve, lo, hi).unwrap_or_else(|| {
                    let v = curve.at(lo as u32);
                    (v, v)
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size order keeps one entry per allocation (3.3M at 10M entries): 24 bytes with the
    /// size inline, 16 without.
    #[test]
    fn size_order_entry_takes_16_bytes() {
        assert_eq!(std::mem::size_of::<SizeOrdered>(), 16);
        assert_eq!(
            std::mem::align_of::<SizeOrdered>(),
            std::mem::align_of::<(u64, u32)>()
        );
    }

    proptest::proptest! {
        /// Few sizes or many, allocations freed or not: counting each size's place gives the
        /// order the sort gives (largest first, ties in stacking order).
        #[test]
        fn the_size_order_counted_equals_the_size_order_sorted(
            events in proptest::collection::vec((0u8..3, 0u64..64, 1u64..12), 0..300),
        ) {
            let trace = events
                .iter()
                .map(|&(action, addr, size)| {
                    let action = match action {
                        0 | 1 => memsnap_format::Action::Alloc,
                        _ => memsnap_format::Action::FreeCompleted,
                    };
                    memsnap_format::TraceEntry::new(action, addr * 512, size, 0)
                })
                .collect();
            let mut snapshot = Snapshot::new(1);
            snapshot.device_traces = Some(vec![trace]);
            let replay = Replay::build(&snapshot, 0).expect("replay");
            let sorted = DrawingIndex::by_size_desc_sorted(&replay);
            let counted = DrawingIndex::by_size_desc_counted(&replay, usize::MAX);
            proptest::prop_assert_eq!(counted.as_ref(), Some(&sorted));
            // Past the bound it declines, and the order is the sorted one all the same.
            let distinct: HashSet<u64> = replay.allocations.iter().map(|a| a.size).collect();
            if distinct.len() > COUNTED_SIZES {
                proptest::prop_assert!(DrawingIndex::by_size_desc_counted(&replay, COUNTED_SIZES).is_none());
            }
            proptest::prop_assert_eq!(DrawingIndex::by_size_desc(&replay), sorted);
        }
    }
}
