//! The format crate's integration tests, one binary. Shared helpers live in `common`.

mod codecs;
mod common;
mod hostile;
mod numbers;
mod part;
mod pickle;
mod reader_paths;
mod validate;
