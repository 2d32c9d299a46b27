//! The stacked "active memory" layout: one band per allocation, stacked in allocation order,
//! each moving down when something below it is freed; allocations below a size threshold fold
//! into one residual band on top, so the stack's total is the curve's value whatever the
//! threshold.
//!
//! **Level of detail.** A layout is computed for a range and a pixel width. The range is cut
//! into `width_px` columns; each column is sampled at one event (the event at its left edge),
//! and the layout is exact at those samples: bands never overlap and drawn bands plus the
//! residual equal the curve there. Between samples a band keeps its position, so a band
//! steps at most once per column. At most `max_bands` bands are drawn (the largest ones live
//! at some sample); everything else is residual. Each column also carries the min and max of
//! the curve over all events it covers, so short spikes stay visible as an envelope.
//!
//! Cost, after the one-time precomputation ([`crate::DeviceTimeline::build_for_drawing`]):
//! O(m + w + b log b + b × w) for `w` columns, `b` drawn bands and `m` allocations of at
//! least `min_size`. The selection walks those largest first, rejecting the ones outside the
//! range in O(1) on average, until `max_bands` are chosen; the sweep restacks a column only
//! from the lowest band that ended, so `b × w` is its worst case, not its usual one. The
//! trace's length enters only through a binary search per column on the time axis.

use serde::Serialize;

use crate::error::{AnalysisError, Result};
use crate::replay::{AllocId, Lifetime};
use crate::DeviceTimeline;

/// The horizontal axis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Axis {
    /// Trace entry index (PyTorch's viewer uses this).
    #[default]
    Event,
    /// `time_us` (only for traces with times).
    Time,
}

/// What to lay out.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayoutRequest {
    pub axis: Axis,
    /// Range start and end in axis units (events, or microseconds since the epoch).
    pub start: f64,
    pub end: f64,
    /// Number of columns (one per pixel).
    pub width_px: u32,
    /// Allocations smaller than this fold into the residual band.
    pub min_size: u64,
    /// At most this many bands are drawn (the largest).
    pub max_bands: usize,
    pub lifetime: Lifetime,
}

impl LayoutRequest {
    /// The whole trace on the event axis.
    pub fn whole(timeline: &DeviceTimeline, width_px: u32) -> LayoutRequest {
        LayoutRequest {
            axis: Axis::Event,
            start: 0.0,
            end: f64::from(timeline.replay().axis_len()),
            width_px,
            min_size: 0,
            max_bands: 15_000,
            lifetime: Lifetime::Active,
        }
    }
}

/// One column (pixel) of a layout.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Column {
    /// Left and right edge in axis units.
    pub x0: f64,
    pub x1: f64,
    /// The event the column is sampled at.
    pub event: u32,
    /// Bytes of the bands drawn in this column (the residual band's bottom).
    pub drawn_bytes: u64,
    /// The curve at the sample (the residual band's top).
    pub total_bytes: u64,
    /// Min and max of the curve over the events the column covers.
    pub total_min: u64,
    pub total_max: u64,
}

/// Where a band's bottom moves: from column `column` on, its bottom is `bottom`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BandStep {
    pub column: u32,
    /// The column's left edge in axis units.
    pub x: f64,
    pub bottom: u64,
}

/// One allocation's band: a polygon with a flat top at `bottom + size`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Band {
    pub alloc: AllocId,
    pub size: u64,
    /// First and last column (inclusive) where the allocation is live at the sample.
    pub first_column: u32,
    pub last_column: u32,
    /// Left edge of the first column and right edge of the last, in axis units.
    pub x_start: f64,
    pub x_end: f64,
    /// Bottom over columns: `steps[0].column == first_column`; each step holds until the next.
    pub steps: Vec<BandStep>,
}

impl Band {
    /// The band's bottom in column `column` (`None` outside its columns). O(log steps).
    pub fn bottom_at(&self, column: u32) -> Option<u64> {
        if column < self.first_column || column > self.last_column {
            return None;
        }
        let i = self.steps.partition_point(|s| s.column <= column);
        i.checked_sub(1).map(|i| self.steps[i].bottom)
    }
}

