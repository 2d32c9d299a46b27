//! `memsnap summary`, `top`, `check`, `diff` and `ranks` on synthetic runs with known answers
//! and on the real snapshots.

use std::path::{Path, PathBuf};

use memsnap_workload::{generate, GroundTruth, TrainingRun};

use crate::common::{memsnap, real_snapshots_dir};

/// Writes a synthetic run to `dir/name` and returns its path and ground truth.
fn synth_file(dir: &Path, name: &str, run: &TrainingRun) -> (PathBuf, GroundTruth) {
    let (snapshot, truth) = generate(run);
    let path = dir.join(name);
    memsnap_format::write_path(&path, &snapshot, None).expect("write snapshot");
    (path, truth)
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

fn leaky_run() -> TrainingRun {
    TrainingRun {
        steps: 6,
        leak_bytes_per_step: 4 << 20,
        seed: 2,
        ..Default::default()
    }
}

#[test]
fn summary_json_reports_the_true_steps_and_peak() {
    let dir = tempfile::tempdir().unwrap();
    for (name, run) in [
        ("annotated.pickle", TrainingRun::default()),
        (
            "truncated.pickle",
            TrainingRun {
                steps: 8,
                max_entries: Some(600),
                ..Default::default()
            },
        ),
    ] {
        let (path, truth) = synth_file(dir.path(), name, &run);
        let t = &truth.devices[0];
        // Annotations (`ProfilerStep#N`) give the simulator's step bounds exactly.
        let v = json(&memsnap(&[
            "summary",
            path.to_str().unwrap(),
            "--json",
            "--steps-from",
            "annotations",
        ]));
        let d = &v["devices"][0];
        assert_eq!(d["step_method"], "annotations:ProfilerStep#", "{name}");
        let steps = d["steps"].as_array().unwrap();
        assert_eq!(steps.len(), t.steps.len(), "{name}");
        for (s, want) in steps.iter().zip(&t.steps) {
            assert_eq!(s["start_event"], want.start_event);
            assert_eq!(s["peak_event"], want.peak_event);
            assert_eq!(s["end_event"], want.end_event);
            assert_eq!(s["start_bytes"], want.start_bytes);
            assert_eq!(s["peak_bytes"], want.peak_bytes);
            assert_eq!(s["end_bytes"], want.end_bytes);
            assert!(s["forward_bytes_per_s"].as_f64().unwrap() > 0.0);
            assert!(s["backward_bytes_per_s"].as_f64().unwrap() > 0.0);
        }
        // A step starts from where the one before it ended (its first event not yet done).
        for w in steps.windows(2) {
            assert_eq!(w[1]["before_bytes"], w[0]["end_bytes"], "{name}");
        }
        // By default the stacks do, with each phase starting at its first allocation.
        let v = json(&memsnap(&["summary", path.to_str().unwrap(), "--json"]));
        assert_eq!(v["schema"], "memsnap.summary/1");
        let d = &v["devices"][0];
        assert_eq!(d["device"], 0);
        assert_eq!(d["step_method"], "stacks", "{name}");
        assert_eq!(d["before_window_bytes"], t.before_window_bytes, "{name}");
        assert_eq!(d["dropped_entries"], t.dropped_entries, "{name}");
        // Every true step is found, by its backward phase's first allocation (a first step
        // cut by the ring buffer is found too, but it is not in the truth).
        let found = d["steps"].as_array().unwrap();
        assert!(found.len() <= t.steps.len() + 1, "{name}");
        for want in &t.steps {
            let s = found
                .iter()
                .find(|s| s["phases"][1]["start_event"] == want.phases[1].1)
                .unwrap_or_else(|| panic!("{name}: no step like {:?}", want.phases));
            assert_eq!(s["partial"], false);
            let phases = s["phases"].as_array().unwrap();
            let kinds: Vec<&str> = phases.iter().map(|p| p["kind"].as_str().unwrap()).collect();
            assert_eq!(kinds, ["forward", "backward", "optimizer"], "{name}");
            for (i, (p, &(_, first_alloc))) in phases.iter().zip(&want.phases).enumerate() {
                // The window's first phase starts at its first event, which may come before
                // the phase's first allocation (the step before's last frees).
                if !(i == 0 && s["start_event"] == 0) {
                    assert_eq!(p["start_event"], first_alloc, "{name}");
                }
                assert!(p["end_event"].as_u64() >= p["start_event"].as_u64());
                assert!(p["bytes_per_s"].is_f64(), "{name}: {p}");
            }
            assert_eq!(s["peak_bytes"], want.peak_bytes, "{name}");
        }
        let cats = d["categories_at_peak"].as_object().unwrap();
        let total: u64 = cats.values().map(|b| b.as_u64().unwrap()).sum();
        assert_eq!(total, d["peak"]["bytes"].as_u64().unwrap(), "{name}");
        assert!(cats["activation"].as_u64().unwrap() > 0, "{name}");
        let max_step_peak = t.steps.iter().map(|s| s.peak_bytes).max().unwrap();
        assert!(d["peak"]["bytes"].as_u64().unwrap() >= max_step_peak);
        assert!(d["peak"]["event"].is_u64());
        assert!(d["peak"]["time_us"].is_i64());
        assert!(d["drift_bytes_per_step"].is_number());
    }
}

#[test]
fn summary_text_names_the_leak() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = synth_file(dir.path(), "leaky.pickle", &leaky_run());
    let out = memsnap(&["summary", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("LEAK SUSPECTED"), "{text}");
    assert!(text.contains("+4.0 MiB/step"), "{text}");
    // And the code that keeps it.
    assert!(
        text.contains("leaking: metrics.py:33:record keeps 4.0 MiB/step: 6 allocations"),
        "{text}"
    );
}

#[test]
fn check_exits_1_over_budget_0_within_and_2_on_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (path, truth) = synth_file(dir.path(), "run.pickle", &TrainingRun::default());
    let path = path.to_str().unwrap();
    let peak = truth.devices[0]
        .steps
        .iter()
        .map(|s| s.peak_bytes)
        .max()
        .unwrap();

    let within = memsnap(&["check", path, "--max-peak", "80GiB"]);
    assert_eq!(within.status.code(), Some(0), "{}", stdout(&within));

    let over = memsnap(&["check", path, "--max-peak", &(peak - 1).to_string()]);
    assert_eq!(over.status.code(), Some(1));
    assert!(
        stdout(&over).contains("over the budget"),
        "{}",
        stdout(&over)
    );

    let garbage = dir.path().join("garbage.pickle");
    std::fs::write(&garbage, b"\x80\x04not really a pickle").unwrap();
    let bad = memsnap(&["check", garbage.to_str().unwrap(), "--max-peak", "1GiB"]);
    assert_eq!(bad.status.code(), Some(2));
    let missing = memsnap(&["check", "/nonexistent/run.pickle", "--max-peak", "1GiB"]);
    assert_eq!(missing.status.code(), Some(2));
    let bad_size = memsnap(&["check", path, "--max-peak", "12 parsecs"]);
    assert_eq!(bad_size.status.code(), Some(2));
}

