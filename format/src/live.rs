//! The live protocol: a recorder publishes its history to listeners while it records
//! (issue 26), and a listener rebuilds the snapshot as the entries arrive.
//!
//! ## Framing (protocol version [`PROTOCOL_VERSION`])
//!
//! A connection is a byte stream (a unix socket or a loopback TCP connection) from the
//! recorder to the listener; the listener never writes. The stream is a sequence of
//! **frames**: a `u32` little-endian body length `L` (at most [`MAX_FRAME_BYTES`]), then `L`
//! bytes of msgpack holding one [`Message`] (rmp-serde's encoding: an enum is a one-key map
//! `{variant: fields}`, a struct an array of its fields in order).
//!
//! The messages, in the order a recorder sends them:
//!
//! 1. [`Message::Hello`] once, first: the protocol version, the producer, the device index.
//!    A reader refuses a version it does not know rather than misreading it.
//! 2. [`Message::State`] once: the allocator's state at connect (segments with their blocks,
//!    allocator settings, annotations and the trace the ring held) as a complete memsnap
//!    msgpack snapshot ([`crate::msgpack`], read with the same checks as a file), and
//!    `next_seq`, the sequence number of the first entry that was not in it.
//! 3. Any number of [`Message::Entries`] ([`EntryBatch`]): trace entries numbered from
//!    `first_seq` with no gap, and the frames and stacks seen for the first time on this
//!    connection. Frames and stacks are **interned per connection and sent once**: a batch
//!    adds its `frames` to the connection's frame list (wire ids continue from the frames
//!    sent before), then its `stacks` (each a list of frame wire ids) to the stack list; an
//!    entry names its stack by wire id.
//! 4. [`Message::Dropped`] when the listener fell so far behind that the recorder's ring
//!    overwrote entries it had not sent yet: `missed` entries are gone and the next batch
//!    starts at `resume_seq`. The recorder never waits for a listener; this is what a slow one
//!    gets instead. Entries cleared from the recorder's history (`clear_history`) before they
//!    were sent are reported the same way; entry numbers never restart, and a clear is not
//!    replayed: the listener keeps what it received.
//! 5. [`Message::Annotations`] (since version 2): `record_function`-style annotations
//!    recorded since the last ones sent (those at connect are in the state's
//!    `external_annotations`), appended there, and `missed`, the number the recorder's
//!    annotation ring overwrote or cleared before they were sent.
//!
//! ## A listener's token (version 2)
//!
//! A recorder may be started with a token (required for a non-loopback TCP address). A
//! listener of version 2 writes one frame right after it connects, [`Message::Token`] with
//! the token it was given (empty when none); the recorder sends `Hello` first in any case,
//! then, when it has a token, reads that frame (at most [`MAX_TOKEN_FRAME_BYTES`], within a
//! few seconds), compares it in constant time and, when it is missing or wrong, sends
//! [`Message::Refused`] with the reason and closes instead of sending `State`. A recorder
//! without a token never reads what listeners write. The token travels in clear: it keeps
//! other users of a network out, it does not encrypt (tunnel over ssh where that matters).
//!
//! Versions: 1 had no `Annotations`, `Token` or `Refused`; 2 added them. A reader of
//! version 1 meets a version-2 `Hello` first and stops with "unsupported live protocol
//! version 2", never misreading the messages after it.
//!
//! ## What a reader refuses
//!
//! [`FrameReader`] and [`LiveSnapshot`] treat the stream as untrusted input, like a file:
//! a frame longer than [`MAX_FRAME_BYTES`] (before reading its body), a body that is not
//! one whole message, a first message that is not `Hello`, an unknown protocol version, a
//! second `Hello` or `State`, entries or annotations before `State`, a `Token` (listeners
//! send it), a batch whose `first_seq` is not the next expected entry, an unknown action
//! tag, a stack naming a frame that was not sent, an entry naming a stack that was not
//! sent, and a `Dropped` that does not move forward; a `Refused` ends the stream with the
//! recorder's reason. Each is a [`LiveError`] saying what was wrong; nothing panics, and
//! memory is bounded by the frame size plus what the messages add to the snapshot.

use serde::{Deserialize, Serialize};