/// What is under a point of the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Hit {
    Band(AllocId),
    /// The residual band (allocations below the threshold or beyond `max_bands`).
    Residual {
        column: u32,
    },
}

/// A computed layout.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Layout {
    pub request: LayoutRequest,
    pub columns: Vec<Column>,
    /// Bands in stacking order (bottom first).
    pub bands: Vec<Band>,
    /// Smallest drawn band's size (the effective threshold when `max_bands` cut; else the
    /// requested `min_size`).
    pub drawn_min_size: u64,
    /// Whether `max_bands` cut bands that were above `min_size`.
    pub capped: bool,
    /// Highest `total_max` over the columns (for the y axis).
    pub y_max: u64,
}

impl Layout {
    /// The column containing `x` (axis units). O(log w).
    pub fn column_at(&self, x: f64) -> Option<u32> {
        let i = self.columns.partition_point(|c| c.x1 <= x);
        (i < self.columns.len() && self.columns[i].x0 <= x).then_some(i as u32)
    }

    /// The band of an allocation, if drawn: O(log bands) (bands are in stacking order,
    /// which is [`AllocId`] order).
    pub fn band(&self, alloc: AllocId) -> Option<&Band> {
        self.bands
            .binary_search_by_key(&alloc, |b| b.alloc)
            .ok()
            .map(|i| &self.bands[i])
    }

    /// What is drawn at `(x, bytes)`: O(bands × log steps) (the first band holding it, bottom
    /// first).
    pub fn hit_test(&self, x: f64, bytes: u64) -> Option<Hit> {
        let column = self.column_at(x)?;
        for band in &self.bands {
            if let Some(bottom) = band.bottom_at(column) {
                if bottom <= bytes && bytes < bottom.saturating_add(band.size) {
                    return Some(Hit::Band(band.alloc));
                }
            }
        }
        let c = &self.columns[column as usize];
        (c.drawn_bytes <= bytes && bytes < c.total_bytes).then_some(Hit::Residual { column })
    }
}

