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

/// What [`FreeSet::find_from`] does with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// This is the key.
    Take,
    /// Look at the next one.
    Skip,
    /// No key from here on fits.
    Stop,
}

/// Where [`FreeSet::find_from`] found a key (an index while the set is a sorted `Vec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos(usize);

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

    /// The first key `>= from` that `accept` takes ([`Scan::Take`]), skipping those it
    /// passes over ([`Scan::Skip`]) and giving up at [`Scan::Stop`]. Returns the key with its
    /// position, for [`FreeSet::remove_at`] and [`FreeSet::replace_at`] (valid until the set
    /// changes).
    #[inline]
    pub fn find_from(&self, from: K, mut accept: impl FnMut(&K) -> Scan) -> Option<(Pos, K)> {
        match self {
            FreeSet::Sorted(v) => {
                let start = v.partition_point(|k| *k < from);
                for (i, k) in v.iter().enumerate().skip(start) {
                    match accept(k) {
                        Scan::Take => return Some((Pos(i), *k)),
                        Scan::Skip => {}
                        Scan::Stop => return None,
                    }
                }
                None
            }
            FreeSet::Tree(t) => {
                for k in t.range((Bound::Included(from), Bound::Unbounded)) {
                    match accept(k) {
                        Scan::Take => return Some((Pos(usize::MAX), *k)),
                        Scan::Skip => {}
                        Scan::Stop => return None,
                    }
                }
                None
            }
        }
    }

    /// Removes `key`, found at `pos` by [`FreeSet::find_from`] (no second search).
    #[inline]
    pub fn remove_at(&mut self, pos: Pos, key: &K) -> bool {
        match self {
            FreeSet::Sorted(v) if v.get(pos.0) == Some(key) => {
                v.remove(pos.0);
                true
            }
            _ => self.remove(key),
        }
    }

    /// Replaces `old`, found at `pos`, by `new`: one `memmove` of the keys between the two
    /// places instead of a removal and an insertion.
    #[inline]
    pub fn replace_at(&mut self, pos: Pos, old: &K, new: K) {
        match self {
            FreeSet::Sorted(v) if v.get(pos.0) == Some(old) => {
                let i = pos.0;
                if new < *old {
                    let j = v[..i].partition_point(|k| *k < new);
                    v[j..=i].rotate_right(1);
                    v[j] = new;
                } else {
                    let j = i + 1 + v[i + 1..].partition_point(|k| *k < new);
                    v[i..j].rotate_left(1);
                    v[j - 1] = new;
                }
            }
            _ => {
                self.remove(old);
                self.insert(new);
            }
        }
    }

    /// Replaces `old` (searched for) by `new`; inserts `new` when `old` is absent.
    #[inline]
    pub fn replace(&mut self, old: &K, new: K) {
        match self {
            FreeSet::Sorted(v) => match v.binary_search(old) {
                Ok(i) => self.replace_at(Pos(i), old, new),
                Err(_) => {
                    self.insert(new);
                }
            },
            FreeSet::Tree(t) => {
                t.remove(old);
                t.insert(new);
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

    /// `find_from`, `remove_at`, `replace_at` and `replace` behave like the `BTreeSet`
    /// operations they stand for, in both representations.
    #[test]
    fn positional_updates_match_btreeset() {
        let mut set = FreeSet::default();
        let mut model = BTreeSet::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..40_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 3000, u64::from(step));
            // Phases: grow past GROW_AT, shrink below SHRINK_AT, again.
            let grow = (step / 5000) % 2 == 0;
            match x % 5 {
                0 | 1 if grow => {
                    assert_eq!(set.insert(key), model.insert(key));
                }
                0 => {
                    let victim = model.iter().nth((x % 61) as usize).copied();
                    if let Some(v) = victim {
                        assert!(set.remove(&v) && model.remove(&v));
                    }
                }
                2 => {
                    // Best fit from a probe, then take it out at the found position.
                    let probe = (x % 3000, 0);
                    let limit = probe.0 + 400;
                    let found = set.find_from(probe, |k| {
                        if k.0 > limit {
                            Scan::Stop
                        } else if k.1.is_multiple_of(3) {
                            Scan::Skip
                        } else {
                            Scan::Take
                        }
                    });
                    let expected = model
                        .range(probe..)
                        .take_while(|k| k.0 <= limit)
                        .find(|k| !k.1.is_multiple_of(3))
                        .copied();
                    assert_eq!(found.map(|f| f.1), expected);
                    if let Some((pos, k)) = found {
                        if x.is_multiple_of(2) {
                            assert!(set.remove_at(pos, &k));
                            model.remove(&k);
                        } else {
                            // Smaller or larger replacement (as a split or a merge makes).
                            let new = ((k.0 + x % 700).saturating_sub(350), k.1);
                            set.replace_at(pos, &k, new);
                            model.remove(&k);
                            model.insert(new);
                        }
                    }
                }
                _ => {
                    let old = model.iter().nth((x % 37) as usize).copied().unwrap_or(key);
                    let new = ((old.0 + x % 900).saturating_sub(450), old.1);
                    set.replace(&old, new);
                    model.remove(&old);
                    model.insert(new);
                }
            }
            assert_eq!(set.len(), model.len());
            if step.is_multiple_of(97) {
                assert!(set.iter().copied().eq(model.iter().copied()));
            }
        }
        assert!(set.iter().copied().eq(model.iter().copied()));
    }

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