use crate::intern::{Frame, StackId};
use crate::live_segments::{Change, SegmentModel};
use crate::model::{Action, Annotation, Snapshot, TraceEntry};
use crate::Value;

/// The version this code writes and reads (2: [`Message::Annotations`]).
pub const PROTOCOL_VERSION: u32 = 2;

/// The largest frame body accepted (and written: a writer splits its batches below it).
pub const MAX_FRAME_BYTES: u32 = 64 << 20;

/// The largest frame a recorder reads from a listener (its [`Message::Token`]).
pub const MAX_TOKEN_FRAME_BYTES: u32 = 4096;

/// The wire tag of `action`: its index in [`Action::ALL`]; `None` for [`Action::Other`] (a
/// recorder never makes one).
pub fn action_tag(action: Action) -> Option<u8> {
    (action != Action::Other).then_some(action as u8)
}

/// The action of a wire tag, `None` for a tag no action has (or [`Action::Other`]'s).
fn tag_action(tag: u8) -> Option<Action> {
    Action::ALL
        .get(usize::from(tag))
        .copied()
        .filter(|&a| a != Action::Other)
}

/// One message of the protocol (see the module docs for the order).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    Hello {
        protocol: u32,
        producer: String,
        device: i64,
    },
    State {
        /// A memsnap msgpack snapshot ([`crate::msgpack::to_vec`]).
        snapshot: Bytes,
        /// The sequence number of the first entry not in the snapshot's trace.
        next_seq: u64,
    },
    Entries(EntryBatch),
    Dropped {
        missed: u64,
        resume_seq: u64,
    },
    /// Annotations recorded since the last ones sent (version 2).
    Annotations {
        /// Annotations the recorder's ring lost before they were sent.
        missed: u64,
        annotations: Vec<LiveAnnotation>,
    },
    /// The one frame a listener writes, first (version 2): its token, empty when it has
    /// none.
    Token {
        token: String,
    },
    /// The recorder refuses this listener (a missing or wrong token) and closes (version 2).
    Refused {
        reason: String,
    },
}

/// A `record_function`-style annotation as the recorder makes it (the snapshot's
/// [`crate::model::Annotation`], its values strings, on the connection's device).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveAnnotation {
    pub time_us: i64,
    /// Key and value pairs (`stage`, `name`, ...) in the order given.
    pub metadata: Vec<(String, String)>,
}

/// Bytes written as a msgpack `bin` (serde would write a `Vec<u8>` as an array of ints).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes(v.to_vec()))
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

/// Entries `first_seq..first_seq + entries.len()`, with the frames and stacks they use that
/// were not sent before on this connection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EntryBatch {
    pub first_seq: u64,
    /// New frames; their wire ids continue from the frames sent before.
    pub frames: Vec<Frame>,
    /// New stacks as frame wire ids (innermost first); their wire ids continue likewise.
    pub stacks: Vec<Vec<u32>>,
    pub entries: Vec<LiveEntry>,
}

/// A trace entry as the recorder makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveEntry {
    /// The action's wire tag ([`action_tag`]).
    pub action: u8,
    /// The address, or for `oom` the device's free bytes (`device_free`).
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub time_us: i64,
    /// A stack wire id.
    pub stack: Option<u32>,
}

/// Why a live stream was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiveError {
    #[error("frame of {len} bytes is over the limit of {limit} bytes")]
    FrameTooLong { len: u64, limit: u32 },
    #[error("malformed message in frame {frame}: {what}")]
    Malformed { frame: u64, what: String },
    #[error("protocol violation at frame {frame}: {what}")]
    Protocol { frame: u64, what: String },
    #[error("unsupported live protocol version {version} (this reader knows {PROTOCOL_VERSION})")]
    Version { version: u32 },
    #[error("the state snapshot does not read: {0}")]
    State(#[from] crate::error::FormatError),
    #[error("the recorder refused this listener: {reason}")]
    Refused { reason: String },
}

/// Writes a listener's one frame, its `token` (empty when it has none), to the recorder: a
/// recorder with a token reads it first and refuses a wrong one; one without never reads it.
pub fn send_token(to: &mut impl std::io::Write, token: &str) -> std::io::Result<()> {
    let mut frame = Vec::new();
    encode(
        &Message::Token {
            token: token.to_owned(),
        },
        &mut frame,
    )
    .map_err(std::io::Error::other)?;
    to.write_all(&frame)
}

