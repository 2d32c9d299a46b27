//! Memory by module: the workload's module calls and the real snapshots' own code.

use memsnap_analysis::modules::{modules_at, MODULE_RANGE_PREFIX, NO_MODULE};
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

/// A run recorded with `memsnap.torch.enable(modules=True)`: each allocation belongs to the
/// innermost `memsnap.module: PATH` range open when it was made; the rest keep their chain
/// (no stacks here: outside every module).
#[test]
fn allocations_made_inside_module_ranges_are_attributed_to_the_innermost_path() {
    use memsnap_format::{Action, Annotation, Snapshot, TraceEntry};
    let mut snapshot = Snapshot::new(1);
    let allocs = [(10, 1u64), (20, 10), (30, 100), (40, 1000), (60, 10000)];
    for (i, &(time, size)) in allocs.iter().enumerate() {
        let mut e = TraceEntry::new(Action::Alloc, 0x10000 * (i as u64 + 1), size, 0);
        e.set_time_us(Some(time));
        snapshot.device_traces.as_mut().unwrap()[0].push(e);
    }
    let mark = |end: bool, path: &str, time_us: i64| {
        Annotation::record(end, format!("{MODULE_RANGE_PREFIX}{path}"), 0, time_us)
    };
    snapshot.external_annotations = Some(vec![
        mark(false, "GPT", 15),
        mark(false, "blocks.0", 25),
        mark(false, "blocks.0.feed_forward", 27),
        mark(true, "blocks.0.feed_forward", 35),
        mark(true, "blocks.0", 45),
        mark(true, "GPT", 50),
        // Only the START of a call still running when the snapshot was taken.
        mark(false, "head", 55),
    ]);
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let paths = timeline.module_paths();
    let of: Vec<Option<&str>> = (0..allocs.len()).map(|i| paths.of(i)).collect();
    assert_eq!(
        of,
        [
            None,
            Some("GPT"),
            Some("blocks.0.feed_forward"),
            Some("blocks.0"),
            Some("head")
        ]
    );
    let last = timeline.replay().trace_len - 1;
    let modules = modules_at(&snapshot, &timeline, &[], last);
    let bytes: Vec<(&str, u64)> = modules
        .iter()
        .map(|m| (m.module.as_str(), m.bytes))
        .collect();
    assert_eq!(
        bytes,
        [
            ("head", 10000),
            ("blocks.0", 1000),
            ("blocks.0.feed_forward", 100),
            ("GPT", 10),
            (NO_MODULE, 1)
        ]
    );
    // `top --by module` groups the same way.
    let top: Vec<(String, u64)> = timeline
        .top_sites(&snapshot, memsnap_analysis::GroupBy::Module)
        .iter()
        .map(|s| (s.key.label(&snapshot), s.bytes_at_peak))
        .collect();
    assert_eq!(
        top.iter()
            .map(|(k, b)| (k.as_str(), *b))
            .collect::<Vec<_>>(),
        [
            ("head", 10000),
            ("blocks.0", 1000),
            ("blocks.0.feed_forward", 100),
            ("GPT", 10),
            ("<no stack>", 1)
        ]
    );
    // The module tree nests the paths under the model's call that held them.
    let tree = memsnap_analysis::modules::module_tree_at(
        &snapshot,
        &timeline,
        last,
        memsnap_analysis::Lifetime::Active,
        0,
    );
    fn flat(nodes: &[memsnap_analysis::modules::ModuleNode], out: &mut Vec<(String, u64)>) {
        for n in nodes {
            out.push((n.path.clone(), n.bytes));
            flat(&n.children, out);
        }
    }
    let mut nodes = Vec::new();
    flat(&tree, &mut nodes);
    let expected: Vec<(String, u64)> = [
        ("head", 10000),
        ("GPT", 1110),
        ("GPT > blocks", 1100),
        ("GPT > blocks > 0", 1100),
        ("GPT > blocks > 0 > feed_forward", 100),
        (NO_MODULE, 1),
    ]
    .iter()
    .map(|(p, b)| (p.to_string(), *b))
    .collect();
    assert_eq!(nodes, expected);
    // Without module ranges, nothing is named.
    snapshot.external_annotations = None;
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    assert!(timeline.module_paths().is_empty());
}
