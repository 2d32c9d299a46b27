//! Memory by module: the workload's module calls and the real snapshots' own code.

use memsnap_analysis::modules::{modules_at, NO_MODULE};
use memsnap_analysis::{
    summarize, Category, CurveKind, DeviceTimeline, StepOptions, SummaryOptions,
};
use memsnap_workload::{generate, TrainingRun};

use crate::util::real_snapshots_dir;

/// The workload's activations are made inside `model.py:212` (the model's loop over its
/// blocks) and a block's line, its parameters, optimizer state and gradients outside every
/// module: the split by category at the peak says so.
#[test]
fn the_workloads_activations_are_attributed_to_its_blocks_and_the_rest_to_no_module() {
    let (snapshot, _) = generate(&TrainingRun::default());
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let steps = timeline.steps(&StepOptions::default());
    let peak = timeline.peak(CurveKind::Active).event;
    let modules = modules_at(&snapshot, &timeline, &steps.categories, peak);
    let total: u64 = modules.iter().map(|m| m.bytes).sum();
    assert_eq!(total, timeline.curves().active.at(peak));
    let in_blocks: Vec<_> = modules
        .iter()
        .filter(|m| m.module.starts_with("model.py:212 > model.py:"))
        .collect();
    assert!(!in_blocks.is_empty(), "{modules:?}");
    for m in &in_blocks {
        assert_eq!(
            m.categories.get(Category::Activation),
            m.bytes,
            "{}: only activations are live in a block at the forward's peak",
            m.module
        );
    }
    let outside = modules.iter().find(|m| m.module == NO_MODULE).unwrap();
    assert!(outside.categories.get(Category::Parameter) > 0);
    assert_eq!(
        outside.categories.get(Category::Activation),
        4,
        "the loss (4 bytes)"
    );

    let summary = summarize(&snapshot, &SummaryOptions::default()).unwrap();
    let first = &summary.devices[0].modules_at_peak[0];
    assert_eq!(first.module, modules[0].module);
    assert_eq!(first.bytes, modules[0].bytes);
}

/// On the real snapshots with Python stacks, the modules are the files' own code (their
/// `model.py` / `transformer.py`), never PyTorch's `nn/modules`.
#[test]
fn real_snapshots_modules_name_their_own_code() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    for (file, expected) in [
        ("09_magma27_v211_windows_python_frames.pickle", "model.py:"),
        (
            "12_kkaitlyn_ctx128_forward_cpp_frames.pickle",
            "transformer.py:",
        ),
    ] {
        let (snapshot, _) = memsnap_format::io::read_path(&dir.join(file)).unwrap();
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        let steps = timeline.steps(&StepOptions::default());
        let peak = timeline.peak(CurveKind::Active).event;
        let modules = modules_at(&snapshot, &timeline, &steps.categories, peak);
        let named: Vec<&str> = modules
            .iter()
            .map(|m| m.module.as_str())
            .filter(|m| *m != NO_MODULE)
            .collect();
        assert!(!named.is_empty(), "{file}");
        for m in &named {
            assert!(m.starts_with(expected), "{file}: {m}");
            assert!(!m.contains("module.py"), "{file}: {m}");
        }
    }
}
