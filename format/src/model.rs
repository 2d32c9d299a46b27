//! The typed snapshot model: what `torch.cuda.memory._snapshot()` returns, for every era.
//!
//! Field names follow PyTorch's keys. Keys that some eras lack are `Option`s; keys no era we
//! know has are kept in `extra` and written back. Stacks are [`StackId`]s into the snapshot's
//! [`StackTable`] (see [`crate::intern`]).
//!
//! Integers: the typed int fields hold the 64-bit value analysis uses; when the file's number
//! is not what writing that field back gives (negative where the field is unsigned, ≥ 2^63
//! where it is signed, beyond 64 bits), the struct's `exact` ([`ExactInts`]) keeps the exact
//! value, and `exact_int` gives every field's exact value (see [`crate::int`]). Frame lines and
//! allocator settings are [`PyInt`]s outright.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::int::{ExactInts, IntField, PyInt};
use crate::intern::{Frame, FrameId, FrameTable, StackId, StackTable, StrId, StrTable};
use crate::value::{Extras, Value};

/// A whole snapshot, with its interning tables.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub frames: FrameTable,
    pub stacks: StackTable,
    pub strings: StrTable,
    /// The top-level shape: a dict (every era since 2.0) or a bare segment list.
    pub shape: Shape,
    /// Every segment, all devices, as the file lists them.
    pub segments: Vec<Segment>,
    /// One trace per device, oldest entry first. `None` when the file has no such key.
    pub device_traces: Option<Vec<Vec<TraceEntry>>>,
    pub allocator_settings: Option<AllocatorSettings>,
    pub external_annotations: Option<Vec<Annotation>>,
    /// 2.14+ pinned host allocator state; its schema is not pinned down, so kept generic.
    pub host_segments: Option<Value>,
    pub host_traces: Option<Value>,
    /// What memsnap's recorder adds (entries dropped by the ring buffer, ...). Written under the
    /// top-level key `"memsnap"`, which PyTorch's tools ignore.
    pub recorder_info: Option<RecorderInfo>,
    /// Unknown top-level keys, in order.
    pub extra: Extras,
}

/// The top-level object of the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shape {
    /// `{'segments': ..., 'device_traces': ..., ...}`
    #[default]
    Dict,
    /// The list `torch.cuda.memory_snapshot()` returns (only segments).
    SegmentList,
}

/// Information memsnap's recorder stores beside PyTorch's keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecorderInfo {
    /// Name and version of the program that wrote the snapshot.
    pub producer: String,
    /// Per device: trace entries the ring buffer dropped (oldest events lost).
    pub dropped_entries: Vec<u64>,
    /// Unknown keys of the `"memsnap"` dict, in order.
    #[serde(default)]
    pub extra: Extras,
    /// The exact `dropped_entries`, when one of them is not a `u64` (a foreign or damaged
    /// file); see [`RecorderInfo::dropped_entry_ints`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_entries_exact: Option<Vec<PyInt>>,
}

impl RecorderInfo {
    /// Sets `dropped_entries` from exact values (keeping them exactly when one is not a
    /// `u64`).
    pub fn set_dropped_entries(&mut self, exact: Vec<PyInt>) {
        self.dropped_entries = exact.iter().map(PyInt::low_u64).collect();
        self.dropped_entries_exact = exact.iter().any(|e| e.as_u64().is_none()).then_some(exact);
    }

    /// [`RecorderInfo::dropped_entries_exact`] when it is current (same length, same low 64
    /// bits as `dropped_entries`).
    pub fn current_dropped_entries_exact(&self) -> Option<&[PyInt]> {
        self.dropped_entries_exact.as_deref().filter(|exact| {
            exact.len() == self.dropped_entries.len()
                && exact
                    .iter()
                    .zip(&self.dropped_entries)
                    .all(|(e, &d)| e.low_u64() == d)
        })
    }

    /// The exact `dropped_entries` values.
    pub fn dropped_entry_ints(&self) -> Vec<PyInt> {
        match self.current_dropped_entries_exact() {
            Some(exact) => exact.to_vec(),
            None => self
                .dropped_entries
                .iter()
                .map(|&d| PyInt::from(d))
                .collect(),
        }
    }
}

/// One segment: a `cudaMalloc` or one mapped range of an expandable segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    /// Sum of `size` over `active_allocated` blocks.
    pub allocated_size: Option<u64>,
    /// Sum of `size` over blocks that are not `inactive`.
    pub active_size: Option<u64>,
    /// Sum of `requested_size` over blocks that are not `inactive`.
    pub requested_size: Option<u64>,
    pub stream: i64,
    pub segment_type: Option<SegmentType>,
    pub segment_pool_id: Option<(i64, i64)>,
    pub is_expandable: Option<bool>,
    /// Stack at segment allocation. `None` when the key is absent (legacy files).
    pub frames: Option<StackId>,
    /// PyTorch writes a non-empty `frames` after `blocks` and an empty one before; we keep the
    /// order the file had.
    pub frames_after_blocks: bool,
    pub blocks: Vec<Block>,
    pub extra: Extras,
    /// Exact values of the int fields where the typed field differs (see [`crate::int`]).
    #[serde(default, skip_serializing_if = "ExactInts::is_empty")]
    pub exact: ExactInts,
}

