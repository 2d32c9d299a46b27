//! A cache prefetch hint for the history ring, the one hardware hint behind it. The ring is
//! usually far larger than the caches, so the slot an entry overwrites is rarely cached: its
//! store then waits for the line, and the allocator's lock release (a locked instruction)
//! waits for that store. Asking for the line a few slots ahead takes the miss off that path.
#![allow(unsafe_code)]

/// Hints the CPU to bring `slots[index]` into the caches (nothing when `index` is out of
/// range or the architecture has no such hint). Has no effect on the program's results.
#[inline(always)]
pub(super) fn prefetch<T>(slots: &[T], index: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(slot) = slots.get(index) {
        // SAFETY: PREFETCHT0 never faults and changes no architectural state (only what the
        // caches hold); the pointer comes from a live reference anyway. SSE, which it
        // belongs to, is part of every x86-64 CPU. The intrinsic is `unsafe` only because it
        // takes a raw pointer.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                (slot as *const T).cast::<i8>(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (slots, index);
    }
}
