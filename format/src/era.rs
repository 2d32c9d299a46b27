//! Which PyTorch release wrote a snapshot, from the keys it has and lacks.
//!
//! PyTorch has added keys release by release (§1.9 of the format spec): `time_us` in 2.2,
//! `allocator_settings` in 2.3, `external_annotations` in 2.5, `compile_context` in 2.8, ...
//! A key that is present gives a lowest version, a key that is absent (where every entry
//! would have it) a highest one. [`Era::infer`] gives that range and the keys behind it; a
//! file whose keys no single release writes is "mixed".

use crate::model::{Action, Shape, Snapshot, TraceEntry};

/// The PyTorch versions (minor numbers of 2.x) whose snapshots have the keys this one has.
pub struct Era {
    /// Lowest minor version (2.x) with every key present, and the key that says so.
    pub low: (u32, &'static str),
    /// Highest minor version that writes none of the keys absent here, and the missing key.
    pub high: (u32, &'static str),
    pub shape: Shape,
}

/// Which of the keys that date a file some trace entry has.
#[derive(Default)]
struct EntryKeys {
    any: bool,
    time_us: bool,
    compile_context: bool,
    user_metadata: bool,
    forward_frames: bool,
    internal_metadata: bool,
    annotate: bool,
}

impl EntryKeys {
    #[inline]
    fn add(&mut self, e: &TraceEntry) {
        self.any = true;
        self.time_us |= e.time_us().is_some();
        self.compile_context |= e.has_compile_context();
        self.user_metadata |= e.has_user_metadata();
        self.annotate |= e.action == Action::Annotate;
        if let Some(r) = e.rare.as_deref() {
            self.forward_frames |= r.forward_frames.is_some();
            self.internal_metadata |= r.internal_metadata.is_some();
        }
    }
}

/// The newest format memsnap knows.
pub const NEWEST_MINOR: u32 = 15;

impl Era {
    /// The range of releases whose snapshots have this file's keys.
    pub fn infer(s: &Snapshot) -> Era {
        let mut low = (0u32, "");
        let mut high = (NEWEST_MINOR, "");
        let mut at_least = |v: u32, why: &'static str| {
            if v > low.0 {
                low = (v, why);
            }
        };
        // One pass over the entries (a million in a big file) for every key they can have.
        let mut seen = EntryKeys::default();
        for e in s.traces().iter().flatten() {
            seen.add(e);
        }
        let blocks = s.segments.iter().flat_map(|seg| seg.blocks.iter());
        let legacy_blocks = blocks
            .clone()
            .any(|b| b.history.is_some() || b.address.is_none());
        if s.segments.iter().any(|seg| seg.is_expandable.is_some())
            || blocks.clone().any(|b| b.address.is_some())
        {
            at_least(1, "block addresses");
        }
        if seen.time_us {
            at_least(2, "time_us");
        }
        if s.allocator_settings.is_some() {
            at_least(3, "allocator_settings");
        }
        if s.external_annotations.is_some() {
            at_least(5, "external_annotations");
        }
        if seen.compile_context {
            at_least(8, "compile_context");
        }
        let settings = s.allocator_settings.as_ref();
        if settings.is_some_and(|a| a.graph_capture_record_stream_reuse.is_some()) {
            at_least(9, "graph_capture_record_stream_reuse");
        }
        if seen.user_metadata {
            at_least(10, "user_metadata");
        }
        if seen.forward_frames {
            at_least(11, "forward_frames");
        }
        if settings.is_some_and(|a| a.max_round_threshold.is_some() || a.max_cached_size.is_some())
        {
            at_least(13, "max_round_threshold");
        }
        if s.host_segments.is_some() || s.host_traces.is_some() {
            at_least(14, "host_segments");
        }
        if seen.annotate {
            at_least(14, "annotate entries");
        }
        if seen.internal_metadata {
            at_least(15, "internal_metadata");
        }

        let mut at_most = |v: u32, why: &'static str| {
            if v < high.0 {
                high = (v, why);
            }
        };
        if legacy_blocks {
            at_most(0, "legacy blocks without address");
        }
        // Absent top-level keys say nothing about a bare list, which never has them.
        if s.shape == Shape::Dict {
            if s.allocator_settings.is_none() {
                at_most(2, "allocator_settings");
            }
            if s.external_annotations.is_none() {
                at_most(4, "external_annotations");
            }
            if s.host_segments.is_none() {
                at_most(13, "host_segments");
            }
            if let Some(a) = settings {
                if a.graph_capture_record_stream_reuse.is_none() {
                    at_most(8, "graph_capture_record_stream_reuse");
                }
                if a.max_round_threshold.is_none() {
                    at_most(12, "max_round_threshold");
                }
            }
            if seen.any {
                if !seen.time_us {
                    at_most(1, "time_us");
                }
                if !seen.compile_context {
                    at_most(7, "compile_context");
                }
                if !seen.user_metadata {
                    at_most(9, "user_metadata");
                }
            }
        }
        Era {
            low,
            high,
            shape: s.shape,
        }
    }

