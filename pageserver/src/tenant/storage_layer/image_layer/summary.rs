//! Block 0 of an image layer file, and the file name it gives the layer (the byte layout is in
//! the module documentation of `image_layer` and in docs/file-formats.md).

use super::*;

/// Offsets of the image layer's own fields, after the head every summary starts with
/// (`layer_file::head_off`).
mod summary_off {
    pub const LSN: usize = crate::tenant::storage_layer::layer_file::head_off::END;
    pub const CHECKSUMS_START: usize = 84;
    pub const INDEX_START: usize = 88;
    pub const INDEX_ROOT: usize = 92;
    pub const ENTRIES: usize = 96;
    pub const VALUES_END: usize = 104;
    pub const CHECKSUM: usize = 112;
}

pub(super) const LAYOUT: SummaryLayout = SummaryLayout {
    magic: IMAGE_MAGIC,
    versions: &[IMAGE_FORMAT_VERSION_PLAIN, IMAGE_FORMAT_VERSION],
    crc_off: summary_off::CHECKSUM,
    reserved: &[],
};

/// What block 0 says about the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    pub key_start: Key,
    /// Exclusive.
    pub key_end: Key,
    /// [`IMAGE_FORMAT_VERSION_PLAIN`], or [`IMAGE_FORMAT_VERSION`] if images may be compressed.
    pub format_version: u16,
    /// The LSN every image is the page at.
    pub lsn: Lsn,
    /// The first block of the checksum table, just after the last value block.
    pub checksums_start_blk: u32,
    /// The first block of the index, just after the checksum table.
    pub index_start_blk: u32,
    /// Relative to `index_start_blk`.
    pub index_root_blk: u32,
    pub entries: u64,
    /// The byte just past the last image; 8192 if there is none.
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
                (LSN, &self.lsn.0.to_be_bytes()),
                (CHECKSUMS_START, &self.checksums_start_blk.to_be_bytes()),
                (INDEX_START, &self.index_start_blk.to_be_bytes()),
                (INDEX_ROOT, &self.index_root_blk.to_be_bytes()),
                (ENTRIES, &self.entries.to_be_bytes()),
                (VALUES_END, &self.values_end.to_be_bytes()),
            ],
        )
    }

    /// Parses and checks block 0 of a file of `file_len` bytes: every region the summary
    /// describes must follow from the one before it, and the file must end with the index
    /// root.
    pub(super) fn decode(b: &[u8; PAGE_SZ], file_len: u64) -> Result<Summary, String> {
        use summary_off::*;
        let head = LAYOUT.decode(b)?;
        let s = Summary {
            tenant_id: head.tenant_id,
            timeline_id: head.timeline_id,
            key_start: head.key_start,
            key_end: head.key_end,
            format_version: head.version,
            lsn: Lsn(u64_at(b, LSN)),
            checksums_start_blk: u32_at(b, CHECKSUMS_START),
            index_start_blk: u32_at(b, INDEX_START),
            index_root_blk: u32_at(b, INDEX_ROOT),
            entries: u64_at(b, ENTRIES),
            values_end: u64_at(b, VALUES_END),
        };
        // Layer names use it as no LSN (see `layer_name`).
        if s.lsn == Lsn::MAX {
            return Err(format!("the LSN {} is reserved", s.lsn));
        }
        let page = PAGE_SZ as u64;
        if s.values_end < page {
            return Err(format!("values end at byte {}, before 8192", s.values_end));
        }
        let checksums_start = s.values_end.div_ceil(page);
        if u64::from(s.checksums_start_blk) != checksums_start {
            return Err(format!(
                "the checksum table starts at block {}, but values ending at byte {} put it at \
                 block {checksums_start}",
                s.checksums_start_blk, s.values_end
            ));
        }
        let table_blocks = (checksums_start - 1).div_ceil(CRCS_PER_BLOCK as u64);
        let index_start = checksums_start + table_blocks;
        if u64::from(s.index_start_blk) != index_start {
            return Err(format!(
                "the index starts at block {}, but the checksum table of {table_blocks} blocks \
                 ends at block {index_start}",
                s.index_start_blk
            ));
        }
        // The index is built bottom-up and its root is the last block written: the file ends
        // right after it. A file of any other length is not the file this summary describes
        // (truncated, or with blocks appended).
        let index_blocks = u64::from(s.index_root_blk) + 1;
        let end = (index_start + index_blocks) * page;
        if file_len != end {
            return Err(format!(
                "file is {file_len} bytes, but the index root at block {} ends it at byte {end}",
                index_start + index_blocks - 1
            ));
        }
        let most = index_blocks * crate::format::disk_btree::leaf_capacity(KEY_LEN) as u64;
        if s.entries > most {
            return Err(format!(
                "{} entries cannot fit in an index of {index_blocks} blocks",
                s.entries
            ));
        }
        if s.entries == 0 && s.values_end != page {
            return Err(format!(
                "no entries, but values end at byte {}",
                s.values_end
            ));
        }
        Ok(s)
    }

    /// The name of the layer this summary describes.
    pub fn layer_name(&self) -> LayerName {
        LayerName::Image(ImageLayerName {
            key_range: self.key_start..self.key_end,
            lsn: self.lsn,
        })
    }

    /// [`Summary::layer_name`] as text: the file's name.
    pub fn file_name(&self) -> String {
        self.layer_name().to_string()
    }

    /// Blocks of the checksum table.
    pub fn checksum_blocks(&self) -> u32 {
        self.index_start_blk - self.checksums_start_blk
    }

    /// Blocks holding images (and their padding), from block 1.
    pub fn value_blocks(&self) -> u32 {
        self.checksums_start_blk - 1
    }
}
