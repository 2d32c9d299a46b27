//! The strings the reader recognises as it reads them: a trace entry's keys and the action
//! names, as one byte ([`Sym`]) stored with the string in the arena and the memo.

use crate::model::Action;
use crate::schema::{self, Key};

/// Strings the VM recognises once, as it reads them: the keys of a trace entry and the action
/// names (recognised by the schema, [`Key::of_bytes`]). Memoized strings are read once and
/// referenced many times, so matching bytes per use would be the reader's hottest work. A key
/// variant's discriminant is its rank in [`schema::ENTRY_ORDER`] (asserted below), which the
/// fast path compares to check the key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Sym {
    Other,
    Action,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    CompileContext,
    UserMetadata,
    InternalMetadata,
    Frames,
    ForwardFrames,
    ActAlloc,
    ActFreeRequested,
    ActFreeCompleted,
    ActSegmentAlloc,
    ActSegmentFree,
    ActSegmentMap,
    ActSegmentUnmap,
    ActSnapshot,
    ActOom,
    ActAnnotate,
    ActFree,
}

impl Sym {
    /// What a string read from the input is (the schema recognises it).
    #[inline]
    pub fn classify(bytes: &[u8]) -> Sym {
        Key::of_bytes(bytes).map_or(Sym::Other, Sym::of_key)
    }

    /// The symbol of a schema key (`Other` for a key no trace entry has).
    #[inline]
    const fn of_key(key: Key) -> Sym {
        match key {
            Key::action => Sym::Action,
            Key::addr => Sym::Addr,
            Key::device_free => Sym::DeviceFree,
            Key::size => Sym::Size,
            Key::stream => Sym::Stream,
            Key::time_us => Sym::TimeUs,
            Key::compile_context => Sym::CompileContext,
            Key::user_metadata => Sym::UserMetadata,
            Key::internal_metadata => Sym::InternalMetadata,
            Key::frames => Sym::Frames,
            Key::forward_frames => Sym::ForwardFrames,
            Key::a_alloc => Sym::ActAlloc,
            Key::a_free_requested => Sym::ActFreeRequested,
            Key::a_free_completed => Sym::ActFreeCompleted,
            Key::a_segment_alloc => Sym::ActSegmentAlloc,
            Key::a_segment_free => Sym::ActSegmentFree,
            Key::a_segment_map => Sym::ActSegmentMap,
            Key::a_segment_unmap => Sym::ActSegmentUnmap,
            Key::a_snapshot => Sym::ActSnapshot,
            Key::a_oom => Sym::ActOom,
            Key::a_annotate => Sym::ActAnnotate,
            Key::a_free => Sym::ActFree,
            _ => Sym::Other,
        }
    }

    /// The trace-entry key a symbol is (`None` for an action name or another string).
    #[inline]
    pub(crate) const fn key(self) -> Option<Key> {
        Some(match self {
            Sym::Action => Key::action,
            Sym::Addr => Key::addr,
            Sym::DeviceFree => Key::device_free,
            Sym::Size => Key::size,
            Sym::Stream => Key::stream,
            Sym::TimeUs => Key::time_us,
            Sym::CompileContext => Key::compile_context,
            Sym::UserMetadata => Key::user_metadata,
            Sym::InternalMetadata => Key::internal_metadata,
            Sym::Frames => Key::frames,
            Sym::ForwardFrames => Key::forward_frames,
            _ => return None,
        })
    }

    /// The symbol with discriminant `n` (`Other` for anything else).
    pub(crate) fn from_u8(n: u8) -> Sym {
        Sym::ALL.get(usize::from(n)).copied().unwrap_or(Sym::Other)
    }

    /// The action names, as [`Sym::action`] maps them (the tail of [`Sym::ALL`]).
    pub(crate) const ACTIONS: &'static [Sym] = Sym::ALL.split_at(Sym::ActAlloc as usize).1;

    /// Every symbol, by discriminant.
    pub(crate) const ALL: [Sym; 23] = [
        Sym::Other,
        Sym::Action,
        Sym::Addr,
        Sym::DeviceFree,
        Sym::Size,
        Sym::Stream,
        Sym::TimeUs,
        Sym::CompileContext,
        Sym::UserMetadata,
        Sym::InternalMetadata,
        Sym::Frames,
        Sym::ForwardFrames,
        Sym::ActAlloc,
        Sym::ActFreeRequested,
        Sym::ActFreeCompleted,
        Sym::ActSegmentAlloc,
        Sym::ActSegmentFree,
        Sym::ActSegmentMap,
        Sym::ActSegmentUnmap,
        Sym::ActSnapshot,
        Sym::ActOom,
        Sym::ActAnnotate,
        Sym::ActFree,
    ];

    /// The action a known action name stands for.
    pub(crate) fn action(self) -> Option<Action> {
        Some(match self {
            Sym::ActAlloc => Action::Alloc,
            Sym::ActFreeRequested => Action::FreeRequested,
            Sym::ActFreeCompleted => Action::FreeCompleted,
            Sym::ActSegmentAlloc => Action::SegmentAlloc,
            Sym::ActSegmentFree => Action::SegmentFree,
            Sym::ActSegmentMap => Action::SegmentMap,
            Sym::ActSegmentUnmap => Action::SegmentUnmap,
            Sym::ActSnapshot => Action::Snapshot,
            Sym::ActOom => Action::Oom,
            Sym::ActAnnotate => Action::Annotate,
            Sym::ActFree => Action::Free,
            _ => return None,
        })
    }
}

/// A trace-entry key's symbol is its rank in the schema's entry order
/// ([`schema::ENTRY_ORDER`]), so the fast path checks the order by comparing symbols.
const _: () = {
    let mut i = 0;
    while i < Sym::ALL.len() {
        let sym = Sym::ALL[i];
        assert!(sym as usize == i);
        if let Some(key) = sym.key() {
            assert!(schema::entry_rank(key) == sym as u8);
            assert!(Sym::of_key(key) as u8 == sym as u8);
        }
        i += 1;
    }
    let mut r = 0;
    while r < schema::ENTRY_ORDER.len() {
        assert!(Sym::of_key(schema::ENTRY_ORDER[r]) as usize == r + 1);
        r += 1;
    }
};
