//! A run recorded with module names (`memsnap.torch.enable(modules=True)`'s
//! `memsnap.module: PATH` ranges): `advise` aims checkpointing at the blocks by name
//! (`blocks.0` to `blocks.2`), finds each block's call from its range rather than from the
//! stack's lines, and each such prediction matches the run made with that change.

use memsnap_advise::{advise, Advisor, Fix, ModuleNode, Options};
use memsnap_format::Snapshot;
use memsnap_workload::{generate, TrainingRun};

mod common;
use common::{advise_out_of_memory, peaks_within, replayed_peaks, six_blocks};

/// Six blocks of eight ~24 MiB activations, named; the stacks give the blocks' lines in no
/// order, so only the names can tell one block's call from the next.
fn named() -> TrainingRun {
    TrainingRun {
        module_ranges: true,
        ..six_blocks()
    }
}

fn blocks(calls: (u32, u32)) -> Fix {
    Fix::Checkpoint {
        module: "blocks.*".into(),
        node: ModuleNode::Named("blocks.*".into()),
        calls: Some(calls),
    }
}

/// `base` made with a named checkpointing fix, when the workload can make it: blocks by number,
/// one block, or a sub-module (`attn`, `mlp`) of every block.
fn made_with(fix: &Fix, base: &TrainingRun) -> Option<TrainingRun> {
    let Fix::Checkpoint {
        node: ModuleNode::Named(pattern),
        calls,
        ..
    } = fix
    else {
        return None;
    };
    let every_block = Some((0, base.layers as u32 - 1));
    let run = match (pattern.as_str(), *calls) {
        ("blocks.*", Some((first, last))) => TrainingRun {
            checkpoint_layers: (first as usize..=last as usize).collect(),
            ..base.clone()
        },
        ("blocks.*.attn" | "blocks.*.mlp", calls) if calls == every_block => TrainingRun {
            checkpoint_submodules: vec![pattern.rsplit('.').next()?.to_string()],
            ..base.clone()
        },
        (single, None) => TrainingRun {
            checkpoint_layers: vec![single.strip_prefix("blocks.")?.parse().ok()?],
            ..base.clone()
        },
        _ => return None,
    };
    Some(run)
}

/// The predicted peaks of `fix` on `recorded`, against the run made with `changed`.
fn check(recorded: &Snapshot, fix: &Fix, changed: TrainingRun) {
    let advisor = Advisor::new(recorded, None).unwrap();
    let p = advisor.predict(std::slice::from_ref(fix), None).unwrap();
    let (allocated, reserved) = replayed_peaks(&generate(&changed).0);
    peaks_within(&p.description, &p, (allocated, reserved));
}

#[test]
fn the_blocks_are_named_and_their_first_half_and_all_of_them_are_candidates() {
    let (recorded, _) = generate(&named());
    let advisor = Advisor::new(&recorded, None).unwrap();
    let modules = advisor.module_bytes();
    let labels: Vec<&str> = modules.iter().map(|m| m.module.as_str()).collect();
    assert_eq!(labels[0], "blocks.*", "{labels:?}");
    // Every block's activations, not the model's call (`GPT`), nor a block alone, lead.
    assert!(!labels.contains(&"GPT"), "{labels:?}");
    assert!(
        labels[1..].iter().all(|l| l.starts_with("blocks.")),
        "{labels:?}"
    );
    let candidates = advisor.candidates();
    assert!(candidates.contains(&blocks((0, 2))), "{candidates:#?}");
    assert!(candidates.contains(&blocks((0, 5))), "{candidates:#?}");
    assert_eq!(
        blocks((0, 2)).describe(),
        "checkpoint the activations of blocks.0 to blocks.2 (blocks.*)"
    );
}

#[test]
fn checkpointing_named_blocks_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&named());
    check(
        &recorded,
        &blocks((0, 2)),
        TrainingRun {
            checkpoint_layers: vec![0, 1, 2],
            ..named()
        },
    );
    check(
        &recorded,
        &blocks((0, 5)),
        TrainingRun {
            checkpoint_layers: (0..6).collect(),
            ..named()
        },
    );
    // Blocks in the middle, by their numbers.
    check(
        &recorded,
        &blocks((2, 3)),
        TrainingRun {
            checkpoint_layers: vec![2, 3],
            ..named()
        },
    );
}

