//! memsnap-format's codecs, pickle reader paths and validation, checked on generated training
//! runs (and on the real snapshots of `MEMSNAP_REAL_SNAPSHOTS` beside them).
//!
//! They test the format crate, but live here because they need [`memsnap_workload::generate`]:
//! the workload sits above the format crate, which may not name it, not even as a
//! dev-dependency.

mod codecs;
#[path = "../../../../format/tests/it/common.rs"]
mod common;
mod reader_paths;
mod validate;
