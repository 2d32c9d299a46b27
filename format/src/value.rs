//! A generic value for keys the typed model does not know.
//!
//! PyTorch keeps adding keys to its snapshots. A reader that dropped what it does not
//! understand would lose data on a round trip, so unknown keys are kept as [`Value`]s, in
//! order, and written back unchanged.

use serde::{Deserialize, Serialize};

/// Any value a snapshot pickle can hold (the data subset: no globals, no objects).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside `i64`, as little-endian two's-complement bytes (pickle `LONG1`).
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Keys and values in insertion order.
    Dict(Vec<(Value, Value)>),
}

impl Value {
    /// A short name of the value's Python type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// Looks a string key up in a dict value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Unknown keys of a dict, in the order they were read.
pub type Extras = Vec<(String, Value)>;
