//! msgpack codec (to be written).
use crate::error::{FormatError, Result};
use crate::model::Snapshot;

pub fn looks_like(_bytes: &[u8]) -> bool {
    false
}

pub fn read(_bytes: &[u8]) -> Result<Snapshot> {
    Err(FormatError::Msgpack { what: "not implemented yet".into() })
}

pub fn to_vec(_snapshot: &Snapshot) -> Result<Vec<u8>> {
    Ok(Vec::new())
}
