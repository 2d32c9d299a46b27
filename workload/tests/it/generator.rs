//! The simulated training run: valid output, a consistent allocator state, a faithful ring
//! buffer, realistic stacks and ground truth that matches the trace.

use std::collections::HashMap;

use memsnap_format::{validate, Action, BlockState, Snapshot};
use memsnap_workload::{generate, GroundTruth, TrainingRun};

fn configs() -> Vec<TrainingRun> {
    let base = TrainingRun::default();
    let mut runs = vec![base.clone()];
    for seed in 0..6u64 {
        runs.push(TrainingRun {
            devices: 1 + (seed as usize % 3),
            steps: 2 + seed as usize,
            layers: 1 + seed as usize,
            activations_per_layer: 1 + (seed as usize * 2) % 7,
            activation_bytes: [300, 64 << 10, 900 << 10, 3 << 20, 24 << 20, 100 << 20]
                [seed as usize],
            param_bytes_per_layer: [0, 1000, 2 << 20, 12 << 20, 40 << 20, 7][seed as usize],
            optimizer: seed % 2 == 0,
            leak_bytes_per_step: [0, 4, 1 << 20, 0, 70_000, 12 << 20][seed as usize],
            max_entries: [None, Some(1), Some(37), None, Some(200), Some(5000)][seed as usize],
            with_time: seed != 3,
            with_annotations: seed != 4,
            stack_pool: [1, 8, 30, 100, 300, 48][seed as usize],
            seed,
            ..base.clone()
        });
    }
    runs
}

#[test]
fn generated_snapshots_validate_clean() {
    for run in configs() {
        let (snapshot, _) = generate(&run);
        let violations = validate(&snapshot);
        assert!(violations.is_empty(), "{run:?}: {violations:?}");
    }
}

#[test]
fn generation_is_deterministic_and_seeded() {
    let run = TrainingRun::default();
    let (a, truth_a) = generate(&run);
    let (b, truth_b) = generate(&run);
    assert_eq!(a.device_traces, b.device_traces);
    assert_eq!(a.segments, b.segments);
    assert_eq!(truth_a, truth_b);
    let (c, _) = generate(&TrainingRun { seed: 1, ..run });
    assert_ne!(a.device_traces, c.device_traces);
}

/// Replays each device trace from the window's starting bytes and checks every step answer.
pub(crate) fn check_truth(snapshot: &Snapshot, truth: &GroundTruth) {
    assert_eq!(truth.devices.len(), snapshot.traces().len());
    for (device, (trace, dev)) in snapshot.traces().iter().zip(&truth.devices).enumerate() {
        let mut live = dev.before_window_bytes;
        let after: Vec<u64> = trace
            .iter()
            .map(|e| {
                match e.action {
                    Action::Alloc => live += e.size,
                    Action::FreeCompleted => live -= e.size,
                    _ => {}
                }
                live
            })
            .collect();
        let mut previous_end = None;
        for (i, step) in dev.steps.iter().enumerate() {
            let place = format!("device {device} step {i}");
            assert!(step.start_event <= step.peak_event, "{place}");
            assert!(step.peak_event <= step.end_event, "{place}");
            assert!(step.end_event < trace.len(), "{place}");
            if let Some(end) = previous_end {
                assert!(step.start_event > end, "{place} overlaps the previous step");
            }
            previous_end = Some(step.end_event);
            assert_eq!(after[step.start_event], step.start_bytes, "{place} start");
            assert_eq!(after[step.end_event], step.end_bytes, "{place} end");
            assert_eq!(after[step.peak_event], step.peak_bytes, "{place} peak");
            let max = after[step.start_event..=step.end_event]
                .iter()
                .max()
                .copied();
            assert_eq!(max, Some(step.peak_bytes), "{place} peak is the maximum");
            assert!(step.peak_bytes > step.start_bytes, "{place} rises");
            assert!(step.end_bytes < step.peak_bytes, "{place} falls");
        }
    }
}

#[test]
fn ground_truth_matches_the_trace() {
    for run in configs() {
        let (snapshot, truth) = generate(&run);
        check_truth(&snapshot, &truth);
    }
}

#[test]
fn leak_shows_as_step_over_step_growth() {
    let leak = 3 << 20;
    let run = TrainingRun {
        steps: 6,
        leak_bytes_per_step: leak,
        ..TrainingRun::default()
    };
    let (snapshot, truth) = generate(&run);
    check_truth(&snapshot, &truth);
    let steps = &truth.devices[0].steps;
    assert_eq!(steps.len(), 6);
    assert_eq!(truth.devices[0].leak_bytes_per_step, leak);
    // After the first step (which also creates the optimizer state) each step ends `leak` higher.
    for pair in steps[1..].windows(2) {
        assert_eq!(pair[1].end_bytes - pair[0].end_bytes, leak);
    }
    let (no_leak, truth) = generate(&TrainingRun {
        leak_bytes_per_step: 0,
        ..run
    });
    check_truth(&no_leak, &truth);
    let steps = &truth.devices[0].steps;
    assert!(steps[1..]
        .windows(2)
        .all(|p| p[0].end_bytes == p[1].end_bytes));
}

