//! The Zstandard frame of a compressed stored value (`pageserver::format::compression`), as a
//! layer file's checksum hands it to the decoder: the checksum covers the frame, so these bytes
//! reach the decoder only as written or damaged in a way the checksum did not see, and the
//! decoder must hold its bounds for any bytes at all. The input is a frame itself, decoded with
//! a limit of 64 KiB; and the input is compressed, its frame (where kept) decoded back.

use pageserver::format::compression::{decompress, worth_keeping, ValueCompressor};

/// The largest value a frame may name here.
const LIMIT: usize = 64 * 1024;

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    if let Ok(out) = decompress(input, LIMIT) {
        assert!(
            out.len() <= LIMIT,
            "{} bytes made, above the limit",
            out.len()
        );
        let named = zstd::zstd_safe::get_frame_content_size(input);
        assert_eq!(
            named.ok().flatten(),
            Some(out.len() as u64),
            "made other than the content size the frame names"
        );
    }
    let mut compressor = ValueCompressor::new(1).expect("a level 1 context");
    if let Some(frame) = compressor.compress(input) {
        assert!(
            worth_keeping(input.len(), frame.len()),
            "a frame kept that saves too little"
        );
        let back = decompress(frame, input.len()).expect("a frame just made decodes");
        assert_eq!(
            back, input,
            "a frame decodes to other bytes than were compressed"
        );
    }
}