#[test]
fn check_max_drift_catches_a_leak() {
    let dir = tempfile::tempdir().unwrap();
    let (leaky, _) = synth_file(dir.path(), "leaky.pickle", &leaky_run());
    let (clean, _) = synth_file(
        dir.path(),
        "clean.pickle",
        &TrainingRun {
            steps: 6,
            ..Default::default()
        },
    );
    let out = memsnap(&["check", leaky.to_str().unwrap(), "--max-drift", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("step floor grows"));
    let out = memsnap(&["check", clean.to_str().unwrap(), "--max-drift", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn top_groups_the_live_set_at_the_peak_and_at_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = synth_file(dir.path(), "run.pickle", &TrainingRun::default());
    let path = path.to_str().unwrap();
    let v = json(&memsnap(&["top", path, "--json"]));
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    let listed: u64 = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    assert_eq!(
        v["shown_bytes"].as_u64().unwrap(),
        v["live_bytes"].as_u64().unwrap()
    );
    assert!(listed <= v["live_bytes"].as_u64().unwrap());

    let filtered = json(&memsnap(&[
        "top",
        path,
        "--json",
        "--min-size",
        "1MiB",
        "--by",
        "file",
    ]));
    for r in filtered["rows"].as_array().unwrap() {
        assert!(r["largest"].as_u64().unwrap() >= 1 << 20);
    }
    let at = json(&memsnap(&[
        "top", path, "--json", "--at", "event:5", "--by", "stack",
    ]));
    assert_eq!(at["event"], 5);
    let text = memsnap(&["top", path, "--at", "+1ms"]);
    assert!(text.status.success());
    let past = memsnap(&["top", path, "--at", "event:99999999"]);
    assert_eq!(past.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&past.stderr).contains("is past the end of device"));
    // `--at 5` was an event here and a time_us in `memsnap export`: now it says which to write.
    let bare = memsnap(&["top", path, "--at", "5"]);
    assert_eq!(bare.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bare.stderr);
    assert!(
        stderr.contains("`5` is ambiguous: write `event:5`") && stderr.contains("`5us`"),
        "{stderr}"
    );
    let nonsense = memsnap(&["top", path, "--at", "yesterday"]);
    assert_eq!(nonsense.status.code(), Some(2));
}

#[test]
fn diff_shows_the_leak_site_growing() {
    let dir = tempfile::tempdir().unwrap();
    let (clean, _) = synth_file(
        dir.path(),
        "clean.pickle",
        &TrainingRun {
            steps: 6,
            seed: 2,
            ..Default::default()
        },
    );
    let (leaky, _) = synth_file(dir.path(), "leaky.pickle", &leaky_run());
    let v = json(&memsnap(&[
        "diff",
        clean.to_str().unwrap(),
        leaky.to_str().unwrap(),
        "--json",
    ]));
    let d = &v["devices"][0];
    assert!(d["delta_peak_bytes"].as_i64().unwrap() > 0);
    let grew = d["grew"].as_array().unwrap();
    assert!(!grew.is_empty());
    assert_eq!(
        grew[0]["delta_bytes_at_peak"].as_i64().unwrap() % (4 << 20),
        0,
        "{grew:?}"
    );
    // Each step's start is what it starts from, before its first event, as `summary` has it.
    let before_bytes = |file: &std::path::Path| -> Vec<i64> {
        let v = json(&memsnap(&["summary", file.to_str().unwrap(), "--json"]));
        v["devices"][0]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["before_bytes"].as_i64().unwrap())
            .collect()
    };
    let (was, is) = (before_bytes(&clean), before_bytes(&leaky));
    let steps = d["steps"].as_array().unwrap();
    assert!(!steps.is_empty());
    for s in steps {
        let k = s["index"].as_u64().unwrap() as usize;
        assert_eq!(
            s["delta_start_bytes"].as_i64().unwrap(),
            is[k] - was[k],
            "{s}"
        );
    }
    let text = memsnap(&["diff", clean.to_str().unwrap(), leaky.to_str().unwrap()]);
    assert!(stdout(&text).contains("sites that grew most"));
}

#[test]
fn ranks_lists_each_file_and_the_skew() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, activation) in [4u64, 8, 6].into_iter().enumerate() {
        let run = TrainingRun {
            activation_bytes: activation << 20,
            seed: i as u64,
            ..Default::default()
        };
        files.push(synth_file(dir.path(), &format!("rank{i}.pickle"), &run).0);
    }
    let mut args = vec!["ranks", "--json"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let v = json(&memsnap(&args));
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 3);
    let peaks: Vec<u64> = ranks
        .iter()
        .map(|r| r["peak_bytes"].as_u64().unwrap())
        .collect();
    assert!(peaks[1] > peaks[2] && peaks[2] > peaks[0], "{peaks:?}");
    assert_eq!(v["skew"]["max_peak_bytes"], peaks[1]);
    assert_eq!(v["skew"]["peak_spread_bytes"], peaks[1] - peaks[0]);
    assert!(v["skew"]["max_peak_file"]
        .as_str()
        .unwrap()
        .ends_with("rank1.pickle"));
    // A bad file among them is an error (exit 2), not a silent row.
    let garbage = dir.path().join("bad.pickle");
    std::fs::write(&garbage, b"nope").unwrap();
    args.push(garbage.to_str().unwrap());
    assert_eq!(memsnap(&args).status.code(), Some(2));
}

