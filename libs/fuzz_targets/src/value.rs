//! The stored value format (images and deltas with their patches), as layer files and the
//! ephemeral file hold it: never panics, and a value that decodes encodes to bytes that decode
//! to the same value.

use bytes::Bytes;
use pageserver_api::Value;

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let borrowed = Value::deserialize(input);
    let shared = Value::deserialize_bytes(Bytes::copy_from_slice(input));
    assert_eq!(borrowed, shared, "the two decoders disagree");
    if let Ok(value) = borrowed {
        let bytes = value.serialize().expect("a decoded value encodes");
        assert_eq!(Value::deserialize(&bytes), Ok(value));
    }
}
