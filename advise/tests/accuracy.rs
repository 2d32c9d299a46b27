//! Every fix's prediction against a generated run made with that change: the predicted peaks
//! (the recorded run's trace, edited and replayed) must be within 3 % of the peaks of the run
//! regenerated with the change (its own trace, replayed the same way). And the advice,
//! combinations included, does not depend on how many replays run at once.

use memsnap_advise::{Advisor, Fix};
use memsnap_workload::{generate, TrainingRun};

mod common;
use common::{advise_out_of_memory, peaks_within, replayed_peaks, six_blocks, within};

/// [`six_blocks`] with each block's activations made in order by their stacks' lines (what
/// the chain checkpointing without names reads).
fn run() -> TrainingRun {
    TrainingRun {
        ordered_forward_stacks: true,
        ..six_blocks()
    }
}

fn check(name: &str, fixes: &[Fix], changed: TrainingRun) {
    let (recorded, _) = generate(&run());
    let advisor = Advisor::new(&recorded, None).unwrap();
    let p = advisor.predict(fixes, None).unwrap();
    let (actual_allocated, actual_reserved) = replayed_peaks(&generate(&changed).0);
    let (base_allocated, _) = replayed_peaks(&recorded);
    eprintln!("{name}: recorded allocated peak {base_allocated}");
    peaks_within(name, &p, (actual_allocated, actual_reserved));
}

fn blocks(advisor: &Advisor<'_>) -> Fix {
    let top = advisor.module_bytes().into_iter().next().unwrap();
    assert_eq!(
        top.module, "model.py:212",
        "the model's loop over its blocks"
    );
    Fix::Checkpoint {
        module: top.module,
        node: top.node,
        calls: None,
    }
}

#[test]
fn checkpointing_every_block_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&run());
    let fix = blocks(&Advisor::new(&recorded, None).unwrap());
    let changed = TrainingRun {
        checkpoint_layers: (0..6).collect(),
        ..run()
    };
    check("checkpoint", &[fix], changed);
}

#[test]
fn checkpointing_a_range_of_blocks_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&run());
    let advisor = Advisor::new(&recorded, None).unwrap();
    let Fix::Checkpoint { module, node, .. } = blocks(&advisor) else {
        unreachable!()
    };
    // The candidate `advise` makes: the first half of the six blocks.
    assert!(advisor.candidates().contains(&Fix::Checkpoint {
        module: module.clone(),
        node: node.clone(),
        calls: Some((0, 2)),
    }));
    let fix = Fix::Checkpoint {
        module,
        node,
        calls: Some((0, 2)),
    };
    let changed = TrainingRun {
        checkpoint_layers: vec![0, 1, 2],
        ..run()
    };
    check("checkpoint blocks 0-2", &[fix], changed);
}

#[test]
fn micro_batches_are_predicted_within_3_percent() {
    for count in [2u32, 4] {
        let changed = TrainingRun {
            micro_batches: count as usize,
            ..run()
        };
        check(
            &format!("micro-batches {count}"),
            &[Fix::MicroBatches { count }],
            changed,
        );
    }
}

#[test]
fn optimizer_state_in_8_bits_or_offloaded_is_predicted_within_3_percent() {
    for percent in [25u8, 0] {
        let changed = TrainingRun {
            optimizer_state_percent: percent,
            ..run()
        };
        check(
            &format!("optimizer state {percent}%"),
            &[Fix::OptimizerState { percent }],
            changed,
        );
    }
}

#[test]
fn expandable_segments_are_predicted_within_3_percent() {
    let changed = TrainingRun {
        expandable_segments: true,
        ..run()
    };
    let fix = Fix::Allocator {
        alloc_conf: "expandable_segments:True".into(),
    };
    check("expandable segments", &[fix], changed);
}

/// The sub-module calls of every block (a chain two deep: `model.py:212 > model.py:52`, the
/// call at line 52 of each block's forward, which makes activation slot 2), against the run
/// with that slot checkpointed in every block.
#[test]
fn checkpointing_a_sub_module_of_every_block_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&run());
    let advisor = Advisor::new(&recorded, None).unwrap();
    let mut checked = 0;
    for fix in advisor.candidates() {
        let serde_like::Kind::Slot(slot) = serde_like::of(&fix) else {
            continue;
        };
        let changed = TrainingRun {
            checkpoint_slots: vec![slot],
            ..run()
        };
        check(&fix.describe(), &[fix], changed);
        checked += 1;
    }
    assert!(checked >= 1, "{:#?}", advisor.candidates());
}

