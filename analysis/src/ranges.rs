//! Named ranges from `external_annotations`: `record_function` START/END markers paired by
//! name, placed on the event axis through the trace's times.

use memsnap_format::Snapshot;
use serde::Serialize;

use crate::curve::TimeAxis;

/// One `record_function` range.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NamedRange {
    pub name: String,
    /// `None` when only the END is in the annotation buffer (it started before the window).
    pub start_time_us: Option<i64>,
    /// `None` when the range had not ended when the snapshot was taken.
    pub end_time_us: Option<i64>,
    /// First event at or after the start (`None` without trace times).
    pub start_event: Option<u32>,
    /// Last event at or before the end (`None` without trace times or end, or when the end
    /// precedes every event).
    pub end_event: Option<u32>,
    /// Nesting depth among the ranges open at its start (0 = outermost).
    pub depth: u32,
}

/// Pairs the device's START/END annotations into ranges, ordered by start (ranges without a
/// start first).
pub fn named_ranges(snapshot: &Snapshot, device: i64, time: &TimeAxis) -> Vec<NamedRange> {
    let Some(annotations) = &snapshot.external_annotations else {
        return Vec::new();
    };
    let mut marks: Vec<(i64, usize)> = annotations
        .iter()
        .enumerate()
        .filter(|(_, a)| a.device == device)
        .map(|(i, a)| (a.time_us, i))
        .collect();
    marks.sort_unstable();
    let mut open: Vec<NamedRange> = Vec::new();
    let mut done = Vec::new();
    for (t, i) in marks {
        let a = &annotations[i];
        let name = a.name().unwrap_or("<unnamed>");
        match a.stage() {
            Some("START") => open.push(NamedRange {
                name: name.to_string(),
                start_time_us: Some(t),
                end_time_us: None,
                start_event: time.first_event_at_or_after(t),
                end_event: None,
                depth: open.len() as u32,
            }),
            Some("END") => {
                let end_event = time.last_event_at_or_before(t);
                match open.iter().rposition(|r| r.name == name) {
                    Some(pos) => {
                        let mut r = open.remove(pos);
                        r.end_time_us = Some(t);
                        r.end_event = end_event;
                        done.push(r);
                    }
                    None => done.push(NamedRange {
                        name: name.to_string(),
                        start_time_us: None,
                        end_time_us: Some(t),
                        start_event: None,
                        end_event,
                        depth: 0,
                    }),
                }
            }
            _ => {}
        }
    }
    done.extend(open);
    done.sort_by_key(|r| (r.start_time_us.is_some(), r.start_time_us, r.end_time_us));
    done
}
