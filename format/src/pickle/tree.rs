//! A plain Rust value tree, built by the pickle machine (`machine`): the third builder, for
//! tests and the fuzz target `machine`.
//!
//! It reads what the Python package's loader reads (protocol-0 numbers, sets and bytearrays
//! too) and shares what the memo shares: a container pushed again through the memo or `DUP` is
//! the same [`Value::Node`], as `pickle.load` gives the same object. So fuzzing the machine
//! with it fuzzes the code `memsnap.load` runs, without Python. Not part of the API.

use std::rc::Rc;

use super::machine::{opcode_name, Build, BuildError, Container, Packing};
use super::opcodes::op;

/// A value the tree holds.
#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// Little-endian two's complement, outside `i64`.
    BigInt(Rc<[u8]>),
    /// A protocol-0 integer literal outside `i64`.
    Decimal(Rc<str>),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    ByteArray(Rc<[u8]>),
    /// A container: an index into [`Tree::nodes`].
    Node(usize),
}

/// A container and its items (a dict's keys and values interleaved).
#[derive(Debug)]
pub struct Node {
    pub kind: Container,
    pub items: Vec<Value>,
}

/// The tree builder: every container made, by index.
#[derive(Debug, Default)]
pub struct Tree {
    pub nodes: Vec<Node>,
    /// How many times a value was pushed again (memo fetches and `DUP`s).
    pub shared: usize,
}

/// Runs the pickle in `bytes` into a [`Tree`].
pub fn load(bytes: &[u8]) -> crate::error::Result<(Value, Tree)> {
    super::machine::load(bytes, Tree::default())
}

impl Packing for Tree {
    type Value = Value;
    type Slot = Option<Value>;
    const EMPTY: Option<Value> = None;

    fn is_empty(slot: &Option<Value>) -> bool {
        slot.is_none()
    }

    fn pack(v: Value, _wide: &mut Vec<Value>) -> Option<Value> {
        Some(v)
    }

    fn unpack(slot: &Option<Value>, _wide: &[Value]) -> Option<Value> {
        slot.clone()
    }
}

impl Tree {
    fn node(&mut self, kind: Container, items: Vec<Value>) -> Value {
        self.nodes.push(Node { kind, items });
        Value::Node(self.nodes.len() - 1)
    }
}

impl Build for Tree {
    type Value = Value;
    type Packing = Tree;
    const PROTOCOL_0_AND_SETS: bool = true;

    fn none(&mut self) -> Value {
        Value::None
    }

    fn bool(&mut self, value: bool) -> Value {
        Value::Bool(value)
    }

    fn int(&mut self, value: i64) -> Value {
        Value::Int(value)
    }

    fn big_int(&mut self, le_bytes: &[u8]) -> Result<Value, BuildError> {
        Ok(Value::BigInt(le_bytes.into()))
    }

    fn decimal_int(&mut self, digits: &str) -> Result<Value, BuildError> {
        Ok(Value::Decimal(digits.into()))
    }

    fn float(&mut self, value: f64) -> Value {
        Value::Float(value)
    }

    fn str(&mut self, utf8: &[u8]) -> Result<Value, BuildError> {
        match std::str::from_utf8(utf8) {
            Ok(text) => Ok(Value::Str(text.into())),
            Err(e) => Err(BuildError::in_payload(
                e.valid_up_to(),
                "invalid UTF-8 in a string",
            )),
        }
    }

    fn bytes(&mut self, bytes: &[u8]) -> Result<Value, BuildError> {
        Ok(Value::Bytes(bytes.into()))
    }

    fn bytearray(&mut self, bytes: &[u8]) -> Result<Value, BuildError> {
        Ok(Value::ByteArray(bytes.into()))
    }

    fn empty(&mut self, kind: Container) -> Result<Value, BuildError> {
        Ok(self.node(kind, Vec::new()))
    }

    fn collect(
        &mut self,
        kind: Container,
        stack: &mut Vec<Value>,
        from: usize,
    ) -> Result<Value, BuildError> {
        let items = stack.split_off(from);
        Ok(self.node(kind, items))
    }

    fn extend(
        &mut self,
        code: u8,
        stack: &mut Vec<Value>,
        target: usize,
        from: usize,
    ) -> Result<(), BuildError> {
        let want = match code {
            op::APPEND | op::APPENDS => Container::List,
            op::SETITEM | op::SETITEMS => Container::Dict,
            _ => Container::Set,
        };
        let name = opcode_name(code).unwrap_or("?");
        match stack[target] {
            Value::Node(id) if self.nodes[id].kind == want => {
                let items = stack.drain(from..);
                self.nodes[id].items.extend(items);
                Ok(())
            }
            _ => Err(BuildError::new(format!(
                "{name} needs a {want:?} below its items"
            ))),
        }
    }

    fn shared(&mut self, _value: &Value) {
        self.shared += 1;
    }

    fn text(&self, value: &Value) -> Option<String> {
        match value {
            Value::Str(text) => Some(text.to_string()),
            _ => None,
        }
    }
}