#[test]
fn ring_buffer_keeps_the_newest_entries() {
    let full_run = TrainingRun {
        devices: 2,
        steps: 5,
        leak_bytes_per_step: 1 << 20,
        ..TrainingRun::default()
    };
    let (full, full_truth) = generate(&full_run);
    // Start the window at the peak of the second-to-last step, in the middle of the step.
    let steps = &full_truth.devices[0].steps;
    let max = full.traces()[0].len() - steps[steps.len() - 2].peak_event;
    let (cut, truth) = generate(&TrainingRun {
        max_entries: Some(max),
        ..full_run
    });
    assert!(validate(&cut).is_empty());
    check_truth(&cut, &truth);
    for device in 0..2 {
        let whole = &full.traces()[device];
        let window = &cut.traces()[device];
        assert_eq!(window.len(), max);
        // The same entries; stack ids are numbered per file, so stacks compare by frames.
        let resolved = |snapshot: &Snapshot, e: &memsnap_format::TraceEntry| {
            let frames: Vec<_> = e
                .frames
                .map(|s| snapshot.stack_frames(s).cloned().collect())
                .unwrap_or_default();
            (e.action, e.addr, e.size, e.time_us(), frames)
        };
        for (w, f) in window.iter().zip(&whole[whole.len() - max..]) {
            assert_eq!(resolved(&cut, w), resolved(&full, f));
        }
        let dropped = (whole.len() - max) as u64;
        assert_eq!(truth.devices[device].dropped_entries, dropped);
        assert_eq!(
            cut.recorder_info.as_ref().unwrap().dropped_entries[device],
            dropped
        );
        assert!(truth.devices[device].before_window_bytes > 0);
        // The steps that survive are the last ones of the full run, shifted.
        let kept = &truth.devices[device].steps;
        let all = &full_truth.devices[device].steps;
        assert!(!kept.is_empty() && kept.len() < all.len());
        for (k, f) in kept.iter().rev().zip(all.iter().rev()) {
            assert_eq!(k.start_event as u64 + dropped, f.start_event as u64);
            assert_eq!(k.peak_bytes, f.peak_bytes);
        }
    }
    let layout = |s: &Snapshot| -> Vec<_> {
        s.segments
            .iter()
            .map(|seg| {
                let blocks: Vec<_> = seg
                    .blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.requested_size, b.state))
                    .collect();
                (seg.device, seg.address, seg.total_size, blocks)
            })
            .collect()
    };
    assert_eq!(
        layout(&full),
        layout(&cut),
        "the ring buffer does not change the state"
    );
    // The window starts mid-run: some frees have no alloc in it, and parameters have none.
    let window = &cut.traces()[0];
    let mut allocated = std::collections::HashSet::new();
    let mut orphan_frees = 0;
    for e in window {
        match e.action {
            Action::Alloc => {
                allocated.insert(e.addr);
            }
            Action::FreeCompleted if !allocated.remove(&e.addr) => orphan_frees += 1,
            _ => {}
        }
    }
    assert!(orphan_frees > 0);
}

#[test]
fn segments_match_the_live_allocations() {
    for run in configs() {
        if run.max_entries.is_some() {
            continue;
        }
        let (snapshot, _) = generate(&run);
        for (device, trace) in snapshot.traces().iter().enumerate() {
            // addr -> (requested size, completed?)
            let mut live: HashMap<u64, (u64, bool)> = HashMap::new();
            let mut segment_allocs = 0;
            for e in trace {
                match e.action {
                    Action::Alloc => {
                        live.insert(e.addr, (e.size, false));
                    }
                    Action::FreeRequested => {
                        live.get_mut(&e.addr).expect("freed block is live").1 = true;
                    }
                    Action::FreeCompleted => {
                        live.remove(&e.addr).expect("freed block is live");
                    }
                    Action::SegmentAlloc => segment_allocs += 1,
                    _ => {}
                }
            }
            let segments: Vec<_> = snapshot
                .segments
                .iter()
                .filter(|s| s.device == device as i64)
                .collect();
            assert_eq!(segments.len(), segment_allocs, "{run:?}");
            assert!(segments.windows(2).all(|p| p[0].address < p[1].address));
            let mut active = HashMap::new();
            for seg in &segments {
                for (addr, block) in seg.block_addresses() {
                    assert_eq!(block.size % 512, 0);
                    if block.state.is_active() {
                        let requested = block.requested_size.unwrap();
                        // Large blocks are not split when less than 1 MiB would be left.
                        assert!(requested <= block.size);
                        assert!(block.size - requested < (1 << 20) + 512);
                        let pending = block.state == BlockState::ActivePendingFree;
                        active.insert(addr, (requested, pending));
                    }
                }
            }
            assert_eq!(active, live, "{run:?}");
        }
    }
}