/// Without names, the stacks of this run cannot tell the blocks apart (the lines inside a block
/// come in no order), so the chain splits the six blocks into other calls, and "the first
/// three calls" is not blocks 0 to 2: its prediction is far from the run made with those
/// blocks checkpointed. With names, the prediction is that run's, to the byte. What broke: a
/// model whose code does not run down its lines within a call.
#[test]
fn names_find_the_calls_where_the_stacks_lines_do_not_rise() {
    let first_three = |run: &TrainingRun| {
        generate(&TrainingRun {
            checkpoint_layers: vec![0, 1, 2],
            ..run.clone()
        })
        .0
    };
    let unnamed = TrainingRun {
        module_ranges: false,
        ..named()
    };
    let (recorded, _) = generate(&unnamed);
    let advisor = Advisor::new(&recorded, None).unwrap();
    let chain = advisor.module_bytes().remove(0);
    assert!(matches!(chain.node, ModuleNode::Chain(_)), "{chain:?}");
    let by_chain = advisor
        .predict(
            &[Fix::Checkpoint {
                module: chain.module,
                node: chain.node,
                calls: Some((0, 2)),
            }],
            None,
        )
        .unwrap();
    let (actual, _) = replayed_peaks(&first_three(&unnamed));
    let off = by_chain.allocated_peak_bytes.abs_diff(actual) as f64 / actual as f64;
    eprintln!("by the chain: {off:.3} off");
    assert!(off > 0.03, "the chain's calls are right after all: {off}");

    let (recorded, _) = generate(&named());
    let advisor = Advisor::new(&recorded, None).unwrap();
    let p = advisor.predict(&[blocks((0, 2))], None).unwrap();
    assert_eq!(
        (p.allocated_peak_bytes, p.reserved_peak_bytes),
        replayed_peaks(&first_three(&named()))
    );
}

/// A sub-module of every block by name (`blocks.*.mlp`: each block's `mlp` call), against
/// the run with that sub-module checkpointed in every block.
#[test]
fn checkpointing_a_named_sub_module_of_every_block_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&named());
    let advisor = Advisor::new(&recorded, None).unwrap();
    let mut checked = Vec::new();
    for fix in advisor.candidates() {
        let Fix::Checkpoint {
            node: ModuleNode::Named(pattern),
            ..
        } = &fix
        else {
            continue;
        };
        if !pattern.starts_with("blocks.*.") {
            continue;
        }
        // The workload checkpoints a sub-module in every block, not in some.
        let Some(changed) = made_with(&fix, &named()) else {
            continue;
        };
        check(&recorded, &fix, changed);
        checked.push(pattern.clone());
    }
    checked.sort();
    assert_eq!(checked, ["blocks.*.attn", "blocks.*.mlp"]);
}

/// With no stacks at all (`context=None`), the names still say what to checkpoint.
#[test]
fn a_frameless_run_with_names_gets_named_checkpointing() {
    let frameless = TrainingRun {
        frameless: true,
        ..named()
    };
    let (recorded, _) = generate(&frameless);
    let advice = advise(&recorded, &Options::default()).unwrap();
    assert!(advice.passes >= 2, "passes {}", advice.passes);
    assert_eq!(advice.modules[0].module, "blocks.*");
    let fix = advice
        .predictions
        .iter()
        .find(|p| p.fixes == [blocks((0, 2))])
        .unwrap_or_else(|| panic!("{:#?}", advice.predictions));
    let (allocated, reserved) = replayed_peaks(
        &generate(&TrainingRun {
            checkpoint_layers: vec![0, 1, 2],
            ..frameless
        })
        .0,
    );
    peaks_within("frameless blocks 0-2", fix, (allocated, reserved));
}

