//! Full-page images: the page a block reference carries, back to its 8 KiB.
//!
//! A record stores an image as the page without its hole (the free space between `pd_lower`
//! and `pd_upper` of a standard page, which is zeros), and with `wal_compression` compressed
//! by pglz, LZ4 or Zstandard. [`restore_page`] undoes both, as PostgreSQL's
//! `RestoreBlockImage` does, and checks what it is given: the decompressed bytes must be
//! exactly the page less its hole, whatever the stream claims, and no method reads or writes
//! outside its buffers or makes more than a page (pglz is decoded here with every reference
//! checked; LZ4 by `lz4_flex` and Zstandard by libzstd, each into a page-sized buffer).

use crate::record::{
    BlockImage, BKPIMAGE_COMPRESS_LZ4, BKPIMAGE_COMPRESS_PGLZ, BKPIMAGE_COMPRESS_ZSTD,
};
use crate::BLCKSZ;

/// How an image is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Pglz,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn of(image: &BlockImage) -> Compression {
        if image.bimg_info & BKPIMAGE_COMPRESS_PGLZ != 0 {
            Compression::Pglz
        } else if image.bimg_info & BKPIMAGE_COMPRESS_LZ4 != 0 {
            Compression::Lz4
        } else if image.bimg_info & BKPIMAGE_COMPRESS_ZSTD != 0 {
            Compression::Zstd
        } else {
            Compression::None
        }
    }

    /// As `pg_waldump` names it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Pglz => "pglz",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// The page `image` stores in `bytes` (the image's bytes in its record).
pub fn restore_page(image: &BlockImage, bytes: &[u8]) -> Result<Box<[u8; BLCKSZ]>, String> {
    if bytes.len() != usize::from(image.len) {
        return Err(format!(
            "the image is {} bytes, its header says {}",
            bytes.len(),
            image.len
        ));
    }
    let hole_offset = usize::from(image.hole_offset);
    let hole_len = usize::from(image.hole_len);
    if hole_offset + hole_len > BLCKSZ {
        return Err(format!(
            "a hole of {hole_len} at {hole_offset} is not inside the page"
        ));
    }
    let stored = BLCKSZ - hole_len;
    let method = Compression::of(image);
    let mut unpacked = vec![0u8; stored];
    match method {
        Compression::None => {
            if bytes.len() != stored {
                return Err(format!(
                    "an uncompressed image of {} bytes with a hole of {hole_len}",
                    bytes.len()
                ));
            }
            unpacked.copy_from_slice(bytes);
        }
        Compression::Pglz => pglz_decompress(bytes, &mut unpacked)?,
        Compression::Lz4 => {
            let n = lz4_flex::block::decompress_into(bytes, &mut unpacked)
                .map_err(|e| format!("the LZ4 image does not decompress: {e}"))?;
            if n != stored {
                return Err(format!(
                    "the LZ4 image decompresses to {n} bytes, not the {stored} of the page less its hole"
                ));
            }
        }
        Compression::Zstd => zstd_decompress(bytes, &mut unpacked)?,
    }
    let mut page = Box::new([0u8; BLCKSZ]);
    page[..hole_offset].copy_from_slice(&unpacked[..hole_offset]);
    page[hole_offset + hole_len..].copy_from_slice(&unpacked[hole_offset..]);
    Ok(page)
}

