//! The recorder's integration tests (one binary, shared helpers in `common`).

mod common;
mod deps;
mod frame_pointers;
mod given;
mod global_alloc;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod gpu;
mod host;
mod live;
mod model;
mod snapshot;
mod stress;
