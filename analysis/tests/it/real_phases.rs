//! Steps, phases, categories and sites of real training snapshots, pinned: the phases fall
//! where the stacks put them (regression tests for "no steps in real training snapshots").

use memsnap_analysis::sites::top_frame;
use memsnap_analysis::{
    Category, CurveKind, DeviceTimeline, PhaseKind, StepAnalysis, StepMethod, StepOptions,
};
use memsnap_format::Snapshot;

use crate::util::real_snapshots_dir;

fn load(prefix: &str) -> Option<Snapshot> {
    let dir = real_snapshots_dir()?;
    let path = std::fs::read_dir(&dir)
        .expect("read MEMSNAP_REAL_SNAPSHOTS")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .unwrap_or_else(|| panic!("no real snapshot {prefix}* in {}", dir.display()));
    Some(memsnap_format::read_path(&path).expect("read").0)
}

fn analyse(snapshot: &Snapshot, device: i64) -> (DeviceTimeline, StepAnalysis) {
    let timeline = DeviceTimeline::build(snapshot, device).expect("timeline");
    let steps = timeline.steps(&StepOptions::default());
    (timeline, steps)
}

/// `(kind, first event, last event)` of each phase of each step.
fn phases(analysis: &StepAnalysis) -> Vec<Vec<(PhaseKind, u32, u32)>> {
    analysis
        .steps
        .iter()
        .map(|s| {
            s.phases
                .iter()
                .map(|p| (p.kind, p.start_event, p.end_event))
                .collect()
        })
        .collect()
}

use PhaseKind::{Backward as B, Forward as F, Optimizer as O};

#[test]
fn ten_training_steps_of_11_with_their_first_step() {
    let Some(snapshot) = load("11_") else { return };
    let (timeline, analysis) = analyse(&snapshot, 0);
    assert_eq!(analysis.method, StepMethod::Stacks);
    let got = phases(&analysis);
    assert_eq!(got.len(), 10, "{got:?}");
    assert_eq!(got[0], vec![(F, 0, 118), (B, 119, 574), (O, 575, 582)]);
    assert_eq!(got[1], vec![(F, 583, 702), (B, 703, 1157), (O, 1158, 1163)]);
    assert_eq!(
        got[9],
        vec![(F, 5224, 5343), (B, 5344, 5797), (O, 5798, 5802)]
    );
    assert!(
        analysis.setup.is_none(),
        "recording began after the model was built"
    );
    // The first step creates Adam's state: a warm-up, not a leak.
    assert!(analysis.steps[0].warmup);
    assert_eq!(analysis.steps[0].optimizer_state_bytes, 15 << 20);
    assert!(analysis.steps[1..].iter().all(|s| !s.warmup && !s.partial));
    assert!(!analysis.drift.leak_suspected);
    // Forward grows, backward and the optimizer give back, the same every step after the
    // warm-up.
    for s in &analysis.steps[1..] {
        let [f, b, o] = &s.phases[..] else { panic!() };
        assert_eq!(
            (f.slope().bytes, b.slope().bytes, o.slope().bytes),
            (28_052_464, -20_188_144, -7_864_320),
            "forward growth, backward and optimizer release"
        );
        assert!(f.slope().bytes_per_s.is_some_and(|r| r > 0.0));
    }
    // The peak is in a backward pass (gradients appear before activations go).
    let peak = timeline.peak(CurveKind::Active);
    let (step, phase) = analysis.phase_at(peak.event).expect("peak in a phase");
    assert_eq!((step, phase.kind), (Some(1), B));
    let at = analysis.categories_at(timeline.replay(), &[peak.event])[0];
    assert_eq!(at.total(), peak.bytes);
    assert_eq!(at.get(Category::OptimizerState), 15 << 20);
    assert!(at.get(Category::Activation) > 0 && at.get(Category::Gradient) > 0);
}

