//! The snapshot reader's builder: the pickle machine (`machine`) runs the data opcodes, and
//! this builds what they make into an [`Arena`], executing nothing.
//!
//! Strings go to the arena's string heap (the snapshot's keys and action names recognised
//! once, as they are read), small ints are inline [`Val`]s, containers are nodes, and a memo
//! reference is the same node again. A trace entry dict is converted as soon as its
//! `SETITEMS` runs (by the converter, `convert`, whose state [`ConvState`] this carries), and
//! at `EMPTY_DICT` `fast_path` reads entries in the usual layout straight from the machine's
//! window (this builder's [`Build::empty_dict`] hook).

use crate::error::Result;
use crate::progress::Progress;

use super::arena::{Arena, Chunk, Kind, Node, Val, NONE};
use super::convert::{Conv, ConvState};
use super::machine::{opcode_name, Build, BuildError, Container, Feed, Machine};
use super::memo::ValPacking;
use super::opcodes::op;
use super::sym::Sym;

mod fast_path;
use crate::intern::FrameId;

/// Sees the trace entries read so far, in input order, a batch per progress tick (a preview
/// of a big file while it loads; entries in unusual layouts, converted at the end, are not
/// shown).
pub type Observe<'a> = &'a mut dyn FnMut(&[crate::TraceEntry]);

type BuildResult<T> = std::result::Result<T, BuildError>;

/// The snapshot reader's [`Build`]er: the arena, the converter's state, and the fast path's
/// caches.
pub(crate) struct Snap<'o> {
    arena: Arena,
    state: ConvState,
    /// Shown the trace entries read since the last call, at each progress tick.
    observe: Option<Observe<'o>>,
    /// Entries already shown to `observe`.
    observed: usize,
    /// Take `fast_path`'s `fast_entry` when it applies (off only to test it against the
    /// generic path).
    fast_entries: bool,
    /// Frames of the frames list `fast_path` is reading.
    frames_buf: Vec<FrameId>,
    /// Reused for [`ConvState::cache_journal`].
    journal_buf: Vec<(bool, u32)>,
    /// Fresh frames lists already read, by their bytes.
    lists: fast_path::ListCache,
    /// Memo references to entry keys and action names already read, by their bytes.
    refs: fast_path::SymRefs,
}

/// How to run the reader over one input: everything but the bytes themselves.
pub(crate) struct Run<'p, 'o> {
    /// Input length (bounds every declared length; progress is reported against it).
    pub total: u64,
    pub progress: Progress<'p>,
    /// Shown the trace entries read so far, at each progress tick.
    pub observe: Option<Observe<'o>>,
    /// Take the trace-entry fast path when it applies (off only to test it against the
    /// generic path).
    pub fast_entries: bool,
    /// Where to end the top-level dict as if `SETITEMS STOP` stood there (reading only the
    /// segments, see `part`).
    pub end_at: Option<u64>,
}

/// Runs the pickle in `feed` and returns its object graph, with trace entries already
/// converted (they are most of a snapshot, and converting them as they complete keeps their
/// keys and values out of the arena).
///
/// With [`Run::end_at`], the opcode at that offset is not read: the top-level dict is closed
/// there as if `SETITEMS STOP` followed, and the rest of the input is left alone.
pub(crate) fn run<F: Feed>(feed: F, options: Run<'_, '_>) -> Result<(Arena, ConvState)> {
    let Run {
        total,
        progress,
        observe,
        fast_entries,
        end_at,
    } = options;
    let snap = Snap {
        arena: Arena::new(),
        state: ConvState::new(total),
        observe,
        observed: 0,
        fast_entries,
        frames_buf: Vec::new(),
        journal_buf: Vec::new(),
        lists: fast_path::ListCache::default(),
        refs: fast_path::SymRefs::default(),
    };
    let mut machine = Machine::new(feed, snap, total, progress).end_at(end_at);
    let root = machine.run()?;
    let mut snap = machine.into_builder();
    snap.arena.root = root;
    Ok((snap.arena, snap.state))
}

