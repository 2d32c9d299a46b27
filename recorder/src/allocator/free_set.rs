//! An ordered set of free-block keys with the iteration order of `BTreeSet` (PyTorch's
//! `std::set`), stored as a sorted `Vec` while small and as a `BTreeSet` once large.
//!
//! Pools usually hold a few dozen free blocks; there a binary search plus a short `memmove`
//! costs a fraction of a B-tree insert or remove (no node allocation, one cache-friendly
//! array). Past [`GROW_AT`] entries the set moves to a `BTreeSet` so that heavily fragmented
//! pools keep logarithmic updates; it moves back below [`SHRINK_AT`] (hysteresis, so a pool
//! hovering around the limit does not convert back and forth).

use std::collections::BTreeSet;
use std::ops::Bound;

/// Entries above which the set becomes a `BTreeSet`.
const GROW_AT: usize = 512;
/// Entries below which a `BTreeSet` goes back to a sorted `Vec`.
const SHRINK_AT: usize = 128;

#[derive(Debug)]
pub(crate) enum FreeSet<K: Ord + Copy> {
    Sorted(Vec<K>),
    Tree(BTreeSet<K>),
}

impl<K: Ord + Copy> Default for FreeSet<K> {
    fn default() -> Self {
        FreeSet::Sorted(Vec::new())
    }
}

/// Ascending or descending iteration over either representation.
pub(crate) enum Iter<'a, K> {
    Slice(std::slice::Iter<'a, K>),
    SliceRev(std::iter::Rev<std::slice::Iter<'a, K>>),
    Tree(std::collections::btree_set::Range<'a, K>),
    TreeRev(std::iter::Rev<std::collections::btree_set::Range<'a, K>>),
}

impl<'a, K> Iterator for Iter<'a, K> {
    type Item = &'a K;

    #[inline]
    fn next(&mut self) -> Option<&'a K> {
        match self {
            Iter::Slice(it) => it.next(),
            Iter::SliceRev(it) => it.next(),
            Iter::Tree(it) => it.next(),
            Iter::TreeRev(it) => it.next(),
        }
    }
}

impl<K: Ord + Copy> FreeSet<K> {
    /// Inserts `key`; returns false if it was already present.
    #[inline]
    pub fn insert(&mut self, key: K) -> bool {
        match self {
            FreeSet::Sorted(v) => match v.binary_search(&key) {
                Ok(_) => false,
                Err(i) => {
                    v.insert(i, key);
                    if v.len() > GROW_AT {
                        *self = FreeSet::Tree(std::mem::take(v).into_iter().collect());
                    }
                    true
                }
            },
            FreeSet::Tree(t) => t.insert(key),
        }
    }

    /// Removes `key`; returns whether it was present.
    #[inline]
    pub fn remove(&mut self, key: &K) -> bool {
        match self {
            FreeSet::Sorted(v) => match v.binary_search(key) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            FreeSet::Tree(t) => {
                let removed = t.remove(key);
                if t.len() < SHRINK_AT {
                    *self = FreeSet::Sorted(std::mem::take(t).into_iter().collect());
                }
                removed
            }
        }
    }

    pub fn contains(&self, key: &K) -> bool {
        match self {
            FreeSet::Sorted(v) => v.binary_search(key).is_ok(),
            FreeSet::Tree(t) => t.contains(key),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            FreeSet::Sorted(v) => v.len(),
            FreeSet::Tree(t) => t.len(),
        }
    }

    /// All keys, ascending.
    pub fn iter(&self) -> Iter<'_, K> {
        match self {
            FreeSet::Sorted(v) => Iter::Slice(v.iter()),
            FreeSet::Tree(t) => Iter::Tree(t.range(..)),
        }
    }

    /// Keys `>= from`, ascending.
    #[inline]
    pub fn range_from(&self, from: K) -> Iter<'_, K> {
        match self {
            FreeSet::Sorted(v) => {
                let i = v.partition_point(|k| *k < from);
                Iter::Slice(v[i..].iter())
            }
            FreeSet::Tree(t) => Iter::Tree(t.range((Bound::Included(from), Bound::Unbounded))),
        }
    }

    /// Keys `< below`, descending.
    pub fn range_below_rev(&self, below: K) -> Iter<'_, K> {
        match self {
            FreeSet::Sorted(v) => {
                let i = v.partition_point(|k| *k < below);
                Iter::SliceRev(v[..i].iter().rev())
            }
            FreeSet::Tree(t) => {
                Iter::TreeRev(t.range((Bound::Unbounded, Bound::Excluded(below))).rev())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The set behaves like a `BTreeSet` across conversions in both directions.
    #[test]
    fn matches_btreeset_across_conversions() {
        let mut set = FreeSet::default();
        let mut model = BTreeSet::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 2000, u64::from(step % 7));
            // Grow for a while, then shrink, so both conversions happen.
            let grow = (step / 2500) % 2 == 0;
            if grow != x.is_multiple_of(4) {
                assert_eq!(set.insert(key), model.insert(key));
            } else {
                let victim = model.iter().nth((x % 97) as usize).copied().unwrap_or(key);
                assert_eq!(set.remove(&victim), model.remove(&victim));
            }
            assert_eq!(set.len(), model.len());
            if step.is_multiple_of(251) {
                assert!(set.iter().copied().eq(model.iter().copied()));
                let probe = (x % 2000, 3);
                assert!(set
                    .range_from(probe)
                    .copied()
                    .eq(model.range(probe..).copied()));
                assert!(set
                    .range_below_rev(probe)
                    .copied()
                    .eq(model.range(..probe).rev().copied()));
                assert_eq!(set.contains(&probe), model.contains(&probe));
            }
        }
    }
}
