//! The history clock: one cheap reading per API call, in nanoseconds since the process clock
//! anchor (the same time base as [`crate::history::now_ns`], turned into microseconds since
//! the Unix epoch by [`crate::history::epoch_micros`]).
//!
//! `Instant::now()` (vDSO `clock_gettime`) costs 20–24 ns here with its `Duration`
//! arithmetic, about a quarter of a whole malloc+free pair, and a pair needs two readings.
//! Like PyTorch's `c10::getApproximateTime`, the clock reads the CPU's timestamp counter
//! instead (`RDTSC`, about 10 ns in the allocator) and turns counter ticks into nanoseconds
//! with a scale it calibrates against the OS clock:
//!
//! * **Calibration.** The scale is the ratio of OS-clock nanoseconds to counter ticks since
//!   the process's first synchronisation point (shared by all clocks, so a device created
//!   later starts calibrated); it is re-measured at every resynchronisation over the ever
//!   longer baseline. During the first [`CALIBRATE_NS`] of the process, every reading is an
//!   OS clock reading (bracketed by two counter reads).
//! * **Resynchronisation.** A reading [`RESYNC_NS`] or more (in ticks) after the last
//!   synchronisation point, or a counter that went backwards, takes a fresh (counter, OS
//!   clock) pair as the new base. Between two such points a reading is `base + ticks ×
//!   scale`, so its error is bounded by the scale error over at most 10 ms: well under a
//!   microsecond once calibrated, and still under 5 µs if NTP slews the OS clock at its
//!   500 ppm maximum. Each pair is read between two counter reads, up to four times, keeping
//!   the narrowest bracket, so a preemption between the reads does not skew it.
//! * **Monotone.** A reading is never below the previous one of the same clock (each device
//!   has its own, under its lock), so timestamps never go back even across a
//!   resynchronisation or a CPU migration.
//! * **Where the counter is not trusted** (not x86-64 Linux, a kernel clocksource other than
//!   `tsc`, or `RDTSC` disabled by `prctl`), every reading is the OS clock, as before.
//!
//! * **Manual** (deterministic recordings: tests, simulated workloads): the clock stands still
//!   until it is advanced, and its readings count from the epoch the caller chose.
//!
//! The only `unsafe` is the counter read itself and the `prctl` check, in `tsc.rs`.

use std::sync::OnceLock;

use crate::history::now_ns as os_now_ns;

mod tsc;

/// How long the clock reads the OS clock before it trusts its first scale.
const CALIBRATE_NS: u64 = 2_000_000;
/// Longest stretch (in ticks at the calibrated rate) between two synchronisations.
const RESYNC_NS: u64 = 10_000_000;
/// Fraction bits of the fixed-point nanoseconds-per-tick scale.
const SCALE_BITS: u32 = 32;
/// A (counter, OS clock) pair is taken as soon as its bracket is this narrow (1 µs at 1 GHz;
/// an undisturbed bracket, one OS clock read, is a few tens of nanoseconds).
const GOOD_BRACKET_TICKS: u64 = 1024;

/// Where readings come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The CPU's timestamp counter, calibrated against the OS clock.
    Counter,
    /// The OS monotonic clock (`Instant`) at every reading.
    Os,
    /// A fake clock for deterministic recordings: it reads what [`Clock::advance`] made it,
    /// nanoseconds since its own epoch (see `CachingAllocator::use_manual_clock`).
    Manual,
}

/// The best source on this machine (decided once per process).
pub(crate) fn default_source() -> Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    *SOURCE.get_or_init(|| {
        if tsc::usable() {
            Source::Counter
        } else {
            Source::Os
        }
    })
}

/// A monotone clock (see the module documentation). Not shared: each device owns one.
#[derive(Debug)]
pub(crate) struct Clock {
    source: Source,
    /// Counter reading and time of the last synchronisation.
    base_ticks: u64,
    base_ns: u64,
    /// Nanoseconds per tick, fixed point with [`SCALE_BITS`] fraction bits.
    scale: u64,
    /// Readings fewer than this many ticks after `base_ticks` are extrapolated; 0 until
    /// calibrated, so that every reading synchronises.
    resync_ticks: u64,
    /// The calibration baseline's start: the process's first synchronisation point, or this
    /// clock's own when the counter went back past that.
    origin: Option<(u64, u64)>,
    /// The last reading returned.
    last_ns: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::with_source(default_source())
    }
}

impl Clock {
    pub fn with_source(source: Source) -> Self {
        Clock {
            source,
            base_ticks: 0,
            base_ns: 0,
            scale: 0,
            resync_ticks: 0,
            origin: None,
            last_ns: 0,
        }
    }

    #[cfg(test)]
    pub fn source(&self) -> Source {
        self.source
    }

    /// Moves a [`Source::Manual`] clock forward by `ns` (saturating); other clocks ignore it.
    pub fn advance(&mut self, ns: u64) {
        if self.source == Source::Manual {
            self.last_ns = self.last_ns.saturating_add(ns);
        }
    }