pub(crate) fn compute(timeline: &DeviceTimeline, req: &LayoutRequest) -> Result<Layout> {
    let invalid = |what: &str| AnalysisError::InvalidRequest { what: what.into() };
    if req.width_px == 0 || req.width_px > 1 << 20 {
        return Err(invalid("width_px must be between 1 and 2^20"));
    }
    if !(req.start.is_finite() && req.end.is_finite() && req.start < req.end) {
        return Err(invalid("the range must be finite with start < end"));
    }
    let replay = timeline.replay();
    let axis_len = replay.axis_len();
    let last_event = axis_len - 1;
    let width = req.width_px as usize;

    // Column edges in axis units and the event each column samples.
    let edge = |c: usize| req.start + (req.end - req.start) * c as f64 / width as f64;
    let to_event = |x: f64| -> Result<f64> {
        match req.axis {
            Axis::Event => Ok(x),
            Axis::Time => timeline
                .time()
                .event_at(x)
                .ok_or_else(|| invalid("the time axis needs a trace with time_us")),
        }
    };
    let mut event_edges = Vec::with_capacity(width + 1);
    for c in 0..=width {
        event_edges.push(to_event(edge(c))?);
    }
    let clamp_event = |p: f64| (p.floor().max(0.0) as u64).min(u64::from(last_event)) as u32;
    let samples: Vec<u32> = event_edges[..width]
        .iter()
        .map(|&p| clamp_event(p))
        .collect();

    let curve = timeline.curves().for_lifetime(req.lifetime);
    let minmax = timeline.minmax(req.lifetime);
    let mut columns: Vec<Column> = (0..width)
        .map(|c| {
            let s = samples[c];
            let hi = clamp_event(event_edges[c + 1].ceil()).max(s) as usize + 1;
            let (lo_v, hi_v) = minmax
                .query(curve, s as usize, hi)
                .unwrap_or((curve.at(s), curve.at(s)));
            Column {
                x0: edge(c),
                x1: edge(c + 1),
                event: s,
                drawn_bytes: 0,
                total_bytes: curve.at(s),
                total_min: lo_v.min(curve.at(s)),
                total_max: hi_v.max(curve.at(s)),
            }
        })
        .collect();

    // Samples are non-decreasing; an allocation is drawn if live at some sample.
    let probe = SampleProbe::new(&samples);
    let (first_sample, last_sample) = (samples[0], samples[width - 1]);
    // Largest first: the allocations of at least `min_size` are a prefix.
    let by_size = timeline.by_size_desc();
    let big_enough =
        by_size.partition_point(|o| replay.allocations[o.id.0 as usize].size >= req.min_size);
    let mut chosen: Vec<AllocId> = Vec::with_capacity(req.max_bands.min(big_enough));
    let mut capped = false;
    for o in &by_size[..big_enough] {
        let end = o.end(req.lifetime);
        // Cheap rejection of everything outside the range before the per-sample check.
        if o.start > last_sample || end <= first_sample || !probe.any_in(o.start, end) {
            continue;
        }
        if chosen.len() == req.max_bands {
            capped = true;
            break;
        }
        chosen.push(o.id);
    }
    let drawn_min_size = if capped {
        chosen
            .iter()
            .map(|id| replay.allocations[id.0 as usize].size)
            .min()
            .unwrap_or(req.min_size)
    } else {
        req.min_size
    };
    chosen.sort_unstable();

    let mut bands: Vec<Band> = chosen
        .iter()
        .map(|&id| Band {
            alloc: id,
            size: replay.allocations[id.0 as usize].size,
            first_column: 0,
            last_column: 0,
            x_start: 0.0,
            x_end: 0.0,
            steps: Vec::new(),
        })
        .collect();
    let ends: Vec<u32> = chosen
        .iter()
        .map(|id| replay.allocations[id.0 as usize].end(req.lifetime, axis_len))
        .collect();
    let starts: Vec<u32> = chosen
        .iter()
        .map(|id| replay.allocations[id.0 as usize].start())
        .collect();
    let sizes: Vec<u64> = bands.iter().map(|b| b.size).collect();
    // Bands by end, so each column finds the bands that end at it without scanning the
    // live ones.
    // (end << 32 | band): one integer key sorts faster than a pair.
    let mut by_end: Vec<u64> = ends
        .iter()
        .enumerate()
        .map(|(b, &e)| u64::from(e) << 32 | b as u64)
        .collect();
    by_end.sort_unstable();

    // Sweep the columns. `live` holds band indices in stacking order, `base[i]` is the bottom
    // of `live[i]` (and `base[live.len()]` the stack's top), `pos[b]` is band `b`'s index in
    // `live` (`NOT_LIVE` before it starts and after it ends). A column only restacks from
    // the lowest band that ended; the bands below it keep their bottoms. New bands go on top
    // (stacking order is start order).
    const NOT_LIVE: u32 = u32::MAX;
    let mut live: Vec<u32> = Vec::with_capacity(chosen.len());
    let mut base: Vec<u64> = Vec::with_capacity(chosen.len() + 1);
    base.push(0);
    let mut pos: Vec<u32> = vec![NOT_LIVE; chosen.len()];
    let mut next = 0usize;
    let mut next_end = 0usize;
    for (c, &s) in samples.iter().enumerate() {
        let mut lowest = live.len();
        while next_end < by_end.len() && (by_end[next_end] >> 32) as u32 <= s {
            let b = (by_end[next_end] & u64::from(u32::MAX)) as usize;
            next_end += 1;
            // A band that has not started yet ends between samples: it is never live.
            if pos[b] != NOT_LIVE {
                lowest = lowest.min(pos[b] as usize);
                pos[b] = NOT_LIVE;
                bands[b].last_column = c as u32 - 1;
                bands[b].x_end = columns[c - 1].x1;
            }
        }
        while next < chosen.len() && starts[next] <= s {
            if ends[next] > s {
                bands[next].first_column = c as u32;
                bands[next].x_start = columns[c].x0;
                pos[next] = live.len() as u32;
                live.push(next as u32);
            }
            next += 1;
        }
        if lowest < live.len() {
            // Restack from `lowest`, dropping the bands that ended.
            base.resize(live.len() + 1, 0);
            let mut bottom = base[lowest];
            let mut w = lowest;
            for r in lowest..live.len() {
                let b = live[r] as usize;
                if pos[b] == NOT_LIVE {
                    continue;
                }
                live[w] = b as u32;
                pos[b] = w as u32;
                base[w] = bottom;
                if bands[b].steps.last().map(|st| st.bottom) != Some(bottom) {
                    bands[b].steps.push(BandStep {
                        column: c as u32,
                        x: columns[c].x0,
                        bottom,
                    });
                }
                bottom = bottom.saturating_add(sizes[b]);
                w += 1;
            }
            live.truncate(w);
            base.truncate(w + 1);
            base[w] = bottom;
        }
        columns[c].drawn_bytes = base[live.len()];
    }
    for &b in &live {
        bands[b as usize].last_column = (width - 1) as u32;
        bands[b as usize].x_end = columns[width - 1].x1;
    }
    bands.retain(|b| !b.steps.is_empty());
    let y_max = columns.iter().map(|c| c.total_max).max().unwrap_or(0);
    Ok(Layout {
        request: *req,
        columns,
        bands,
        drawn_min_size,
        capped,
        y_max,
    })
}

