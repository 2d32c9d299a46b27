//! `memsnap plot` writes PNG and SVG pictures and rejects what it cannot draw.

use crate::common::memsnap;

fn generated_snapshot(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("run.json");
    let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun::default());
    memsnap_format::write_path(&path, &snapshot, None).unwrap();
    path
}

#[test]
fn plot_writes_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let input = generated_snapshot(dir.path());
    let png = dir.path().join("t.png");
    let out = memsnap(&["plot", input.to_str().unwrap(), "-o", png.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");

    let svg = dir.path().join("t.svg");
    let out = memsnap(&[
        "plot",
        input.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
        "--min-size",
        "1MiB",
        "--range",
        "10..400",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("smaller than 1.0 MiB"),
        "the residual band is in the legend"
    );

    let out = memsnap(&[
        "plot",
        input.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
        "--colour-by",
        "module",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("allocations (colour = module path)"));
}

#[test]
fn plot_rejects_unknown_extension_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = generated_snapshot(dir.path());
    let out = memsnap(&["plot", input.to_str().unwrap(), "-o", "x.gif"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(".png or .svg"));

    let garbage = dir.path().join("garbage.pickle");
    std::fs::write(&garbage, b"not a snapshot").unwrap();
    let out = memsnap(&["plot", garbage.to_str().unwrap(), "-o", "x.png"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn plot_of_an_import_without_reserved_memory_draws_no_reserved_outline() {
    // export_memory_timeline records no reserved memory: the outline was drawn at 0 B (and
    // the legend named it) as if nothing had been reserved.
    let dir = tempfile::tempdir().unwrap();
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpu_h200_torch2.11");
    for (file, outlined) in [
        ("memory_timeline.raw.json.gz", false),
        ("profiler.pt.trace.json.gz", true),
        ("native.pickle.gz", true),
    ] {
        let svg = dir.path().join(format!("{file}.svg"));
        let input = fixtures.join(file);
        let out = memsnap(&["plot", input.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&svg).unwrap();
        assert_eq!(text.contains(">reserved<"), outlined, "{file}");
    }
}

#[test]
fn plot_of_a_profiler_trace_draws_the_memory_from_before_the_profile_as_its_own_band() {
    // The profiler counts memory live before the profile in `Total Allocated` but records no
    // block for it: the picture draws it as one grey band under the profile's blocks, and the
    // legend names it with its size, so the curve reaches the profiler's peak.
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gpu_h200_torch2.11/profiler.pt.trace.json.gz")];
    match std::env::var_os("MEMSNAP_REAL_TRACES") {
        Some(traces) => inputs
            .push(std::path::Path::new(&traces).join("tracelens_h100_bert-small.pt.trace.json.gz")),
        None => eprintln!("notice: MEMSNAP_REAL_TRACES is unset; plotting the fixture only"),
    }
    for input in inputs {
        let input = input.to_str().unwrap();
        let summary = memsnap(&["summary", input, "--json"]);
        assert!(summary.status.success(), "{input}");
        let json: serde_json::Value = serde_json::from_slice(&summary.stdout).unwrap();
        let before = json["devices"][0]["before_window_bytes"].as_u64().unwrap();
        assert!(
            before > 0,
            "{input}: the trace has memory from before the profile"
        );

        let svg = dir.path().join("plot.svg");
        let out = memsnap(&["plot", input, "-o", svg.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&svg).unwrap();
        let label = format!(
            "before the profile, unattributed ({})",
            memsnap_units::format_size(before)
        );
        assert!(text.contains(&label), "{input}: no legend entry {label:?}");
        // The band itself: a filled path in the before-the-window grey (either theme).
        assert!(
            text.lines().any(|l| l.starts_with("<path")
                && (l.contains(r##"fill="#b0b4c0""##) || l.contains(r##"fill="#585c68""##))),
            "{input}: no band in the before-the-window colour"
        );
    }
}
