//! Real PyTorch snapshots from `$MEMSNAP_REAL_SNAPSHOTS`: no panic, sensible numbers.

use memsnap_analysis::{
    summarize, CurveKind, DeviceTimeline, GroupBy, Instant, LayoutRequest, Lifetime, Origin,
    StepOptions, SummaryOptions,
};

use crate::util::real_snapshots_dir;

fn real_files() -> Vec<std::path::PathBuf> {
    let Some(dir) = real_snapshots_dir() else {
        return Vec::new();
    };
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("read MEMSNAP_REAL_SNAPSHOTS")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pickle" || e == "pkl"))
        .collect();
    files.sort();
    files
}

#[test]
fn real_snapshots_analyse_without_panics_and_with_consistent_totals() {
    for path in real_files() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let (snapshot, _) = match memsnap_format::read_path(&path) {
            Ok(s) => s,
            Err(e) => panic!("{name}: cannot read: {e}"),
        };
        let summary = summarize(&snapshot, &SummaryOptions::default()).expect("summary");
        for device in DeviceTimeline::devices(&snapshot) {
            let t = DeviceTimeline::build(&snapshot, device).expect("timeline");
            let replay = t.replay();
            // Before-window accounting: the curve starts at the before-window bytes, which are
            // exactly the allocations without an alloc event.
            let before: u64 = replay
                .allocations
                .iter()
                .filter(|a| a.before_window())
                .map(|a| a.size)
                .sum();
            assert_eq!(before, replay.before_window_bytes, "{name}/{device}");
            assert_eq!(t.curves().active.initial, before, "{name}/{device}");
            let ghosts = replay
                .allocations
                .iter()
                .filter(|a| a.origin == Origin::LiveInSegments)
                .count() as u64;
            assert_eq!(
                ghosts, replay.live_in_segments_allocations,
                "{name}/{device}"
            );
            // The final live set matches the final segments' active_allocated blocks.
            let final_live: u64 = replay
                .live_at(replay.axis_len() - 1, Lifetime::Active)
                .iter()
                .map(|id| replay.allocations[id.0 as usize].size)
                .sum();
            assert_eq!(
                final_live,
                t.curves().active.at(replay.axis_len() - 1),
                "{name}/{device}"
            );
            // Totals at a handful of instants equal the live set's sum.
            let n = replay.axis_len();
            for e in [0, n / 3, n / 2, n - 1] {
                let live: u64 = replay
                    .live_at(e, Lifetime::Active)
                    .iter()
                    .map(|id| replay.allocations[id.0 as usize].size)
                    .sum();
                assert_eq!(live, t.curves().active.at(e), "{name}/{device} event {e}");
            }
            let peak = t.peak(CurveKind::Active);
            assert!(peak.bytes >= t.curves().active.at(n - 1), "{name}/{device}");
            let _ = t.steps(&StepOptions::default());
            let _ = t.live_groups(
                &snapshot,
                Instant::Peak,
                Lifetime::Active,
                GroupBy::Frame,
                0,
            );
            let _ = t.fragmentation(Instant::Peak);
            let layout = t.layout(&LayoutRequest::whole(&t, 1000)).expect("layout");
            for c in &layout.columns {
                assert!(c.drawn_bytes <= c.total_bytes, "{name}/{device}");
            }
            let s = summary
                .devices
                .iter()
                .find(|d| d.device == device)
                .expect("device");
            assert_eq!(s.peak.bytes, peak.bytes);
            eprintln!(
                "{name} device {device}: {} entries, peak {} at {}, {} steps ({}), before window {} B in {} allocs",
                replay.trace_len, peak.bytes, peak.event, s.steps.len(), s.step_method,
                replay.before_window_bytes, replay.before_window_allocations
            );
        }
    }
}