impl Build for Snap<'_> {
    type Value = Val;
    type Packing = ValPacking;

    #[inline(always)]
    fn none(&mut self) -> Val {
        Val::None
    }

    #[inline(always)]
    fn bool(&mut self, value: bool) -> Val {
        Val::Bool(value)
    }

    #[inline(always)]
    fn int(&mut self, value: i64) -> Val {
        Val::Int(value)
    }

    fn big_int(&mut self, le_bytes: &[u8]) -> BuildResult<Val> {
        let (start, len) = self.copy(le_bytes);
        Ok(Val::BigInt { start, len })
    }

    #[inline(always)]
    fn float(&mut self, value: f64) -> Val {
        Val::Float(value)
    }

    /// Copied to the string heap, validated, and recognised when it is a key we look for.
    #[inline]
    fn str(&mut self, utf8: &[u8]) -> BuildResult<Val> {
        let sym = if utf8.is_ascii() {
            Sym::classify(utf8)
        } else {
            if let Err(e) = std::str::from_utf8(utf8) {
                return Err(BuildError::in_payload(
                    e.valid_up_to(),
                    "invalid UTF-8 in a string",
                ));
            }
            Sym::Other
        };
        let (start, len) = self.copy(utf8);
        Ok(Val::Str { start, len, sym })
    }

    #[inline]
    fn bytes(&mut self, bytes: &[u8]) -> BuildResult<Val> {
        let (start, len) = self.copy(bytes);
        Ok(Val::Bytes { start, len })
    }

    #[inline]
    fn empty(&mut self, kind: Container) -> BuildResult<Val> {
        Ok(Val::Node(self.new_node(node_kind(kind)?)?))
    }

    fn collect(&mut self, kind: Container, stack: &mut Vec<Val>, from: usize) -> BuildResult<Val> {
        let id = self.new_node(node_kind(kind)?)?;
        self.extend_from_stack(id, stack, from)?;
        Ok(Val::Node(id))
    }

    #[inline]
    fn extend(
        &mut self,
        code: u8,
        stack: &mut Vec<Val>,
        target: usize,
        from: usize,
    ) -> BuildResult<()> {
        let name = opcode_name(code).unwrap_or("?");
        let kind = match code {
            op::APPEND | op::APPENDS => Kind::List,
            op::SETITEM | op::SETITEMS => Kind::Dict,
            _ => return Err(BuildError::new(format!("{name} is not read"))),
        };
        let id = self.check_target(stack[target], kind, name)?;
        if code == op::SETITEMS
            && self.arena.nodes[id as usize].len == 0
            && self.try_pack_entry(id, &stack[from..])
        {
            stack.truncate(from);
            return Ok(());
        }
        self.extend_from_stack(id, stack, from)
    }

    #[inline]
    fn shared(&mut self, v: &Val) {
        match *v {
            Val::Node(id) => self.arena.nodes[id as usize].shared = true,
            Val::Entry(index) => {
                self.arena.shared_entries.insert(index);
            }
            _ => {}
        }
    }

    fn text(&self, v: &Val) -> Option<String> {
        match *v {
            Val::Str { start, len, .. } => {
                Some(String::from_utf8_lossy(self.arena.bytes(start, len)).into_owned())
            }
            _ => None,
        }
    }

    #[inline]
    fn empty_dict<F: Feed>(m: &mut Machine<'_, Self, F>) -> bool {
        m.b.fast_entries && m.fast_entry()
    }

    fn checkpoint(&mut self) {
        // Between opcodes every entry read is final (a fast-path attempt rolls back within
        // its opcode).
        if let Some(observe) = self.observe.as_mut() {
            observe(&self.state.entries[self.observed..]);
            self.observed = self.state.entries.len();
        }
    }
}

/// The arena's node kind for a container the machine asks for (sets are not read).
#[inline]
fn node_kind(kind: Container) -> BuildResult<Kind> {
    match kind {
        Container::List => Ok(Kind::List),
        Container::Dict => Ok(Kind::Dict),
        Container::Tuple => Ok(Kind::Tuple),
        _ => Err(BuildError::new("sets are not read")),
    }
}

