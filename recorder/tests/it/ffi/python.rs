//! `recorder/python/test_memsnap_ctypes.py`: the library loaded into python3 through ctypes
//! (no torch), with Python frames recorded.

use std::path::Path;
use std::process::Command;

use memsnap_format::validate;

use super::{alloc_frames, built_library, have_program};

#[derive(Debug, PartialEq)]
struct ExpectedFrame {
    filename: String,
    line: i64,
    name: String,
}

/// Reads the script's "function<TAB>line<TAB>file" lines.
fn parse_expected(text: &str) -> Vec<ExpectedFrame> {
    text.lines()
        .map(|line| {
            let mut fields = line.splitn(3, '\t');
            let (Some(name), Some(number), Some(filename)) =
                (fields.next(), fields.next(), fields.next())
            else {
                panic!("malformed expected-frame line {line:?}");
            };
            ExpectedFrame {
                filename: filename.to_owned(),
                line: number.parse().expect("a line number"),
                name: name.to_owned(),
            }
        })
        .collect()
}

#[test]
fn python_frames_of_the_calling_script_appear_in_the_snapshot() {
    if !have_program("python3", "the Python ctypes test") {
        return;
    }
    let library = built_library("libmemsnap_recorder.so");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/test_memsnap_ctypes.py");
    let dir = tempfile::tempdir().unwrap();
    let snapshot_path = dir.path().join("py.pickle");
    let expect_path = dir.path().join("expected.json");

    let run = Command::new("python3")
        .arg(&script)
        .arg("--library")
        .arg(&library)
        .arg("--out")
        .arg(&snapshot_path)
        .arg("--expect")
        .arg(&expect_path)
        .env("MEMSNAP_BACKEND", "host")
        .env_remove("MEMSNAP_DUMP")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the Python test failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );

    let expected = parse_expected(&std::fs::read_to_string(&expect_path).unwrap());
    let names: Vec<&str> = expected.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["main", "train_step", "allocate_activations"]);

    let (snapshot, _) = memsnap_format::read_path(&snapshot_path).unwrap();
    assert_eq!(validate(&snapshot), vec![]);
    let stacks = alloc_frames(&snapshot);
    assert_eq!(stacks.len(), 4, "3 activations and the kept tensor");
    let first = &stacks[0];
    // Innermost first: native frames (ctypes' call into the library; memsnap's own frames are
    // trimmed), then the script's frames spliced in where the interpreter loop was.
    let ctypes_call = first
        .iter()
        .position(|(name, _, _)| name == "_ctypes_callproc");
    let first_script = first
        .iter()
        .position(|(_, file, _)| file.ends_with("test_memsnap_ctypes.py"));
    assert!(
        matches!((ctypes_call, first_script), (Some(c), Some(p)) if c < p),
        "native frames (ctypes) should come before the Python frames: {first:?}"
    );
    assert!(
        !first
            .iter()
            .any(|(name, _, _)| name.contains("PyEval_EvalFrame")),
        "interpreter-loop frames are replaced by Python frames: {first:?}"
    );
    let script_frames: Vec<(String, String, i64)> = first
        .iter()
        .filter(|(_, file, _)| file.ends_with("test_memsnap_ctypes.py"))
        .cloned()
        .collect();
    let wanted: Vec<(String, String, i64)> = expected
        .iter()
        .rev()
        .map(|f| (f.name.clone(), f.filename.clone(), f.line))
        .collect();
    assert!(
        script_frames.starts_with(&wanted),
        "expected the script frames {wanted:?}, the snapshot has {script_frames:?}"
    );
}

#[test]
fn the_expected_frames_parser_reads_the_script_format() {
    let parsed = parse_expected("main\t12\t/a/b c.py\nf\t7\t/a/b c.py\n");
    assert_eq!(
        parsed,
        vec![
            ExpectedFrame {
                filename: "/a/b c.py".into(),
                line: 12,
                name: "main".into()
            },
            ExpectedFrame {
                filename: "/a/b c.py".into(),
                line: 7,
                name: "f".into()
            },
        ]
    );
}
