//! The pickle memo (what `MEMOIZE`/`BINPUT` store and `BINGET` fetches), bounded against
//! hostile indices and packed: a 1M-entry file memoizes 2M objects, so a dense slot of the
//! format reader's memo is 8 bytes, and an undo record lets the reader's fast path take back
//! what it stored when it gives up.
//!
//! The memo is the machine's (`machine`), generic over how a builder's values sit in a slot
//! ([`Packing`]): the format reader packs its [`Val`]s into a `u64` ([`ValPacking`]), the
//! Python loader keeps its objects as they are (`Option<Bound<PyAny>>`, one pointer).

use std::collections::HashMap;

use super::arena::Val;
use super::sym::Sym;

/// Memo indices above `memo.len() + MEMO_DENSE_SLACK` go to a sparse map, so a hostile
/// `LONG_BINPUT 0xffffffff` cannot make us allocate a 64 GiB vector.
const MEMO_DENSE_SLACK: usize = 1 << 16;

/// How a builder's values are held in the memo's dense slots.
pub trait Packing {
    /// What the builder makes (see `machine::Build::Value`).
    type Value: Clone;
    /// One dense slot: [`Packing::EMPTY`] or a packed value.
    type Slot: Clone;
    /// A slot never stored to.
    const EMPTY: Self::Slot;
    fn is_empty(slot: &Self::Slot) -> bool;
    /// `v` as a slot; values that do not fit may go to `wide` (and the slot says where).
    fn pack(v: Self::Value, wide: &mut Vec<Self::Value>) -> Self::Slot;
    /// The value in a non-empty slot (`None` for a slot that names nothing valid).
    fn unpack(slot: &Self::Slot, wide: &[Self::Value]) -> Option<Self::Value>;
}

/// The pickle memo: dense for the indices picklers use (counting up from 0), sparse beyond.
pub struct Memo<P: Packing> {
    pub(crate) dense: Vec<P::Slot>,
    /// Values too wide to pack, referenced from `dense`.
    wide: Vec<P::Value>,
    sparse: HashMap<u64, P::Value>,
    /// Number of indices stored (the next `MEMOIZE` index).
    pub(crate) count: usize,
    /// Bumped whenever a stored index changes or is removed (not when one is added): what was
    /// concluded from memo references before then may be stale (see `fast_path::ListCache`).
    pub(crate) changes: u64,
}

impl<P: Packing> Default for Memo<P> {
    fn default() -> Self {
        Memo {
            dense: Vec::new(),
            wide: Vec::new(),
            sparse: HashMap::new(),
            count: 0,
            changes: 0,
        }
    }
}

/// Where a [`Memo::put`] went and what it replaced, to undo it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemoPut<V> {
    index: u64,
    dense: bool,
    old: Option<V>,
}

impl<V> Default for MemoPut<V> {
    fn default() -> Self {
        MemoPut {
            index: 0,
            dense: false,
            old: None,
        }
    }
}

/// The format reader's packing of [`Val`] into 8 bytes.
pub(crate) struct ValPacking;

/// Packed memo slot layout: the low 3 bits are the tag, 0 is an empty slot.
mod slot {
    pub const EMPTY: u64 = 0;
    pub const NODE: u64 = 1;
    pub const STR: u64 = 2;
    pub const INT: u64 = 3;
    /// `None` (payload 0), `False` (1) or `True` (2).
    pub const SMALL: u64 = 4;
    pub const STACK: u64 = 5;
    pub const WIDE: u64 = 6;
    pub const ENTRY: u64 = 7;
    pub const TAG: u64 = 7;
}

impl Packing for ValPacking {
    type Value = Val;
    type Slot = u64;
    const EMPTY: u64 = slot::EMPTY;

    #[inline(always)]
    fn is_empty(slot: &u64) -> bool {
        *slot == slot::EMPTY
    }

