//! memsnap-converters' integration tests (one binary; a module per converter).

mod chrome;
mod memviz;
mod open;
mod parquet_export;
mod profiles;
mod rocm;
