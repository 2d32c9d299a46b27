//! memsnap-converters' integration tests (one binary; a module per converter).

mod memviz;
mod open;
mod parquet_export;
