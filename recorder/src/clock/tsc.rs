//! The CPU's timestamp counter (x86-64 `RDTSC`), the one hardware read behind the history
//! clock, and the check that it may be used. Everything else about the clock is safe code in
//! the parent module.
#![allow(unsafe_code)]

/// Whether [`read`] may be used: an x86-64 Linux process whose kernel keeps its own
/// clocksource on the TSC (so the counter is invariant, ticks at a constant rate, and is
/// synchronised across CPUs: the kernel checks all of this and switches away from the TSC
/// when it is not), and where `RDTSC` is not made to fault (`prctl(PR_SET_TSC)`).
pub(super) fn usable() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let clocksource = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        if clocksource.trim() != "tsc" {
            return false;
        }
        let mut mode: libc::c_int = 0;
        // SAFETY: PR_GET_TSC writes one `int` through the pointer, which points to a live
        // local; no other memory is touched.
        let rc = unsafe { libc::prctl(libc::PR_GET_TSC, &mut mode as *mut libc::c_int) };
        rc == 0 && mode == libc::PR_TSC_ENABLE
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// The timestamp counter. Only meaningful after [`usable`] returned true (elsewhere it is 0).
#[inline(always)]
pub(super) fn read() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC reads a register and touches no memory; every x86-64 CPU has it, and
        // `usable` checked that this process may execute it (it faults only under
        // `PR_TSC_SIGSEGV`). The intrinsic is `unsafe` only because all `core::arch` ones are.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}