/// Encodes `message` as one frame (length prefix and body), appended to `out`.
///
/// A message whose body would be over [`MAX_FRAME_BYTES`] is an error (readers refuse it);
/// a writer sends entries in batches small enough.
pub fn encode(message: &Message, out: &mut Vec<u8>) -> Result<(), LiveError> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut ser = rmp_serde::Serializer::new(&mut *out);
    message
        .serialize(&mut ser)
        .map_err(|e| LiveError::Malformed {
            frame: 0,
            what: e.to_string(),
        })?;
    let len = out.len() - start - 4;
    if len > MAX_FRAME_BYTES as usize {
        out.truncate(start);
        return Err(LiveError::FrameTooLong {
            len: len as u64,
            limit: MAX_FRAME_BYTES,
        });
    }
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// Splits a byte stream into messages: feed it what arrives ([`FrameReader::push`]) and
/// take the whole messages out ([`FrameReader::next_message`]). Holds at most one frame
/// (plus what was pushed past it); O(frame) work per message.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed (compacted lazily).
    pos: usize,
    frames: u64,
}

impl FrameReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes received.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Frames decoded so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The next whole message, `None` when more bytes are needed. An error is final: the
    /// stream cannot be resynchronised.
    pub fn next_message(&mut self) -> Result<Option<Message>, LiveError> {
        let rest = &self.buf[self.pos..];
        let Some(head) = rest.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if len > MAX_FRAME_BYTES {
            return Err(LiveError::FrameTooLong {
                len: len.into(),
                limit: MAX_FRAME_BYTES,
            });
        }
        let Some(body) = rest.get(4..4 + len as usize) else {
            return Ok(None);
        };
        let frame = self.frames;
        let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(body));
        let message = Message::deserialize(&mut de).map_err(|e| LiveError::Malformed {
            frame,
            what: e.to_string(),
        })?;
        let used = de.position() as usize;
        if used != body.len() {
            return Err(LiveError::Malformed {
                frame,
                what: format!("{} bytes after the message", body.len() - used),
            });
        }
        self.pos += 4 + len as usize;
        self.frames += 1;
        Ok(Some(message))
    }
}

/// What applying a message changed, for a listener's display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Hello,
    /// The state arrived with this many trace entries.
    State {
        entries: usize,
    },
    Entries {
        count: usize,
    },
    Dropped {
        missed: u64,
    },
    Annotations {
        count: usize,
        missed: u64,
    },
}

/// A listener's snapshot, rebuilt from the messages: the state at connect, then every entry
/// appended to the device's trace as it arrives (entries are made exactly as the recorder's
/// own snapshot makes them, so the trace equals the recorder's dump entry for entry).
///
/// The segments are kept in step with the entries (see `live_segments`): segments made,
/// released, mapped and unmapped after connect, and block states, are the recorder's; the
/// sizes of blocks allocated after connect are their requests rounded to 512 bytes. (They
/// used to stay those at connect, which made a block freed after connect count as live for
/// the whole window in a replay of the snapshot.)
#[derive(Debug, Default)]
pub struct LiveSnapshot {
    snapshot: Option<Snapshot>,
    device: i64,
    hello: bool,
    next_seq: u64,
    frames: Vec<Frame>,
    stacks: Vec<StackId>,
    missed: u64,
    missed_annotations: u64,
    frame_no: u64,
    /// The device's segments, changed by each entry (`None` before the state, or when the
    /// state's segments were not well formed: then they stay those at connect).
    segments: Option<SegmentModel>,
    /// Entries changed `segments` since they were last written to the snapshot.
    segments_stale: bool,
}

impl LiveSnapshot {
    pub fn new() -> Self {
        Self::default()
    }

    /// The snapshot so far (`None` before the state arrived). Writes the segments when
    /// entries changed them since the last call: O(blocks) then, nothing otherwise.
    pub fn snapshot(&mut self) -> Option<&Snapshot> {
        self.write_segments();
        self.snapshot.as_ref()
    }

