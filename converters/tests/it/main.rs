//! memsnap-converters' integration tests (one binary; a module per converter).

mod chrome;
mod common;
mod memviz;
mod open;
mod parquet_export;
mod profiles;
mod real_traces;
mod rocm;
