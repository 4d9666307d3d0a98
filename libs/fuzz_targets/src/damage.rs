//! Damage as an input says: the byte flips the whole-file targets apply to a valid file, the
//! damaged copies they open, and the rule for the errors that damage may cause.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pageserver::page_cache::{PageCache, PageCacheConfig};
use pageserver::PAGE_SZ;

/// The name of every damaged copy: an error about one must contain it.
pub const DAMAGED: &str = "damaged";

/// A valid file made once per fuzzing process, and what reading damaged copies of it needs.
pub struct Original {
    pub bytes: Vec<u8>,
    /// Holds the original and the damaged copy (one name, rewritten for each input).
    dir: tempfile::TempDir,
    /// A small page cache for the readers: every damaged copy is a new file to it.
    pub cache: Arc<PageCache>,
}

impl Original {
    /// The file at `path`, which lies in `dir`.
    pub fn read(dir: tempfile::TempDir, path: &Path) -> Original {
        let config = PageCacheConfig {
            capacity_bytes: 64 * PAGE_SZ as u64,
            ..Default::default()
        };
        Original {
            bytes: std::fs::read(path).unwrap(),
            dir,
            cache: Arc::new(PageCache::new(config).unwrap()),
        }
    }

    /// Writes a copy damaged as `input` says ([`damage`]) and returns its path.
    pub fn damaged_copy(&self, input: &[u8]) -> PathBuf {
        let mut bytes = self.bytes.clone();
        damage(&mut bytes, input);
        let path = self.dir.path().join(DAMAGED);
        std::fs::write(&path, &bytes).unwrap();
        path
    }
}

/// Fails unless a layer written to be damaged stores both ways, so that damage hits compressed
/// and plain values alike: some of its `entries` `compressed`, not all.
pub fn assert_both_stored_forms(compressed: u64, entries: u64) {
    assert!(
        compressed > 0 && compressed < entries,
        "{compressed} of {entries} entries compressed: the layer should hold both forms"
    );
}

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

/// Fails the run unless `error` names the damaged copy: an error about damage must say which
/// file is damaged.
pub fn assert_names_damaged_file(error: &dyn Display) {
    let msg = error.to_string();
    assert!(
        msg.contains(DAMAGED),
        "an error that does not name the damaged file: {msg}"
    );
}