#[test]
fn analysis_commands_run_on_every_real_snapshot() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pickle" || e == "pkl"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for f in &files {
        let f = f.to_str().unwrap();
        let v = json(&memsnap(&["summary", f, "--json"]));
        for d in v["devices"].as_array().unwrap() {
            assert!(d["peak"]["bytes"].is_u64(), "{f}");
            assert!(d["before_window_bytes"].is_u64(), "{f}");
        }
        let out = memsnap(&["summary", f]);
        assert!(out.status.success(), "{f}");
        let out = memsnap(&["top", f]);
        assert!(
            out.status.code() == Some(0) || out.status.code() == Some(2),
            "{f}"
        );
        let check = memsnap(&["check", f, "--max-peak", "1TiB"]);
        assert_eq!(check.status.code(), Some(0), "{f}");
    }
    let mut args = vec!["ranks"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    assert!(memsnap(&args).status.success());
}

/// `memsnap demo`'s run (Python and C++ stacks; its first step allocates the
/// optimizer state): `summary` finds the set-up and every step with its forward, backward and
/// optimizer phases from the stacks, for several step and layer counts, and names the first
/// step a warm-up.
#[test]
fn summary_finds_every_step_of_the_demo_run() {
    let dir = tempfile::tempdir().unwrap();
    for (steps, layers) in [("5", None), ("2", Some("2")), ("8", Some("6"))] {
        let out = dir.path().join(format!("demo-{steps}.pickle"));
        let mut args = vec![
            "demo",
            "--no-view",
            "--out",
            out.to_str().unwrap(),
            "--steps",
            steps,
        ];
        if let Some(layers) = layers {
            args.extend(["--layers", layers]);
        }
        let run = memsnap(&args);
        assert!(
            run.status.success(),
            "memsnap demo failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let v = json(&memsnap(&["summary", out.to_str().unwrap(), "--json"]));
        let d = &v["devices"][0];
        assert_eq!(d["step_method"], "stacks", "{v}");
        let found = d["steps"].as_array().expect("steps");
        assert_eq!(found.len().to_string(), steps, "--steps {steps}: {v}");
        assert_eq!(d["setup_phase"]["kind"], "setup");
        for (i, s) in found.iter().enumerate() {
            let kinds: Vec<&str> = s["phases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["kind"].as_str().unwrap())
                .collect();
            assert_eq!(kinds, ["forward", "backward", "optimizer"], "step {i}: {s}");
            assert_eq!(s["warmup"], i == 0, "step {i}");
        }
        assert_eq!(d["leak_suspected"], false);
    }
}

/// `summary --json` on every real snapshot keeps the contract: each step's `phases` tile it
/// (kind, inclusive events, bytes, rate), and the categories at the peak add up to the peak.
/// The training runs (11: ten steps; 13: one warm-up step) are named in text too.
#[test]
fn summary_of_real_snapshots_gives_phases_and_categories() {
    let Some(dir) = crate::common::real_snapshots_dir() else {
        return;
    };
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle" || e == "pkl"))
        .collect();
    files.sort();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let v = json(&memsnap(&["summary", path.to_str().unwrap(), "--json"]));
        for d in v["devices"].as_array().unwrap() {
            let cats = d["categories_at_peak"]
                .as_object()
                .expect("categories_at_peak");
            assert_eq!(cats.len(), 6, "{name}");
            let total: u64 = cats.values().map(|b| b.as_u64().unwrap()).sum();
            assert_eq!(total, d["peak"]["bytes"].as_u64().unwrap(), "{name}");
            for s in d["steps"].as_array().unwrap() {
                let phases = s["phases"].as_array().expect("phases");
                assert!(!phases.is_empty(), "{name}");
                let mut next = s["start_event"].as_u64().unwrap();
                for p in phases {
                    assert!(
                        ["forward", "backward", "optimizer"].contains(&p["kind"].as_str().unwrap()),
                        "{name}: {p}"
                    );
                    assert_eq!(p["start_event"].as_u64().unwrap(), next, "{name}");
                    next = p["end_event"].as_u64().unwrap() + 1;
                    assert!(p["start_bytes"].is_u64() && p["end_bytes"].is_u64());
                    assert!(p["bytes_per_s"].is_f64() || p["bytes_per_s"].is_null());
                    // Kept as an array in memory, written as the device's map of names.
                    let phase_cats = p["categories_at_peak"].as_object().expect("a map");
                    assert!(phase_cats.keys().eq(cats.keys()), "{name}: {p}");
                    assert!(phase_cats.values().all(|b| b.is_u64()), "{name}: {p}");
                }
                assert_eq!(next, s["end_event"].as_u64().unwrap() + 1, "{name}");
            }
        }
        let steps = |i: usize| v["devices"][i]["steps"].as_array().unwrap().len();
        match &name[..3] {
            "11_" => assert_eq!(steps(0), 10, "{name}"),
            "13_" | "09_" | "10_" | "12_" | "15_" => assert_eq!(steps(0), 1, "{name}"),
            _ => {}
        }
    }
    let Some(path) = files.iter().find(|p| p.to_string_lossy().contains("13_")) else {
        return;
    };
    let text = stdout(&memsnap(&["summary", path.to_str().unwrap()]));
    assert!(
        text.contains("forward > backward > optimizer (warm-up: creates"),
        "{text}"
    );
    assert!(
        text.contains("the peak falls in the optimizer phase of step 0"),
        "{text}"
    );
    assert!(!text.contains("LEAK"), "{text}");
}
