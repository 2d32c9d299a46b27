//! The map from a live allocation's address to its block, with a hasher made for addresses.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A folded-multiply hasher for pointer keys (the default SipHash costs more than the rest of
/// a malloc/free pair).
///
/// The full 128-bit product is folded (high half XOR low half) so that every bit of the key
/// reaches the *low* bits of the hash, which hashbrown uses to pick the bucket: block
/// addresses are 512-byte aligned and share their high bits within a segment, so a plain
/// `key * K` would send every block of a segment to the same probe group.
#[derive(Default)]
pub(crate) struct PtrHasher(u64);

const HASH_K: u64 = 0x9e37_79b9_7f4a_7c15;

#[inline]
fn folded_mul(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Hasher for PtrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = folded_mul(self.0.rotate_left(8) ^ u64::from(b), HASH_K);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = folded_mul(n ^ self.0, HASH_K);
    }
}

/// A map keyed by address, hashed with [`PtrHasher`].
pub(crate) type PtrMap<V> = HashMap<u64, V, BuildHasherDefault<PtrHasher>>;