    #[inline(always)]
    fn pack(v: Val, wide: &mut Vec<Val>) -> u64 {
        match v {
            Val::Node(id) => (u64::from(id) << 32) | slot::NODE,
            Val::Entry(index) => (u64::from(index) << 32) | slot::ENTRY,
            Val::Str { start, len, sym } if start < 1 << 40 && len < 1 << 16 => {
                ((start as u64) << 24)
                    | (u64::from(len) << 8)
                    | (u64::from(sym as u8) << 3)
                    | slot::STR
            }
            Val::Int(i) if (i << 3) >> 3 == i => ((i << 3) as u64) | slot::INT,
            Val::Stack(id) => (u64::from(id) << 32) | slot::STACK,
            Val::None => slot::SMALL,
            Val::Bool(b) => ((1 + u64::from(b)) << 3) | slot::SMALL,
            other => pack_wide(other, wide),
        }
    }

    #[inline(always)]
    fn unpack(packed: &u64, wide: &[Val]) -> Option<Val> {
        let packed = *packed;
        Some(match packed & slot::TAG {
            slot::NODE => Val::Node((packed >> 32) as u32),
            slot::ENTRY => Val::Entry((packed >> 32) as u32),
            slot::STR => Val::Str {
                start: (packed >> 24) as usize,
                len: ((packed >> 8) & 0xffff) as u32,
                sym: Sym::from_u8(((packed >> 3) & 0x1f) as u8),
            },
            slot::INT => Val::Int(packed as i64 >> 3),
            slot::STACK => Val::Stack((packed >> 32) as u32),
            slot::SMALL => match packed >> 3 {
                0 => Val::None,
                small => Val::Bool(small == 2),
            },
            slot::WIDE => *wide.get((packed >> 3) as usize)?,
            _ => return None,
        })
    }
}

// `#[inline]` (with `#[cold]`, so it stays out of line) gives each codegen unit that calls
// it a copy of the body: the VM's loop and fast path are optimised knowing what it
// touches. Without it they run 1.4% more instructions (a 100k-entry load, callgrind).
#[cold]
#[inline]
fn pack_wide(v: Val, wide: &mut Vec<Val>) -> u64 {
    wide.push(v);
    ((wide.len() as u64 - 1) << 3) | slot::WIDE
}

impl Memo<ValPacking> {
    /// What the str stored at a dense index was recognised as (`None` for anything else).
    #[inline(always)]
    pub(crate) fn sym_at(&self, index: u64) -> Option<Sym> {
        let packed = *self.dense.get(index as usize)?;
        (packed & slot::TAG == slot::STR).then(|| Sym::from_u8(((packed >> 3) & 0x1f) as u8))
    }

    /// The node stored at a dense index, without unpacking anything else.
    #[inline(always)]
    pub(crate) fn node_at(&self, index: u64) -> Option<u32> {
        let packed = *self.dense.get(index as usize)?;
        (packed & slot::TAG == slot::NODE).then_some((packed >> 32) as u32)
    }
}

impl<P: Packing> Memo<P> {
    /// Stores `v` at `index`.
    #[inline(always)]
    pub(crate) fn put(&mut self, index: u64, v: P::Value) -> MemoPut<P::Value> {
        match self.try_push(index, v) {
            Ok(()) => MemoPut {
                index,
                dense: true,
                old: None,
            },
            Err(v) => self.put_elsewhere(index, v),
        }
    }

    /// Stores `v` when `index` is the next dense one (picklers count up: the usual case);
    /// gives `v` back otherwise.
    #[inline(always)]
    pub(crate) fn try_push(&mut self, index: u64, v: P::Value) -> Result<(), P::Value> {
        if index as usize != self.dense.len() || index >= u32::MAX as u64 {
            return Err(v);
        }
        let packed = P::pack(v, &mut self.wide);
        self.dense.push(packed);
        self.count += 1;
        Ok(())
    }

    // Out of the hot path (`#[cold]`) but visible to its callers' codegen unit (`#[inline]`),
    // as `pack_wide` is.
    #[cold]
    #[inline]
    pub(crate) fn put_elsewhere(&mut self, index: u64, v: P::Value) -> MemoPut<P::Value> {
        let dense_limit = self.dense.len() + MEMO_DENSE_SLACK;
        let dense = (index as usize) < dense_limit && index < u32::MAX as u64;
        let old = if dense {
            let i = index as usize;
            let packed = P::pack(v, &mut self.wide);
            if i == self.dense.len() {
                // Picklers count up: the usual case.
                self.dense.push(packed);
                None
            } else {
                if i > self.dense.len() {
                    self.dense.resize(i + 1, P::EMPTY);
                }
                let old = std::mem::replace(&mut self.dense[i], packed);
                if P::is_empty(&old) {
                    None
                } else {
                    P::unpack(&old, &self.wide)
                }
            }
        } else {
            self.sparse.insert(index, v)
        };
        if old.is_none() {
            self.count += 1;
        } else {
            self.changes += 1;
        }
        MemoPut { index, dense, old }
    }