/// Answers "is some sample in `[start, end)`?" in constant time on average: a table of
/// buckets of equal event width over the sampled range holds, per bucket, the first sample
/// index at or after the bucket's first event; a query scans at most a few samples from
/// there (then falls back to a binary search within the bucket, where many columns sample
/// the same events).
struct SampleProbe<'a> {
    samples: &'a [u32],
    lo: u32,
    /// Events per bucket, as a shift.
    shift: u32,
    /// `first[k]`: the first sample index whose sample is at or after bucket `k`'s start.
    first: Vec<u32>,
}

impl<'a> SampleProbe<'a> {
    fn new(samples: &'a [u32]) -> SampleProbe<'a> {
        let lo = samples[0];
        let span = u64::from(samples[samples.len() - 1] - lo) + 1;
        // About one bucket per sample, a power of two events wide.
        let per = span.div_ceil(samples.len() as u64).max(1);
        let shift = 64 - (per - 1).leading_zeros();
        let buckets = (span >> shift) as usize + 2;
        let mut first = vec![samples.len() as u32; buckets];
        let mut i = 0usize;
        for (k, f) in first.iter_mut().enumerate() {
            let bucket_start = u64::from(lo) + ((k as u64) << shift);
            while i < samples.len() && u64::from(samples[i]) < bucket_start {
                i += 1;
            }
            *f = i as u32;
        }
        SampleProbe {
            samples,
            lo,
            shift,
            first,
        }
    }

    /// The index of the first sample at or after event `e`.
    fn first_at_or_after(&self, e: u32) -> usize {
        if e <= self.lo {
            return 0;
        }
        let k = ((e - self.lo) >> self.shift) as usize;
        if k + 1 >= self.first.len() {
            return self.samples.len();
        }
        let (from, to) = (self.first[k] as usize, self.first[k + 1] as usize);
        // Within bucket `k`: samples from `from` to `to` lie in it.
        for i in from..to.min(from + 4) {
            if self.samples[i] >= e {
                return i;
            }
        }
        if to <= from + 4 {
            return to;
        }
        from + 4 + self.samples[from + 4..to].partition_point(|&s| s < e)
    }

    /// Whether some sample lies in `[start, end)`.
    fn any_in(&self, start: u32, end: u32) -> bool {
        let i = self.first_at_or_after(start);
        i < self.samples.len() && self.samples[i] < end
    }
}
