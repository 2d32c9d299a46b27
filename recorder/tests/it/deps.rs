//! The recorder is loaded into training processes: it must never pull in UI crates.

use std::process::Command;

#[test]
fn recorder_depends_on_no_ui_crate() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--manifest-path",
            manifest,
            "-p",
            "memsnap-recorder",
        ])
        .args(["--all-features", "-e", "normal,build", "--prefix", "none"])
        .output()
        .expect("running cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        tree.contains("memsnap-format"),
        "unexpected cargo tree output:\n{tree}"
    );
    for line in tree.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        for banned in ["egui", "eframe", "wgpu", "winit"] {
            assert!(
                !(name == banned
                    || name.starts_with(&format!("{banned}-"))
                    || name.starts_with(&format!("{banned}_"))),
                "the recorder depends on {name}"
            );
        }
    }
}