/// PostgreSQL's pglz format: groups of a control byte and up to eight items, each a literal
/// byte (its bit 0) or a back reference (bit 1) of 2 or 3 bytes: length 3 to 273, offset 1 to
/// 4095 into what was already written. `out` must be filled exactly, with all of `input`.
pub fn pglz_decompress(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    let bad = |what: &str, at: usize| Err(format!("the pglz image breaks at byte {at}: {what}"));
    let (mut sp, mut dp) = (0usize, 0usize);
    while sp < input.len() && dp < out.len() {
        let mut ctrl = input[sp];
        sp += 1;
        for _ in 0..8 {
            if sp >= input.len() || dp >= out.len() {
                break;
            }
            if ctrl & 1 != 0 {
                if sp + 1 >= input.len() {
                    return bad("a back reference cut short", sp);
                }
                let mut len = usize::from(input[sp] & 0x0f) + 3;
                let off = (usize::from(input[sp] & 0xf0) << 4) | usize::from(input[sp + 1]);
                sp += 2;
                if len == 18 {
                    let Some(extra) = input.get(sp) else {
                        return bad("a long back reference cut short", sp);
                    };
                    len += usize::from(*extra);
                    sp += 1;
                }
                if off == 0 || off > dp {
                    return bad("a back reference before the start", sp);
                }
                let len = len.min(out.len() - dp);
                // Overlapping copies repeat the bytes just written, as PostgreSQL's do.
                for i in 0..len {
                    out[dp + i] = out[dp + i - off];
                }
                dp += len;
            } else {
                out[dp] = input[sp];
                sp += 1;
                dp += 1;
            }
            ctrl >>= 1;
        }
    }
    if dp != out.len() || sp != input.len() {
        return Err(format!(
            "the pglz image makes {dp} bytes from {sp} of its {}, not the {} of the page less its hole",
            input.len(),
            out.len()
        ));
    }
    Ok(())
}

/// One Zstandard frame, into exactly `out`. PostgreSQL's `ZSTD_compress` of a page writes a
/// single-segment frame that names its content size; only such a frame is taken, and its size
/// must be `out`'s. libzstd decompresses it straight into `out` (a frame that would make more
/// fails there, whatever its blocks claim), its window bounded to a page's.
fn zstd_decompress(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    let size = zstd_content_size(input)?;
    if size != out.len() as u64 {
        return Err(format!(
            "the Zstandard image names {size} bytes of content, not the {} of the page less its hole",
            out.len()
        ));
    }
    // One context per thread: a new one allocates its tables anew, which costs more than
    // decompressing a page.
    thread_local! {
        static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let bad = |e: std::io::Error| format!("the Zstandard image does not decompress: {e}");
    let written = DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let decompressor = match &mut *cell {
            Some(d) => d,
            None => {
                let mut d = zstd::bulk::Decompressor::new().map_err(bad)?;
                // A page's window (2^13), with room: a frame asking for more is refused.
                d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(14))
                    .map_err(bad)?;
                cell.insert(d)
            }
        };
        decompressor.decompress_to_buffer(input, out).map_err(bad)
    })?;
    if written != out.len() {
        return Err(format!(
            "the Zstandard image makes {written} bytes, not the {} of the page less its hole",
            out.len()
        ));
    }
    Ok(())
}

