//! Where memsnap's Chrome export puts things: the process and thread ids of its rows and the
//! version of its layout.
//!
//! Apart from the writer ([`crate::chrome`], which re-exports all of it) because the importer
//! reads memsnap's own export back ([`crate::torch::own`]) by the same ids, while the writer's
//! `--merge` reads torch.profiler traces through the importer's parser: with these in
//! `chrome`, the two modules imported each other.

/// Process ids of memsnap's rows: `1_000_000_000 + rank * 1000 + device`.
pub const PID_BASE: i64 = 1_000_000_000;

/// The `pid` of a device's rows.
pub fn pid_of(rank: u32, device: i64) -> i64 {
    PID_BASE + i64::from(rank) * 1000 + device
}

/// The `tid`s of memsnap's threads inside a device's process.
pub mod tid {
    /// Counters, allocation and segment lanes, instants.
    pub const MEMORY: i64 = 0;
    /// `record_function` annotations (`B`/`E`).
    pub const ANNOTATIONS: i64 = 1;
    /// Step phases (`X`).
    pub const PHASES: i64 = 2;
}

/// The version of memsnap's export layout, in `otherData.memsnap.version`.
pub const LAYOUT_VERSION: u32 = 1;