#[test]
fn one_warm_up_step_of_13() {
    let Some(snapshot) = load("13_") else { return };
    let (_, analysis) = analyse(&snapshot, 0);
    assert_eq!(
        phases(&analysis),
        vec![vec![(F, 0, 361), (B, 362, 1817), (O, 1818, 6485)]]
    );
    let step = &analysis.steps[0];
    assert!(step.warmup && !step.partial);
    assert_eq!(step.optimizer_state_bytes, 1_523_681_280);
    assert!(!analysis.drift.leak_suspected);
}

#[test]
fn python_only_stacks_put_frameless_allocations_in_backward_09() {
    let Some(snapshot) = load("09_") else { return };
    let (timeline, analysis) = analyse(&snapshot, 0);
    assert_eq!(phases(&analysis), vec![vec![(F, 0, 1417), (B, 1418, 5162)]]);
    let peak = timeline.peak(CurveKind::Active);
    let at = analysis.categories_at(timeline.replay(), &[peak.event])[0];
    // At the forward peak most memory is activations kept for backward.
    assert!(at.get(Category::Activation) * 10 > peak.bytes * 8, "{at:?}");
}

#[test]
fn forward_only_captures_are_one_step_without_backward() {
    for (prefix, device) in [("10_", 0), ("12_", 0), ("15_", 0), ("14_", 1), ("14_", 2)] {
        let Some(snapshot) = load(prefix) else { return };
        let (timeline, analysis) = analyse(&snapshot, device);
        let got = phases(&analysis);
        let last = timeline.replay().trace_len - 1;
        assert_eq!(got, vec![vec![(F, 0, last)]], "{prefix} device {device}");
    }
}

#[test]
fn model_set_up_before_the_first_step_of_14() {
    let Some(snapshot) = load("14_") else { return };
    let (timeline, analysis) = analyse(&snapshot, 0);
    let setup = analysis.setup.as_ref().expect("model.to(device) is set-up");
    assert_eq!((setup.start_event, setup.end_event), (0, 427));
    assert_eq!(phases(&analysis), vec![vec![(F, 428, 6444)]]);
    // The weights moved to the GPU in the set-up are parameters at the peak.
    let peak = timeline.peak(CurveKind::Active);
    let at = analysis.categories_at(timeline.replay(), &[peak.event])[0];
    assert_eq!(at.get(Category::Parameter), setup.end_bytes);
}

/// Sites name the user's code, not the allocator: regression for
/// `CUDACachingAllocator.cpp:0:...DeviceCachingAllocator::malloc` at the top of 11's peak.
#[test]
fn sites_skip_the_allocator_and_torch_internals() {
    for prefix in ["11_", "13_", "12_", "15_"] {
        let Some(snapshot) = load(prefix) else { return };
        for i in 0..snapshot.stacks.len() {
            let stack = memsnap_format::StackId::from_index(i);
            let Some(f) = top_frame(&snapshot, stack) else {
                continue;
            };
            let frame = snapshot.frames.get(f);
            let has_user_python = snapshot.stack_frames(stack).any(|f| {
                f.filename.ends_with(".py") && !memsnap_analysis::sites::is_torch_python_frame(f)
            });
            assert!(
                !frame.name.contains("CachingAllocator") && !frame.name.contains("unwind"),
                "{prefix}: {}",
                frame.name
            );
            if has_user_python {
                assert!(
                    frame.filename.ends_with(".py")
                        && !memsnap_analysis::sites::is_torch_python_frame(frame),
                    "{prefix}: site {}:{} although the stack has user Python frames",
                    frame.filename,
                    frame.name
                );
            }
        }
    }
}

/// Regression: the largest site of 12's peak (weights loaded before the recording, blocks with
/// empty frames) read `<no stack>`; it says where the memory comes from.
#[test]
fn weights_from_before_the_recording_are_named_not_no_stack() {
    let Some(snapshot) = load("12_") else { return };
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let top = &timeline.top_sites(&snapshot, memsnap_analysis::GroupBy::Frame)[0];
    assert_eq!(top.key, memsnap_analysis::SiteKey::BeforeWindow);
    assert_eq!(
        top.key.label(&snapshot),
        "<allocated before the recording (no stack)>"
    );
    assert_eq!(top.bytes_at_peak, 13_628_553_216);
}
