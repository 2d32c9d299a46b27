//! pprof heap profile (`profile.proto`, gzipped) of the memory live at an instant and of every
//! allocation in the recorded window.
//!
//! The layout is Go's heap profile, so `go tool pprof`, speedscope and the other pprof
//! readers show it as they show a Go program's memory:
//!
//! | sample type | value |
//! |---|---|
//! | `inuse_objects`/`count`, `inuse_space`/`bytes` (the default) | blocks live at the instant [`crate::profile`] picks, and their requested bytes |
//! | `alloc_objects`/`count`, `alloc_space`/`bytes` | every allocation of the device's recorded window (and those live from before it), freed or not |
//!
//! One sample per stack, block size, stream and category; each carries the labels `bytes`
//! (the block's requested size, `num_unit` `bytes`), `device`, `stream` and `category`
//! (parameter, optimizer_state, gradient, activation, temporary, unknown: from the steps'
//! phases, as `memsnap summary` reports them). Locations are listed leaf first, one per
//! distinct function and line; functions are one per name and file (`system_name` keeps a
//! native frame's full signature, `name` drops its argument list). There are no mappings
//! (the frames are source lines, not addresses). `time_nanos` is the instant, in epoch ns;
//! `duration_nanos` the window; the comments say which device and instant.
//!
//! [`proto`] holds the message types (hand-written `prost` derives of google/pprof's
//! `proto/profile.proto`, no `protoc`), so a program can decode what [`encode`] writes:
//!
//! ```
//! use memsnap_converters::pprof::{self, proto};
//! use memsnap_converters::profile::{LiveProfile, ProfileOptions};
//! use memsnap_format::{Action, Snapshot, TraceEntry};
//! use prost::Message;
//! use std::io::Read;
//!
//! let mut snapshot = Snapshot::new(1);
//! snapshot.device_traces.as_mut().unwrap()[0].push(TraceEntry::new(Action::Alloc, 0x1000, 4096, 0));
//! let live = LiveProfile::select(&snapshot, &ProfileOptions::default())?;
//! let gzipped = pprof::encode(&live)?;
//!
//! let mut bytes = Vec::new();
//! flate2::read::GzDecoder::new(&gzipped[..]).read_to_end(&mut bytes)?;
//! let profile = proto::Profile::decode(&bytes[..])?;
//! assert_eq!(profile.string_table[0], "");
//! let inuse_space: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
//! assert_eq!(inuse_space, 4096);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::io::Write;

use memsnap_analysis::categories::Category;
use memsnap_analysis::sites::symbol_without_arguments;
use memsnap_format::FrameId;

use crate::profile::{LiveProfile, ProfileError};

/// google/pprof `proto/profile.proto`, the fields memsnap writes and reads (every field of
/// the messages, so decoding another tool's profile loses nothing it uses).
pub mod proto {
    /// A profile: samples over locations and functions, every string in `string_table`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// `string_table[0]` is always `""`.
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        /// String indices.
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        /// String index of the sample type a viewer shows first.
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
        #[prost(int64, tag = "15")]
        pub doc_url: i64,
    }

    /// A sample type or the period type: string indices of its name and unit.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// Values (one per sample type) for a stack, leaf first.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A string (`str`) or numeric (`num`, `num_unit`) label; `key` etc. are string indices.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// A binary mapped into the profiled process (memsnap writes none).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// A place in the code: its lines (the last is the caller of the ones before).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    /// A function and line of a location.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    /// A function: string indices of its names and file.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Index of each value in [`proto::Sample::value`].
pub const INUSE_OBJECTS: usize = 0;
pub const INUSE_SPACE: usize = 1;
pub const ALLOC_OBJECTS: usize = 2;
pub const ALLOC_SPACE: usize = 3;

