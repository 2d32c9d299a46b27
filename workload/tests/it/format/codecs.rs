//! Codec agreement: every snapshot, pushed through pickle, msgpack and JSON in every order,
//! must come back equal by value (`compare::diff`), and each writer must be stable (writing
//! what it read gives the same bytes). Also compression wrappers, format detection, and
//! hostile JSON and msgpack input.

use std::path::Path;

use memsnap_format::compare::diff;
use memsnap_format::io::{self, Compression, Format};
use memsnap_format::{json, msgpack, pickle, FormatError, Snapshot, Value};
use memsnap_workload::{generate, TrainingRun};

use super::common;

const CODECS: [Format; 3] = [Format::Pickle, Format::Msgpack, Format::Json];

fn encode(snapshot: &Snapshot, format: Format) -> Vec<u8> {
    io::encode(snapshot, format).unwrap_or_else(|e| panic!("encoding {}: {e}", format.name()))
}

fn decode(bytes: &[u8], format: Format) -> Result<Snapshot, FormatError> {
    match format {
        Format::Pickle => pickle::read(bytes),
        Format::Msgpack => msgpack::read(bytes),
        Format::Json => json::read(bytes),
    }
}

/// The six orders of the three codecs, each ending where it started
/// (e.g. pickle → json → msgpack → pickle).
fn permutations() -> Vec<Vec<Format>> {
    let mut out = Vec::new();
    for a in CODECS {
        for b in CODECS.into_iter().filter(|&b| b != a) {
            for c in CODECS.into_iter().filter(|&c| c != a && c != b) {
                out.push(vec![a, b, c, a]);
            }
        }
    }
    out
}

/// A snapshot reached along some chain, with its encodings once made.
struct State {
    snapshot: Snapshot,
    encoded: [Option<Vec<u8>>; 3],
    /// The format and bytes it was decoded from (`None` for the original).
    source: Option<(Format, usize)>,
}

fn slot(format: Format) -> usize {
    CODECS.iter().position(|&f| f == format).unwrap()
}

/// Runs `original` through every chain of codecs and checks each hop against it.
///
/// Encoding and decoding are functions of their input, so the chains are walked as a graph:
/// each distinct snapshot is encoded once per format, and bytes already decoded lead to the
/// state they decoded to. Most chains meet in a few states, which keeps this fast on the
/// multi-megabyte real files while every hop of every order is still checked.
fn check_all_chains(name: &str, original: &Snapshot) {
    let mut states = vec![State {
        snapshot: original.clone(),
        encoded: [None, None, None],
        source: None,
    }];
    for chain in permutations() {
        let mut at = 0;
        let mut route = String::from("start");
        for format in chain {
            route.push_str(" → ");
            route.push_str(format.name());
            let k = slot(format);
            if states[at].encoded[k].is_none() {
                states[at].encoded[k] = Some(encode(&states[at].snapshot, format));
            }
            let bytes = states[at].encoded[k].as_ref().unwrap();
            let known = states.iter().position(|s| {
                s.source.is_some_and(|(f, from)| {
                    f == format && states[from].encoded[k].as_ref() == Some(bytes)
                })
            });
            if let Some(next) = known {
                at = next;
                continue;
            }
            let decoded = decode(bytes, format)
                .unwrap_or_else(|e| panic!("{name}: {route}: decoding failed: {e}"));
            if let Some(d) = diff(original, &decoded) {
                panic!("{name}: {route}: {d}");
            }
            // The writer is stable: writing what was just read gives the same bytes.
            let again = encode(&decoded, format);
            assert!(
                &again == bytes,
                "{name}: {route}: re-encoding changed the bytes"
            );
            let mut encoded = [None, None, None];
            encoded[k] = Some(again);
            states.push(State {
                snapshot: decoded,
                encoded,
                source: Some((format, at)),
            });
            at = states.len() - 1;
        }
    }
}

fn generated_runs() -> Vec<(String, TrainingRun)> {
    let base = TrainingRun::default();
    vec![
        ("default".into(), base.clone()),
        (
            "2 devices, ring buffer, leak".into(),
            TrainingRun {
                devices: 2,
                steps: 6,
                max_entries: Some(400),
                leak_bytes_per_step: 1 << 20,
                seed: 7,
                ..base.clone()
            },
        ),
        (
            "2.1 era without time".into(),
            TrainingRun {
                with_time: false,
                optimizer: false,
                stack_pool: 200,
                seed: 3,
                ..base
            },
        ),
    ]
}