#[test]
fn the_other_allocator_settings_are_predicted_within_3_percent() {
    for conf in ["max_split_size_mb:128", "roundup_power2_divisions:4"] {
        let changed = TrainingRun {
            alloc_conf: conf.into(),
            ..run()
        };
        // The run made with it was made with it.
        let (config, _) = memsnap_simulate::settings::file_config(&generate(&changed).0);
        assert_ne!(
            config,
            memsnap_simulate::settings::file_config(&generate(&run()).0).0,
            "{conf}"
        );
        let fix = Fix::Allocator {
            alloc_conf: conf.into(),
        };
        check(conf, &[fix], changed);
    }
}

#[test]
fn checkpointing_with_micro_batches_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&run());
    let fix = blocks(&Advisor::new(&recorded, None).unwrap());
    let changed = TrainingRun {
        checkpoint_layers: (0..6).collect(),
        micro_batches: 2,
        optimizer_state_percent: 25,
        ..run()
    };
    check(
        "checkpoint + micro-batches 2 + 8-bit",
        &[
            fix,
            Fix::MicroBatches { count: 2 },
            Fix::OptimizerState { percent: 25 },
        ],
        changed,
    );
}

/// The workload run that fits a `run()` fix: the fix's changes applied.
fn with_fixes(base: TrainingRun, fixes: &[serde_like::Kind]) -> Option<TrainingRun> {
    let mut run = base;
    for f in fixes {
        match f {
            serde_like::Kind::Blocks => run.checkpoint_layers = (0..run.layers).collect(),
            serde_like::Kind::BlockRange(first, last) => {
                run.checkpoint_layers = (*first as usize..=*last as usize).collect()
            }
            serde_like::Kind::Slot(slot) => run.checkpoint_slots = vec![*slot],
            serde_like::Kind::MicroBatches(n) => run.micro_batches = *n as usize,
            serde_like::Kind::Optimizer(p) => run.optimizer_state_percent = *p,
            serde_like::Kind::Expandable => run.expandable_segments = true,
            serde_like::Kind::StopLeak => run.leak_freed_at_step_end = true,
            serde_like::Kind::Other => return None,
        }
    }
    Some(run)
}

mod serde_like {
    pub enum Kind {
        Blocks,
        BlockRange(u32, u32),
        /// The call at line `50 + slot` of every block, which makes activation `slot`.
        Slot(usize),
        MicroBatches(u32),
        Optimizer(u8),
        Expandable,
        /// The workload's leak stopped (its one leaking site).
        StopLeak,
        Other,
    }

    pub fn of(fix: &memsnap_advise::Fix) -> Kind {
        match fix {
            memsnap_advise::Fix::Checkpoint {
                module,
                calls: None,
                ..
            } if module == "model.py:212" => Kind::Blocks,
            memsnap_advise::Fix::Checkpoint {
                module,
                calls: Some((first, last)),
                ..
            } if module == "model.py:212" => Kind::BlockRange(*first, *last),
            memsnap_advise::Fix::Checkpoint {
                module,
                calls: None,
                ..
            } if module.starts_with("model.py:212 > model.py:5") => module
                .strip_prefix("model.py:212 > model.py:")
                .and_then(|line| line.parse::<usize>().ok())
                .map_or(Kind::Other, |line| Kind::Slot(line - 50)),
            memsnap_advise::Fix::MicroBatches { count } => Kind::MicroBatches(*count),
            memsnap_advise::Fix::ReleaseKept { sites, .. } if sites.len() == 1 => Kind::StopLeak,
            memsnap_advise::Fix::OptimizerState { percent } => Kind::Optimizer(*percent),
            memsnap_advise::Fix::Allocator { alloc_conf }
                if alloc_conf == "expandable_segments:True" =>
            {
                Kind::Expandable
            }
            _ => Kind::Other,
        }
    }
}

/// An OOM run is completed with the step before's rest; the completed run's peak is the peak
/// of the same run on a device big enough, and each fix `advise` says fits does fit: the run
/// made with it on the small device finishes, with the predicted peak.
#[test]
fn an_oom_run_is_completed_and_the_fixes_that_fit_run_on_the_small_device() {
    let (small, truth, advice) = advise_out_of_memory(&run(), 1 << 30);
    let oom = truth.oom.expect("the run outgrows 1 GiB");
    assert!(oom.step >= 1, "step 0 completes: {oom:?}");
    eprintln!("{:?}", advice.completion);
    assert_eq!(advice.baseline.fits, Some(false));
    let mut checked = 0;
    for p in advice.predictions.iter().filter(|p| p.fits == Some(true)) {
        let kinds: Vec<_> = p.fixes.iter().map(serde_like::of).collect();
        let Some(changed) = with_fixes(small.clone(), &kinds) else {
            continue;
        };
        let (snapshot, truth) = generate(&changed);
        assert!(truth.devices[0].oom.is_none(), "{} fits", p.description);
        let (allocated, reserved) = replayed_peaks(&snapshot);
        peaks_within(&p.description, p, (allocated, reserved));
        checked += 1;
    }
    assert!(checked >= 2, "{:#?}", advice.predictions);
}