#[test]
fn entries_look_like_pytorch_2_10() {
    let (snapshot, _) = generate(&TrainingRun {
        devices: 2,
        leak_bytes_per_step: 1000,
        ..TrainingRun::default()
    });
    let trace = &snapshot.traces()[0];
    let count = |action| trace.iter().filter(|e| e.action == action).count();
    assert!(count(Action::SegmentAlloc) > 0);
    assert!(count(Action::FreeRequested) > count(Action::Alloc) / 2);
    // Some frees complete later, not right after their request.
    assert!(trace
        .windows(2)
        .any(|p| p[0].action == Action::FreeRequested
            && (p[1].action != Action::FreeCompleted || p[1].addr != p[0].addr)));
    assert!(trace
        .iter()
        .any(|e| e.action == Action::Alloc && e.size < 1 << 20));
    assert!(trace
        .iter()
        .any(|e| e.action == Action::Alloc && e.size > 1 << 20));
    assert!(trace
        .iter()
        .any(|e| e.action == Action::Alloc && e.size % 512 != 0));
    // The fake clock: entries of one allocator call share its reading, calls are apart.
    assert!(trace.windows(2).all(|p| p[0].time_us() <= p[1].time_us()));
    let allocs: Vec<_> = trace.iter().filter(|e| e.action == Action::Alloc).collect();
    assert!(allocs.windows(2).all(|p| p[0].time_us() < p[1].time_us()));
    for e in trace {
        assert_eq!(
            snapshot.str(e.compile_context(&snapshot.strings).unwrap()),
            "N/A"
        );
        assert_eq!(
            snapshot.str(e.user_metadata(&snapshot.strings).unwrap()),
            ""
        );
        let frames: Vec<_> = snapshot.stack_frames(e.frames.unwrap()).collect();
        assert!(
            (15..=64).contains(&frames.len()),
            "stack depth {}",
            frames.len()
        );
        // Innermost, PyTorch's own unwinder and the caching allocator, as stacks="all" has.
        assert_eq!(frames[0].name, "torch::unwind::unwind()");
        assert!(frames[3]
            .name
            .starts_with("c10::cuda::CUDACachingAllocator::"));
        // Backward work runs on the autograd engine's thread: engine frames, no Python.
        let engine = frames
            .iter()
            .any(|f| f.name.starts_with("torch::autograd::Engine::thread_main"));
        let python = frames.iter().any(|f| f.filename.ends_with(".py"));
        assert!(engine != python, "{frames:?}");
    }
    let frames: Vec<String> = snapshot
        .frames
        .iter()
        .map(|f| format!("{}:{} {}", f.basename(), f.line, f.name))
        .collect();
    for expected in [
        "model.py:50 forward",
        "model.py:57 forward",
        "linear.py:125 forward",
        "train.py:88 train_step",
        "adam.py:247 step",
        "optimizer.py:1010 zero_grad",
        "Functions.cpp:0 torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
    ] {
        assert!(frames.iter().any(|f| f == expected), "no frame {expected}");
    }
    assert!(snapshot
        .segments
        .iter()
        .any(|s| s.segment_type == Some(memsnap_format::SegmentType::Small)));
    assert!(snapshot
        .segments
        .iter()
        .any(|s| s.segment_type == Some(memsnap_format::SegmentType::Large)));
    assert!(snapshot.segments.iter().any(|s| s.device == 1));

    let settings = snapshot.allocator_settings.as_ref().unwrap();
    assert_eq!(settings.max_split_size, Some((-1).into()));
    assert_eq!(
        settings.roundup_power2_divisions.as_ref().unwrap().len(),
        16
    );
    let annotations = snapshot.external_annotations.as_ref().unwrap();
    let names: Vec<_> = annotations.iter().filter_map(|a| a.name()).collect();
    assert!(names.contains(&"ProfilerStep#0"));
    assert!(names.contains(&"Optimizer.step#Adam.step"));
    assert!(annotations.windows(2).all(|p| p[0].time_us <= p[1].time_us));
}

