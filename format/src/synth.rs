//! Synthetic training-run snapshots (to be written).