/// [`run`] keeping 40 MiB every step (`losses.append(loss)`, a metrics list on the GPU).
fn leaking(steps: usize) -> TrainingRun {
    TrainingRun {
        steps,
        leak_bytes_per_step: 40 << 20,
        ..run()
    }
}

/// The fix the advisor offers for its one leak.
fn stop_the_leak(advisor: &Advisor<'_>) -> Fix {
    let [leak] = advisor.leaks() else {
        panic!("one leak: {:#?}", advisor.leaks());
    };
    let fix = Fix::ReleaseKept {
        sites: vec![leak.site.clone()],
        bytes_per_step: leak.bytes_per_step,
    };
    assert!(advisor.candidates().contains(&fix));
    assert_eq!(leak.bytes_per_step, 40 << 20);
    fix
}

#[test]
fn stopping_a_leak_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&leaking(8));
    let advisor = Advisor::new(&recorded, None).unwrap();
    let p = advisor.predict(&[stop_the_leak(&advisor)], None).unwrap();
    let changed = TrainingRun {
        leak_freed_at_step_end: true,
        ..leaking(8)
    };
    let (allocated, _) = replayed_peaks(&recorded);
    assert!(p.allocated_peak_bytes < allocated - ((6 * 40) << 20));
    peaks_within(
        "stopping the leak",
        &p,
        replayed_peaks(&generate(&changed).0),
    );
}

/// The week-long run: a ring buffer holds its last steps, the leak's first tensors are from
/// before the window, and it runs out of memory. Stopping the leak is the fix that fits, its
/// prediction is the run made with the leak stopped (which finishes on the small device),
/// and the leak's memory from before the window is gone from the predicted start.
#[test]
fn a_long_runs_leak_that_ran_out_of_memory_is_stopped_within_its_window() {
    const DEVICE: u64 = 2 << 30;
    let recorded_run = TrainingRun {
        device_memory: DEVICE,
        max_entries: Some(2_000),
        ..leaking(60)
    };
    let (recorded, truth) = generate(&recorded_run);
    let truth = &truth.devices[0];
    assert!(truth.oom.is_some() && truth.dropped_entries > 0);
    let options = memsnap_advise::Options {
        budget: Some(DEVICE),
        ..memsnap_advise::Options::default()
    };
    let advice = memsnap_advise::advise(&recorded, &options).unwrap();
    let best = &advice.predictions[0];
    assert!(
        matches!(best.fixes[..], [Fix::ReleaseKept { .. }]),
        "{:#?}",
        advice.predictions
    );
    assert_eq!(best.fits, Some(true));
    assert_eq!((best.verdict(), best.leak_bytes_per_step), ("yes", 0));
    // The others fit the recorded steps at most: the leak goes on, and fills the budget a
    // few steps later.
    for p in &advice.predictions[1..] {
        if p.fixes.iter().any(|f| matches!(f, Fix::ReleaseKept { .. })) {
            continue;
        }
        assert_eq!(p.leak_bytes_per_step, 40 << 20, "{}", p.description);
        if p.fits == Some(true) {
            assert_eq!(p.verdict(), "yes*", "{}", p.description);
            let steps = p.steps_to_budget.expect("steps to the budget");
            assert_eq!(steps, (DEVICE - p.reserved_peak_bytes) / (40 << 20));
        }
    }
    let changed = TrainingRun {
        leak_freed_at_step_end: true,
        max_entries: None,
        ..recorded_run
    };
    let (snapshot, changed_truth) = generate(&changed);
    assert!(changed_truth.devices[0].oom.is_none());
    peaks_within("the leak stopped", best, replayed_peaks(&snapshot));
}