/// An OOM run with names: the completion carries the module ranges of the step it copies, so
/// the failed step's blocks are found by name too, and the named fixes that fit run.
#[test]
fn a_named_oom_run_is_completed_with_its_module_ranges() {
    let (small, _, advice) = advise_out_of_memory(&named(), 1 << 30);
    let mut checked = 0;
    for p in &advice.predictions {
        let [fix] = &p.fixes[..] else {
            continue;
        };
        let Some(changed) = made_with(fix, &small) else {
            continue;
        };
        let (snapshot, truth) = generate(&changed);
        let (allocated, reserved) = replayed_peaks(&snapshot);
        eprintln!(
            "{}: fits {:?}, oom {:?}",
            p.description, p.fits, truth.devices[0].oom
        );
        if p.fits == Some(true) {
            assert!(truth.devices[0].oom.is_none(), "{} fits", p.description);
            peaks_within(&p.description, p, (allocated, reserved));
            checked += 1;
        }
    }
    // Every block, and the first three.
    assert!(checked >= 2, "{:#?}", advice.predictions);
}

/// Hugging Face's GPT-2 naming: the blocks are `transformer.h.N`, inside `transformer` (called
/// once), inside the model's call (named by its class). The nodes worth checkpointing are the
/// numbered ones and single modules; the model's call and `transformer`, which hold all the
/// blocks, are not.
#[test]
fn nested_names_rank_the_repeated_blocks_and_leave_out_the_calls_around_them() {
    use memsnap_analysis::modules::MODULE_RANGE_PREFIX;
    use memsnap_format::{Action, Annotation, TraceEntry};
    let mut snapshot = Snapshot::new(1);
    let mut annotations = Vec::new();
    let mut time = 0i64;
    let mut sizes = Vec::new();
    let trace = &mut snapshot.device_traces.as_mut().unwrap()[0];
    let mut mark = |end: bool, path: &str, time: &mut i64| {
        *time += 1;
        annotations.push(Annotation::record(
            end,
            format!("{MODULE_RANGE_PREFIX}{path}"),
            0,
            *time,
        ));
    };
    let mut alloc = |size: u64, time: &mut i64| {
        *time += 1;
        let mut e = TraceEntry::new(Action::Alloc, 0x1_0000 * (trace.len() as u64 + 1), size, 0);
        e.set_time_us(Some(*time));
        trace.push(e);
        sizes.push(size);
    };
    mark(false, "GPT2LMHeadModel", &mut time);
    alloc(7, &mut time);
    mark(false, "transformer", &mut time);
    mark(false, "transformer.wte", &mut time);
    alloc(100, &mut time);
    mark(true, "transformer.wte", &mut time);
    for block in 0..4 {
        let path = format!("transformer.h.{block}");
        mark(false, &path, &mut time);
        mark(false, &format!("{path}.attn"), &mut time);
        alloc(1000, &mut time);
        mark(true, &format!("{path}.attn"), &mut time);
        mark(false, &format!("{path}.mlp"), &mut time);
        alloc(3000, &mut time);
        mark(true, &format!("{path}.mlp"), &mut time);
        mark(true, &path, &mut time);
    }
    mark(true, "transformer", &mut time);
    mark(false, "lm_head", &mut time);
    alloc(5000, &mut time);
    mark(true, "lm_head", &mut time);
    mark(true, "GPT2LMHeadModel", &mut time);
    snapshot.external_annotations = Some(annotations);
    let timeline = memsnap_analysis::DeviceTimeline::build(&snapshot, 0).unwrap();
    let nodes = memsnap_advise::node::named_nodes(
        timeline.module_paths(),
        sizes.iter().copied().enumerate(),
    );
    let ranked: Vec<(&str, u64)> = nodes.iter().map(|(p, _, b)| (p.as_str(), *b)).collect();
    assert_eq!(
        ranked,
        [
            ("transformer.h.*", 16000),
            ("transformer.h.*.mlp", 12000),
            ("lm_head", 5000),
            ("transformer.h.*.attn", 4000),
            ("transformer.h.0", 4000),
            ("transformer.h.1", 4000),
            ("transformer.h.2", 4000),
            ("transformer.h.3", 4000),
            ("transformer.h.0.mlp", 3000),
            ("transformer.h.1.mlp", 3000),
            ("transformer.h.2.mlp", 3000),
            ("transformer.h.3.mlp", 3000),
            ("transformer.h.0.attn", 1000),
            ("transformer.h.1.attn", 1000),
            ("transformer.h.2.attn", 1000),
            ("transformer.h.3.attn", 1000),
            ("transformer.wte", 100),
        ]
    );
}