/// The profile, gzipped, as `go tool pprof` reads it.
pub fn encode(live: &LiveProfile<'_>) -> Result<Vec<u8>, ProfileError> {
    let bytes = prost::Message::encode_to_vec(&profile(live));
    let fail = |e: std::io::Error| ProfileError::Compress {
        what: e.to_string(),
    };
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&bytes).map_err(fail)?;
    gzip.finish().map_err(fail)
}

/// Reads a profile [`encode`] (or another tool) wrote: gzipped or not.
pub fn decode(bytes: &[u8]) -> Result<proto::Profile, ProfileError> {
    let mut raw = Vec::new();
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut raw).map_err(
            |e| ProfileError::Decode {
                what: format!("gzip: {e}"),
            },
        )?;
        &raw[..]
    } else {
        bytes
    };
    <proto::Profile as prost::Message>::decode(bytes).map_err(|e| ProfileError::Decode {
        what: e.to_string(),
    })
}

/// The profile message (see the module docs).
pub fn profile(live: &LiveProfile<'_>) -> proto::Profile {
    let mut b = Builder::default();
    b.string(""); // string_table[0] must be "".
    let sample_type = [
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
    ]
    .map(|(name, unit)| proto::ValueType {
        r#type: b.string(name),
        unit: b.string(unit),
    });
    let default_sample_type = sample_type[INUSE_SPACE].r#type;
    let period_type = proto::ValueType {
        r#type: b.string("space"),
        unit: b.string("bytes"),
    };
    let keys = LabelKeys {
        bytes: b.string("bytes"),
        device: b.string("device"),
        stream: b.string("stream"),
        category: b.string("category"),
    };

    let allocations = live.all_allocations();
    let mut is_live = vec![false; allocations.len()];
    for id in &live.allocations {
        if let Some(flag) = is_live.get_mut(id.0 as usize) {
            *flag = true;
        }
    }
    let categories = live.categories();
    let device = live.device.map(|d| b.string(&d.to_string())).unwrap_or(0);
    let mut samples: HashMap<SampleKey, [i64; 4]> = HashMap::new();
    let mut stacks: HashMap<Option<memsnap_format::StackId>, Vec<u64>> = HashMap::new();
    for (i, a) in allocations.iter().enumerate() {
        if a.size < live.options.min_size {
            continue;
        }
        // Memory from before the window without frames has its own label, so the cache
        // key is the stack and the origin.
        let locations = if a.before_window() {
            b.locations(live, a)
        } else {
            match stacks.get(&a.stack) {
                Some(ids) => ids.clone(),
                None => {
                    let ids = b.locations(live, a);
                    stacks.insert(a.stack, ids.clone());
                    ids
                }
            }
        };
        let category = categories.get(i).copied().unwrap_or(Category::Unknown);
        let key = SampleKey {
            locations,
            size: a.size,
            stream: a.stream,
            category,
        };
        let size = i64::try_from(a.size).unwrap_or(i64::MAX);
        let values = samples.entry(key).or_default();
        if is_live[i] {
            values[INUSE_OBJECTS] += 1;
            values[INUSE_SPACE] = values[INUSE_SPACE].saturating_add(size);
        }
        values[ALLOC_OBJECTS] += 1;
        values[ALLOC_SPACE] = values[ALLOC_SPACE].saturating_add(size);
    }
    let mut samples: Vec<(SampleKey, [i64; 4])> = samples.into_iter().collect();
    // Biggest in use first, then biggest allocated: a stable file for the same input.
    samples.sort_by(|(ka, va), (kb, vb)| {
        (vb[INUSE_SPACE], vb[ALLOC_SPACE])
            .cmp(&(va[INUSE_SPACE], va[ALLOC_SPACE]))
            .then_with(|| ka.cmp(kb))
    });
    let sample = samples
        .into_iter()
        .map(|(key, values)| {
            let mut label = vec![proto::Label {
                key: keys.bytes,
                num: i64::try_from(key.size).unwrap_or(i64::MAX),
                num_unit: keys.bytes,
                ..Default::default()
            }];
            if device != 0 {
                label.push(proto::Label {
                    key: keys.device,
                    str: device,
                    ..Default::default()
                });
            }
            label.push(proto::Label {
                key: keys.stream,
                str: b.string(&key.stream.to_string()),
                ..Default::default()
            });
            label.push(proto::Label {
                key: keys.category,
                str: b.string(key.category.name()),
                ..Default::default()
            });
            proto::Sample {
                location_id: key.locations,
                value: values.to_vec(),
                label,
            }
        })
        .collect();

    let mut comment = vec![b.string(&format!(
        "memsnap export: live memory {}",
        live.describe_instant()
    ))];
    comment.push(b.string(&live.describe()));
    comment.push(b.string(
        "inuse_*: blocks live at that instant; alloc_*: every allocation of the recorded window",
    ));
    let time_nanos = live.time_us.map_or(0, |t| t.saturating_mul(1000));
    let duration_nanos = live.time_span().map_or(0, |(first, last)| {
        last.saturating_sub(first).max(0).saturating_mul(1000)
    });
    proto::Profile {
        sample_type: sample_type.to_vec(),
        sample,
        mapping: Vec::new(),
        location: b.location,
        function: b.function,
        string_table: b.strings,
        time_nanos,
        duration_nanos,
        period_type: Some(period_type),
        period: 1,
        comment,
        default_sample_type,
        ..Default::default()
    }
}