/// A run that leaks most often runs out of memory making its leak. The completion made the
/// rest of the failed step from an earlier step's but left out what that step kept (as it
/// does a warm-up's optimizer state), the leak's tensor included: the request that failed was
/// never made, and the completed run "fit" the GPU it had run out of.
#[test]
fn a_run_that_ran_out_of_memory_making_its_leak_does_not_fit_once_completed() {
    const LEAK: u64 = 256 << 20;
    let whole = TrainingRun {
        leak_bytes_per_step: LEAK,
        ..run()
    };
    // The device is what the first steps reserved and one step's leak less: the run fails in
    // its last step, asking for the leak's tensor.
    for steps in [4, 5] {
        let whole = TrainingRun {
            steps,
            ..whole.clone()
        };
        let (_, reserved) = replayed_peaks(&generate(&whole).0);
        let device = reserved - LEAK / 2;
        let (_, truth, advice) = advise_out_of_memory(&whole, device);
        let oom = truth.oom.expect("out of memory");
        assert_eq!(oom.requested_bytes, LEAK, "{steps} steps: {oom:?}");
        assert_eq!(advice.baseline.fits, Some(false), "{steps} steps");
        let best = &advice.predictions[0];
        assert!(
            matches!(best.fixes[..], [Fix::ReleaseKept { .. }]),
            "{:#?}",
            advice.predictions
        );
        assert_eq!(best.verdict(), "yes");
    }
}

/// The replays of the candidates and of the combinations run side by side; the ranking,
/// peaks and verdicts must be those of one replay at a time, combinations included.
#[test]
fn the_advice_is_the_same_whatever_the_replays_run_at_once() {
    let (recorded, _) = generate(&six_blocks());
    let singles = memsnap_advise::advise(&recorded, &memsnap_advise::Options::default()).unwrap();
    // Just under the best single fix: none fits alone, so combinations are tried.
    let best = singles
        .predictions
        .iter()
        .map(|p| p.reserved_peak_bytes)
        .min()
        .unwrap();
    let summary = |jobs: usize| {
        let advice = memsnap_advise::advise(
            &recorded,
            &memsnap_advise::Options {
                budget: Some(best - 1),
                jobs: Some(jobs),
                ..memsnap_advise::Options::default()
            },
        )
        .unwrap();
        let rows: Vec<(String, u64, u64, &'static str)> = advice
            .predictions
            .iter()
            .map(|p| {
                (
                    p.description.clone(),
                    p.allocated_peak_bytes,
                    p.reserved_peak_bytes,
                    p.verdict(),
                )
            })
            .collect();
        let combined = advice.predictions.iter().any(|p| p.fixes.len() > 1);
        (rows, advice.unchanged, combined)
    };
    let one = summary(1);
    assert!(one.2, "no combination was tried: {:?}", one.0);
    for jobs in [2, 3, 16] {
        assert_eq!(summary(jobs), one, "{jobs} at once");
    }
}

/// A ring buffer's window of a long run starts long after the warm-up made the optimizer
/// state, which the start state then holds. The edit scaled only state the window made, so
/// 8-bit and offloaded state were "no change" on exactly the runs that need them most.
#[test]
fn optimizer_state_made_before_a_ring_buffers_window_is_shrunk_too() {
    let whole = TrainingRun { steps: 8, ..run() };
    let entries = generate(&whole).0.traces()[0].len();
    // The last five steps or so: the warm-up step is long gone.
    let windowed = |run: TrainingRun| TrainingRun {
        max_entries: Some(entries * 5 / 8),
        ..run
    };
    let (recorded, truth) = generate(&windowed(whole.clone()));
    assert!(truth.devices[0].dropped_entries as usize > entries / 4);
    let advisor = Advisor::new(&recorded, None).unwrap();
    let (recorded_allocated, _) = replayed_peaks(&recorded);
    for percent in [25u8, 0] {
        let p = advisor
            .predict(&[Fix::OptimizerState { percent }], None)
            .unwrap();
        let changed = windowed(TrainingRun {
            optimizer_state_percent: percent,
            ..whole.clone()
        });
        let (allocated, reserved) = replayed_peaks(&generate(&changed).0);
        assert!(allocated < recorded_allocated, "the change lowers the peak");
        within(
            &format!("optimizer state {percent}%, windowed, allocated"),
            p.allocated_peak_bytes,
            allocated,
        );
        // Reserved: the state's old segments stay where other blocks share them, and the
        // smaller state made again may settle in their holes; the run made with the change
        // never had them. The prediction errs high (what to plan for), by at most 5 %.
        let error = p.reserved_peak_bytes as f64 / reserved as f64 - 1.0;
        eprintln!(
            "optimizer state {percent}%, windowed, reserved: predicted {}, actual {reserved}, {:+.3}%",
            p.reserved_peak_bytes,
            error * 100.0
        );
        assert!((-0.03..=0.05).contains(&error), "{error}");
    }
}
