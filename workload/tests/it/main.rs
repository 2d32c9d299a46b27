//! The workload's integration tests: one binary, one module per subject.

mod generator;
mod shapes;
