//! Interning tables: every distinct frame, stack and repeated string is stored once.
//!
//! A real 1M-entry snapshot holds a few thousand distinct frames and stacks that are shared
//! by reference in the pickle. Entries here hold a [`StackId`]; the [`StackTable`] maps it to a
//! slice of [`FrameId`]s (innermost frame first, as PyTorch writes them), and the
//! [`FrameTable`] maps those to [`Frame`]s.

// SipHash costs more than the rest of interning a 30-frame stack; foldhash is seeded per
// process, so crafted input still cannot pick collisions in advance.
use foldhash::HashMap;

use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};

use crate::int::PyInt;
use crate::value::Extras;

/// Defines an id type: an index stored plus one in a `NonZeroU32`, so `Option<Id>` takes 4
/// bytes (a trace entry holds `Option<StackId>` and, in its rare part, `Option<StrId>`s).
/// Serialized as the index (a `u32` newtype), as when the id was a plain `u32`.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(NonZeroU32);

        /// `StrId(3)`: the index, as when ids were plain indices.
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({})", stringify!($name), self.index())
            }
        }

        impl $name {
            /// The id of the table entry at `index`.
            ///
            /// # Panics
            /// When `index` is `u32::MAX` or more: no table holds that many entries (interning
            /// 4 billion distinct values would take far more memory than a machine has).
            #[inline]
            pub fn from_index(index: usize) -> Self {
                u32::try_from(index)
                    .ok()
                    .and_then(Self::try_from_index)
                    .unwrap_or_else(|| panic!("{} index {index} does not fit an id", $what))
            }

            /// The id of the entry at `index`; `None` for `u32::MAX`, the one index an id
            /// cannot hold.
            #[inline]
            pub const fn try_from_index(index: u32) -> Option<Self> {
                match index.checked_add(1) {
                    Some(n) => match NonZeroU32::new(n) {
                        Some(n) => Some($name(n)),
                        None => None,
                    },
                    None => None,
                }
            }

            /// The index of the entry in its table.
            #[inline]
            pub const fn index(self) -> usize {
                (self.0.get() - 1) as usize
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_newtype_struct(stringify!($name), &(self.index() as u32))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(rename = $what)]
                struct Index(u32);
                let Index(index) = Index::deserialize(d)?;
                $name::try_from_index(index).ok_or_else(|| {
                    serde::de::Error::custom(format!("{} id {index} is out of range", $what))
                })
            }
        }
    };
}

id_type!(
    /// Index of a frame in [`FrameTable`].
    FrameId,
    "frame"
);

id_type!(
    /// Index of a stack (a list of frames) in [`StackTable`].
    StackId,
    "stack"
);

id_type!(
    /// Index of a string in [`StrTable`].
    StrId,
    "string"
);

/// One stack frame: `{'name': ..., 'filename': ..., 'line': ...}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Function name (Python `co_name` or a demangled C++ symbol).
    pub name: String,
    /// Python file path, or a C++ source basename, `"??"` or `""`.
    pub filename: String,
    /// Line number; usually 0 for C++ frames. Any Python int: `torch.compile`d runs write
    /// 2^64 − 1 (an unsigned "no line"), which must stay distinct from −1.
    pub line: PyInt,
    /// Keys beyond the three above (the `fx_*` keys of FX-augmented snapshots), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Extras,
}

impl Frame {
    /// The `filename` of a frame an import made up (a category name where the source has no
    /// stack): it is never stack evidence nor a site of the user's code, and it says so in
    /// PyTorch's viewers too.
    pub const SYNTHETIC_FILE: &'static str = "<memsnap: synthetic>";

    /// A made-up frame named `name` (see [`Frame::SYNTHETIC_FILE`]).
    pub fn synthetic(name: impl Into<String>) -> Self {
        Frame::new(name, Frame::SYNTHETIC_FILE, 0)
    }

    /// Whether an import made this frame up ([`Frame::synthetic`]).
    pub fn is_synthetic(&self) -> bool {
        self.filename == Frame::SYNTHETIC_FILE
    }

    pub fn new(
        name: impl Into<String>,
        filename: impl Into<String>,
        line: impl Into<PyInt>,
    ) -> Self {
        Frame {
            name: name.into(),
            filename: filename.into(),
            line: line.into(),
            extra: Vec::new(),
        }
    }

    /// The file's last path component (either separator), as `_memory_viz.py` prints it.
    pub fn basename(&self) -> &str {
        self.filename
            .rsplit(['/', '\\'])
            .next()
            .unwrap_or(&self.filename)
    }
}

/// The distinct frames of a snapshot.
#[derive(Clone, Debug, Default)]
pub struct FrameTable {
    frames: Vec<Frame>,
    index: HashMap<(String, String, PyInt), FrameId>,
    /// Frames with extra keys (FX-augmented), keyed by their full debug rendering: `Value`
    /// holds floats and so has no `Hash`, and a linear scan would let a hostile file with
    /// many such frames make reading quadratic.
    index_with_extra: HashMap<String, FrameId>,
}

impl FrameTable {
    /// Returns the id of an equal frame already in the table, or adds it.
    ///
    /// Frames without extra keys are looked up by (name, filename, line); frames with extra
    /// keys by their full contents.
    pub fn intern(&mut self, frame: Frame) -> FrameId {
        if frame.extra.is_empty() {
            let key = (frame.name, frame.filename, frame.line);
            if let Some(&id) = self.index.get(&key) {
                return id;
            }
            let id = FrameId::from_index(self.frames.len());
            self.frames
                .push(Frame::new(key.0.clone(), key.1.clone(), key.2.clone()));
            self.index.insert(key, id);
            id
        } else {
            let key = format!("{frame:?}");
            if let Some(&id) = self.index_with_extra.get(&key) {
                return id;
            }
            let id = FrameId::from_index(self.frames.len());
            self.frames.push(frame);
            self.index_with_extra.insert(key, id);
            id
        }
    }

