//! The workload's integration tests: one binary, one module per subject.

mod format;
mod generator;
mod shapes;