impl Segment {
    /// A segment with the 2.1+ keys and no blocks.
    pub fn new(device: i64, address: u64, total_size: u64, stream: i64) -> Self {
        Segment {
            device,
            address,
            total_size,
            allocated_size: Some(0),
            active_size: Some(0),
            requested_size: Some(0),
            stream,
            segment_type: Some(SegmentType::Large),
            segment_pool_id: Some((0, 0)),
            is_expandable: Some(false),
            frames: None,
            frames_after_blocks: false,
            blocks: Vec::new(),
            extra: Vec::new(),
            exact: ExactInts::default(),
        }
    }

    /// The exact value of an int field (`None` for a field the segment has not):
    /// `device`, `address`, `total_size`, `allocated_size`, `active_size`, `requested_size`,
    /// `stream`, and the two ints of `segment_pool_id` ([`IntField::PoolId0`], `PoolId1`).
    pub fn exact_int(&self, field: IntField) -> Option<PyInt> {
        let bits = match field {
            IntField::Device => self.device as u64,
            IntField::Address => self.address,
            IntField::TotalSize => self.total_size,
            IntField::AllocatedSize => self.allocated_size?,
            IntField::ActiveSize => self.active_size?,
            IntField::RequestedSize => self.requested_size?,
            IntField::Stream => self.stream as u64,
            IntField::PoolId0 => self.segment_pool_id?.0 as u64,
            IntField::PoolId1 => self.segment_pool_id?.1 as u64,
            _ => return None,
        };
        Some(self.exact.exact(field, bits))
    }