    pub fn get(&self, id: FrameId) -> &Frame {
        &self.frames[id.index()]
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Frame> {
        self.frames.iter()
    }
}

/// The distinct stacks of a snapshot, stored flat.
#[derive(Clone, Debug)]
pub struct StackTable {
    /// `offsets[i]..offsets[i + 1]` is the range of stack `i` in `frame_ids`.
    offsets: Vec<u32>,
    frame_ids: Vec<FrameId>,
    index: HashMap<Box<[FrameId]>, StackId>,
}

impl Default for StackTable {
    fn default() -> Self {
        StackTable {
            offsets: vec![0],
            frame_ids: Vec::new(),
            index: HashMap::default(),
        }
    }
}

impl StackTable {
    /// Returns the id of an equal stack already in the table, or adds it.
    pub fn intern(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(&id) = self.index.get(frames) {
            return id;
        }
        let id = StackId::from_index(self.offsets.len() - 1);
        self.frame_ids.extend_from_slice(frames);
        self.offsets.push(self.frame_ids.len() as u32);
        self.index.insert(frames.into(), id);
        id
    }

    /// The frames of a stack, innermost first.
    pub fn get(&self, id: StackId) -> &[FrameId] {
        let i = id.index();
        &self.frame_ids[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (StackId, &[FrameId])> {
        (0..self.len()).map(|i| {
            let id = StackId::from_index(i);
            (id, self.get(id))
        })
    }
}

/// Repeated short strings (compile contexts, user metadata, unknown action names).
///
/// Ids are given in interning order (the order the msgpack format stores the table in). The
/// table remembers the ids of the version defaults of `compile_context` (`"N/A"`) and
/// `user_metadata` (`""`), which nearly every trace entry holds: an entry keeps only a flag for
/// them (see [`crate::TraceEntry::compile_context`]).
#[derive(Clone, Debug, Default)]
pub struct StrTable {
    strings: Vec<Box<str>>,
    index: HashMap<Box<str>, StrId>,
    compile_context_default: Option<StrId>,
    user_metadata_default: Option<StrId>,
}

/// `compile_context` when compile-context recording was off.
pub const COMPILE_CONTEXT_DEFAULT: &str = "N/A";
/// `user_metadata` when none was set.
pub const USER_METADATA_DEFAULT: &str = "";

impl StrTable {
    pub fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.index.get(s) {
            return id;
        }
        let id = StrId::from_index(self.strings.len());
        self.strings.push(s.into());
        self.index.insert(s.into(), id);
        match s {
            COMPILE_CONTEXT_DEFAULT => self.compile_context_default = Some(id),
            USER_METADATA_DEFAULT => self.user_metadata_default = Some(id),
            _ => {}
        }
        id
    }

    pub fn get(&self, id: StrId) -> &str {
        &self.strings[id.index()]
    }

    /// The id of `"N/A"` ([`COMPILE_CONTEXT_DEFAULT`]), once interned.
    #[inline]
    pub fn compile_context_default(&self) -> Option<StrId> {
        self.compile_context_default
    }

    /// The id of `""` ([`USER_METADATA_DEFAULT`]), once interned.
    #[inline]
    pub fn user_metadata_default(&self) -> Option<StrId> {
        self.user_metadata_default
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn frames_with_extra_keys_are_interned_by_content() {
        let mut table = FrameTable::default();
        let fx = |op: &str| Frame {
            extra: vec![("fx_node_op".into(), Value::Str(op.into()))],
            ..Frame::new("forward", "model.py", 3)
        };
        let a = table.intern(fx("call_function"));
        let b = table.intern(fx("call_function"));
        let c = table.intern(fx("placeholder"));
        let plain = table.intern(Frame::new("forward", "model.py", 3));
        let no_line = table.intern(Frame::new("f", "x.py", u64::MAX));
        let minus_one = table.intern(Frame::new("f", "x.py", -1));
        assert_ne!(no_line, minus_one);
        assert_eq!(table.get(no_line).line.to_string(), "18446744073709551615");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, plain);
        assert_eq!(table.len(), 5);
    }

    #[test]
    fn many_frames_with_extra_keys_intern_in_linear_time() {
        let mut table = FrameTable::default();
        let started = std::time::Instant::now();
        for i in 0..50_000 {
            table.intern(Frame {
                extra: vec![("fx_node_name".into(), Value::Int(i))],
                ..Frame::new("f", "x.py", 1)
            });
        }
        assert_eq!(table.len(), 50_000);
        // Quadratic interning took minutes here; linear takes well under a second.
        assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    }

    #[test]
    fn stacks_are_interned_by_their_frame_ids() {
        let mut stacks = StackTable::default();
        let ids = [FrameId::from_index(1), FrameId::from_index(2)];
        let a = stacks.intern(&ids);
        let b = stacks.intern(&ids);
        let empty = stacks.intern(&[]);
        assert_eq!(a, b);
        assert_eq!(stacks.get(a), &ids);
        assert!(stacks.get(empty).is_empty());
        assert_eq!(stacks.len(), 2);
    }
}