struct LabelKeys {
    bytes: i64,
    device: i64,
    stream: i64,
    category: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct SampleKey {
    locations: Vec<u64>,
    size: u64,
    stream: i64,
    category: Category,
}

/// The string, function and location tables, interned.
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    function: Vec<proto::Function>,
    /// (name, filename) -> function id.
    function_ids: HashMap<(i64, i64), u64>,
    location: Vec<proto::Location>,
    /// (function id, line) -> location id.
    location_ids: HashMap<(u64, i64), u64>,
    /// Frame -> location id.
    frame_locations: HashMap<FrameId, u64>,
}

impl Builder {
    fn string(&mut self, text: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(text) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(text.to_string());
        self.string_ids.insert(text.to_string(), id);
        id
    }

    fn function(&mut self, name: &str, system_name: &str, filename: &str) -> u64 {
        let key = (self.string(name), self.string(filename));
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.function.len() as u64 + 1;
        let system_name = self.string(system_name);
        self.function.push(proto::Function {
            id,
            name: key.0,
            system_name,
            filename: key.1,
            start_line: 0,
        });
        self.function_ids.insert(key, id);
        id
    }

    fn location(&mut self, function_id: u64, line: i64) -> u64 {
        if let Some(&id) = self.location_ids.get(&(function_id, line)) {
            return id;
        }
        let id = self.location.len() as u64 + 1;
        self.location.push(proto::Location {
            id,
            line: vec![proto::Line {
                function_id,
                line,
                column: 0,
            }],
            ..Default::default()
        });
        self.location_ids.insert((function_id, line), id);
        id
    }

    /// An allocation's locations, leaf first.
    fn locations(
        &mut self,
        live: &LiveProfile<'_>,
        allocation: &memsnap_analysis::Allocation,
    ) -> Vec<u64> {
        let frames = live.frames_of(allocation);
        if frames.is_empty() {
            let function = self.function(live.no_frames_label(allocation), "", "");
            return vec![self.location(function, 0)];
        }
        frames
            .iter()
            .rev()
            .map(|&frame| {
                if let Some(&id) = self.frame_locations.get(&frame) {
                    return id;
                }
                let f = live.snapshot.frames.get(frame);
                let native = !f.filename.ends_with(".py");
                let name = if native {
                    symbol_without_arguments(&f.name)
                } else {
                    f.name.as_str()
                };
                let filename = match f.filename.as_str() {
                    "??" => "",
                    other => other,
                };
                let function = self.function(name, &f.name, filename);
                let id = self.location(function, f.line.as_i64().unwrap_or(0));
                self.frame_locations.insert(frame, id);
                id
            })
            .collect()
    }
}
