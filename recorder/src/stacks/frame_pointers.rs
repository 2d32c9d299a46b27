//! Frame-pointer stack walking, bounded by the current thread's stack.
//!
//! Each frame record is `[saved frame pointer, return address]` at the frame pointer (x86-64
//! `rbp`, AArch64 `x29`). The walk only reads memory between the walker's own frame and the
//! top of the thread's stack (from `pthread_getattr_np`, cached per thread), so a register that
//! does not hold a frame pointer (code built without `-C force-frame-pointers=yes`) ends the
//! walk instead of faulting. It also stops on misalignment or a chain that does not go up.
#![allow(unsafe_code)]

use std::cell::Cell;

thread_local! {
    static STACK_TOP: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The highest address of the current thread's stack.
pub(super) fn thread_stack_top() -> Option<usize> {
    STACK_TOP
        .try_with(|cached| {
            if let Some(top) = cached.get() {
                return Some(top);
            }
            let top = query_stack_top();
            cached.set(top);
            top
        })
        .ok()
        .flatten()
}

fn query_stack_top() -> Option<usize> {
    // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed once; the
    // out-pointers point to live locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() {
            return None;
        }
        (addr as usize).checked_add(size)
    }
}

#[inline(always)]
fn frame_pointer() -> usize {
    let fp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: copies a register; no memory is touched.
    unsafe {
        std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: copies a register; no memory is touched.
    unsafe {
        std::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags));
    }
    fp
}

/// Writes return addresses (innermost first) into `out`; returns how many.
#[inline(never)]
pub(super) fn walk(out: &mut [usize]) -> usize {
    let Some(top) = thread_stack_top() else {
        return 0;
    };
    let marker = 0u8;
    // Everything a caller's frame record can occupy lies above this function's locals.
    let bottom = std::hint::black_box(&marker) as *const u8 as usize;
    let word = std::mem::size_of::<usize>();
    let mut fp = frame_pointer();
    let mut n = 0;
    while n < out.len() {
        let in_bounds = fp >= bottom
            && fp.is_multiple_of(word)
            && fp.checked_add(2 * word).is_some_and(|end| end <= top);
        if !in_bounds {
            break;
        }
        // SAFETY: `fp .. fp + 2 words` is aligned and inside `[bottom, top)`, the part of this
        // thread's own stack above the current frame, which is mapped and not written by any
        // other thread while we read it.
        let (next, ret) = unsafe {
            (
                std::ptr::read_volatile(fp as *const usize),
                std::ptr::read_volatile((fp + word) as *const usize),
            )
        };
        // A return address points into code: zero, or an address inside this thread's stack
        // (a register that only looked like a frame pointer), ends the walk.
        if ret == 0 || (bottom..top).contains(&ret) {
            break;
        }
        out[n] = ret;
        n += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}