    /// Block addresses: the stored `address`, or (legacy files) the running sum from the segment
    /// base, as PyTorch's viewer computes them.
    pub fn block_addresses(&self) -> impl Iterator<Item = (u64, &Block)> {
        let mut next = self.address;
        self.blocks.iter().map(move |b| {
            let addr = b.address.unwrap_or(next);
            next = addr.wrapping_add(b.size);
            (addr, b)
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SegmentType {
    Large,
    Small,
    Other(StrId),
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// Absent in legacy (≤2.0) files.
    pub address: Option<u64>,
    pub size: u64,
    /// What the caller asked for. Stale on `inactive` blocks (PyTorch does not reset it); kept.
    pub requested_size: Option<u64>,
    pub state: BlockState,
    pub frames: Option<StackId>,
    pub forward_frames: Option<Vec<String>>,
    /// Legacy (≤2.0) per-block history.
    pub history: Option<Vec<HistoryItem>>,
    pub extra: Extras,
    /// Exact values of the int fields where the typed field differs (see [`crate::int`]).
    #[serde(default, skip_serializing_if = "ExactInts::is_empty")]
    pub exact: ExactInts,
}

impl Block {
    /// A block at `address` as PyTorch 2.1+ writes one: `requested_size` equal to `size`, no
    /// stack (`frames` empty), nothing else.
    pub fn new(address: u64, size: u64, state: BlockState) -> Block {
        Block {
            address: Some(address),
            size,
            requested_size: Some(size),
            state,
            frames: None,
            forward_frames: None,
            history: None,
            extra: Vec::new(),
            exact: Default::default(),
        }
    }

    /// The exact value of `address`, `size` or `requested_size` (`None` for another field or
    /// an absent key).
    pub fn exact_int(&self, field: IntField) -> Option<PyInt> {
        let bits = match field {
            IntField::Address => self.address?,
            IntField::Size => self.size,
            IntField::RequestedSize => self.requested_size?,
            _ => return None,
        };
        Some(self.exact.exact(field, bits))
    }
}

impl Default for Block {
    /// An empty cached block: no address, size 0, `inactive`, no keys beyond the required.
    fn default() -> Self {
        Block {
            address: None,
            size: 0,
            requested_size: None,
            state: BlockState::Inactive,
            frames: None,
            forward_frames: None,
            history: None,
            extra: Vec::new(),
            exact: ExactInts::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
    Other(StrId),
}

/// A legacy block history item: `{'addr', 'real_size', 'frames'[, 'cpp_frames']}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryItem {
    pub addr: u64,
    pub real_size: u64,
    pub frames: Option<StackId>,
    pub extra: Extras,
    /// Exact values of the int fields where the typed field differs (see [`crate::int`]).
    #[serde(default, skip_serializing_if = "ExactInts::is_empty")]
    pub exact: ExactInts,
}

impl HistoryItem {
    /// The exact value of `addr` or `real_size` (`None` for another field).
    pub fn exact_int(&self, field: IntField) -> Option<PyInt> {
        let bits = match field {
            IntField::Addr => self.addr,
            IntField::RealSize => self.real_size,
            _ => return None,
        };
        Some(self.exact.exact(field, bits))
    }
}

/// One event of a device trace.
///
/// 48 bytes (a 10M-entry trace is 480 MB): what nearly every entry has is stored inline, the
/// rest in [`EntryRare`]. `time_us` is stored with a sentinel for "absent",
/// `compile_context` and `user_metadata` as flags when they hold their version default (`"N/A"`,
/// `""`: nearly every real entry), an unknown action's name in the rare part. Read and set
/// those through the methods ([`TraceEntry::time_us`], [`TraceEntry::compile_context`],
/// [`TraceEntry::action_name`], ...).
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEntry {
    /// Block or segment address; 0 for `snapshot`; 0 and absent for `oom` (see [`EntryRare`]).
    pub addr: u64,
    /// Requested bytes for alloc/free, segment bytes for segment events, active bytes for
    /// `snapshot`, the rounded request for `oom`.
    pub size: u64,
    pub stream: i64,
    /// Microseconds since the Unix epoch (2.2+); [`NO_TIME`] when absent (a file that holds
    /// that very value says so in [`EntryRare::time_us_is_sentinel`]).
    time_us: i64,
    /// Keys few entries have, boxed to keep the common entry small.
    pub rare: Option<Box<EntryRare>>,
    /// Present only when the entry has a context.
    pub frames: Option<StackId>,
    /// [`Action::Other`]'s name is [`EntryRare::other_action`].
    pub action: Action,
    /// Which of `compile_context` / `user_metadata` the entry has, and whether it holds the
    /// version default (otherwise the value is in [`EntryRare`]).
    strs: EntryStrs,
}

/// `time_us` of an entry without the key.
const NO_TIME: i64 = i64::MIN;

/// Bits of [`TraceEntry::strs`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct EntryStrs(u8);

impl EntryStrs {
    const COMPILE_CONTEXT: u8 = 1;
    const COMPILE_CONTEXT_IS_DEFAULT: u8 = 2;
    const USER_METADATA: u8 = 4;
    const USER_METADATA_IS_DEFAULT: u8 = 8;

    #[inline]
    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    #[inline]
    fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.0 |= bit;
        } else {
            self.0 &= !bit;
        }
    }
}

impl TraceEntry {
    /// A bare entry with the given action, address, size and stream.
    ///
    /// For an action this version does not know, use [`TraceEntry::set_other_action`].
    pub fn new(action: Action, addr: u64, size: u64, stream: i64) -> Self {
        TraceEntry {
            addr,
            size,
            stream,
            time_us: NO_TIME,
            rare: None,
            frames: None,
            action,
            strs: EntryStrs::default(),
        }
    }

    /// The action's name as written in the file (`""` for an [`Action::Other`] set without
    /// [`TraceEntry::set_other_action`], which `compare::check_ids` reports).
    pub fn action_name<'a>(&self, strings: &'a StrTable) -> &'a str {
        match self.action.known_name() {
            Some(name) => name,
            None => self.other_action().map_or("", |id| strings.get(id)),
        }
    }

    /// The interned name of an [`Action::Other`] (`None` for a known action).
    pub fn other_action(&self) -> Option<StrId> {
        match self.action {
            Action::Other => self.rare.as_ref().and_then(|r| r.other_action),
            _ => None,
        }
    }

    /// Makes the action one this version does not know, named `name`.
    pub fn set_other_action(&mut self, name: StrId) {
        self.action = Action::Other;
        self.rare_mut().other_action = Some(name);
    }

    /// `time_us` (2.2+), `None` when the entry has no such key.
    #[inline]
    pub fn time_us(&self) -> Option<i64> {
        if self.time_us != NO_TIME {
            Some(self.time_us)
        } else if self.rare.as_ref().is_some_and(|r| r.time_us_is_sentinel) {
            Some(NO_TIME)
        } else {
            None
        }
    }

    #[inline]
    pub fn set_time_us(&mut self, time_us: Option<i64>) {
        self.time_us = time_us.unwrap_or(NO_TIME);
        let sentinel = time_us == Some(NO_TIME);
        if sentinel {
            self.rare_mut().time_us_is_sentinel = true;
        } else if let Some(r) = &mut self.rare {
            r.time_us_is_sentinel = false;
        }
    }

    /// `compile_context` (2.8+): `None` when the entry has no such key. `strings` is the
    /// snapshot's table (the default `"N/A"` is kept as a flag, its id is the table's).
    #[inline]
    pub fn compile_context(&self, strings: &StrTable) -> Option<StrId> {
        self.entry_str(
            EntryStrs::COMPILE_CONTEXT,
            EntryStrs::COMPILE_CONTEXT_IS_DEFAULT,
            || strings.compile_context_default(),
            |r| r.compile_context,
        )
    }

    /// `user_metadata` (2.10+): `None` when the entry has no such key. `strings` is the
    /// snapshot's table (the default `""` is kept as a flag, its id is the table's).
    #[inline]
    pub fn user_metadata(&self, strings: &StrTable) -> Option<StrId> {
        self.entry_str(
            EntryStrs::USER_METADATA,
            EntryStrs::USER_METADATA_IS_DEFAULT,
            || strings.user_metadata_default(),
            |r| r.user_metadata,
        )
    }

    /// Whether the entry has a `compile_context` key.
    #[inline]
    pub fn has_compile_context(&self) -> bool {
        self.strs.has(EntryStrs::COMPILE_CONTEXT)
    }

    /// Whether the entry has a `user_metadata` key.
    #[inline]
    pub fn has_user_metadata(&self) -> bool {
        self.strs.has(EntryStrs::USER_METADATA)
    }

    /// Sets `compile_context` to `value`, an id of `strings` (the snapshot's table).
    #[inline]
    pub fn set_compile_context(&mut self, value: Option<StrId>, strings: &StrTable) {
        self.set_compile_context_given_default(value, strings.compile_context_default());
    }

    /// Sets `user_metadata` to `value`, an id of `strings` (the snapshot's table).
    #[inline]
    pub fn set_user_metadata(&mut self, value: Option<StrId>, strings: &StrTable) {
        self.set_user_metadata_given_default(value, strings.user_metadata_default());
    }

    /// [`TraceEntry::set_compile_context`] where the caller knows the id of `"N/A"`.
    #[inline]
    pub(crate) fn set_compile_context_given_default(
        &mut self,
        value: Option<StrId>,
        default: Option<StrId>,
    ) {
        self.set_entry_str(
            value,
            default,
            EntryStrs::COMPILE_CONTEXT,
            EntryStrs::COMPILE_CONTEXT_IS_DEFAULT,
            |r| &mut r.compile_context,
        );
    }

    /// [`TraceEntry::set_user_metadata`] where the caller knows the id of `""`.
    #[inline]
    pub(crate) fn set_user_metadata_given_default(
        &mut self,
        value: Option<StrId>,
        default: Option<StrId>,
    ) {
        self.set_entry_str(
            value,
            default,
            EntryStrs::USER_METADATA,
            EntryStrs::USER_METADATA_IS_DEFAULT,
            |r| &mut r.user_metadata,
        );
    }

    #[inline]
    fn entry_str(
        &self,
        present: u8,
        is_default: u8,
        default: impl FnOnce() -> Option<StrId>,
        rare: impl FnOnce(&EntryRare) -> Option<StrId>,
    ) -> Option<StrId> {
        if !self.strs.has(present) {
            None
        } else if self.strs.has(is_default) {
            default()
        } else {
            self.rare.as_deref().and_then(rare)
        }
    }

    #[inline]
    fn set_entry_str(
        &mut self,
        value: Option<StrId>,
        default: Option<StrId>,
        present: u8,
        is_default: u8,
        rare: impl Fn(&mut EntryRare) -> &mut Option<StrId>,
    ) {
        let is_the_default = value.is_some() && value == default;
        self.strs.set(present, value.is_some());
        self.strs.set(is_default, is_the_default);
        if value.is_some() && !is_the_default {
            *rare(self.rare_mut()) = value;
        } else if let Some(r) = &mut self.rare {
            *rare(r) = None;
        }
    }

    /// `device_free` of an `oom` entry.
    pub fn device_free(&self) -> Option<u64> {
        self.rare.as_ref().and_then(|r| r.device_free)
    }

    /// Whether the entry has an `addr` key (every entry but `oom`).
    pub fn has_addr(&self) -> bool {
        !self.rare.as_ref().is_some_and(|r| r.no_addr)
    }

    pub fn rare_mut(&mut self) -> &mut EntryRare {
        self.rare.get_or_insert_with(Default::default)
    }

    /// The exact value of `addr`, `device_free`, `size`, `stream` or `time_us` (`None` for
    /// another field or an absent key). The common entry has no override and this is the typed
    /// field's value.
    #[inline]
    pub fn exact_int(&self, field: IntField) -> Option<PyInt> {
        let bits = match field {
            IntField::Addr if self.has_addr() => self.addr,
            IntField::DeviceFree => self.device_free()?,
            IntField::Size => self.size,
            IntField::Stream => self.stream as u64,
            IntField::TimeUs => self.time_us()? as u64,
            _ => return None,
        };
        Some(match &self.rare {
            Some(r) => r.exact.exact(field, bits),
            None => field.natural(bits),
        })
    }

    /// Whether any int field has an exact value the typed field does not give.
    pub fn has_exact_ints(&self) -> bool {
        self.rare.as_ref().is_some_and(|r| !r.exact.is_empty())
    }
}

/// Trace-entry keys that few entries carry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EntryRare {
    /// `oom`: free device bytes, written in place of `addr`.
    pub device_free: Option<u64>,
    /// The entry has no `addr` key (`oom`).
    pub no_addr: bool,
    /// 2.15: allocator-internal tag.
    pub internal_metadata: Option<StrId>,
    /// 2.11+: forward-pass traceback strings.
    pub forward_frames: Option<Vec<String>>,
    /// Legacy (≤2.0) entries write `frames` (and `cpp_frames`) first.
    pub legacy_frames_first: bool,
    /// Unknown keys, in order (legacy `cpp_frames` among them).
    pub extra: Extras,
    /// Exact values of the entry's int fields where the typed field differs (see
    /// [`crate::int`]; kept here so the common entry stays small).
    pub exact: ExactInts,
    /// The name of an [`Action::Other`].
    pub other_action: Option<StrId>,
    /// A `compile_context` other than `"N/A"` (set through
    /// [`TraceEntry::set_compile_context`]).
    pub compile_context: Option<StrId>,
    /// A `user_metadata` other than `""` (set through [`TraceEntry::set_user_metadata`]).
    pub user_metadata: Option<StrId>,
    /// `time_us` is present and is `i64::MIN`, the value the entry uses for "absent".
    pub time_us_is_sentinel: bool,
}