    /// `PyTorch 2.5–2.8 (has external_annotations, no graph_capture_record_stream_reuse)`.
    pub fn describe(&self) -> String {
        let version = |v: u32| {
            if v == 0 {
                "2.0".to_string()
            } else {
                format!("2.{v}")
            }
        };
        let (low, why_low) = self.low;
        let (high, why_high) = self.high;
        let has = if why_low.is_empty() {
            String::new()
        } else {
            format!("has {why_low}")
        };
        let lacks = if why_high.is_empty() {
            String::new()
        } else {
            format!("no {why_high}")
        };
        let because = [has.as_str(), lacks.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        let because = if because.is_empty() {
            String::new()
        } else {
            format!(" ({because})")
        };
        if low > high {
            return format!(
                "mixed: keys of PyTorch {}+ but {}; not written by one PyTorch release",
                version(low),
                lacks
            );
        }
        let range = if low == high {
            format!(
                "PyTorch {}",
                if low == 0 {
                    "≤2.0".to_string()
                } else {
                    version(low)
                }
            )
        } else if low == 0 {
            format!("PyTorch ≤{}", version(high))
        } else if high == NEWEST_MINOR && why_high.is_empty() {
            format!("PyTorch {}+", version(low))
        } else {
            format!("PyTorch {}–{}", version(low), version(high))
        };
        match self.shape {
            Shape::SegmentList => format!("{range}{because}, judged from the segments only"),
            Shape::Dict => format!("{range}{because}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AllocatorSettings;

    #[test]
    fn era_comes_from_the_keys_present_and_absent() {
        let mut s = Snapshot::new(1);
        s.allocator_settings = Some(AllocatorSettings::default());
        s.external_annotations = Some(Vec::new());
        // allocator_settings without graph_capture_record_stream_reuse: at most 2.8.
        assert_eq!(
            Era::infer(&s).describe(),
            "PyTorch 2.5–2.8 (has external_annotations, no graph_capture_record_stream_reuse)"
        );

        let mut e = TraceEntry::new(Action::Alloc, 0x1000, 512, 0);
        e.set_time_us(Some(1));
        let na = s.strings.intern("N/A");
        e.set_compile_context(Some(na), &s.strings);
        s.device_traces = Some(vec![vec![e]]);
        assert!(Era::infer(&s).describe().starts_with("PyTorch 2.8 "));

        let mut old = Snapshot::new(1);
        old.device_traces = Some(vec![vec![TraceEntry::new(Action::Alloc, 0, 512, 0)]]);
        assert_eq!(Era::infer(&old).describe(), "PyTorch ≤2.1 (no time_us)");
    }

    #[test]
    fn a_key_on_any_entry_of_any_device_dates_the_file() {
        use crate::model::EntryRare;
        let plain = || TraceEntry::new(Action::Alloc, 0x1000, 512, 0);
        let mut s = Snapshot::new(2);
        s.allocator_settings = Some(AllocatorSettings::default());
        s.external_annotations = Some(Vec::new());
        let mut last = plain();
        last.set_time_us(Some(1));
        last.rare = Some(Box::new(EntryRare {
            forward_frames: Some(vec!["f".into()]),
            ..EntryRare::default()
        }));
        s.device_traces = Some(vec![vec![plain(); 3], vec![plain(), last]]);
        // forward_frames (2.11) and time_us on the last entry only; the absent
        // graph_capture_record_stream_reuse caps it at 2.8: not one release.
        let era = Era::infer(&s);
        assert_eq!(era.low, (11, "forward_frames"));
        assert_eq!(era.high, (7, "compile_context"));

        let mut annotate = plain();
        annotate.action = Action::Annotate;
        s.device_traces = Some(vec![vec![], vec![plain(), annotate]]);
        assert_eq!(Era::infer(&s).low, (14, "annotate entries"));
        assert_eq!(Era::infer(&s).high, (1, "time_us"));
    }
}
