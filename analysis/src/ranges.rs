//! Named ranges from `external_annotations`: `record_function` START/END markers paired by
//! name, placed on the event axis through the trace's times.

use foldhash::HashMap;
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
/// start first). An END closes the latest open START of the same name.
///
/// O(a log a) in the device's annotations: the sort by time, then one hash lookup per mark.
/// (Searching the open ranges for the END's name and removing it from among them was O(a²)
/// on ENDs whose STARTs are missing or many STARTs left open.) The open STARTs of a name are
/// a chain through `open` (each pointing at the previous open one of its name) and the map
/// holds only names with one open: a vector per name, kept after its ranges closed, was a
/// heap allocation per distinct name (`ProfilerStep#N`: one per step) and half of the time
/// here on a run of 600,000 ranges.
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
    // Ranges in START order, `None` once ended, each with the index of the previous open
    // START of its name; per name with an open START, the latest one's index.
    let mut open: Vec<(Option<NamedRange>, Option<usize>)> = Vec::new();
    let mut latest_open: HashMap<&str, usize> = HashMap::default();
    let mut open_count = 0usize;
    let mut done = Vec::new();
    for (t, i) in marks {
        let a = &annotations[i];
        let name = a.name().unwrap_or("<unnamed>");
        match a.stage() {
            Some("START") => {
                let previous = latest_open.insert(name, open.len());
                open.push((
                    Some(NamedRange {
                        name: name.to_string(),
                        start_time_us: Some(t),
                        end_time_us: None,
                        start_event: time.first_event_at_or_after(t),
                        end_event: None,
                        depth: open_count as u32,
                    }),
                    previous,
                ));
                open_count += 1;
            }
            Some("END") => {
                let end_event = time.last_event_at_or_before(t);
                let started = latest_open.remove(name).and_then(|k| {
                    let (range, previous) = &mut open[k];
                    if let Some(p) = *previous {
                        latest_open.insert(name, p);
                    }
                    range.take()
                });
                match started {
                    Some(mut r) => {
                        open_count -= 1;
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
    // Still open at the end, in START order (as the ranges left open always were).
    done.extend(open.into_iter().filter_map(|(range, _)| range));
    done.sort_by_key(|r| (r.start_time_us.is_some(), r.start_time_us, r.end_time_us));
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{value::Value, Annotation};
    use proptest::prelude::*;

    fn mark(stage: &str, name: &str, time_us: i64) -> Annotation {
        Annotation::new(
            vec![
                ("stage".into(), Value::Str(stage.into())),
                ("name".into(), Value::Str(name.into())),
            ]
            .into(),
            0,
            time_us,
        )
    }

    /// The pairing as it was written first: search the open ranges for the END's name and
    /// remove it from among them (O(a²), the reference the indexed pairing must match).
    fn reference(snapshot: &Snapshot, time: &TimeAxis) -> Vec<NamedRange> {
        let annotations = snapshot.external_annotations.as_ref().unwrap();
        let mut marks: Vec<(i64, usize)> = annotations
            .iter()
            .enumerate()
            .map(|(i, a)| (a.time_us, i))
            .collect();
        marks.sort_unstable();
        let (mut open, mut done): (Vec<NamedRange>, Vec<NamedRange>) = (Vec::new(), Vec::new());
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

    proptest! {
        /// Interleaved, unbalanced and repeated names with equal times: the same ranges, in
        /// the same order, with the same depths as the linear search gave.
        #[test]
        fn named_ranges_pair_each_end_with_the_latest_open_start_of_its_name(
            marks in proptest::collection::vec((0u8..3, 0u8..4, 0i64..20), 0..60)
        ) {
            let mut snapshot = Snapshot::new(1);
            snapshot.external_annotations = Some(
                marks
                    .iter()
                    .map(|&(stage, name, t)| {
                        let stage = ["START", "END", "OTHER"][stage as usize];
                        mark(stage, &format!("r{name}"), t)
                    })
                    .collect(),
            );
            let time = TimeAxis::default();
            prop_assert_eq!(named_ranges(&snapshot, 0, &time), reference(&snapshot, &time));
        }
    }
}
