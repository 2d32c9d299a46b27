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