    /// The snapshot so far, taken out.
    pub fn into_snapshot(mut self) -> Option<Snapshot> {
        self.write_segments();
        self.snapshot
    }

    /// Whether the state arrived (the snapshot exists), without writing the segments.
    pub fn has_state(&self) -> bool {
        self.snapshot.is_some()
    }

    fn write_segments(&mut self) {
        if !self.segments_stale {
            return;
        }
        if let (Some(model), Some(snap)) = (&self.segments, self.snapshot.as_mut()) {
            model.write(&mut snap.segments);
        }
        self.segments_stale = false;
    }

    /// The device whose trace grows.
    pub fn device(&self) -> i64 {
        self.device
    }

    /// The sequence number of the next entry expected (entries recorded before it were
    /// received or reported missed).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Entries reported dropped by the recorder for this listener.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Annotations reported lost by the recorder for this listener.
    pub fn missed_annotations(&self) -> u64 {
        self.missed_annotations
    }

    /// The trace of the device (empty before the state).
    pub fn trace(&self) -> &[TraceEntry] {
        self.snapshot
            .as_ref()
            .and_then(|s| s.traces().get(usize::try_from(self.device).ok()?))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    fn protocol(&self, what: impl Into<String>) -> LiveError {
        LiveError::Protocol {
            frame: self.frame_no,
            what: what.into(),
        }
    }

    /// Applies one message. O(message) work, plus interning each new stack once.
    pub fn apply(&mut self, message: Message) -> Result<Applied, LiveError> {
        let result = self.apply_inner(message);
        self.frame_no += 1;
        result
    }

    fn apply_inner(&mut self, message: Message) -> Result<Applied, LiveError> {
        if let Message::Refused { reason } = message {
            return Err(LiveError::Refused { reason });
        }
        if !self.hello && !matches!(message, Message::Hello { .. }) {
            return Err(self.protocol("the first message must be Hello"));
        }
        match message {
            Message::Hello {
                protocol, device, ..
            } => {
                if self.hello {
                    return Err(self.protocol("a second Hello"));
                }
                if protocol != PROTOCOL_VERSION {
                    return Err(LiveError::Version { version: protocol });
                }
                if !(0..=1024).contains(&device) {
                    return Err(self.protocol(format!("device {device} is out of range")));
                }
                self.hello = true;
                self.device = device;
                Ok(Applied::Hello)
            }
            Message::State { snapshot, next_seq } => {
                if self.snapshot.is_some() {
                    return Err(self.protocol("a second State"));
                }
                let mut snapshot = crate::msgpack::read(&snapshot.0)?;
                let device = self.device as usize;
                let traces = snapshot.device_traces.get_or_insert_with(Vec::new);
                if traces.len() <= device {
                    traces.resize_with(device + 1, Vec::new);
                }
                let entries = traces[device].len();
                let empty = snapshot.intern_stack(std::iter::empty());
                self.segments = SegmentModel::new(&mut snapshot.segments, self.device, empty);
                self.segments_stale = self.segments.is_some();
                self.next_seq = next_seq;
                self.snapshot = Some(snapshot);
                Ok(Applied::State { entries })
            }
            Message::Entries(batch) => self.apply_batch(batch),
            Message::Dropped { missed, resume_seq } => {
                if self.snapshot.is_none() {
                    return Err(self.protocol("Dropped before State"));
                }
                if self.next_seq.checked_add(missed) != Some(resume_seq) || missed == 0 {
                    return Err(self.protocol(format!(
                        "Dropped {missed} entries resuming at {resume_seq}, expected to resume after {}",
                        self.next_seq
                    )));
                }
                self.missed += missed;
                self.next_seq = resume_seq;
                Ok(Applied::Dropped { missed })
            }
            Message::Annotations {
                missed,
                annotations,
            } => {
                let device = self.device;
                let Some(snap) = self.snapshot.as_mut() else {
                    return Err(self.protocol("Annotations before State"));
                };
                let count = annotations.len();
                snap.external_annotations
                    .get_or_insert_with(Vec::new)
                    .extend(annotations.into_iter().map(|a| {
                        Annotation::new(
                            a.metadata
                                .into_iter()
                                .map(|(k, v)| (k, Value::Str(v)))
                                .collect(),
                            device,
                            a.time_us,
                        )
                    }));
                self.missed_annotations = self.missed_annotations.saturating_add(missed);
                Ok(Applied::Annotations { count, missed })
            }
            Message::Token { .. } => {
                Err(self.protocol("a Token (listeners send it, recorders do not)"))
            }
            Message::Refused { reason } => Err(LiveError::Refused { reason }),
        }
    }

    fn apply_batch(&mut self, batch: EntryBatch) -> Result<Applied, LiveError> {
        if self.snapshot.is_none() {
            return Err(self.protocol("Entries before State"));
        }
        if batch.first_seq != self.next_seq {
            return Err(self.protocol(format!(
                "entries start at {}, expected {}",
                batch.first_seq, self.next_seq
            )));
        }
        // Check everything before changing anything, so a refused batch leaves the
        // snapshot as it was.
        let frames_after = self.frames.len() + batch.frames.len();
        for (i, stack) in batch.stacks.iter().enumerate() {
            if let Some(f) = stack.iter().find(|&&f| f as usize >= frames_after) {
                return Err(self.protocol(format!(
                    "stack {} names frame {f}, but {frames_after} frames were sent",
                    self.stacks.len() + i
                )));
            }
        }
        let stacks_after = self.stacks.len() + batch.stacks.len();
        for (i, e) in batch.entries.iter().enumerate() {
            if tag_action(e.action).is_none() {
                return Err(self.protocol(format!(
                    "entry {} has unknown action tag {}",
                    batch.first_seq + i as u64,
                    e.action
                )));
            }
            if let Some(s) = e.stack.filter(|&s| s as usize >= stacks_after) {
                return Err(self.protocol(format!(
                    "entry {} names stack {s}, but {stacks_after} stacks were sent",
                    batch.first_seq + i as u64
                )));
            }
        }
        let count = batch.entries.len();
        let Some(snap) = self.snapshot.as_mut() else {
            return Err(self.protocol("Entries before State"));
        };
        self.frames.extend(batch.frames);
        for stack in batch.stacks {
            let frames = stack.iter().map(|&f| self.frames[f as usize].clone());
            self.stacks.push(snap.intern_stack(frames));
        }
        let na = snap.strings.intern("N/A");
        let no_metadata = snap.strings.intern("");
        let device = self.device as usize;
        let mut made = Vec::with_capacity(count);
        for e in &batch.entries {
            let stack = e.stack.map(|s| self.stacks[s as usize]);
            let entry = make_entry(e, stack, na, no_metadata, snap);
            if let Some(model) = self.segments.as_mut() {
                model.apply(Change {
                    action: entry.action,
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    frames: stack,
                });
                self.segments_stale = true;
            }
            made.push(entry);
        }
        if let Some(trace) = snap
            .device_traces
            .as_mut()
            .and_then(|traces| traces.get_mut(device))
        {
            trace.extend(made);
        }
        self.next_seq += count as u64;
        Ok(Applied::Entries { count })
    }
}

/// The trace entry the recorder's snapshot holds for `e` (an `oom` keeps the device's free
/// bytes in `device_free` and no address).
fn make_entry(
    e: &LiveEntry,
    stack: Option<StackId>,
    na: crate::intern::StrId,
    no_metadata: crate::intern::StrId,
    snap: &Snapshot,
) -> TraceEntry {
    let action = tag_action(e.action).unwrap_or(Action::Other);
    let mut entry = TraceEntry::new(action, e.addr, e.size, e.stream);
    entry.set_time_us(Some(e.time_us));
    entry.set_compile_context(Some(na), &snap.strings);
    entry.set_user_metadata(Some(no_metadata), &snap.strings);
    entry.frames = stack;
    if action == Action::Oom {
        entry.addr = 0;
        let rare = entry.rare_mut();
        rare.device_free = Some(e.addr);
        rare.no_addr = true;
    }
    entry
}

/// Whether `given` is `expected`, in time that depends on `expected`'s length only (not on
/// where the two differ, nor on `given`'s length): a listener's token against the
/// recorder's.
pub fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, &e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= usize::from(std::hint::black_box(g ^ e));
    }
    std::hint::black_box(diff) == 0
}