/// The content size a single-segment Zstandard frame's header names (RFC 8878, 3.1.1.1).
fn zstd_content_size(input: &[u8]) -> Result<u64, String> {
    let bad = |what: &str| Err(format!("the Zstandard image's frame header: {what}"));
    if input.len() < 5 || input[..4] != [0x28, 0xb5, 0x2f, 0xfd] {
        return bad("no frame magic");
    }
    let descriptor = input[4];
    let single_segment = descriptor & 0x20 != 0;
    let dictionary = descriptor & 0x03;
    if !single_segment || dictionary != 0 {
        return bad("not a single-segment frame without a dictionary");
    }
    let field = match descriptor >> 6 {
        0 => 1,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let Some(bytes) = input.get(5..5 + field) else {
        return bad("cut short");
    };
    let mut value = [0u8; 8];
    value[..field].copy_from_slice(bytes);
    let size = u64::from_le_bytes(value);
    Ok(if field == 2 { size + 256 } else { size })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{BKPIMAGE_APPLY, BKPIMAGE_HAS_HOLE};
    use proptest::prelude::*;

    /// A page whose header says its hole is 100..8000, with bytes around it.
    fn page() -> Box<[u8; BLCKSZ]> {
        let mut p = Box::new([0u8; BLCKSZ]);
        for (i, b) in p.iter_mut().enumerate() {
            if !(100..8000).contains(&i) {
                *b = (i % 251) as u8;
            }
        }
        p
    }

    fn image(len: usize, info: u8) -> BlockImage {
        BlockImage {
            len: len as u16,
            hole_offset: 100,
            hole_len: 7900,
            bimg_info: info | BKPIMAGE_HAS_HOLE | BKPIMAGE_APPLY,
        }
    }

    fn without_hole(p: &[u8; BLCKSZ]) -> Vec<u8> {
        [&p[..100], &p[8000..]].concat()
    }

    #[test]
    fn every_method_restores_the_page() {
        let p = page();
        let raw = without_hole(&p);
        assert_eq!(*restore_page(&image(raw.len(), 0), &raw).unwrap(), *p);
        let lz4 = lz4_flex::block::compress(&raw);
        assert_eq!(
            *restore_page(&image(lz4.len(), BKPIMAGE_COMPRESS_LZ4), &lz4).unwrap(),
            *p
        );
        // pglz by hand: eight literals, then a reference 8 back of length 18+2.
        let mut out = [0u8; 28];
        pglz_decompress(
            &[0x00, 1, 2, 3, 4, 5, 6, 7, 8, 0x01, 0x0f, 0x08, 2],
            &mut out,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&out[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&out[..8], &out[16..24]);
    }

    #[test]
    fn a_wrong_length_or_reference_is_an_error() {
        let raw = without_hole(&page());
        assert!(restore_page(&image(raw.len() - 1, 0), &raw[1..]).is_err());
        let lz4 = lz4_flex::block::compress(&raw[1..]);
        let e = restore_page(&image(lz4.len(), BKPIMAGE_COMPRESS_LZ4), &lz4).unwrap_err();
        assert!(e.contains("LZ4"), "{e}");
        let mut out = [0u8; 16];
        // A reference before anything was written.
        let e = pglz_decompress(&[0x01, 0x00, 0x01], &mut out).unwrap_err();
        assert!(e.contains("before the start"), "{e}");
        // Too few bytes for the output.
        assert!(pglz_decompress(&[0x00, 1, 2], &mut out).is_err());
        assert!(zstd_decompress(b"not a frame", &mut out).is_err());
        let e = restore_page(&image(11, BKPIMAGE_COMPRESS_ZSTD), b"not a frame").unwrap_err();
        assert!(e.contains("frame magic"), "{e}");
    }

    /// A single-segment Zstandard frame of `blocks` (type, size, bytes), naming `content`.
    fn zstd_frame(content: u8, blocks: &[(u32, u32, &[u8])]) -> Vec<u8> {
        let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x20, content];
        for (i, (kind, size, bytes)) in blocks.iter().enumerate() {
            let last = u32::from(i + 1 == blocks.len());
            f.extend(&(last | (kind << 1) | (size << 3)).to_le_bytes()[..3]);
            f.extend(*bytes);
        }
        f
    }

    #[test]
    fn zstd_frames_are_bounded_by_the_page() {
        let mut out = [0u8; 5];
        zstd_decompress(&zstd_frame(5, &[(0, 5, b"hello")]), &mut out).unwrap();
        assert_eq!(&out, b"hello");
        // Blocks of one byte repeated 128 KiB times, again and again: stopped at the page.
        let rle = (1, 128 << 10, &b"x"[..]);
        let e = zstd_decompress(&zstd_frame(5, &[rle; 64]), &mut out).unwrap_err();
        assert!(e.contains("does not decompress"), "{e}");
        // The same context, reused after a failure, decodes the next frame.
        zstd_decompress(&zstd_frame(5, &[(0, 5, b"world")]), &mut out).unwrap();
        assert_eq!(&out, b"world");
        // A content size other than the page's, or no single segment: refused before decoding.
        assert!(zstd_decompress(&zstd_frame(4, &[(0, 4, b"hell")]), &mut out).is_err());
        let mut windowed = zstd_frame(5, &[(0, 5, b"hello")]);
        windowed[4] = 0x00;
        let e = zstd_decompress(&windowed, &mut out).unwrap_err();
        assert!(e.contains("single-segment"), "{e}");
    }

    proptest! {
        #[test]
        fn any_bytes_restore_or_fail_without_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            method in 0usize..4,
            hole in 0u16..8192,
        ) {
            let info = [0, BKPIMAGE_COMPRESS_PGLZ, BKPIMAGE_COMPRESS_LZ4, BKPIMAGE_COMPRESS_ZSTD][method];
            let image = BlockImage {
                len: bytes.len() as u16,
                hole_offset: 8192 - hole,
                hole_len: hole,
                bimg_info: info | BKPIMAGE_HAS_HOLE,
            };
            if let Ok(page) = restore_page(&image, &bytes) {
                prop_assert_eq!(page.len(), BLCKSZ);
            }
        }
    }
}
