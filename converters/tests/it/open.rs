use std::path::Path;

use memsnap_converters::{ConvertError, Failure, OpenOptions, Source};
use memsnap_format::pickle::Part;
use memsnap_format::{io::encode, Format, Snapshot};

#[test]
fn own_formats_open_through_the_converters() {
    let snapshot = Snapshot::default();
    for format in [Format::Pickle, Format::Msgpack, Format::Json] {
        let bytes = encode(&snapshot, format).unwrap();
        let import = OpenOptions::new()
            .open_bytes(&bytes, Path::new("<input>"))
            .unwrap();
        let (opened, source) = (import.snapshot, import.source);
        assert_eq!(opened.segments.len(), snapshot.segments.len());
        assert_eq!(
            opened.device_traces.is_some(),
            snapshot.device_traces.is_some()
        );
        assert!(matches!(source, Source::Snapshot(d) if d.format == format));
    }
}

/// A snapshot with one allocation on device 0, as a pickle.
fn one_alloc_pickle() -> Vec<u8> {
    let mut snapshot = Snapshot::new(1);
    snapshot.segments.push(memsnap_format::Segment::new(
        0,
        0x7f00_0000_0000,
        2 << 20,
        0,
    ));
    encode(&snapshot, Format::Pickle).unwrap()
}

/// Opening a file reports its progress to the end whatever the input (the viewer's bar
/// reached the end only for pickles when it opened imports its own way).
#[test]
fn progress_reaches_the_end_for_imports_and_own_formats_alike() {
    let dir = tempfile::tempdir().unwrap();
    let trace = br#"{"traceEvents": [
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 100,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 1024,
                  "Total Allocated": 1024, "Total Reserved": 2097152}}]}"#;
    for (name, bytes) in [
        ("prof.json", trace.to_vec()),
        ("snap.pickle", one_alloc_pickle()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let mut last = None;
        OpenOptions::new()
            .progress(|done, total| {
                last = Some((done, total));
                true
            })
            .open(&path)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let len = bytes.len() as u64;
        assert_eq!(last, Some((len, len)), "{name}");
    }
}

/// A progress callback that says stop is a cancel, not a decode error, for every caller.
#[test]
fn a_progress_callback_that_says_stop_is_a_cancelled_failure() {
    let err = OpenOptions::new()
        .progress(|_, _| false)
        .open_bytes(&one_alloc_pickle(), Path::new("snap.pickle"))
        .expect_err("cancelled");
    assert!(matches!(err.failure(), Failure::Cancelled), "{err:?}");
}

/// Which kind a failed open is, decided once for the command line and the viewer: a missing
/// file is unreadable (the I/O error without the path), garbage is undecodable, and a trace
/// that cannot be imported names its file already.
#[test]
fn a_failed_open_says_once_which_kind_of_failure_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pickle");
    let err = OpenOptions::new().open(&missing).expect_err("missing");
    match err.failure() {
        Failure::Read { path, source } => {
            assert_eq!(path, missing);
            assert!(!source.to_string().contains("missing.pickle"), "{source}");
        }
        other => panic!("expected a read failure, got {other:?}"),
    }
    let err = OpenOptions::new()
        .open_bytes(b"hello", Path::new("junk.bin"))
        .expect_err("garbage");
    assert!(matches!(err.failure(), Failure::Decode), "{err:?}");
    let kernels =
        br#"{"traceEvents": [{"ph": "X", "name": "gemm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}"#;
    let err = OpenOptions::new()
        .open_bytes(kernels, Path::new("kernels.json"))
        .expect_err("no memory events");
    assert!(matches!(err.failure(), Failure::Import), "{err:?}");
    assert!(err.to_string().starts_with("kernels.json: "), "{err}");
    assert!(!err.reason().contains("kernels.json"), "{}", err.reason());
}

/// Only the segments of an uncompressed pickle are read when only they are asked for, from
/// a file and from bytes; validation refuses what `memsnap validate` refuses.
#[test]
fn segments_only_and_validation_are_options_of_the_one_open() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = one_alloc_pickle();
    let path = dir.path().join("snap.pickle");
    std::fs::write(&path, &bytes).unwrap();
    let from_file = OpenOptions::new().part(Part::Segments).open(&path).unwrap();
    let from_bytes = OpenOptions::new()
        .part(Part::Segments)
        .open_bytes(&bytes, &path)
        .unwrap();
    for import in [from_file, from_bytes] {
        assert_eq!(import.snapshot.segments.len(), 1);
        assert!(
            import.snapshot.device_traces.is_none(),
            "the trace was not read"
        );
    }
    let mut broken = Snapshot::new(1);
    let mut segment = memsnap_format::Segment::new(0, 0x7f00_0000_0000, 2 << 20, 0);
    // Allocated bytes that no block holds.
    segment.allocated_size = Some(512);
    broken.segments.push(segment);
    let bytes = encode(&broken, Format::Pickle).unwrap();
    let err = OpenOptions::new()
        .validate(true)
        .open_bytes(&bytes, Path::new("broken.pickle"))
        .expect_err("invalid");
    assert!(matches!(err, ConvertError::Invalid { .. }), "{err:?}");
    assert!(OpenOptions::new()
        .open_bytes(&bytes, Path::new("broken.pickle"))
        .is_ok());
}
