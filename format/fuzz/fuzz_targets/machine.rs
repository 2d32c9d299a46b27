//! The pickle machine (`pickle::machine`) with the plain tree builder (`pickle::tree`) on
//! arbitrary bytes: the opcode loop, stack, marks, memo and refusals that `memsnap.load` (the
//! Python package) runs, fuzzed without Python. It never panics; an error names a byte inside
//! the input; every container it hands out exists; and whatever the snapshot reader (the
//! other builder on the same machine) accepts, the tree builder accepts too (it reads a
//! superset: protocol-0 numbers and sets as well), with the top-level value a dict.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap_format::pickle::tree::{self, Value};
use memsnap_format::{pickle, FormatError};

fuzz_target!(|data: &[u8]| {
    let built = tree::load(data);
    match &built {
        Ok((root, tree)) => {
            let exists = |v: &Value| match v {
                Value::Node(id) => *id < tree.nodes.len(),
                _ => true,
            };
            assert!(exists(root));
            for node in &tree.nodes {
                assert!(node.items.iter().all(exists));
            }
        }
        Err(FormatError::Pickle { offset, .. }) => {
            assert!(*offset <= data.len() as u64, "error past the input");
        }
        Err(other) => panic!("a slice read gave {other}"),
    }
    if pickle::read(data).is_ok() {
        assert!(
            built.is_ok(),
            "the snapshot reader accepted what the tree builder refused"
        );
    }
});
