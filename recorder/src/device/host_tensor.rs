//! [`HostTensor`]: an `f32` buffer in a block of a host-memory caching allocator.
#![allow(unsafe_code)]

use std::ops::{Deref, DerefMut};

use crate::{CachingAllocator, HostDevice, Stream};

/// `len` zero-initialised `f32`s in a block of a host-memory caching allocator, freed on drop:
/// for Rust training code that wants its tensors in the recorded history.
///
/// ```
/// use memsnap_recorder::{CachingAllocator, HistoryOptions, HostDevice, HostTensor};
///
/// let gpu = CachingAllocator::new(HostDevice::new(1 << 30));
/// gpu.record_memory_history(HistoryOptions::default());
/// let mut weights = HostTensor::zeros(&gpu, 1024)?;
/// weights[3] = 1.5;
/// assert_eq!(weights.iter().sum::<f32>(), 1.5);
/// drop(weights); // freed through the allocator: a free_requested/free_completed pair
/// # Ok::<(), memsnap_recorder::Error>(())
/// ```
///
/// The block belongs to this value alone: the allocator hands each live block out once, and
/// the pointer is only freed by `Drop`. (Calling [`CachingAllocator::free`] yourself with
/// [`HostTensor::ptr`] while the tensor lives breaks that; don't.)
pub struct HostTensor<'a> {
    allocator: &'a CachingAllocator<HostDevice>,
    ptr: u64,
    len: usize,
}

impl<'a> HostTensor<'a> {
    /// Allocates `len` floats on `allocator` (an `alloc` trace entry with the caller's stack)
    /// and zeroes them.
    pub fn zeros(allocator: &'a CachingAllocator<HostDevice>, len: usize) -> crate::Result<Self> {
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<f32>() as u64);
        let ptr = allocator.malloc(bytes, Stream::DEFAULT)?;
        let tensor = HostTensor {
            allocator,
            ptr,
            len,
        };
        if len > 0 {
            // SAFETY: `ptr` is the start of a live host block of at least `bytes` bytes owned
            // by this tensor (HostDevice memory from the global allocator, 512-byte aligned);
            // writing zeroes initialises it before any read.
            unsafe { std::ptr::write_bytes(tensor.ptr as usize as *mut f32, 0, len) };
        }
        Ok(tensor)
    }

    /// The block's address (what the snapshot shows).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Deref for HostTensor<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` initialised, aligned f32s live at `ptr` until drop, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as usize as *const f32, self.len) }
    }
}

impl DerefMut for HostTensor<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as usize as *mut f32, self.len) }
    }
}

impl Drop for HostTensor<'_> {
    fn drop(&mut self) {
        // The pointer came from this allocator and is freed once: this cannot fail.
        let _ = self.allocator.free(self.ptr);
    }
}

impl std::fmt::Debug for HostTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTensor")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HistoryOptions;

    #[test]
    fn tensors_are_zeroed_writable_and_freed_on_drop() {
        let gpu = CachingAllocator::new(HostDevice::new(64 << 20));
        gpu.record_memory_history(HistoryOptions::without_stacks());
        let mut a = HostTensor::zeros(&gpu, 1000).unwrap();
        assert!(a.iter().all(|&x| x == 0.0));
        a[999] = 2.0;
        let b = HostTensor::zeros(&gpu, 10).unwrap();
        assert_ne!(a.ptr(), b.ptr());
        assert_eq!(a.iter().sum::<f32>(), 2.0);
        assert_eq!(gpu.stats().allocated_bytes(), 4096 + 512);
        drop(a);
        drop(b);
        assert_eq!(gpu.stats().allocated_bytes(), 0);
        assert!(HostTensor::zeros(&gpu, 0).unwrap().is_empty());
    }
}
