//! The value arena: the object graph a pickle describes, as the VM builds it.
//!
//! Strings, bytes and big integers are copied into one string heap (validated UTF-8 for `str`,
//! with the entry keys and action names recognised once as a [`Sym`]); small integers, floats
//! and bools are stored inline in [`Val`]; lists, dicts and tuples are [`Node`]s whose items
//! live in one flat vector, in chunks (one chunk per `APPENDS`/`SETITEMS` batch, merged when
//! batches are adjacent). A memo reference pushes the same `Val::Node`, so a list shared a
//! thousand times is stored once and the conversion pass can cache per node.
//!
//! The VM (`vm`) writes the arena and the conversion pass (`convert`) reads it; neither is
//! named here, so both can depend on this module.

use std::collections::HashSet;

use super::sym::Sym;

/// No chunk / no node marker.
pub(crate) const NONE: u32 = u32::MAX;

/// One value on the VM stack, in the memo, or inside a container.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A `LONG1`/`LONG4` integer outside `i64`: little-endian two's complement bytes in the heap.
    BigInt {
        start: usize,
        len: u32,
    },
    /// Valid UTF-8 in the string heap; `sym` names the snapshot keys the reader looks for.
    Str {
        start: usize,
        len: u32,
        sym: Sym,
    },
    Bytes {
        start: usize,
        len: u32,
    },
    /// A list, dict or tuple in [`Arena::nodes`].
    Node(u32),
    /// A frames list the fast path read straight into this [`crate::StackId`] (no node: real
    /// files hold a fresh list per entry).
    Stack(u32),
    /// A dict the fast path read as the trace entry at this index of
    /// `ConvState::entries` (in `convert`) (no node: most of a file's dicts are these).
    Entry(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    List,
    Dict,
    Tuple,
    /// A dict already converted to a [`crate::TraceEntry`] while reading (see
    /// `ConvState::entries` (in `convert`)); `first` is its index there.
    Entry,
}

/// A container: its items are the chunks `first -> ... -> last`. A dict stores keys and
/// values interleaved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub kind: Kind,
    pub(super) first: u32,
    pub(super) last: u32,
    /// Number of items (a dict holds `len / 2` pairs).
    pub len: u32,
    /// Pushed again through the memo or DUP, so it may be referenced more than once.
    pub shared: bool,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) start: u32,
    pub(super) len: u32,
    pub(super) next: u32,
    /// The items are `Val::Entry(start..start + len)`, not stored in `items` (a trace list
    /// is a million consecutive entries).
    pub(super) entries: bool,
}

/// The result of running a pickle: the object graph and its root.
pub(crate) struct Arena {
    /// The bytes of every string, bytes object and big integer, in input order.
    pub(super) heap: Vec<u8>,
    pub nodes: Vec<Node>,
    pub(super) chunks: Vec<Chunk>,
    pub(super) items: Vec<Val>,
    /// `Val::Entry`s pushed again through the memo or DUP.
    pub(super) shared_entries: HashSet<u32>,
    pub root: Val,
}

impl Arena {
    /// An empty arena; the VM fills it and sets `root` at `STOP`.
    pub(super) fn new() -> Self {
        Arena {
            heap: Vec::new(),
            nodes: Vec::new(),
            chunks: Vec::new(),
            items: Vec::new(),
            shared_entries: HashSet::new(),
            root: Val::None,
        }
    }

    /// The index in the converted entries of a dict read as a trace entry.
    #[inline]
    pub fn entry_of(&self, v: Val) -> Option<usize> {
        match v {
            Val::Entry(index) => Some(index as usize),
            Val::Node(id) => {
                let node = &self.nodes[id as usize];
                (node.kind == Kind::Entry).then_some(node.first as usize)
            }
            _ => None,
        }
    }

    /// The Python type of a value, for error messages.
    pub fn type_name(&self, v: Val) -> &'static str {
        match v {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) | Val::BigInt { .. } => "int",
            Val::Float(_) => "float",
            Val::Str { .. } => "str",
            Val::Bytes { .. } => "bytes",
            Val::Entry(_) => "dict",
            Val::Stack(_) => "list",
            Val::Node(id) => match self.nodes[id as usize].kind {
                Kind::List => "list",
                Kind::Dict | Kind::Entry => "dict",
                Kind::Tuple => "tuple",
            },
        }
    }

    /// Whether a value may be referenced more than once.
    pub fn is_shared(&self, v: Val) -> bool {
        match v {
            Val::Entry(index) => self.shared_entries.contains(&index),
            Val::Node(id) => self.nodes[id as usize].shared,
            _ => false,
        }
    }

    pub fn node(&self, id: u32) -> &Node {
        &self.nodes[id as usize]
    }

    /// The items of a container, in order.
    pub fn items(&self, id: u32) -> Items<'_> {
        let node = self.nodes[id as usize];
        Items {
            arena: self,
            chunk: if node.kind == Kind::Entry {
                NONE
            } else {
                node.first
            },
            pos: 0,
        }
    }

    /// Whether list `id` is the entries `start..start + len` in order, none of them shared
    /// (the usual trace list: entries from 0; a multi-device trace's lists, each the run after
    /// the previous device's). Told from its chunks: a chunk of entries by its first index,
    /// any other chunk (the first entries of a PyTorch file, whose keys are read before they
    /// are memoized, become entry nodes) item by item. O(chunks + items of the other chunks +
    /// shared entries): a million entries are not walked.
    pub fn is_entry_run(&self, id: u32, start: u32) -> bool {
        let node = &self.nodes[id as usize];
        if node.kind != Kind::List {
            return false;
        }
        let (mut chunk, mut next) = (node.first, start as usize);
        while chunk != NONE {
            let c = self.chunks[chunk as usize];
            if c.entries {
                if c.start as usize != next {
                    return false;
                }
            } else {
                let items = &self.items[c.start as usize..(c.start + c.len) as usize];
                for (i, &item) in items.iter().enumerate() {
                    if self.entry_of(item) != Some(next + i) || self.is_shared(item) {
                        return false;
                    }
                }
            }
            next += c.len as usize;
            chunk = c.next;
        }
        let run = start as usize..next;
        !self
            .shared_entries
            .iter()
            .any(|&e| run.contains(&(e as usize)))
    }

    /// The raw bytes of a `Str`, `Bytes` or `BigInt` value.
    pub fn bytes(&self, start: usize, len: u32) -> &[u8] {
        &self.heap[start..start + len as usize]
    }
}

/// Iterator over a container's items.
pub(crate) struct Items<'a> {
    arena: &'a Arena,
    chunk: u32,
    pos: u32,
}

impl<'a> Iterator for Items<'a> {
    type Item = Val;

    #[inline]
    fn next(&mut self) -> Option<Val> {
        loop {
            if self.chunk == NONE {
                return None;
            }
            let c = self.arena.chunks[self.chunk as usize];
            if self.pos < c.len {
                let v = if c.entries {
                    Val::Entry(c.start + self.pos)
                } else {
                    self.arena.items[(c.start + self.pos) as usize]
                };
                self.pos += 1;
                return Some(v);
            }
            self.chunk = c.next;
            self.pos = 0;
        }
    }
}