#[test]
fn without_time_is_a_2_1_era_file() {
    let (snapshot, _) = generate(&TrainingRun {
        with_time: false,
        ..TrainingRun::default()
    });
    let trace = &snapshot.traces()[0];
    assert!(trace
        .iter()
        .all(|e| e.time_us().is_none() && !e.has_compile_context() && !e.has_user_metadata()));
    assert!(snapshot.allocator_settings.is_none());
    assert!(snapshot.external_annotations.is_none());
}

#[test]
fn stack_pool_sets_the_number_of_call_sites() {
    for pool in [8, 48, 200] {
        // A model big enough to use every call site of the pool (a snapshot holds only the
        // stacks its entries and blocks use).
        let (snapshot, _) = generate(&TrainingRun {
            stack_pool: pool,
            steps: 2,
            layers: 16,
            activations_per_layer: 6,
            leak_bytes_per_step: 1000,
            ..TrainingRun::default()
        });
        // The interned stacks include the empty one of cached blocks; each of the 11 kinds of
        // call site has at least one stack.
        let stacks = snapshot.stacks.len() - 1;
        assert!(
            stacks <= pool + 11 && stacks >= pool / 2,
            "{pool}: {stacks}"
        );
    }
}

#[test]
fn target_entries_scales_the_run() {
    let (snapshot, truth) = generate(&TrainingRun {
        target_entries: Some(20_000),
        devices: 2,
        ..TrainingRun::default()
    });
    for trace in snapshot.traces() {
        assert!((20_000..22_000).contains(&trace.len()), "{}", trace.len());
    }
    assert!(truth.devices[0].steps.len() > 10);
    assert!(validate(&snapshot).is_empty());
}

#[test]
fn oom_at_step_stops_the_run_with_the_allocators_oom() {
    let run = TrainingRun {
        steps: 5,
        oom_at_step: Some(2),
        device_memory: 4 << 30,
        ..TrainingRun::default()
    };
    let (snapshot, truth) = generate(&run);
    assert!(validate(&snapshot).is_empty());
    let t = &truth.devices[0];
    assert_eq!(t.steps.len(), 2, "steps 0 and 1 completed");
    let oom = t.oom.expect("the OOM is recorded");
    assert_eq!(oom.step, 2);
    let trace = &snapshot.traces()[0];
    assert_eq!(trace[oom.event].action, Action::Oom);
    assert!(oom.requested_bytes > 4 << 30);
    assert!(oom.event > t.steps[1].end_event);
    // Nothing is allocated after the failure: the run stopped.
    assert!(trace[oom.event..].iter().all(|e| e.action != Action::Alloc));
    let (_, no_oom) = generate(&TrainingRun {
        oom_at_step: None,
        ..run
    });
    assert_eq!(no_oom.devices[0].oom, None);
}

#[test]
fn annotations_come_from_the_recorder_per_device() {
    let (snapshot, _) = generate(&TrainingRun {
        devices: 2,
        steps: 3,
        ..TrainingRun::default()
    });
    let annotations = snapshot.external_annotations.as_ref().unwrap();
    for device in 0..2 {
        let names: Vec<_> = annotations
            .iter()
            .filter(|a| a.device == device)
            .filter_map(|a| a.name())
            .collect();
        // START and END of three steps and of three optimizer steps.
        assert_eq!(names.len(), 12, "device {device}: {names:?}");
        assert_eq!(names[0], "ProfilerStep#0");
    }
    // Each annotation lies strictly between the entries around it (the fake clock moves
    // between calls), so a step's entries are exactly those inside its range.
    let trace = &snapshot.traces()[0];
    for a in annotations.iter().filter(|a| a.device == 0) {
        assert!(trace.iter().all(|e| e.time_us() != Some(a.time_us)));
    }
}

#[test]
fn a_one_step_capture_is_one_step() {
    let (snapshot, truth) = generate(&TrainingRun {
        steps: 1,
        ..TrainingRun::default()
    });
    assert!(validate(&snapshot).is_empty());
    check_truth(&snapshot, &truth);
    assert_eq!(truth.devices[0].steps.len(), 1);
    assert!(truth.devices[0].has_setup);
}

#[test]
fn transformer_shape_sets_the_sizes() {
    let run = TrainingRun::transformer(6, 8, 1024, 1024);
    assert_eq!(run.activation_bytes, 8 * 1024 * 1024 * 4);
    assert_eq!(run.param_bytes_per_layer, 12 * 1024 * 1024 * 4);
    let (snapshot, truth) = generate(&TrainingRun { steps: 2, ..run });
    assert!(validate(&snapshot).is_empty());
    check_truth(&snapshot, &truth);
}
