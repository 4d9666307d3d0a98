//! Block 0 of a delta layer file, and the file name that encodes its ranges (the byte layout is
//! in the module documentation of `delta_layer` and in docs/file-formats.md).

use super::*;

/// Offsets of the delta layer's own fields, after the head every summary starts with
/// (`layer_file::head_off`).
mod summary_off {
    pub const LSN_START: usize = crate::tenant::storage_layer::layer_file::head_off::END;
    pub const LSN_END: usize = 84;
    pub const INDEX_START: usize = 92;
    pub const INDEX_ROOT: usize = 96;
    /// Reserved, zero; covered by the checksum.
    pub const RESERVED: usize = 100;
    pub const ENTRIES: usize = 104;
    pub const VALUES_END: usize = 112;
    pub const CHECKSUM: usize = 120;
}

pub(super) const LAYOUT: SummaryLayout = SummaryLayout {
    magic: DELTA_MAGIC,
    versions: &[DELTA_FORMAT_VERSION_PLAIN, DELTA_FORMAT_VERSION],
    crc_off: summary_off::CHECKSUM,
    reserved: &[(summary_off::RESERVED, 4)],
};

/// What block 0 says about the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub key_start: Key,
    pub key_end: Key,
    /// [`DELTA_FORMAT_VERSION_PLAIN`], or [`DELTA_FORMAT_VERSION`] if values may be compressed.
    pub format_version: u16,
    pub lsn_start: Lsn,
    pub lsn_end: Lsn,
    pub index_start_blk: u32,
    pub index_root_blk: u32,
    pub entries: u64,
    pub values_end: u64,
}

impl Summary {
    pub(super) fn head(&self) -> SummaryHead {
        SummaryHead {
            tenant_id: self.tenant_id,
            timeline_id: self.timeline_id,
            key_start: self.key_start,
            key_end: self.key_end,
            version: self.format_version,
        }
    }

    pub(super) fn encode(&self) -> Box<[u8; PAGE_SZ]> {
        use summary_off::*;
        LAYOUT.encode(
            &self.head(),
            &[
                (LSN_START, &self.lsn_start.0.to_be_bytes()),
                (LSN_END, &self.lsn_end.0.to_be_bytes()),
                (INDEX_START, &self.index_start_blk.to_be_bytes()),
                (INDEX_ROOT, &self.index_root_blk.to_be_bytes()),
                (ENTRIES, &self.entries.to_be_bytes()),
                (VALUES_END, &self.values_end.to_be_bytes()),
            ],
        )
    }

    /// Parses and checks block 0 of a file of `file_len` bytes.
    pub(super) fn decode(b: &[u8; PAGE_SZ], file_len: u64) -> Result<Summary, String> {
        use summary_off::*;
        let head = LAYOUT.decode(b)?;
        let s = Summary {
            tenant_id: head.tenant_id,
            timeline_id: head.timeline_id,
            key_start: head.key_start,
            key_end: head.key_end,
            format_version: head.version,
            lsn_start: Lsn(u64_at(b, LSN_START)),
            lsn_end: Lsn(u64_at(b, LSN_END)),
            index_start_blk: u32_at(b, INDEX_START),
            index_root_blk: u32_at(b, INDEX_ROOT),
            entries: u64_at(b, ENTRIES),
            values_end: u64_at(b, VALUES_END),
        };
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