impl EntryRare {
    /// Whether it holds only what an entry keeps here to stay small (an unknown action's name,
    /// a non-default `compile_context` or `user_metadata`, the `time_us` sentinel flag): the
    /// keys that were inline before the entry shrank, so msgpack writes no rare part for it.
    pub fn holds_only_moved_fields(&self) -> bool {
        self.device_free.is_none()
            && !self.no_addr
            && self.internal_metadata.is_none()
            && self.forward_frames.is_none()
            && !self.legacy_frames_first
            && self.extra.is_empty()
            && self.exact.is_empty()
    }
}

/// Trace actions (`TraceEntry::Action` in PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Annotate,
    /// Never written by PyTorch; its viewer merges a free pair into it.
    Free,
    /// An action name this version does not know, passed through; the name is the entry's
    /// ([`TraceEntry::other_action`]).
    Other,
}

impl Action {
    /// Every action in declaration order, so that `Action::ALL[a as usize] == a`: that index is
    /// an action's tag in the recorder's ring slots and in the live protocol (`crate::live`),
    /// one table for both.
    pub const ALL: [Action; 12] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::Annotate,
        Action::Free,
        Action::Other,
    ];

    /// Parses a known action name; `None` for names to keep as [`Action::Other`].
    pub fn from_name(name: &str) -> Option<Action> {
        Some(match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" => Action::Annotate,
            "free" => Action::Free,
            _ => return None,
        })
    }

    /// The name of a known action as written in the file; `None` for [`Action::Other`] (whose
    /// name [`TraceEntry::action_name`] gives).
    pub fn known_name(&self) -> Option<&'static str> {
        Some(match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::Free => "free",
            Action::Other => return None,
        })
    }
}