#[test]
fn generated_snapshots_agree_across_codecs() {
    for (name, run) in generated_runs() {
        let (snapshot, _) = generate(&run);
        check_all_chains(&name, &snapshot);
    }
}

#[test]
fn unusual_model_content_agrees_across_codecs() {
    let (mut snapshot, _) = generate(&TrainingRun::default());
    // Extras of every value type, recorder extras, frame extras and legacy key orders.
    snapshot.extra = vec![
        ("none".into(), Value::None),
        (
            "mixed".into(),
            Value::List(vec![
                Value::Bool(true),
                Value::Int(i64::MIN),
                Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
                Value::Float(-0.0),
                Value::Float(1e300),
                Value::Str("ünï\"code\n".into()),
                Value::Bytes(vec![0, 1, 254, 255]),
                Value::Tuple(vec![Value::Int(1), Value::Int(2)]),
                Value::Dict(vec![(Value::Int(7), Value::Str("int key".into()))]),
            ]),
        ),
    ];
    let info = snapshot.recorder_info.as_mut().unwrap();
    info.extra.push(("note".into(), Value::Str("kept".into())));
    let mut fx = memsnap_format::Frame::new("forward", "/fx/graph.py", 3);
    fx.extra
        .push(("fx_node_op".into(), Value::Str("call_function".into())));
    let stack = snapshot.intern_stack([fx]);
    let trace = &mut snapshot.device_traces.as_mut().unwrap()[0];
    trace[0].frames = Some(stack);
    let rare = trace[1].rare_mut();
    rare.legacy_frames_first = true;
    rare.extra.push((
        "cpp_frames".into(),
        Value::List(vec![Value::Str("c10::foo".into())]),
    ));
    let oom = &mut trace[2];
    oom.action = memsnap_format::Action::Oom;
    oom.addr = 0;
    oom.rare_mut().no_addr = true;
    oom.rare_mut().device_free = Some(123_456);
    oom.rare_mut().internal_metadata = Some(snapshot.strings.intern("mallocWithAddress"));
    let unknown = snapshot.strings.intern("future_action");
    snapshot.device_traces.as_mut().unwrap()[0][3].set_other_action(unknown);
    let seg = &mut snapshot.segments[0];
    seg.frames_after_blocks = !seg.frames_after_blocks;
    seg.extra.push((
        "pool".into(),
        Value::Tuple(vec![Value::Int(0), Value::Int(1)]),
    ));
    seg.blocks[0].forward_frames = Some(vec!["line one\n".into(), "line two".into()]);
    snapshot.host_traces = Some(Value::List(vec![]));
    check_all_chains("unusual content", &snapshot);

    let mut list_shaped = snapshot.clone();
    list_shaped.shape = memsnap_format::Shape::SegmentList;
    list_shaped.device_traces = None;
    list_shaped.allocator_settings = None;
    list_shaped.external_annotations = None;
    list_shaped.host_traces = None;
    list_shaped.recorder_info = None;
    list_shaped.extra.clear();
    check_all_chains("segment list", &list_shaped);
}

/// A trace entry keeps `compile_context` / `user_metadata` defaults as flags and the rest in
/// its rare part, and stores an absent `time_us` as `i64::MIN`: a file where every entry has
/// its own strings, and one whose `time_us` really is `i64::MIN`, must still round-trip.
#[test]
fn own_entry_strings_and_the_time_sentinel_agree_across_codecs() {
    let (mut snapshot, _) = generate(&TrainingRun {
        steps: 2,
        ..TrainingRun::default()
    });
    let mut trace = snapshot.device_traces.as_mut().unwrap().remove(0);
    let strings = &mut snapshot.strings;
    for (i, e) in trace.iter_mut().enumerate() {
        let context = match i % 4 {
            0 => None,
            1 => Some(strings.intern("N/A")),
            _ => Some(strings.intern(&format!("context {i}"))),
        };
        let metadata = match i % 3 {
            0 => Some(strings.intern("")),
            1 => None,
            _ => Some(strings.intern(&format!("metadata {i}"))),
        };
        e.set_compile_context(context, strings);
        e.set_user_metadata(metadata, strings);
        match i % 5 {
            0 => e.set_time_us(Some(i64::MIN)),
            1 => e.set_time_us(None),
            _ => {}
        }
    }
    assert_eq!(trace[0].time_us(), Some(i64::MIN));
    assert_eq!(trace[1].time_us(), None);
    assert_eq!(
        snapshot.str(trace[2].compile_context(&snapshot.strings).unwrap()),
        "context 2"
    );
    assert_eq!(
        snapshot.str(trace[5].compile_context(&snapshot.strings).unwrap()),
        "N/A"
    );
    assert_eq!(trace[4].compile_context(&snapshot.strings), None);
    snapshot.device_traces.as_mut().unwrap().insert(0, trace);
    check_all_chains("own entry strings", &snapshot);
}

