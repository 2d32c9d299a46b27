//! The live set a profile export shows: one device's allocations live at one instant.
//!
//! [`crate::flamegraph`] and [`crate::pprof`] both start here. [`LiveProfile::select`] picks
//! the device (the one named, else the one whose memory peaks highest), resolves the instant
//! ([`Instant`]: the peak, the end, a trace entry or a time) to a trace entry, and collects the
//! blocks live after it: allocated at or before it and not yet returned to the cache
//! (`free_completed`), as PyTorch's "Active Memory Timeline" counts them and as `memsnap
//! summary` finds the peak. Each block weighs its requested bytes.
//!
//! A snapshot **without a trace** (a segments-only state dump, or a bare
//! `torch.cuda.memory_snapshot()` list) still has a live set: the active blocks of its
//! segments, with their frames when PyTorch recorded them ([`LiveSource::SegmentsOnly`]).
//! Blocks from before a ring buffer's window (freed in it, or live in the final segments) are
//! live from its first entry, as in the viewer.
//!
//! Stacks are shown outermost first after the frame filter the viewer uses
//! ([`memsnap_analysis::sites::is_filtered_frame`]); [`By::Site`] keeps only the allocation's
//! site, the innermost frame of the user's code ([`memsnap_analysis::sites::top_frame`]).

use memsnap_analysis::categories::Category;
use memsnap_analysis::live::{highest_peak_timeline, live_set};
use memsnap_analysis::sites::{is_filtered_frame, top_frame};
use memsnap_analysis::{
    AllocId, Allocation, CurveKind, DeviceTimeline, Instant, Lifetime, StepOptions,
};
use memsnap_format::{FrameId, Snapshot, StackId};

/// How a profile groups the live blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum By {
    /// The whole stack, outermost frame first.
    #[default]
    Stack,
    /// Only the allocation's site: the innermost frame of the user's code.
    Site,
}

/// What to export. Start from `ProfileOptions::default()` (the peak, by stack, every block,
/// the device with the highest peak) and set fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProfileOptions {
    /// When (`--at`): see [`memsnap_analysis::instant`].
    pub at: Instant,
    pub by: By,
    /// Blocks smaller than this are left out (counted in the title and comments).
    pub min_size: u64,
    /// The device to show; `None`: the one whose live bytes peak highest.
    pub device: Option<i64>,
    /// Shown in the flame graph's subtitle and the pprof comments (a file name).
    pub label: Option<String>,
}

/// Where the live set comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiveSource {
    /// The device's trace, replayed up to the instant.
    Trace,
    /// The snapshot has no trace entries for the device: its segments' active blocks.
    SegmentsOnly,
    /// No device has trace entries or segments: nothing is live.
    Empty,
}

/// Why a profile cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The device is not in the snapshot, or its trace is too long to replay.
    #[error(transparent)]
    Analysis(#[from] memsnap_analysis::AnalysisError),
    /// Live bytes no GPU holds (a damaged or hostile file): the flame graph's arithmetic
    /// would overflow.
    #[error("{bytes} live bytes at that instant is beyond any device (at most 2^60 can be drawn): the snapshot's sizes are damaged")]
    Implausible { bytes: u64 },
    /// The SVG writer failed.
    #[error("cannot write the flame graph: {what}")]
    Flamegraph { what: String },
    /// Compressing the pprof file failed.
    #[error("cannot compress the pprof profile: {what}")]
    Compress { what: String },
    /// A pprof file that is not a gzipped (or plain) `profile.proto`.
    #[error("not a pprof profile: {what}")]
    Decode { what: String },
}

/// One device's live set at one instant, ready to render.
#[derive(Debug)]
pub struct LiveProfile<'a> {
    pub(crate) snapshot: &'a Snapshot,
    /// `None` when the snapshot has no device to show ([`LiveSource::Empty`]).
    pub(crate) timeline: Option<DeviceTimeline>,
    pub(crate) options: ProfileOptions,
    /// The device shown.
    pub device: Option<i64>,
    pub source: LiveSource,
    /// The trace entry after which the set is taken (0 without a trace).
    pub event: u32,
    /// Its `time_us`, when the trace has times.
    pub time_us: Option<i64>,
    /// The live blocks of at least `min_size` bytes (see [`memsnap_analysis::live::LiveSet`]).
    pub allocations: Vec<AllocId>,
    /// Their requested bytes: the profile's total.
    pub bytes: u64,
    /// Live blocks left out by `min_size`.
    pub smaller_count: u64,
    pub smaller_bytes: u64,
}

