//! Integration tests of memsnap-analysis: synthetic runs with known answers, real snapshots,
//! the size filter's exactness, layout invariants, odd-but-valid histories.

mod decimation;
mod evidence_fallbacks;
mod layout;
mod leaks;
mod modules;
mod odd_histories;
mod real;
mod real_phases;
mod size_filter;
mod synth_truth;
mod util;
