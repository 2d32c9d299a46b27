//! A slot arena: values addressed by a small index instead of a pointer, with freed slots
//! reused.
//!
//! The allocator's blocks and segments point at each other (a block's segment, a block's
//! neighbours in its segment, a pool's free blocks), so they live in arenas and refer to
//! each other by [`Idx`]. An index stays valid while its value is in use; once the value is
//! removed, its slot goes on a free list and the next insertion takes it. A removed value stays
//! in its slot, marked dead ([`Slot::is_live`]), so that a stale index reads a dead value
//! instead of another one's memory (the invariant checks look for exactly that).

use std::ops::{Index, IndexMut};

/// The index of a value in an [`Arena`] (32 bits keep the pools' keys small).
pub(crate) type Idx = u32;

/// No value: the end of a block chain, the neighbour of a segment's first or last block.
pub(crate) const NIL: Idx = u32::MAX;

/// A value an [`Arena`] holds, which knows whether its slot is in use.
pub(crate) trait Slot {
    /// Whether the value is in use (not yet removed).
    fn is_live(&self) -> bool;
    /// Marks a removed value dead and drops what it owns on the heap; the rest stays as it
    /// was until the slot is reused.
    fn vacate(&mut self);
}

/// Values of type `T` by [`Idx`], with the slots of removed values reused (newest first).
#[derive(Debug)]
pub(crate) struct Arena<T> {
    slots: Vec<T>,
    /// Slots of removed values, the most recently removed last.
    vacant: Vec<Idx>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena {
            slots: Vec::new(),
            vacant: Vec::new(),
        }
    }
}

impl<T: Slot> Arena<T> {
    /// Stores `value` in the most recently vacated slot, or a new one, and returns its index.
    #[inline]
    pub fn insert(&mut self, value: T) -> Idx {
        if let Some(idx) = self.vacant.pop() {
            self.slots[idx as usize] = value;
            idx
        } else {
            self.slots.push(value);
            (self.slots.len() - 1) as Idx
        }
    }

    /// Removes the value at `idx`: it is marked dead and its slot is reused later.
    #[inline]
    pub fn remove(&mut self, idx: Idx) {
        self.slots[idx as usize].vacate();
        self.vacant.push(idx);
    }

    /// The value in slot `idx`, live or dead; `None` past the last slot (or for [`NIL`]).
    #[inline]
    pub fn get(&self, idx: Idx) -> Option<&T> {
        self.slots.get(idx as usize)
    }

    /// The values in use with their indices, in slot order.
    pub fn iter_live(&self) -> impl Iterator<Item = (Idx, &T)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, value)| value.is_live())
            .map(|(i, value)| (i as Idx, value))
    }
}

impl<T> Index<Idx> for Arena<T> {
    type Output = T;

    #[inline]
    fn index(&self, idx: Idx) -> &T {
        &self.slots[idx as usize]
    }
}

impl<T> IndexMut<Idx> for Arena<T> {
    #[inline]
    fn index_mut(&mut self, idx: Idx) -> &mut T {
        &mut self.slots[idx as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::{Arena, Slot};

    #[derive(Debug, PartialEq)]
    struct Value {
        n: u32,
        live: bool,
    }

    impl Slot for Value {
        fn is_live(&self) -> bool {
            self.live
        }
        fn vacate(&mut self) {
            self.live = false;
        }
    }

    fn value(n: u32) -> Value {
        Value { n, live: true }
    }

    #[test]
    fn removed_slots_are_reused_newest_first_and_read_dead_until_then() {
        let mut arena = Arena::default();
        let a = arena.insert(value(1));
        let b = arena.insert(value(2));
        let c = arena.insert(value(3));
        arena.remove(a);
        arena.remove(c);
        assert!(!arena[a].is_live());
        assert_eq!(arena.get(c).map(|v| v.n), Some(3));
        let live: Vec<u32> = arena.iter_live().map(|(_, v)| v.n).collect();
        assert_eq!(live, [2]);
        assert_eq!(arena.insert(value(4)), c);
        assert_eq!(arena.insert(value(5)), a);
        assert_eq!(arena.insert(value(6)), 3);
        assert_eq!(arena[b], value(2));
        assert!(arena.get(super::NIL).is_none());
    }
}
