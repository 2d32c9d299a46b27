//! `recorder-ffi/python/test_memsnap_ctypes.py`: the library loaded into python3 through ctypes
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

/// A program that only calls the allocator's two functions, configured by the environment:
/// the simulated backend (no GPU), a dump on SIGUSR1 and one at exit.
const ZERO_CODE_PROGRAM: &str = r#"
import ctypes, os, signal, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.memsnap_alloc.restype = ctypes.c_void_p
lib.memsnap_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.memsnap_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
kept = [lib.memsnap_alloc(1 << 20, 0, None) for _ in range(3)]
assert all(kept), "simulated allocations failed"
path = os.environ["MEMSNAP_DUMP"]
os.kill(os.getpid(), signal.SIGUSR1)
deadline = time.time() + 30
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.05)
assert os.path.exists(path), "no dump after SIGUSR1"
os.rename(path, path + ".sigusr1")
lib.memsnap_free(kept.pop(), 1 << 20, 0, None)
"#;

#[test]
fn the_environment_alone_configures_a_simulated_run_with_sigusr1_and_exit_dumps() {
    if !have_program("python3", "the zero-code environment test") {
        return;
    }
    let library = built_library("libmemsnap_recorder.so");
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("env.pickle");
    let run = Command::new("python3")
        .arg("-c")
        .arg(ZERO_CODE_PROGRAM)
        .arg(&library)
        .env("MEMSNAP_BACKEND", "simulated")
        .env("MEMSNAP_DUMP", &dump)
        .env("MEMSNAP_DUMP_ON_SIGUSR1", "1")
        .env("MEMSNAP_STACKS", "native")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let count = |path: &Path, action: memsnap_format::Action| {
        let (snapshot, _) = memsnap_format::read_path(path).unwrap();
        assert_eq!(validate(&snapshot), vec![]);
        snapshot.traces()[0]
            .iter()
            .filter(|e| e.action == action)
            .count()
    };
    let on_signal = dump.with_extension("pickle.sigusr1");
    assert_eq!(count(&on_signal, memsnap_format::Action::Alloc), 3);
    assert_eq!(count(&on_signal, memsnap_format::Action::FreeRequested), 0);
    assert_eq!(count(&dump, memsnap_format::Action::Alloc), 3);
    assert_eq!(
        count(&dump, memsnap_format::Action::FreeRequested),
        1,
        "the exit dump comes last"
    );
}

/// Allocates through `ctypes.CDLL`, which releases the GIL around the call as PyTorch's
/// operators do, and returns the function names of the allocation's frames.
fn frames_of_an_allocation_made_without_the_gil(gil_policy: Option<&str>) -> Vec<String> {
    const SCRIPT: &str = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.memsnap_alloc.restype = ctypes.c_void_p
lib.memsnap_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.memsnap_record_history.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_size_t]
lib.memsnap_dump_snapshot.argtypes = [ctypes.c_char_p]
assert lib.memsnap_record_history(b"all", b"all", b"python", 1000) == 0
def operator_that_released_the_gil():
    return lib.memsnap_alloc(1 << 20, 0, None)
assert operator_that_released_the_gil()
assert lib.memsnap_dump_snapshot(sys.argv[2].encode()) == 0
"#;
    let dir = tempfile::tempdir().unwrap();
    let snapshot_path = dir.path().join("gil.pickle");
    let mut command = Command::new("python3");
    command
        .arg("-c")
        .arg(SCRIPT)
        .arg(built_library("libmemsnap_recorder.so"))
        .arg(&snapshot_path)
        .env("MEMSNAP_BACKEND", "host")
        .env_remove("MEMSNAP_DUMP")
        .env_remove("MEMSNAP_PYTHON_GIL");
    if let Some(policy) = gil_policy {
        command.env("MEMSNAP_PYTHON_GIL", policy);
    }
    let run = command.output().unwrap();
    assert!(
        run.status.success(),
        "the script failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (snapshot, _) = memsnap_format::read_path(&snapshot_path).unwrap();
    let stacks = alloc_frames(&snapshot);
    assert_eq!(stacks.len(), 1);
    stacks[0].iter().map(|(name, _, _)| name.clone()).collect()
}

/// Regression: on an H100 with torch 2.11 no allocation had Python frames, because they were
/// read only when the GIL was already held and PyTorch releases it inside its operators.
#[test]
fn python_frames_are_read_when_the_caller_released_the_gil() {
    if !have_program("python3", "the Python GIL test") {
        return;
    }
    let taken = frames_of_an_allocation_made_without_the_gil(None);
    assert!(
        taken.iter().any(|n| n == "operator_that_released_the_gil"),
        "{taken:?}"
    );
    let held_only = frames_of_an_allocation_made_without_the_gil(Some("held"));
    assert!(
        !held_only
            .iter()
            .any(|n| n == "operator_that_released_the_gil"),
        "{held_only:?}"
    );
}
