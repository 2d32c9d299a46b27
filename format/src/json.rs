//! JSON codec (to be written).
use crate::error::{FormatError, Result};
use crate::model::Snapshot;

pub fn read(_bytes: &[u8]) -> Result<Snapshot> {
    Err(FormatError::UnknownFormat { what: "JSON not implemented yet".into() })
}

pub fn to_vec(_snapshot: &Snapshot) -> Result<Vec<u8>> {
    Ok(Vec::new())
}