impl SegmentType {
    pub fn from_name(name: &str) -> Option<SegmentType> {
        match name {
            "large" => Some(SegmentType::Large),
            "small" => Some(SegmentType::Small),
            _ => None,
        }
    }

    pub fn name<'a>(&self, strings: &'a StrTable) -> &'a str {
        match self {
            SegmentType::Large => "large",
            SegmentType::Small => "small",
            SegmentType::Other(id) => strings.get(*id),
        }
    }
}

impl BlockState {
    pub fn from_name(name: &str) -> Option<BlockState> {
        match name {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            "active_pending_free" => Some(BlockState::ActivePendingFree),
            "inactive" => Some(BlockState::Inactive),
            _ => None,
        }
    }

    pub fn name<'a>(&self, strings: &'a StrTable) -> &'a str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
            BlockState::Other(id) => strings.get(*id),
        }
    }

    /// Allocated or pending free (counted in `active_size`).
    pub fn is_active(&self) -> bool {
        !matches!(self, BlockState::Inactive)
    }
}

/// `allocator_settings` (2.3+). Known keys are typed; others kept in order in `extra`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorSettings {
    /// Key `PYTORCH_CUDA_ALLOC_CONF`.
    pub alloc_conf: Option<String>,
    /// `-1` means unlimited.
    pub max_split_size: Option<PyInt>,
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: Option<bool>,
    pub pinned_num_register_threads: Option<PyInt>,
    pub release_lock_on_cudamalloc: Option<bool>,
    pub pinned_use_cuda_host_register: Option<bool>,
    pub graph_capture_record_stream_reuse: Option<bool>,
    /// `("1", divisions), ("2", ...), ...` in file order.
    pub roundup_power2_divisions: Option<Vec<(String, PyInt)>>,
    pub max_round_threshold: Option<PyInt>,
    pub max_cached_size: Option<PyInt>,
    pub extra: Extras,
}

/// One `external_annotations` entry (2.5+): `record_function` START/END markers.
///
/// A run holds millions (two per range, and a range per step, per phase, per module call):
/// the keys after `time_us` and the exact ints that nearly none has are boxed, so that an
/// annotation is 64 bytes instead of 104 (48 MB of a 10M-entry run's 1.2M annotations).
#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    /// The metadata keys (`stage`, `name`, ...) in file order; their order is not fixed.
    pub metadata: Metadata,
    pub device: i64,
    pub time_us: i64,
    rare: Option<Box<AnnotationRare>>,
}

/// What few annotations have.
#[derive(Clone, Debug, Default, PartialEq)]
struct AnnotationRare {
    /// Keys after `time_us`.
    extra: Extras,
    /// Exact `device` / `time_us` where the typed field differs (see [`crate::int`]).
    exact: ExactInts,
}

/// Nothing, for an annotation without the rare part.
static NO_EXACT_INTS: ExactInts = ExactInts::NONE;

/// The msgpack and JSON layout of an [`Annotation`] (as when every field was its own).
#[derive(Serialize)]
struct AnnotationOut<'a> {
    metadata: &'a Metadata,
    device: i64,
    time_us: i64,
    extra: &'a [(String, Value)],
    #[serde(skip_serializing_if = "no_exact_ints")]
    exact: &'a ExactInts,
}

fn no_exact_ints(exact: &&ExactInts) -> bool {
    exact.is_empty()
}

#[derive(Deserialize)]
struct AnnotationIn {
    metadata: Metadata,
    device: i64,
    time_us: i64,
    extra: Extras,
    #[serde(default)]
    exact: ExactInts,
}

impl Serialize for Annotation {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        AnnotationOut {
            metadata: &self.metadata,
            device: self.device,
            time_us: self.time_us,
            extra: self.extra(),
            exact: self.exact(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Annotation {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let a = AnnotationIn::deserialize(deserializer)?;
        Ok(Annotation::new(a.metadata, a.device, a.time_us).with_rare(a.extra, a.exact))
    }
}

impl Annotation {
    /// An annotation with these keys and nothing after `time_us`.
    pub fn new(metadata: Metadata, device: i64, time_us: i64) -> Self {
        Annotation {
            metadata,
            device,
            time_us,
            rare: None,
        }
    }

    /// A `record_function` marker, as PyTorch's profiler writes one: the START (or END, when
    /// `end`) of the range `name` on `device` at `time_us`.
    pub fn record(end: bool, name: impl Into<String>, device: i64, time_us: i64) -> Self {
        Annotation::new(Metadata::record(end, name), device, time_us)
    }