impl Snap<'_> {
    /// Copies a payload into the string heap; its range there.
    #[inline]
    fn copy(&mut self, bytes: &[u8]) -> (usize, u32) {
        let start = self.arena.heap.len();
        self.arena.heap.extend_from_slice(bytes);
        // The machine refuses payloads of 4 GiB or more.
        (start, bytes.len() as u32)
    }

    fn new_node(&mut self, kind: Kind) -> BuildResult<u32> {
        let id = u32::try_from(self.arena.nodes.len())
            .ok()
            .filter(|&id| id != NONE)
            .ok_or_else(|| BuildError::new("too many containers"))?;
        self.arena.nodes.push(Node {
            kind,
            first: NONE,
            last: NONE,
            len: 0,
            shared: false,
        });
        Ok(id)
    }

    /// Appends the stack values `from..` to a container and truncates the stack there.
    fn extend_from_stack(
        &mut self,
        node: u32,
        stack: &mut Vec<Val>,
        from: usize,
    ) -> BuildResult<()> {
        let n = stack.len() - from;
        if n == 0 {
            return Ok(());
        }
        let too_many = || BuildError::new("too many container items");
        let n32 = u32::try_from(n).map_err(|_| too_many())?;
        let nd = self.arena.nodes[node as usize];
        let new_len = nd.len.checked_add(n32).ok_or_else(too_many)?;
        let values = &stack[from..];
        let entry_run = match values[0] {
            Val::Entry(first) => values
                .iter()
                .zip(first..)
                .all(|(v, index)| matches!(*v, Val::Entry(e) if e == index))
                .then_some(first),
            _ => None,
        };
        let start = match entry_run {
            Some(first) => first as usize,
            None => {
                let start = self.arena.items.len();
                if start + n >= NONE as usize {
                    return Err(too_many());
                }
                self.arena.items.extend_from_slice(values);
                start
            }
        };
        let entries = entry_run.is_some();
        stack.truncate(from);
        let last = nd.last;
        if last != NONE {
            let c = &mut self.arena.chunks[last as usize];
            if c.entries == entries && (c.start + c.len) as usize == start {
                c.len += n32;
                self.arena.nodes[node as usize].len = new_len;
                return Ok(());
            }
        }
        let cid = self.arena.chunks.len() as u32;
        if cid == NONE {
            return Err(too_many());
        }
        self.arena.chunks.push(Chunk {
            start: start as u32,
            len: n32,
            next: NONE,
            entries,
        });
        let nd = &mut self.arena.nodes[node as usize];
        if last == NONE {
            nd.first = cid;
        } else {
            self.arena.chunks[last as usize].next = cid;
        }
        let nd = &mut self.arena.nodes[node as usize];
        nd.last = cid;
        nd.len = new_len;
        Ok(())
    }

    /// The container `target` must be a mutable one of `kind`.
    fn check_target(&self, target: Val, kind: Kind, name: &str) -> BuildResult<u32> {
        let frozen = match target {
            Val::Node(id) => self.state.is_frozen(id),
            // A frames list the fast path read as a stack: the generic path would have read
            // (and frozen) its node, so both report the same error.
            Val::Stack(_) => true,
            _ => false,
        };
        if self.arena.entry_of(target).is_some() || frozen {
            return Err(BuildError::new(format!(
                "{name} modifies a dict or list after it was read as a trace entry, stack or frame (not supported)"
            )));
        }
        match target {
            Val::Node(id) if self.arena.nodes[id as usize].kind == kind => Ok(id),
            other => Err(BuildError::new(format!(
                "{name} on a {}, expected a {}",
                self.arena.type_name(other),
                match kind {
                    Kind::List => "list",
                    Kind::Dict | Kind::Entry => "dict",
                    Kind::Tuple => "tuple",
                }
            ))),
        }
    }

    /// Converts a dict that is being filled in one batch to a trace entry now, when it has
    /// the shape of one and converts losslessly; otherwise it stays a generic dict (and the
    /// conversion pass reports any error with its path).
    fn try_pack_entry(&mut self, id: u32, pairs: &[Val]) -> bool {
        let looks_like_entry = pairs.len() >= 8
            && pairs.iter().step_by(2).take(2).any(|k| {
                matches!(
                    k,
                    Val::Str {
                        sym: Sym::Action,
                        ..
                    }
                )
            });
        if !looks_like_entry || self.state.entries.len() >= NONE as usize {
            return false;
        }
        let Some(entry) = Conv::new(&self.arena, &mut self.state).packed_entry(pairs) else {
            return false;
        };
        let node = &mut self.arena.nodes[id as usize];
        node.kind = Kind::Entry;
        node.first = self.state.entries.len() as u32;
        self.state.entries.push(entry);
        true
    }
}
