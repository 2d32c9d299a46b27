//! The format crate's integration tests, one binary. Shared helpers live in `common`.
//!
//! The tests that need generated training runs (codecs round trips, the pickle reader's paths,
//! validation) live in `memsnap-workload`'s tests (`workload/tests/it/format/`): the workload
//! sits above this crate, and a crate names only crates below it, dev-dependencies included.

mod common;
mod hostile;
mod live;
mod machine;
mod numbers;
mod part;
mod pickle;