    #[inline(always)]
    pub(crate) fn get(&self, index: u64) -> Option<P::Value> {
        match self.dense.get(index as usize) {
            Some(packed) if !P::is_empty(packed) => P::unpack(packed, &self.wide),
            _ => self.sparse.get(&index).cloned(),
        }
    }

    /// Undoes a [`Memo::put`].
    pub(crate) fn undo(&mut self, put: MemoPut<P::Value>) {
        self.changes += 1;
        if put.old.is_none() {
            self.count -= 1;
        }
        if put.dense {
            let packed = match put.old {
                Some(v) => P::pack(v, &mut self.wide),
                None => P::EMPTY,
            };
            self.dense[put.index as usize] = packed;
        } else {
            match put.old {
                Some(v) => self.sparse.insert(put.index, v),
                None => self.sparse.remove(&put.index),
            };
        }
    }

    /// The dense slots, by index: what a builder's own fast path reads memo references from
    /// (the Python loader's dicts, without a reference count taken per lookup).
    #[inline(always)]
    pub fn dense_slots(&self) -> &[P::Slot] {
        &self.dense
    }

    /// The number of indices stored: the index the next `MEMOIZE` stores at.
    #[inline(always)]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Stores `v` at `index` when it is the next dense one (`index == dense_slots().len()`);
    /// `false`, with nothing stored, otherwise.
    #[inline(always)]
    pub fn push_dense(&mut self, index: u64, v: P::Value) -> bool {
        self.try_push(index, v).is_ok()
    }

    /// Takes back [`Memo::push_dense`]es: cuts the dense slots back to `len`, which must not
    /// be below where the pushes started.
    pub fn truncate_dense(&mut self, len: usize) {
        let removed = self.dense.len().saturating_sub(len);
        self.dense.truncate(len);
        self.count -= removed;
        self.changes += 1;
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_slots_keep_every_value() {
        let values = [
            Val::None,
            Val::Bool(false),
            Val::Bool(true),
            Val::Int(0),
            Val::Int(-1),
            Val::Int(i64::MAX >> 3),
            Val::Int(i64::MIN >> 3),
            Val::Int(i64::MAX),
            Val::Int(i64::MIN),
            Val::Float(-0.5),
            Val::Float(f64::NAN),
            Val::BigInt { start: 3, len: 9 },
            Val::Bytes { start: 7, len: 2 },
            Val::Node(0),
            Val::Node(u32::MAX - 1),
            Val::Str {
                start: 0,
                len: 0,
                sym: Sym::Other,
            },
            Val::Str {
                start: (1 << 40) - 1,
                len: 0xffff,
                sym: Sym::ActFree,
            },
            Val::Str {
                start: 1 << 40,
                len: 3,
                sym: Sym::Action,
            },
            Val::Str {
                start: 5,
                len: 1 << 16,
                sym: Sym::TimeUs,
            },
        ];
        let mut memo = Memo::<ValPacking>::default();
        for (i, &v) in values.iter().enumerate() {
            memo.put(i as u64, v);
        }
        // Far beyond the dense part: sparse.
        memo.put(1 << 40, Val::Int(7));
        assert_eq!(memo.count, values.len() + 1);
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(
                format!("{:?}", memo.get(i as u64)),
                format!("{:?}", Some(v))
            );
        }
        assert!(matches!(memo.get(1 << 40), Some(Val::Int(7))));
        assert!(memo.get(values.len() as u64).is_none());
        // Undo restores both the value and the count.
        let put = memo.put(2, Val::Node(9));
        let fresh = memo.put(values.len() as u64, Val::None);
        memo.undo(fresh);
        memo.undo(put);
        assert_eq!(memo.count, values.len() + 1);
        assert!(matches!(memo.get(2), Some(Val::Bool(true))));
        assert!(memo.get(values.len() as u64).is_none());
    }
}
