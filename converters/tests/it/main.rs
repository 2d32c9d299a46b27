//! memsnap-converters' integration tests (one binary; a module per converter).

mod chrome;
mod memviz;
mod open;
mod rocm;
mod profiles;
mod parquet_export;