    /// The same with keys after `time_us` and exact ints (boxed only when there are any).
    pub fn with_rare(mut self, mut extra: Extras, exact: ExactInts) -> Self {
        self.rare = if extra.is_empty() && exact.is_empty() {
            None
        } else {
            extra.shrink_to_fit();
            Some(Box::new(AnnotationRare { extra, exact }))
        };
        self
    }

    /// Keys after `time_us`, if any.
    pub fn extra(&self) -> &[(String, Value)] {
        self.rare
            .as_deref()
            .map_or(&[], |rare| rare.extra.as_slice())
    }

    pub fn extra_mut(&mut self) -> &mut Extras {
        &mut self.rare.get_or_insert_with(Default::default).extra
    }

    /// Exact `device` / `time_us` where the typed field differs (see [`crate::int`]).
    pub fn exact(&self) -> &ExactInts {
        self.rare
            .as_deref()
            .map_or(&NO_EXACT_INTS, |rare| &rare.exact)
    }

    pub fn exact_mut(&mut self) -> &mut ExactInts {
        &mut self.rare.get_or_insert_with(Default::default).exact
    }

    /// The exact value of `device` or `time_us` (`None` for another field).
    pub fn exact_int(&self, field: IntField) -> Option<PyInt> {
        let bits = match field {
            IntField::Device => self.device as u64,
            IntField::TimeUs => self.time_us as u64,
            _ => return None,
        };
        Some(self.exact().exact(field, bits))
    }

    pub fn stage(&self) -> Option<&str> {
        self.meta_str("stage")
    }

    pub fn name(&self) -> Option<&str> {
        self.meta_str("name")
    }

    fn meta_str(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).and_then(Value::as_str)
    }
}

/// An annotation's metadata: its keys and values in file order.
///
/// A run's annotations are nearly all `record_function`'s `{'stage': 'START' | 'END',
/// 'name': str}`, and a long run has millions of them: held as five allocations (the pair
/// vector, two keys, two values) that was about 340 bytes an annotation, more than the
/// trace entries around it. That layout is held as the name alone (the stage a flag, the
/// keys and the stage's value shared statics), about 130 bytes; anything else keeps every
/// pair as written. Both read back the same through [`Metadata::iter`] and compare equal
/// when their pairs do.
#[derive(Clone, Default)]
pub struct Metadata(MetadataRepr);

#[derive(Clone, Default)]
enum MetadataRepr {
    #[default]
    Empty,
    /// `[('stage', 'START' or 'END'), ('name', Value::Str(..))]`, in that order.
    Record {
        end: bool,
        name: Value,
    },
    Pairs(Vec<(String, Value)>),
}

/// The shared values of a compact [`Metadata`]'s `stage` key (a `String` cannot be a
/// constant, so they are made once).
fn stage_value(end: bool) -> &'static Value {
    static START: std::sync::LazyLock<Value> =
        std::sync::LazyLock::new(|| Value::Str("START".to_owned()));
    static END: std::sync::LazyLock<Value> =
        std::sync::LazyLock::new(|| Value::Str("END".to_owned()));
    if end {
        &END
    } else {
        &START
    }
}

impl Metadata {
    /// No keys.
    pub fn new() -> Self {
        Metadata(MetadataRepr::Empty)
    }

    /// A `record_function` marker's metadata: `stage` (`START`, or `END` when `end`), then
    /// `name`.
    pub fn record(end: bool, name: impl Into<String>) -> Self {
        Metadata(MetadataRepr::Record {
            end,
            name: Value::Str(name.into()),
        })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        match &self.0 {
            MetadataRepr::Empty => 0,
            MetadataRepr::Record { .. } => 2,
            MetadataRepr::Pairs(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys and values in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + '_ {
        let record = match &self.0 {
            MetadataRepr::Record { end, name } => Some((*end, name)),
            MetadataRepr::Empty | MetadataRepr::Pairs(_) => None,
        };
        let pairs: &[(String, Value)] = match &self.0 {
            MetadataRepr::Pairs(p) => p,
            MetadataRepr::Empty | MetadataRepr::Record { .. } => &[],
        };
        let record = record
            .into_iter()
            .flat_map(|(end, name)| [("stage", stage_value(end)), ("name", name)]);
        MetadataIter {
            record,
            pairs: pairs.iter(),
            left: self.len(),
        }
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Appends a key (a repeated key is kept, as the file had it).
    pub fn push(&mut self, key: String, value: Value) {
        let mut pairs = std::mem::take(self).into_pairs();
        pairs.push((key, value));
        *self = Metadata::from(pairs);
    }

    /// The keys and values as owned pairs, in file order.
    pub fn into_pairs(self) -> Vec<(String, Value)> {
        match self.0 {
            MetadataRepr::Empty => Vec::new(),
            MetadataRepr::Record { end, name } => vec![
                ("stage".to_owned(), stage_value(end).clone()),
                ("name".to_owned(), name),
            ],
            MetadataRepr::Pairs(p) => p,
        }
    }
}

struct MetadataIter<'a, R> {
    record: R,
    pairs: std::slice::Iter<'a, (String, Value)>,
    left: usize,
}

impl<'a, R: Iterator<Item = (&'static str, &'a Value)>> Iterator for MetadataIter<'a, R> {
    type Item = (&'a str, &'a Value);

    fn next(&mut self) -> Option<Self::Item> {
        let next = match self.record.next() {
            Some(kv) => Some(kv),
            None => self.pairs.next().map(|(k, v)| (k.as_str(), v)),
        };
        self.left = self.left.saturating_sub(usize::from(next.is_some()));
        next
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<'a, R: Iterator<Item = (&'static str, &'a Value)>> ExactSizeIterator for MetadataIter<'a, R> {}

impl From<Vec<(String, Value)>> for Metadata {
    /// Holds `record_function`'s layout compactly (see [`Metadata`]); keeps any other.
    fn from(mut pairs: Vec<(String, Value)>) -> Self {
        if pairs.is_empty() {
            return Metadata::new();
        }
        if let [(stage_key, Value::Str(stage)), (name_key, Value::Str(_))] = pairs.as_slice() {
            if stage_key == "stage" && name_key == "name" && (stage == "START" || stage == "END") {
                let end = stage == "END";
                let name = pairs.pop().map(|(_, v)| v).unwrap_or(Value::None);
                return Metadata(MetadataRepr::Record { end, name });
            }
        }
        pairs.shrink_to_fit();
        Metadata(MetadataRepr::Pairs(pairs))
    }
}

impl<K: Into<String>> FromIterator<(K, Value)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (K, Value)>>(pairs: I) -> Self {
        Metadata::from(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v))
                .collect::<Vec<_>>(),
        )
    }
}

impl PartialEq for Metadata {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// As the list of `(key, value)` pairs it was before it was compact: the msgpack and JSON
/// layouts are unchanged.
impl Serialize for Metadata {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<(String, Value)>::deserialize(deserializer).map(Metadata::from)
    }
}

impl Snapshot {
    /// An empty dict-shaped snapshot with `devices` empty traces.
    pub fn new(devices: usize) -> Self {
        Snapshot {
            device_traces: Some(vec![Vec::new(); devices]),
            ..Default::default()
        }
    }