impl<'a> LiveProfile<'a> {
    /// Picks the device and instant and collects the live set (see the module docs).
    pub fn select(
        snapshot: &'a Snapshot,
        options: &ProfileOptions,
    ) -> Result<LiveProfile<'a>, ProfileError> {
        let timeline = match options.device {
            Some(device) => Some(DeviceTimeline::build(snapshot, device)?),
            None => highest_peak_timeline(snapshot)?,
        };
        let mut profile = LiveProfile {
            snapshot,
            timeline: None,
            options: options.clone(),
            device: None,
            source: LiveSource::Empty,
            event: 0,
            time_us: None,
            allocations: Vec::new(),
            bytes: 0,
            smaller_count: 0,
            smaller_bytes: 0,
        };
        let Some(timeline) = timeline else {
            return Ok(profile);
        };
        let device = timeline.device();
        let trace_len = timeline.replay().trace_len;
        let event = timeline.resolve_exact(options.at)?;
        let set = live_set(&timeline, event, Lifetime::Active, options.min_size);
        profile.device = Some(device);
        profile.source = if trace_len == 0 {
            LiveSource::SegmentsOnly
        } else {
            LiveSource::Trace
        };
        profile.event = event;
        profile.time_us = timeline.time().time_of(event);
        profile.allocations = set.allocations;
        profile.bytes = set.bytes;
        profile.smaller_count = set.smaller_count;
        profile.smaller_bytes = set.smaller_bytes;
        profile.timeline = Some(timeline);
        Ok(profile)
    }

    /// The replayed allocations of the shown device (empty for [`LiveSource::Empty`]).
    pub(crate) fn all_allocations(&self) -> &[Allocation] {
        self.timeline
            .as_ref()
            .map_or(&[], |t| t.replay().allocations.as_slice())
    }

    pub(crate) fn allocation(&self, id: AllocId) -> Option<&Allocation> {
        self.timeline.as_ref().and_then(|t| t.replay().get(id))
    }

    /// The category of every replayed allocation (same order), from the device's steps.
    pub(crate) fn categories(&self) -> Vec<Category> {
        self.timeline
            .as_ref()
            .map_or_else(Vec::new, |t| t.steps(&StepOptions::default()).categories)
    }

    /// The first and last `time_us` of the device's trace.
    pub(crate) fn time_span(&self) -> Option<(i64, i64)> {
        self.timeline.as_ref()?.time().span()
    }

    /// Whether the instant is the device's peak (whatever `--at` said).
    pub fn is_peak(&self) -> bool {
        self.timeline
            .as_ref()
            .is_some_and(|t| t.peak(CurveKind::Active).event == self.event)
    }

    /// `at the peak (trace entry 759, t+1.67 s)`, `at the end (...)`, `after trace entry 12
    /// (...)`, `in the snapshot's segments (no trace)`: the instant, for titles.
    pub fn describe_instant(&self) -> String {
        let what = match (self.source, self.options.at) {
            (LiveSource::Empty, _) => return "in the snapshot (no device has memory)".to_string(),
            (LiveSource::SegmentsOnly, _) => {
                return "in the snapshot's segments (no trace: their active blocks)".to_string()
            }
            (_, Instant::Peak) => "at the peak",
            (_, Instant::End) => "at the end",
            (_, Instant::Event(_)) => "after trace entry",
            (_, _) => "at",
        };
        let after_start = match (self.time_us, self.time_span()) {
            (Some(t), Some((first, _))) => Some(format!(
                "t+{}",
                memsnap_units::format_duration_us(t.saturating_sub(first))
            )),
            _ => None,
        };
        match (what, after_start) {
            ("after trace entry", Some(t)) => format!("{what} {} ({t})", self.event),
            ("after trace entry", None) => format!("{what} {}", self.event),
            ("at", Some(t)) => format!("at {t} (trace entry {})", self.event),
            (_, Some(t)) => format!("{what} (trace entry {}, {t})", self.event),
            (_, None) => format!("{what} (trace entry {})", self.event),
        }
    }

    /// What the title does not say: the file, device, grouping and size filter.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(label) = &self.options.label {
            parts.push(label.clone());
        }
        if let Some(device) = self.device {
            parts.push(format!("device {device}"));
        }
        parts.push(match self.options.by {
            By::Stack => "by stack".to_string(),
            By::Site => "by site".to_string(),
        });
        if self.options.min_size > 0 {
            parts.push(format!(
                "blocks of at least {} ({} in {} smaller ones left out)",
                memsnap_units::format_size(self.options.min_size),
                memsnap_units::format_size(self.smaller_bytes),
                self.smaller_count
            ));
        }
        parts.join(" · ")
    }

    /// The frames an allocation is shown with, outermost first (empty: no frames).
    pub(crate) fn frames_of(&self, allocation: &Allocation) -> Vec<FrameId> {
        let Some(stack) = valid_stack(self.snapshot, allocation.stack) else {
            return Vec::new();
        };
        match self.options.by {
            By::Site => top_frame(self.snapshot, stack).into_iter().collect(),
            By::Stack => self
                .snapshot
                .stacks
                .get(stack)
                .iter()
                .rev()
                .copied()
                .filter(|&f| {
                    f.index() < self.snapshot.frames.len()
                        && !is_filtered_frame(self.snapshot.frames.get(f))
                })
                .collect(),
        }
    }

    /// What a block without frames is shown as (`memsnap top`'s labels).
    pub(crate) fn no_frames_label(&self, allocation: &Allocation) -> &'static str {
        if allocation.before_window() && self.source == LiveSource::Trace {
            "<allocated before the recording (no stack)>"
        } else {
            "<no frames>"
        }
    }
}

fn valid_stack(snapshot: &Snapshot, stack: Option<StackId>) -> Option<StackId> {
    stack.filter(|s| s.index() < snapshot.stacks.len())
}

/// A frame as `file:line:function` (the basename; native frames without a source file show
/// the symbol without its argument list), the label `memsnap top` and the viewer use.
pub(crate) fn frame_label(snapshot: &Snapshot, frame: FrameId) -> String {
    memsnap_analysis::SiteKey::Frame(frame).label(snapshot)
}
