//! `memsnap advise`: the fix it ranks first fits the budget, and running the demo with that
//! change gives the peak it predicted; `top --by module` names the model's code; the real
//! snapshots (from `MEMSNAP_REAL_SNAPSHOTS`, skipped with a notice when unset).

use serde_json::Value;

use crate::common::{memsnap, real_snapshots_dir};

fn demo(dir: &std::path::Path, name: &str, extra: &[&str]) -> String {
    let path = dir.join(name).display().to_string();
    let mut args = vec!["demo", "--no-view", "--out", &path];
    if !extra.contains(&"--steps") {
        args.extend(["--steps", "3"]);
    }
    args.extend_from_slice(extra);
    let out = memsnap(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// `memsnap advise FILE ARGS --json`, which must succeed, parsed.
fn advise_json(file: &str, args: &[&str]) -> Value {
    let mut all = vec!["advise", file];
    all.extend_from_slice(args);
    all.push("--json");
    let out = memsnap(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn replayed_allocated_peak(file: &str) -> u64 {
    let out = memsnap(&["simulate", file, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["devices"][0]["allocated_peak_bytes"].as_u64().unwrap()
}

#[test]
fn advise_ranks_a_fix_that_fits_and_the_demo_run_with_it_has_the_predicted_peak() {
    let dir = tempfile::tempdir().unwrap();
    let file = demo(dir.path(), "run.pickle", &[]);
    let v = advise_json(&file, &["--budget", "1.5GiB"]);
    assert_eq!(v["baseline"]["fits"], false);
    let best = &v["predictions"][0];
    assert_eq!(best["fits"], true, "{best}");
    // Every single fix the demo can make, checked against the demo made with it.
    for p in v["predictions"].as_array().unwrap() {
        let fixes = p["fixes"].as_array().unwrap();
        let mut flags: Vec<String> = Vec::new();
        let mut supported = true;
        for f in fixes {
            match f["kind"].as_str().unwrap() {
                "checkpoint" if f["module"] == "model.py:212" && f["calls"].is_null() => {
                    flags.push("--checkpoint".into())
                }
                "micro_batches" => {
                    flags.push("--micro-batches".into());
                    flags.push(f["count"].to_string());
                }
                "optimizer_state" => {
                    flags.push("--optimizer-state-percent".into());
                    flags.push(f["percent"].to_string());
                }
                _ => supported = false,
            }
        }
        if !supported {
            continue;
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let changed = demo(dir.path(), "changed.pickle", &flags);
        let actual = replayed_allocated_peak(&changed);
        let predicted = p["allocated_peak_bytes"].as_u64().unwrap();
        let error = (predicted as f64 - actual as f64).abs() / actual as f64;
        assert!(
            error <= 0.03,
            "{}: predicted {predicted}, actual {actual}",
            p["description"]
        );
    }
}

/// A demo recorded with module names (`--modules`, as `enable(modules=True)` records them):
/// `advise` names the blocks, and each named checkpointing fix the demo can make
/// (`--checkpoint-blocks`, `--checkpoint-sub-module`) has the predicted peaks to the byte.
#[test]
fn advise_names_the_blocks_of_a_run_with_module_names_and_each_named_fix_is_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = demo(dir.path(), "named.pickle", &["--modules"]);
    let v = advise_json(&file, &[]);
    assert_eq!(v["modules"][0]["module"], "blocks.*", "{}", v["modules"]);
    let text = memsnap(&["advise", &file]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("(* stands for a number: blocks.* is every blocks.N)"),
        "{text}"
    );
    let mut checked = Vec::new();
    for p in v["predictions"].as_array().unwrap() {
        let [f] = &p["fixes"].as_array().unwrap()[..] else {
            continue;
        };
        if f["kind"] != "checkpoint" {
            continue;
        }
        let flags: [String; 2] = match (f["module"].as_str().unwrap(), &f["calls"]) {
            ("blocks.*", calls) => [
                "--checkpoint-blocks".into(),
                format!("{}-{}", calls[0], calls[1]),
            ],
            // The demo checkpoints a sub-module in every block (0 to 5), not in some.
            (sub @ ("blocks.*.attn" | "blocks.*.mlp"), calls)
                if *calls == serde_json::json!([0, 5]) =>
            {
                [
                    "--checkpoint-sub-module".into(),
                    sub.rsplit('.').next().unwrap().into(),
                ]
            }
            ("blocks.*.attn" | "blocks.*.mlp", _) => continue,
            (single, Value::Null) => [
                "--checkpoint-blocks".into(),
                single.strip_prefix("blocks.").unwrap().to_string(),
            ],
            other => panic!("{other:?}"),
        };
        let changed = demo(
            dir.path(),
            "changed.pickle",
            &["--modules", &flags[0], &flags[1]],
        );
        let out = memsnap(&["simulate", &changed, "--json"]);
        let actual: Value = serde_json::from_slice(&out.stdout).unwrap();
        for peak in ["allocated_peak_bytes", "reserved_peak_bytes"] {
            assert_eq!(
                p[peak], actual["devices"][0][peak],
                "{} {peak}",
                p["description"]
            );
        }
        checked.push(p["description"].as_str().unwrap().to_string());
    }
    assert!(
        checked
            .iter()
            .any(|d| d.ends_with("blocks.0 to blocks.2 (blocks.*)")),
        "{checked:?}"
    );
    assert!(
        checked
            .iter()
            .any(|d| d.ends_with("(blocks.*.mlp)") && d.contains("blocks.0.mlp to blocks.5.mlp")),
        "{checked:?}"
    );
    assert!(checked.len() >= 4, "{checked:?}");
}

#[test]
fn demo_checkpoint_blocks_must_be_blocks_of_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.pickle").display().to_string();
    for (range, says) in [
        ("3-1", "comes after the last"),
        ("0-6", "the model has 6 blocks"),
        ("a-b", "expected FIRST-LAST"),
    ] {
        let run = memsnap(&[
            "demo",
            "--no-view",
            "--out",
            &out,
            "--checkpoint-blocks",
            range,
        ]);
        assert!(!run.status.success(), "{range}");
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(err.contains(says), "{range}: {err}");
    }
}

#[test]
fn advise_exits_with_1_when_nothing_fits_and_prints_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let file = demo(dir.path(), "run.pickle", &[]);
    let out = memsnap(&["advise", &file, "--budget", "64MiB"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("does not fit"), "{text}");
    assert!(
        text.contains("checkpoint the activations of model.py:212"),
        "{text}"
    );
    assert!(text.contains("optimizer state in 8 bits"), "{text}");
}

#[test]
fn top_by_module_groups_the_peak_by_the_models_module_calls() {
    let dir = tempfile::tempdir().unwrap();
    let file = demo(dir.path(), "run.pickle", &[]);
    let out = memsnap(&["top", &file, "--by", "module", "--json"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sites: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["site"].as_str().unwrap())
        .collect();
    assert!(
        sites
            .iter()
            .any(|s| s.starts_with("model.py:212 > model.py:")),
        "{sites:?}"
    );
    assert!(sites.contains(&"<no module>"), "{sites:?}");
}

#[test]
fn advise_on_real_snapshots_names_their_own_modules() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let file = dir
        .join("09_magma27_v211_windows_python_frames.pickle")
        .display()
        .to_string();
    let v = advise_json(&file, &[]);
    let top = v["modules"][0]["module"].as_str().unwrap();
    // The file's own `cs336_basics/model.py`, not PyTorch's `nn/modules/*.py`.
    assert!(top.starts_with("model.py:"), "{top}");
    assert!(
        v["predictions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["fixes"][0]["kind"] == "checkpoint"),
        "{v}"
    );
    // Every file with a trace gets advice (or a clear error), never a crash. Exit 1: a file
    // that ran out of memory is advised on its GPU's memory, and nothing fits it.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path
            .extension()
            .is_some_and(|e| e == "pickle" || e == "pkl")
        {
            continue;
        }
        let out = memsnap(&["advise", &path.display().to_string()]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let on_its_gpu = stdout.contains("(the GPU's memory, as the file's out-of-memory entry");
        let fits = stdout
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("yes"));
        // Only a file advised on the GPU it ran out of, where nothing fits, exits 1.
        let expected = match out.status.code() {
            Some(1) => on_its_gpu && !fits,
            Some(0 | 2) => true,
            _ => false,
        };
        assert!(
            expected,
            "{}: exit {:?}\n{stdout}{}",
            path.display(),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A leaking run that runs out of memory: stopping the leak is ranked first and fits, the
/// fixes that leave it going on fit the recorded steps only (`yes*`), and the demo made with
/// the leak stopped (`--free-leak`) trains every step with the predicted peaks.
#[test]
fn advise_stops_a_leak_first_and_the_demo_with_the_leak_stopped_has_the_predicted_peaks() {
    let dir = tempfile::tempdir().unwrap();
    let leaking = [
        "--leak",
        "256MiB",
        "--steps",
        "10",
        "--device-memory",
        "3GiB",
    ];
    let file = demo(dir.path(), "leak.pickle", &leaking);
    let v = advise_json(&file, &["--budget", "3GiB"]);
    // Without --budget, a file that ran out of memory is advised on the GPU it ran out of
    // (the device `simulate` sizes from its `oom` entry), and says so.
    let out = memsnap(&["simulate", &file, "--json"]);
    let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sim["devices"][0]["capacity_bytes"], 3u64 << 30);
    let by_default = advise_json(&file, &[]);
    assert_eq!(by_default["budget_bytes"], 3u64 << 30);
    assert_eq!(by_default["budget_is_device_memory"], true);
    assert_eq!(by_default["predictions"], v["predictions"]);
    assert_eq!(v["budget_is_device_memory"], false);
    let text = String::from_utf8_lossy(&memsnap(&["advise", &file]).stdout).into_owned();
    assert!(text.contains("budget 3.0 GiB (the GPU's memory"), "{text}");
    let unbudgeted = advise_json(&file, &["--no-budget"]);
    assert!(unbudgeted["budget_bytes"].is_null());
    // The completed run is the run that failed: it does not fit the GPU it ran out of.
    assert_eq!(v["baseline"]["fits"], false, "{}", v["baseline"]);
    let best = &v["predictions"][0];
    assert_eq!(best["fixes"][0]["kind"], "release_kept", "{best}");
    assert_eq!(
        best["fixes"][0]["sites"][0], "metrics.py:33:record",
        "{best}"
    );
    assert_eq!(best["fits"], true, "{best}");
    assert_eq!(best["leak_bytes_per_step"], 0, "{best}");
    let others = v["predictions"].as_array().unwrap()[1..].to_vec();
    assert!(others
        .iter()
        .all(|p| p["leak_bytes_per_step"] == 256u64 << 20));
    let mut args = leaking.to_vec();
    args.push("--free-leak");
    let fixed = demo(dir.path(), "fixed.pickle", &args);
    let out = memsnap(&["simulate", &fixed, "--json"]);
    let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &sim["devices"][0];
    assert!(d["oom"].is_null(), "{d}");
    assert_eq!(d["allocated_peak_bytes"], best["allocated_peak_bytes"]);
    assert_eq!(d["reserved_peak_bytes"], best["reserved_peak_bytes"]);
    // The text marks what fits only until the leak fills the budget.
    let out = memsnap(&["advise", &file, "--budget", "3GiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  yes*  "), "{text}");
    assert!(
        text.contains("yes*: fits the recorded steps only"),
        "{text}"
    );
}