    /// Interns a stack given as frames, innermost first.
    pub fn intern_stack(&mut self, frames: impl IntoIterator<Item = Frame>) -> StackId {
        let ids: Vec<FrameId> = frames.into_iter().map(|f| self.frames.intern(f)).collect();
        self.stacks.intern(&ids)
    }

    /// Appends `segments`, which belong to `source`, with every stack they name (a segment's,
    /// its blocks', their history items') interned into this snapshot's tables, each once.
    /// O(blocks + frames of the stacks they use).
    pub fn add_segments_from(
        &mut self,
        source: &Snapshot,
        segments: impl IntoIterator<Item = Segment>,
    ) {
        let mut interned: Vec<Option<StackId>> = vec![None; source.stacks.len()];
        let mut reintern = |this: &mut Snapshot, id: &mut Option<StackId>| {
            let Some(old) = *id else { return };
            let new = match interned.get(old.index()).copied().flatten() {
                Some(known) => known,
                None => {
                    let new = this.intern_stack(source.stack_frames(old).cloned());
                    if let Some(slot) = interned.get_mut(old.index()) {
                        *slot = Some(new);
                    }
                    new
                }
            };
            *id = Some(new);
        };
        for mut segment in segments {
            reintern(self, &mut segment.frames);
            for block in &mut segment.blocks {
                reintern(self, &mut block.frames);
                for item in block.history.iter_mut().flatten() {
                    reintern(self, &mut item.frames);
                }
            }
            self.segments.push(segment);
        }
    }

