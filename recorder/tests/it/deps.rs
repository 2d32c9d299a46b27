//! The recorder and its C ABI are loaded into training processes: they must never pull in UI
//! crates.

use std::process::Command;

/// The packages that end up inside a training process: the library and the shim over it.
const IN_PROCESS: [&str; 2] = ["memsnap-recorder", "memsnap-recorder-ffi"];

/// `cargo tree` of `package` with every feature on: one crate name per line.
fn dependency_tree(package: &str) -> String {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--manifest-path", manifest, "-p", package])
        .args(["--all-features", "-e", "normal,build", "--prefix", "none"])
        .output()
        .expect("running cargo tree");
    assert!(
        output.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn recorder_depends_on_no_ui_crate() {
    for package in IN_PROCESS {
        let tree = dependency_tree(package);
        assert!(
            tree.contains("memsnap-format"),
            "unexpected cargo tree output for {package}:\n{tree}"
        );
        for line in tree.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            for banned in ["egui", "eframe", "wgpu", "winit"] {
                assert!(
                    !(name == banned
                        || name.starts_with(&format!("{banned}-"))
                        || name.starts_with(&format!("{banned}_"))),
                    "{package} depends on {name}"
                );
            }
        }
    }
}