#[test]
fn real_snapshots_agree_across_codecs() {
    let Some(files) = common::real_snapshots() else {
        return;
    };
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let snapshot = pickle::read(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_all_chains(&name, &snapshot);
    }
}

#[test]
fn compression_and_detection_through_files() {
    let (snapshot, _) = generate(&TrainingRun::default());
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("s.pickle", Format::Pickle, Compression::None),
        ("s.pkl.gz", Format::Pickle, Compression::Gzip),
        ("s.json", Format::Json, Compression::None),
        ("s.json.zst", Format::Json, Compression::Zstd),
        ("s.msgpack", Format::Msgpack, Compression::None),
        ("s.mpk.gz", Format::Msgpack, Compression::Gzip),
        ("s.memsnap.zst", Format::Msgpack, Compression::Zstd),
    ];
    for (file, format, compression) in cases {
        let path = dir.path().join(file);
        assert_eq!(Format::from_path(&path), Some(format), "{file}");
        assert_eq!(Compression::from_path(&path), compression, "{file}");
        let written = io::write_path(&path, &snapshot, None).unwrap();
        assert_eq!(written, format, "{file}");
        let (back, detected) = io::read_path(&path).unwrap();
        assert_eq!(detected.format, format, "{file}");
        assert_eq!(detected.compression, compression, "{file}");
        assert_eq!(diff(&snapshot, &back), None, "{file}");
    }
    // The content decides, not the name: JSON bytes under a .pickle name still read as JSON.
    let path = dir.path().join("misnamed.pickle");
    io::write_path(&path, &snapshot, Some(Format::Json)).unwrap();
    let (back, detected) = io::read_path(&path).unwrap();
    assert_eq!(detected.format, Format::Json);
    assert_eq!(diff(&snapshot, &back), None);
    assert_eq!(Format::from_path(Path::new("x.txt")), None);
}

#[test]
fn detection_from_content() {
    let (snapshot, _) = generate(&TrainingRun::default());
    for format in CODECS {
        let bytes = encode(&snapshot, format);
        assert_eq!(Format::detect(&bytes), Some(format), "{}", format.name());
    }
    assert!(msgpack::looks_like(&encode(&snapshot, Format::Msgpack)));
    assert!(!msgpack::looks_like(&encode(&snapshot, Format::Pickle)));
    assert_eq!(
        Format::detect(b"  \n{\"segments\": []}"),
        Some(Format::Json)
    );
    assert_eq!(Format::detect(b"hello"), None);
    let err = io::read_bytes(b"hello").unwrap_err();
    assert!(err.to_string().contains("68 65 6c 6c 6f"), "{err}");
}

#[test]
fn json_is_plain_json_with_the_pickle_schema() {
    let (snapshot, _) = generate(&TrainingRun::default());
    let bytes = json::to_vec(&snapshot).unwrap();
    // Any JSON parser (the browser's JSON.parse included) reads it.
    let parsed: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let entry = &parsed["device_traces"][0][0];
    assert_eq!(entry["action"], "segment_alloc");
    assert_eq!(entry["compile_context"], "N/A");
    assert!(entry["frames"][0]["filename"].is_string());
    assert!(parsed["segments"][0]["segment_pool_id"].is_array());
    assert_eq!(
        parsed["allocator_settings"]["garbage_collection_threshold"],
        0.0
    );
    // Keys in PyTorch's order.
    let text = std::str::from_utf8(&bytes).unwrap();
    let first = text.find("{\"action\"").unwrap();
    let entry_text = &text[first..first + text[first..].find("\"frames\"").unwrap()];
    let order: Vec<usize> = [
        "\"action\"",
        "\"addr\"",
        "\"size\"",
        "\"stream\"",
        "\"time_us\"",
        "\"compile_context\"",
        "\"user_metadata\"",
    ]
    .iter()
    .map(|k| entry_text.find(k).unwrap())
    .collect();
    assert!(order.windows(2).all(|p| p[0] < p[1]), "{entry_text}");
}

