//! What the fuzz targets share: damaging a valid file as an input says, and the rule for the
//! errors that damage may cause.

use std::fmt::Display;

/// Applies `input` to `bytes` as damage: each 4 bytes of it are a 24-bit offset (taken modulo
/// the length) and a byte to XOR there.
pub fn damage(bytes: &mut [u8], input: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    for flip in input.chunks_exact(4) {
        let at = u32::from_le_bytes([flip[0], flip[1], flip[2], 0]) as usize % bytes.len();
        bytes[at] ^= flip[3];
    }
}

/// Fails the run unless `error` names the file `file_name`: an error about damage must say
/// which file is damaged.
pub fn assert_names_file(error: &dyn Display, file_name: &str) {
    let msg = error.to_string();
    assert!(
        msg.contains(file_name),
        "an error that does not name the file {file_name}: {msg}"
    );
}
