//! The stored value format (images and deltas with their patches), as layer files and the
//! ephemeral file hold it: never panics, and a value that decodes encodes to bytes that decode
//! to the same value.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pageserver_api::Value;

fuzz_target!(|input: &[u8]| {
    let borrowed = Value::deserialize(input);
    let shared = Value::deserialize_bytes(Bytes::copy_from_slice(input));
    assert_eq!(borrowed, shared, "the two decoders disagree");
    if let Ok(value) = borrowed {
        let bytes = value.serialize().expect("a decoded value encodes");
        assert_eq!(Value::deserialize(&bytes), Ok(value));
    }
});
