//! The live tail ([`crate::live_tail`]) on the timeline: where it sits on the axes, and its
//! line past the document's end.

use egui::{Painter, Pos2, Shape, Stroke};
use memsnap_analysis::{Axis, DeviceTimeline};
use memsnap_plot::scene::{event_to_axis, Mapping};

use crate::live_tail::LiveTail;

/// The colour of the line of entries received after the document (a green no band has).
pub(super) const LIVE_TAIL: egui::Color32 = egui::Color32::from_rgb(40, 200, 120);

/// Where the document's last event ends on `axis`, and its active bytes there: the tail
/// starts from that point.
fn document_end(timeline: &DeviceTimeline, axis: Axis) -> (f64, u64) {
    let events = timeline.replay().axis_len();
    let level = timeline.curves().active.at(events.saturating_sub(1));
    let x = match axis {
        Axis::Event => f64::from(events),
        Axis::Time => event_to_axis(timeline, Axis::Time, f64::from(events) - 1.0) + 1.0,
    };
    (x, level)
}

/// The tail's points on `axis` (position, active bytes), from the document's end: each
/// point at the end of the entries it covers, at their highest active bytes. On the time
/// axis, only points with a time. O(points).
pub(super) fn tail_points(
    timeline: &DeviceTimeline,
    axis: Axis,
    tail: &LiveTail,
) -> Vec<(f64, u64)> {
    let (start, level) = document_end(timeline, axis);
    let bytes = |delta: i64| u64::try_from(i128::from(level) + i128::from(delta)).unwrap_or(0);
    let mut points = Vec::with_capacity(tail.points.len() + 1);
    points.push((start, level));
    for p in &tail.points {
        let x = match axis {
            Axis::Event => start + p.entries as f64,
            Axis::Time => match p.time_us {
                Some(t) => (t as f64).max(start),
                None => continue,
            },
        };
        points.push((x, bytes(p.max_delta)));
    }
    points
}

/// The end of the tail on `axis` (where [`tail_points`]'s last point is), when it has a
/// point there. O(1) on the event axis; on the time axis O(points without a time at the end).
pub(super) fn tail_end(timeline: &DeviceTimeline, axis: Axis, tail: &LiveTail) -> Option<f64> {
    let (start, _) = document_end(timeline, axis);
    match axis {
        Axis::Event => tail.points.last().map(|p| start + p.entries as f64),
        Axis::Time => tail
            .points
            .iter()
            .rev()
            .find_map(|p| p.time_us)
            .map(|t| (t as f64).max(start)),
    }
}

/// The highest active bytes of the tail.
pub(super) fn tail_top(timeline: &DeviceTimeline, tail: &LiveTail) -> u64 {
    let (_, level) = document_end(timeline, Axis::Event);
    u64::try_from(i128::from(level) + i128::from(tail.max_delta().max(0))).unwrap_or(u64::MAX)
}

/// Draws the tail as a line in [`LIVE_TAIL`].
pub(super) fn live_tail_ui(painter: &Painter, map: &Mapping, points: &[(f64, u64)]) {
    if points.len() < 2 {
        return;
    }
    let line: Vec<Pos2> = points
        .iter()
        .map(|&(x, bytes)| Pos2::new(map.x(x), map.y(bytes)))
        .collect();
    painter.add(Shape::line(line, Stroke::new(2.0, LIVE_TAIL)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{Action, TraceEntry};
    use memsnap_workload::{generate, TrainingRun};

    /// The tail starts where the document's active curve ends and each point is that level
    /// plus the point's change, one event per entry on the event axis and at the entries'
    /// times on the time axis.
    #[test]
    fn the_tail_continues_the_active_curve_from_the_documents_last_event() {
        let (snapshot, _) = generate(&TrainingRun::default());
        let timeline = DeviceTimeline::build(&snapshot, 0).expect("timeline");
        let events = timeline.replay().axis_len();
        let level = timeline.curves().active.at(events - 1);
        let last_time = snapshot.traces()[0]
            .iter()
            .rev()
            .find_map(TraceEntry::time_us)
            .expect("times");
        let mut tail = LiveTail::new(0, events as u64);
        for (i, (action, size)) in [
            (Action::Alloc, 4096),
            (Action::Alloc, 512),
            (Action::FreeCompleted, 4096),
        ]
        .into_iter()
        .enumerate()
        {
            let mut e = TraceEntry::new(action, 0x10_0000 + i as u64, size, 0);
            e.set_time_us(Some(last_time + 10 * (i as i64 + 1)));
            tail.push(&e);
        }
        let by_event = tail_points(&timeline, Axis::Event, &tail);
        let e = f64::from(events);
        assert_eq!(
            by_event,
            [
                (e, level),
                (e + 1.0, level + 4096),
                (e + 2.0, level + 4608),
                (e + 3.0, level + 512)
            ]
        );
        assert_eq!(tail_end(&timeline, Axis::Event, &tail), Some(e + 3.0));
        assert_eq!(
            tail_end(&timeline, Axis::Time, &tail),
            Some((last_time + 30) as f64)
        );
        assert_eq!(tail_top(&timeline, &tail), level + 4608);
        let by_time = tail_points(&timeline, Axis::Time, &tail);
        assert_eq!(by_time.len(), 4);
        assert_eq!(by_time[3], ((last_time + 30) as f64, level + 512));
    }
}