/// Every prefix of a valid file and many corrupted copies must give an error or a snapshot,
/// never a panic.
fn survives_corruption(bytes: &[u8], read: fn(&[u8]) -> Result<Snapshot, FormatError>) {
    for len in (0..bytes.len()).step_by((bytes.len() / 300).max(1)) {
        assert!(
            read(&bytes[..len]).is_err(),
            "prefix of {len} bytes accepted"
        );
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..400 {
        let mut copy = bytes.to_vec();
        for _ in 0..3 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (state >> 33) as usize % copy.len();
            copy[at] = (state >> 17) as u8;
        }
        let _ = read(&copy);
    }
}

#[test]
fn hostile_json_gives_errors_not_panics() {
    let (snapshot, _) = generate(&TrainingRun {
        steps: 1,
        ..TrainingRun::default()
    });
    survives_corruption(&json::to_vec(&snapshot).unwrap(), json::read);

    let deep = format!(
        "{{\"segments\": [], \"x\": {}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let err = json::read(deep.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("nested deeper"), "{err}");
    let long_number = format!("{{\"segments\": [], \"x\": {}}}", "9".repeat(100_000));
    let err = json::read(long_number.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("longer than"), "{err}");
    for (text, expected) in [
        ("", "expected a snapshot"),
        ("{\"segments\": [}", "segments[0]: expected an object"),
        ("{\"segments\": [{\"device\": -1}]}", "lacks key 'address'"),
        (
            "{\"segments\": [{\"device\": 0, \"address\": 1.5}]}",
            "expected an integer, found 1.5",
        ),
        (
            "{\"segments\": [], \"s\": \"\\ud800\"}",
            "unpaired surrogate",
        ),
        ("{\"segments\": [], \"s\": \"\u{1}\"}", "control character"),
        ("{\"segments\": []} trailing", "after the snapshot"),
        ("{\"device_traces\": []}", "no \"segments\" key"),
        (
            "{\"segments\": [], \"x\": {\"$tuple\": 5}}",
            "\"$tuple\" holds",
        ),
    ] {
        let err = json::read(text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
    }
    // Where: line, column and path.
    let text = "{\"segments\": [\n  {\"device\": 0, \"address\": 4096, \"total_size\": \"x\"}]}";
    match json::read(text.as_bytes()).unwrap_err() {
        FormatError::Json { line, column, what } => {
            assert_eq!((line, column), (2, 48));
            assert!(what.starts_with("segments[0].total_size:"), "{what}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn hostile_msgpack_gives_errors_not_panics() {
    let (snapshot, _) = generate(&TrainingRun {
        steps: 1,
        ..TrainingRun::default()
    });
    let bytes = msgpack::to_vec(&snapshot).unwrap();
    survives_corruption(&bytes, msgpack::read);
    let err = msgpack::read(b"\x82\xafmemsnap_msgpack\x01").unwrap_err();
    assert!(err.to_string().contains("\"snapshot\""), "{err}");
}

#[test]
fn msgpack_reports_dangling_ids_with_their_path() {
    let (mut snapshot, _) = generate(&TrainingRun {
        steps: 1,
        ..TrainingRun::default()
    });
    let stacks = snapshot.stacks.len() as u32;
    // A writer refuses a snapshot whose ids dangle...
    snapshot.device_traces.as_mut().unwrap()[0][5].frames =
        Some(memsnap_format::StackId::from_index(stacks as usize));
    let err = msgpack::to_vec(&snapshot).unwrap_err();
    assert!(
        err.to_string()
            .contains("device_traces[0][5].frames: stack id"),
        "{err}"
    );
    assert!(json::to_vec(&snapshot).is_err());
    // The reader's side is a unit test in `msgpack.rs`, which can write dangling ids.
}

/// Compressed pickles are inflated as they are decoded (issue: a 1 GB `.pickle.gz` was
/// inflated whole in memory first): every real snapshot read through `.gz` and `.zst` files
/// equals the plain read, progress counts the compressed bytes up to the file's length, and a
/// cut or corrupted compressed file is an error that names the codec, never a panic.
#[test]
fn compressed_pickles_stream_and_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut inputs: Vec<(String, Vec<u8>)> = vec![(
        "generated".into(),
        memsnap_format::pickle::to_vec(&generate(&TrainingRun::default()).0),
    )];
    if let Some(files) = common::real_snapshots() {
        inputs.extend(files.iter().map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(p).unwrap(),
            )
        }));
    }
    for (name, raw) in &inputs {
        let (plain, _) = io::read_bytes(raw).unwrap();
        for (ext, compression) in [("gz", Compression::Gzip), ("zst", Compression::Zstd)] {
            let compressed = match compression {
                Compression::Gzip => {
                    use std::io::Write;
                    let mut enc =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    enc.write_all(raw).unwrap();
                    enc.finish().unwrap()
                }
                _ => zstd::encode_all(&raw[..], 1).unwrap(),
            };
            let path = dir.path().join(format!("s.pickle.{ext}"));
            std::fs::write(&path, &compressed).unwrap();
            let mut seen = Vec::new();
            let mut progress = |done, total| {
                seen.push((done, total));
                true
            };
            let (back, detected) = io::read_path_with(&path, &mut progress, None)
                .unwrap_or_else(|e| panic!("{name}.{ext}: {e}"));
            assert_eq!(detected.format, Format::Pickle);
            assert_eq!(detected.compression, compression);
            assert_eq!(diff(&plain, &back), None, "{name}.{ext}");
            assert!(
                seen.iter()
                    .all(|&(d, t)| t == compressed.len() as u64 && d <= t),
                "{name}.{ext}: progress counts the file's bytes"
            );
            assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{name}.{ext}");
            // Cut in the middle, and with a flipped byte: errors, not panics.
            let cut = &compressed[..compressed.len() / 2];
            std::fs::write(&path, cut).unwrap();
            let err = io::read_path(&path).expect_err("a cut file");
            assert!(!err.to_string().is_empty());
            let mut flipped = compressed.clone();
            let at = flipped.len() * 2 / 3;
            flipped[at] ^= 0x5a;
            std::fs::write(&path, &flipped).unwrap();
            let _ = io::read_path(&path);
        }
    }
    // A compressed file that is not a snapshot says what it starts with.
    let path = dir.path().join("junk.gz");
    {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"hello, not a snapshot").unwrap();
        std::fs::write(&path, enc.finish().unwrap()).unwrap();
    }
    let err = io::read_path(&path).expect_err("junk");
    assert!(err.to_string().contains("starts with"), "{err}");
}

/// A writer that takes `limit` bytes, then fails.
struct FailingAfter {
    written: Vec<u8>,
    limit: usize,
}

impl std::io::Write for FailingAfter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.written.len() + buf.len() > self.limit {
            return Err(std::io::Error::other("disk full"));
        }
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn json_written_in_pieces_equals_json_built_whole_and_a_failed_write_is_an_error() {
    // Chrome exports embed the final segment state as JSON; built whole it was 1.6 GB in
    // memory for a 3M-entry run. Written in pieces it must be the same bytes.
    let (snapshot, _) = generate(&TrainingRun::default());
    let whole = json::to_vec(&snapshot).unwrap();
    assert!(
        whole.len() > 1 << 20,
        "several flushes: {} bytes",
        whole.len()
    );
    let mut pieces = Vec::new();
    json::to_writer(&snapshot, &mut pieces).unwrap();
    assert!(pieces == whole, "streamed JSON differs from the whole");
    let mut failing = FailingAfter {
        written: Vec::new(),
        limit: 1 << 19,
    };
    let err = json::to_writer(&snapshot, &mut failing).unwrap_err();
    assert!(matches!(err, FormatError::Write { .. }), "{err}");
    assert!(failing.written.len() <= 1 << 19);
}
