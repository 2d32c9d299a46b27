//! Placeholder being written (the CUDA backend of the recorder is landing).
fn main() {}
