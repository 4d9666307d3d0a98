//! Block 0 of a delta layer file, and the file name that encodes its ranges (the byte layout is
//! in the module documentation of `delta_layer` and in docs/file-formats.md).

use super::*;

pub(super) mod summary_off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const TENANT: usize = 8;
    pub const TIMELINE: usize = 24;
    pub const KEY_START: usize = 40;
    pub const KEY_END: usize = 58;
    pub const LSN_START: usize = 76;
    pub const LSN_END: usize = 84;
    pub const INDEX_START: usize = 92;
    pub const INDEX_ROOT: usize = 96;
    pub const ENTRIES: usize = 104;
    pub const VALUES_END: usize = 112;
    pub const CHECKSUM: usize = 120;
    /// Reserved fields, zero; covered by the checksum.
    pub const RESERVED_1: usize = 6;
    pub const RESERVED_2: usize = 100;
    /// Just past the checksum: the rest of block 0 is zero.
    pub const END: usize = 124;
}

/// What block 0 says about the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub key_start: Key,
    pub key_end: Key,
    pub lsn_start: Lsn,
    pub lsn_end: Lsn,
    pub index_start_blk: u32,
    pub index_root_blk: u32,
    pub entries: u64,
    pub values_end: u64,
}

impl Summary {
    pub(super) fn encode(&self) -> Box<[u8; PAGE_SZ]> {
        use summary_off::*;
        let mut b = Box::new([0u8; PAGE_SZ]);
        b[MAGIC..MAGIC + 4].copy_from_slice(&DELTA_MAGIC.to_be_bytes());
        b[VERSION..VERSION + 2].copy_from_slice(&DELTA_FORMAT_VERSION.to_be_bytes());
        b[TENANT..TENANT + 16].copy_from_slice(self.tenant_id.as_bytes());
        b[TIMELINE..TIMELINE + 16].copy_from_slice(self.timeline_id.as_bytes());
        b[KEY_START..KEY_START + KEY_LEN].copy_from_slice(&self.key_start.to_bytes());
        b[KEY_END..KEY_END + KEY_LEN].copy_from_slice(&self.key_end.to_bytes());
        b[LSN_START..LSN_START + 8].copy_from_slice(&self.lsn_start.0.to_be_bytes());
        b[LSN_END..LSN_END + 8].copy_from_slice(&self.lsn_end.0.to_be_bytes());
        b[INDEX_START..INDEX_START + 4].copy_from_slice(&self.index_start_blk.to_be_bytes());
        b[INDEX_ROOT..INDEX_ROOT + 4].copy_from_slice(&self.index_root_blk.to_be_bytes());
        b[ENTRIES..ENTRIES + 8].copy_from_slice(&self.entries.to_be_bytes());
        b[VALUES_END..VALUES_END + 8].copy_from_slice(&self.values_end.to_be_bytes());
        let crc = crc32c::crc32c(&b[..CHECKSUM]);
        b[CHECKSUM..CHECKSUM + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Parses and checks block 0 of a file of `file_len` bytes.
    pub(super) fn decode(b: &[u8; PAGE_SZ], file_len: u64) -> Result<Summary, String> {
        use summary_off::*;
        let u16_at = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from_be_bytes(array_at(b, o));
        let id = |o: usize| array_at::<16>(b, o);
        let key = |o: usize| Key::from_bytes(array_at(b, o));
        let magic = u32_at(MAGIC);
        if magic != DELTA_MAGIC {
            return Err(format!(
                "bad magic {magic:#010x}, expected {DELTA_MAGIC:#010x}"
            ));
        }
        let version = u16_at(VERSION);
        if version != DELTA_FORMAT_VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        let stored = u32_at(CHECKSUM);
        let computed = crc32c::crc32c(&b[..CHECKSUM]);
        if stored != computed {
            return Err(format!(
                "summary checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        let s = Summary {
            tenant_id: TenantId::from_bytes(id(TENANT)),
            timeline_id: TimelineId::from_bytes(id(TIMELINE)),
            key_start: key(KEY_START),
            key_end: key(KEY_END),
            lsn_start: Lsn(u64_at(LSN_START)),
            lsn_end: Lsn(u64_at(LSN_END)),
            index_start_blk: u32_at(INDEX_START),
            index_root_blk: u32_at(INDEX_ROOT),
            entries: u64_at(ENTRIES),
            values_end: u64_at(VALUES_END),
        };
        if s.key_start >= s.key_end {
            return Err(format!("empty key range {}..{}", s.key_start, s.key_end));
        }
        if s.lsn_start >= s.lsn_end {
            return Err(format!("empty LSN range {}..{}", s.lsn_start, s.lsn_end));
        }
        let index_start = u64::from(s.index_start_blk) * PAGE_SZ as u64;
        if s.values_end < PAGE_SZ as u64 || s.values_end > index_start {
            return Err(format!(
                "values end at byte {} outside 8192..={index_start}",
                s.values_end
            ));
        }
        // The index is built bottom-up and its root is the last block written: the file ends
        // right after it. A file of any other length is not the file this summary describes
        // (truncated, or with blocks appended).
        let root = u64::from(s.index_start_blk) + u64::from(s.index_root_blk);
        let end = (root + 1) * PAGE_SZ as u64;
        if file_len != end {
            return Err(format!(
                "file is {file_len} bytes, but the index root at block {root} ends it at byte {end}"
            ));
        }
        Ok(s)
    }

    /// The file name that encodes the layer's key and LSN ranges.
    /// The name of the layer this summary describes.
    pub fn layer_name(&self) -> LayerName {
        LayerName::Delta(DeltaLayerName {
            key_range: self.key_start..self.key_end,
            lsn_range: self.lsn_start..self.lsn_end,
        })
    }

    /// [`Summary::layer_name`] as text: the file's name.
    pub fn file_name(&self) -> String {
        self.layer_name().to_string()
    }
}
