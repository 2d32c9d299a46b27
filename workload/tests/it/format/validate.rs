//! `validate()`: sound snapshots give no violations; each kind of damage is reported at the
//! place it was made.

use memsnap_format::{pickle, validate, Action, Segment, Snapshot, Violation};
use memsnap_workload::{generate, TrainingRun};

use super::common;

fn generated() -> Snapshot {
    generate(&TrainingRun {
        devices: 2,
        steps: 3,
        ..TrainingRun::default()
    })
    .0
}

fn places(violations: &[Violation]) -> Vec<&str> {
    violations.iter().map(|v| v.place.as_str()).collect()
}

#[test]
fn generated_snapshots_are_sound() {
    for seed in 0..20 {
        let run = TrainingRun {
            devices: 1 + seed as usize % 3,
            steps: 1 + seed as usize % 5,
            layers: 1 + seed as usize % 6,
            leak_bytes_per_step: seed * 100_003,
            max_entries: (seed % 2 == 1).then_some(50 + seed as usize * 13),
            with_time: seed % 4 != 0,
            seed,
            ..TrainingRun::default()
        };
        let violations = validate(&generate(&run).0);
        assert!(violations.is_empty(), "{run:?}: {violations:?}");
    }
}

#[test]
fn real_snapshots_are_sound() {
    let Some(files) = common::real_snapshots() else {
        return;
    };
    for path in files {
        let snapshot = pickle::read(&std::fs::read(&path).unwrap()).unwrap();
        let violations = validate(&snapshot);
        assert!(violations.is_empty(), "{}: {violations:?}", path.display());
    }
}

/// The index of a segment with at least two blocks.
fn split_segment(snapshot: &Snapshot) -> usize {
    snapshot
        .segments
        .iter()
        .position(|s| s.blocks.len() >= 2)
        .expect("a generated snapshot has split segments")
}

#[test]
fn a_gap_between_blocks_is_reported_at_the_block() {
    let mut snapshot = generated();
    let si = split_segment(&snapshot);
    let last = snapshot.segments[si].blocks.len() - 1;
    let block = &mut snapshot.segments[si].blocks[last];
    // Move the block up by 512 bytes, keeping its end: a hole opens before it.
    block.address = block.address.map(|a| a + 512);
    block.size -= 512;
    let violations = validate(&snapshot);
    let place = format!("segments[{si}].blocks[{last}]");
    let gap = violations
        .iter()
        .find(|v| v.place == place)
        .unwrap_or_else(|| panic!("no violation at {place}: {violations:?}"));
    assert!(gap.what.contains("does not follow"), "{gap}");
    let segment = format!("segments[{si}]");
    assert!(
        places(&violations)
            .iter()
            .all(|p| *p == place || *p == segment),
        "{violations:?}"
    );
}

#[test]
fn a_wrong_allocated_size_is_reported_at_the_segment() {
    let mut snapshot = generated();
    let si = split_segment(&snapshot);
    let seg = &mut snapshot.segments[si];
    seg.allocated_size = seg.allocated_size.map(|s| s + 512);
    let violations = validate(&snapshot);
    assert_eq!(places(&violations), [format!("segments[{si}]")]);
    assert!(
        violations[0].what.starts_with("allocated_size is"),
        "{}",
        violations[0]
    );
}

#[test]
fn time_going_backwards_is_reported_at_the_entry() {
    let mut snapshot = generated();
    let trace = &mut snapshot.device_traces.as_mut().unwrap()[1];
    let before = trace[9].time_us().unwrap();
    trace[10].set_time_us(Some(before - 5));
    let violations = validate(&snapshot);
    assert_eq!(places(&violations), ["device_traces[1][10]"]);
    assert!(
        violations[0].what.contains("earlier than entry 9"),
        "{}",
        violations[0]
    );
}

#[test]
fn a_free_that_does_not_match_its_alloc_is_reported_at_the_free() {
    let mut snapshot = generated();
    let trace = &mut snapshot.device_traces.as_mut().unwrap()[0];
    // The first allocation that the trace frees (parameters never are).
    let (alloc_at, free_at) = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Alloc)
        .find_map(|(i, alloc)| {
            trace[i..]
                .iter()
                .position(|e| e.action == Action::FreeCompleted && e.addr == alloc.addr)
                .map(|n| (i, i + n))
        })
        .expect("the trace frees something");
    trace[free_at].size += 1;
    let violations = validate(&snapshot);
    assert_eq!(
        places(&violations),
        [format!("device_traces[0][{free_at}]")]
    );
    assert!(
        violations[0].what.contains(&format!("entry {alloc_at}")),
        "{}",
        violations[0]
    );
}

#[test]
fn overlapping_segments_are_reported_even_when_not_neighbours() {
    let mut snapshot = Snapshot::new(1);
    let mib = 1 << 20;
    // A long segment, then two that start inside it; the third does not overlap the second.
    snapshot.segments = vec![
        Segment::new(0, 100 * mib, 20 * mib, 0),
        Segment::new(0, 102 * mib, 2 * mib, 0),
        Segment::new(0, 110 * mib, 2 * mib, 0),
        // The same range on another device is fine.
        Segment::new(1, 102 * mib, 2 * mib, 0),
    ];
    let violations = validate(&snapshot);
    assert_eq!(places(&violations), ["segments[1]", "segments[2]"]);
    assert!(
        violations[1].what.contains("overlaps segments[0]"),
        "{}",
        violations[1]
    );
}