    /// Nanoseconds since the process clock anchor; never less than the previous reading.
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        let ns = match self.source {
            Source::Counter => {
                // Wrapping: a counter below the base (another CPU, a resume) is a huge
                // distance and resynchronises.
                let elapsed = tsc::read().wrapping_sub(self.base_ticks);
                if elapsed < self.resync_ticks {
                    self.base_ns + scale_ticks(elapsed, self.scale)
                } else {
                    self.synchronise()
                }
            }
            Source::Os => os_now_ns(),
            Source::Manual => self.last_ns,
        };
        let ns = ns.max(self.last_ns);
        self.last_ns = ns;
        ns
    }

    /// Takes a fresh (counter, OS clock) pair as the base and refines the scale.
    #[cold]
    #[inline(never)]
    fn synchronise(&mut self) -> u64 {
        static PROCESS_ORIGIN: OnceLock<(u64, u64)> = OnceLock::new();
        let (ticks, ns) = sync_point();
        let (origin_ticks, origin_ns) = *self
            .origin
            .get_or_insert_with(|| *PROCESS_ORIGIN.get_or_init(|| (ticks, ns)));
        if ticks > origin_ticks {
            let span_ns = ns.saturating_sub(origin_ns);
            if span_ns >= CALIBRATE_NS {
                let scale = (u128::from(span_ns) << SCALE_BITS) / u128::from(ticks - origin_ticks);
                self.scale = u64::try_from(scale).unwrap_or(u64::MAX);
                let resync = (u128::from(RESYNC_NS) << SCALE_BITS) / scale.max(1);
                self.resync_ticks = u64::try_from(resync).unwrap_or(u64::MAX);
            }
        } else {
            // The origin is this very reading, or the counter went back past it (another
            // CPU, a resume): (re)start the baseline here.
            self.origin = Some((ticks, ns));
            self.scale = 0;
            self.resync_ticks = 0;
        }
        self.base_ticks = ticks;
        self.base_ns = ns;
        ns
    }
}

/// `ticks × scale` in nanoseconds.
#[inline(always)]
fn scale_ticks(ticks: u64, scale: u64) -> u64 {
    ((u128::from(ticks) * u128::from(scale)) >> SCALE_BITS) as u64
}

/// An OS clock reading and the counter at the same moment: the middle of the narrowest of up
/// to four brackets of two counter reads.
fn sync_point() -> (u64, u64) {
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..4 {
        let before = tsc::read();
        let ns = os_now_ns();
        let after = tsc::read();
        let width = after.wrapping_sub(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, before.wrapping_add(width / 2), ns));
        }
        if width <= GOOD_BRACKET_TICKS {
            break;
        }
    }
    let (_, ticks, ns) = best.unwrap_or((0, tsc::read(), os_now_ns()));
    (ticks, ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readings lie within `tolerance` of OS clock readings taken just before and after.
    fn check_against_os_clock(clock: &mut Clock, duration_ns: u64, tolerance: u64) -> u64 {
        let start = os_now_ns();
        let mut last = 0;
        let mut worst = 0;
        let mut spin = 0u64;
        while os_now_ns() - start < duration_ns {
            let before = os_now_ns();
            let t = clock.now_ns();
            let after = os_now_ns();
            assert!(t >= last, "clock went back: {t} < {last}");
            last = t;
            let error = before.saturating_sub(t).max(t.saturating_sub(after));
            worst = worst.max(error);
            assert!(
                error <= tolerance,
                "reading {t} is {error} ns outside [{before}, {after}]"
            );
            // Vary the gaps between readings.
            for _ in 0..(spin % 2000) {
                std::hint::black_box(spin);
            }
            spin = spin
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407)
                >> 33;
        }
        worst
    }

    #[test]
    fn counter_clock_follows_the_os_clock_and_never_goes_back() {
        let mut clock = Clock::default();
        // 50 ms: calibration, then several resynchronisations. 200 µs of slack for a loaded
        // machine (an OS preemption between the reads widens the bracket, not the error).
        let worst = check_against_os_clock(&mut clock, 50_000_000, 200_000);
        eprintln!("source {:?}: worst deviation {worst} ns", clock.source());
    }

    #[test]
    fn os_clock_is_the_fallback() {
        let mut clock = Clock::with_source(Source::Os);
        check_against_os_clock(&mut clock, 5_000_000, 0);
    }

    #[test]
    fn calibrates_after_the_calibration_span() {
        if default_source() != Source::Counter {
            return;
        }
        let mut clock = Clock::default();
        let start = os_now_ns();
        while os_now_ns() - start < 2 * CALIBRATE_NS {
            clock.now_ns();
        }
        clock.now_ns();
        assert!(clock.scale > 0 && clock.resync_ticks > 0, "{clock:?}");
        // Somewhere between 0.05 and 20 GHz.
        let ns_per_tick = clock.scale as f64 / (1u64 << SCALE_BITS) as f64;
        assert!((0.05..20.0).contains(&ns_per_tick), "{ns_per_tick}");
    }

    #[test]
    fn scale_ticks_is_fixed_point() {
        assert_eq!(scale_ticks(1000, 1 << SCALE_BITS), 1000);
        assert_eq!(scale_ticks(3000, (1 << SCALE_BITS) / 3 + 1), 1000);
    }
}