/// One block alone, named without a number (`blocks.4`): its recomputation goes where its own
/// backward starts, after the blocks that ran after it released theirs. What broke: with no
/// other call of the node to order it by, the recomputation was placed at the backward's first
/// allocation, where everything is still live, and the prediction kept the recorded peak.
#[test]
fn one_named_block_is_recomputed_where_its_own_backward_starts() {
    let (recorded, _) = generate(&named());
    let advisor = Advisor::new(&recorded, None).unwrap();
    for block in [0u32, 4] {
        let path = format!("blocks.{block}");
        let fix = Fix::Checkpoint {
            module: path.clone(),
            node: ModuleNode::Named(path),
            calls: None,
        };
        let p = advisor.predict(&[fix], None).unwrap();
        let changed = TrainingRun {
            checkpoint_layers: vec![block as usize],
            ..named()
        };
        assert_eq!(
            (p.allocated_peak_bytes, p.reserved_peak_bytes),
            replayed_peaks(&generate(&changed).0),
            "{}",
            p.description
        );
        // The same block as call `block` of `blocks.*`.
        let q = advisor.predict(&[blocks((block, block))], None).unwrap();
        assert_eq!(q.allocated_peak_bytes, p.allocated_peak_bytes);
    }
}

/// Many distinct, deep module paths (a hostile or merely strange file): ranking the patterns is
/// linear in the paths and their segments (a pattern's check against every numbered one was
/// quadratic in the patterns).
#[test]
fn many_distinct_deep_module_paths_are_ranked_in_linear_time() {
    use memsnap_analysis::modules::MODULE_RANGE_PREFIX;
    use memsnap_format::{Action, Annotation, TraceEntry};
    const CALLS: usize = 20_000;
    let mut snapshot = Snapshot::new(1);
    let mut annotations = Vec::with_capacity(2 * CALLS + 2);
    let model = format!("{MODULE_RANGE_PREFIX}Model");
    annotations.push(Annotation::record(false, model.clone(), 0, -1));
    let trace = &mut snapshot.device_traces.as_mut().unwrap()[0];
    for i in 0..CALLS {
        let t = 3 * i as i64;
        // 24 segments, numbered ones among them, each path its own.
        let path = format!("m.{i}.a.{}.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u", i % 7);
        let name = format!("{MODULE_RANGE_PREFIX}{path}");
        annotations.push(Annotation::record(false, name.clone(), 0, t));
        let mut e = TraceEntry::new(Action::Alloc, 0x1000 * (i as u64 + 1), 512, 0);
        e.set_time_us(Some(t + 1));
        trace.push(e);
        annotations.push(Annotation::record(true, name, 0, t + 2));
    }
    annotations.push(Annotation::record(true, model, 0, 3 * CALLS as i64));
    snapshot.external_annotations = Some(annotations);
    let timeline = memsnap_analysis::DeviceTimeline::build(&snapshot, 0).unwrap();
    let started = std::time::Instant::now();
    let nodes =
        memsnap_advise::node::named_nodes(timeline.module_paths(), (0..CALLS).map(|i| (i, 512)));
    eprintln!("{} nodes in {:?}", nodes.len(), started.elapsed());
    // Each path (a call of its own) and its numbered pattern: the 7 patterns `m.N.a.*.b...`
    // hold 512 bytes per path, and each path as many.
    assert_eq!(nodes.len(), CALLS + CALLS, "{:?}", &nodes[..5]);
    assert!(nodes.iter().all(|(p, _, _)| !p.starts_with("Model")));
}