    /// The frames of a stack, innermost first.
    pub fn stack_frames(&self, id: StackId) -> impl ExactSizeIterator<Item = &Frame> + '_ {
        self.stacks.get(id).iter().map(|f| self.frames.get(*f))
    }

    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id)
    }

    /// The traces, or an empty slice when the file has none.
    pub fn traces(&self) -> &[Vec<TraceEntry>] {
        self.device_traces.as_deref().unwrap_or(&[])
    }

    /// Number of trace entries over all devices.
    pub fn entry_count(&self) -> usize {
        self.traces().iter().map(Vec::len).sum()
    }

    /// Devices that appear in the traces or segments, ascending.
    pub fn devices(&self) -> Vec<i64> {
        let mut devices: Vec<i64> = (0..self.traces().len() as i64).collect();
        devices.extend(self.segments.iter().map(|s| s.device));
        devices.sort_unstable();
        devices.dedup();
        devices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(kv: &[(&str, &str)]) -> Vec<(String, Value)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), Value::Str(v.to_string())))
            .collect()
    }

    #[test]
    fn record_function_metadata_is_held_compactly_and_reads_back_as_written() {
        for stage in ["START", "END"] {
            let written = pairs(&[("stage", stage), ("name", "ProfilerStep#7")]);
            let metadata = Metadata::from(written.clone());
            assert!(matches!(metadata.0, MetadataRepr::Record { .. }), "{stage}");
            let read: Vec<(String, Value)> = metadata
                .iter()
                .map(|(k, v)| (k.to_owned(), v.clone()))
                .collect();
            assert_eq!(read, written);
            assert_eq!(metadata.iter().len(), 2);
            assert_eq!(metadata.get("stage").and_then(Value::as_str), Some(stage));
            assert_eq!(metadata, Metadata::record(stage == "END", "ProfilerStep#7"));
            assert_eq!(metadata.clone().into_pairs(), written);
        }
    }

    #[test]
    fn metadata_of_any_other_layout_keeps_every_pair_in_order() {
        let layouts = [
            pairs(&[("name", "x"), ("stage", "START")]),
            pairs(&[("stage", "BEGIN"), ("name", "x")]),
            pairs(&[("stage", "START"), ("name", "x"), ("tag", "y")]),
            pairs(&[("stage", "START")]),
            pairs(&[("stage", "START"), ("stage", "END")]),
            vec![
                ("stage".into(), Value::Str("START".into())),
                ("name".into(), Value::Int(3)),
            ],
            Vec::new(),
        ];
        for written in layouts {
            let metadata = Metadata::from(written.clone());
            assert!(
                !matches!(metadata.0, MetadataRepr::Record { .. }),
                "{written:?}"
            );
            assert_eq!(metadata.len(), written.len());
            assert_eq!(metadata.clone().into_pairs(), written);
        }
        // Pushing onto a compact record keeps the pairs and their order.
        let mut grown = Metadata::record(false, "x");
        grown.push("tag".into(), Value::Int(1));
        let mut expected = pairs(&[("stage", "START"), ("name", "x")]);
        expected.push(("tag".into(), Value::Int(1)));
        assert_eq!(grown.into_pairs(), expected);
    }

    #[test]
    fn every_action_sits_at_its_own_tag() {
        for (tag, &action) in Action::ALL.iter().enumerate() {
            assert_eq!(action as usize, tag, "{action:?}");
        }
    }

    #[test]
    fn segments_from_another_snapshot_keep_their_stacks() {
        // What a Chrome export's state brings back: segments whose block and history stacks
        // point into the exporting snapshot's tables.
        let mut source = Snapshot::default();
        let _unused = source.intern_stack([Frame::new("traced_only", "t.py", 1)]);
        let a = source.intern_stack([Frame::new("forward", "m.py", 7)]);
        let b = source.intern_stack([Frame::new("step", "o.py", 9)]);
        let mut segment = Segment::new(0, 0x1000, 4096, 0);
        segment.frames = Some(b);
        let mut block = Block::new(0x1000, 512, BlockState::ActiveAllocated);
        block.frames = Some(a);
        block.history = Some(vec![HistoryItem {
            addr: 0x1000,
            real_size: 512,
            frames: Some(b),
            extra: Vec::new(),
            exact: Default::default(),
        }]);
        segment.blocks.push(block);
        let mut target = Snapshot::default();
        let first = target.intern_stack([Frame::new("other", "x.py", 2)]);
        target.add_segments_from(&source, [segment]);
        let names = |id: Option<StackId>| -> Vec<String> {
            target
                .stack_frames(id.unwrap())
                .map(|f| f.name.clone())
                .collect()
        };
        let seg = &target.segments[0];
        assert_eq!(names(seg.frames), ["step"]);
        assert_eq!(names(seg.blocks[0].frames), ["forward"]);
        assert_eq!(
            names(seg.blocks[0].history.as_ref().unwrap()[0].frames),
            ["step"]
        );
        // Only the stacks the segments use were added, each once.
        assert_eq!(target.stacks.len(), 3);
        assert_eq!(names(Some(first)), ["other"]);
    }

    /// What keeps the entry at 48 bytes (pinned in `tests/it/numbers.rs`).
    #[test]
    fn optional_ids_take_4_bytes() {
        assert_eq!(std::mem::size_of::<Option<StrId>>(), 4);
        assert_eq!(std::mem::size_of::<Option<StackId>>(), 4);
    }

    #[test]
    fn entry_strings_keep_defaults_as_flags_and_others_in_the_rare_part() {
        let mut strings = StrTable::default();
        let own = strings.intern("ctx");
        let na = strings.intern("N/A");
        let blank = strings.intern("");
        let mut e = TraceEntry::new(Action::Alloc, 1, 2, 3);
        e.set_compile_context(Some(na), &strings);
        e.set_user_metadata(Some(blank), &strings);
        assert_eq!(e.compile_context(&strings), Some(na));
        assert_eq!(e.user_metadata(&strings), Some(blank));
        assert!(e.rare.is_none());
        e.set_compile_context(Some(own), &strings);
        assert_eq!(e.compile_context(&strings), Some(own));
        assert_eq!(e.user_metadata(&strings), Some(blank));
        e.set_compile_context(None, &strings);
        assert_eq!(e.compile_context(&strings), None);
        assert!(!e.has_compile_context());
        assert!(e.rare.as_ref().unwrap().holds_only_moved_fields());
    }

    #[test]
    fn a_time_of_i64_min_is_kept_apart_from_no_time() {
        let mut e = TraceEntry::new(Action::Alloc, 1, 2, 3);
        assert_eq!(e.time_us(), None);
        e.set_time_us(Some(i64::MIN));
        assert_eq!(e.time_us(), Some(i64::MIN));
        assert_eq!(e.exact_int(IntField::TimeUs), Some(PyInt::from(i64::MIN)));
        e.set_time_us(None);
        assert_eq!(e.time_us(), None);
        e.set_time_us(Some(-1));
        assert_eq!(e.time_us(), Some(-1));
    }

    #[test]
    fn an_unknown_action_is_named_by_its_entry() {
        let mut strings = StrTable::default();
        let name = strings.intern("future_action");
        let mut e = TraceEntry::new(Action::Alloc, 1, 2, 3);
        assert_eq!(e.action_name(&strings), "alloc");
        e.set_other_action(name);
        assert_eq!(e.action, Action::Other);
        assert_eq!(e.action_name(&strings), "future_action");
        assert_eq!(e.other_action(), Some(name));
    }
}
