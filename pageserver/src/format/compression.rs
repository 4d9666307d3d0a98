//! Compression of stored values: one Zstandard frame per value, kept only where it pays.
//!
//! A layer compresses each value on its own, not a block or a file at a time, so that reading
//! one page decompresses one page's bytes and a value's place in the file is still found from
//! the index alone. A frame is kept only when it is at least an eighth smaller than the value
//! ([`worth_keeping`]): a value that barely compresses (a page of random bytes, a short delta)
//! costs nothing to read.
//!
//! Frames are standard Zstandard frames (RFC 8878) that name their content size, without their
//! own checksum (the layer's CRC-32C covers the stored bytes). Reading treats a frame as
//! untrusted: the content size it names must be at most the reader's limit, the output buffer
//! is sized from that checked figure, and the frame must make exactly the bytes it named. The
//! frame is decoded in one pass straight into that buffer (libzstd's one-shot decoding keeps no
//! window of its own), so a frame cannot make the decoder allocate more than the buffer.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

/// How a layer file's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    /// As they are.
    #[default]
    Off,
    /// Each value worth it as a Zstandard frame at this level.
    Zstd { level: i32 },
}

impl Compression {
    /// The level `zstd` alone means: `scripts/bench-layer-compression` found level 3 to store
    /// no fewer bytes of a pgbench cluster and -1 to store 23 % more (docs/benchmarks.md,
    /// "Compressed layers").
    pub const DEFAULT_ZSTD_LEVEL: i32 = 1;

    /// The levels the setting accepts: libzstd's fast levels down to -7, and up to 19 (the
    /// levels above need far more memory per writer for little gain on pages).
    pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = -7..=19;

    pub fn is_off(&self) -> bool {
        matches!(self, Compression::Off)
    }

    /// What a layer writer compresses with: none when off.
    pub fn compressor(&self) -> std::io::Result<Option<ValueCompressor>> {
        match self {
            Compression::Off => Ok(None),
            Compression::Zstd { level } => ValueCompressor::new(*level).map(Some),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::Off => f.write_str("off"),
            Compression::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

impl FromStr for Compression {
    type Err = String;

    /// `off`, `zstd` (at [`Compression::DEFAULT_ZSTD_LEVEL`]) or `zstd:<level>`.
    fn from_str(s: &str) -> Result<Compression, String> {
        let level = match s.split_once(':') {
            None if s == "off" => return Ok(Compression::Off),
            None if s == "zstd" => Compression::DEFAULT_ZSTD_LEVEL,
            Some(("zstd", level)) => level
                .parse::<i32>()
                .map_err(|_| format!("compression level {level:?} is not an integer"))?,
            _ => {
                return Err(format!(
                    "unknown compression {s:?}: expected \"off\", \"zstd\" or \"zstd:<level>\""
                ))
            }
        };
        if !Compression::ZSTD_LEVELS.contains(&level) {
            return Err(format!(
                "zstd level {level} is outside {}..={}",
                Compression::ZSTD_LEVELS.start(),
                Compression::ZSTD_LEVELS.end()
            ));
        }
        Ok(Compression::Zstd { level })
    }
}

impl<'de> serde::Deserialize<'de> for Compression {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Compression, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether a frame of `compressed` bytes is worth storing in place of `plain` bytes: it must
/// save at least an eighth, so that the decompression a read pays buys real space.
pub fn worth_keeping(plain: usize, compressed: usize) -> bool {
    compressed <= largest_kept(plain)
}

/// The largest frame [`worth_keeping`] keeps of a value of `plain` bytes.
fn largest_kept(plain: usize) -> usize {
    plain - plain / 8
}

/// Values shorter than this are never compressed: a frame's header alone is 6 to 9 bytes, and
/// short deltas and records rarely lose an eighth.
pub const MIN_COMPRESSED_INPUT: usize = 64;

/// Compresses values at one level; a writer keeps one for its file (a context allocates its
/// tables once, which costs more than compressing a page).
pub struct ValueCompressor {
    context: zstd::bulk::Compressor<'static>,
    /// The last frame made.
    frame: Vec<u8>,
}

impl ValueCompressor {
    pub fn new(level: i32) -> std::io::Result<ValueCompressor> {
        let mut context = zstd::bulk::Compressor::new(level)?;
        // The layer's CRC-32C covers the stored bytes; the content size is what a reader sizes
        // its buffer by (after checking it against its limit).
        context.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(false))?;
        context.set_parameter(zstd::zstd_safe::CParameter::ContentSizeFlag(true))?;
        Ok(ValueCompressor {
            context,
            frame: Vec::new(),
        })
    }

    /// `input` as one frame, if the frame is [worth keeping](worth_keeping).
    pub fn compress(&mut self, input: &[u8]) -> Option<&[u8]> {
        if input.len() < MIN_COMPRESSED_INPUT {
            return None;
        }
        self.frame.clear();
        // Room for a frame worth keeping: libzstd stops as soon as a frame will not fit
        // ("destination buffer too small"), which here means "not worth it". (Room left from a
        // longer value may fit a larger frame: the check below refuses it.)
        self.frame.reserve_exact(largest_kept(input.len()));
        let written = self
            .context
            .compress_to_buffer(input, &mut self.frame)
            .ok()?;
        worth_keeping(input.len(), written).then_some(&self.frame[..written])
    }
}

/// `frame` decompressed: a frame that names its content size, at most `max_len` bytes, and
/// makes exactly that many.
pub fn decompress(frame: &[u8], max_len: usize) -> Result<Vec<u8>, String> {
    let size = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) => size,
        Ok(None) => return Err("the Zstandard frame does not name its content size".to_owned()),
        Err(_) => return Err("not a Zstandard frame".to_owned()),
    };
    let size = usize::try_from(size)
        .ok()
        .filter(|size| *size <= max_len)
        .ok_or_else(|| {
            format!("the Zstandard frame names {size} bytes of content, more than the {max_len} allowed")
        })?;
    // One context per thread: a new one allocates its tables anew, which costs more than
    // decompressing a page.
    thread_local! {
        static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { RefCell::new(None) };
    }
    let bad = |e: std::io::Error| format!("the Zstandard frame does not decompress: {e}");
    let mut out = Vec::with_capacity(size);
    let written = DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let decompressor = match &mut *cell {
            Some(d) => d,
            None => cell.insert(zstd::bulk::Decompressor::new().map_err(bad)?),
        };
        // One pass into `out`, which bounds what the frame can make (whatever its blocks or
        // window claim).
        decompressor
            .decompress_to_buffer(frame, &mut out)
            .map_err(bad)
    })?;
    if written != size {
        return Err(format!(
            "the Zstandard frame makes {written} bytes, not the {size} it names"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(seed: u8) -> Vec<u8> {
        // A heap page's look: a header, then rows of a repeated pattern with a counter.
        let mut p = vec![0u8; 8192];
        for (i, chunk) in p[24..].chunks_mut(100).enumerate() {
            let row = format!("{seed:3} row {i:5} filler ");
            for (j, b) in chunk.iter_mut().enumerate() {
                *b = row.as_bytes()[j % row.len()];
            }
        }
        p
    }

    #[test]
    fn a_compressible_value_round_trips_and_a_random_one_is_not_kept() {
        let mut c = ValueCompressor::new(Compression::DEFAULT_ZSTD_LEVEL).unwrap();
        let plain = page(7);
        let frame = c
            .compress(&plain)
            .expect("a heap-like page compresses")
            .to_vec();
        assert!(frame.len() < plain.len() / 4, "{} bytes", frame.len());
        assert_eq!(decompress(&frame, 8192).unwrap(), plain);

        let mut random = vec![0u8; 8192];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for b in random.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        assert!(c.compress(&random).is_none());
        assert!(c.compress(&plain[..MIN_COMPRESSED_INPUT - 1]).is_none());
        // The compressor is usable after a refusal.
        assert_eq!(c.compress(&plain).unwrap(), &frame[..]);
    }

    #[test]
    fn untrusted_frames_are_refused_with_what_is_wrong() {
        let mut c = ValueCompressor::new(3).unwrap();
        let plain = page(1);
        let frame = c.compress(&plain).unwrap().to_vec();
        let err = decompress(&frame, 8191).unwrap_err();
        assert!(
            err.contains("8192 bytes of content, more than the 8191"),
            "{err}"
        );
        assert!(decompress(b"not a frame at all", 8192)
            .unwrap_err()
            .contains("not a Zstandard frame"));
        assert!(decompress(&frame[..frame.len() - 3], 8192).is_err());
        // A damaged body fails or, where libzstd cannot tell, makes other bytes: the layer's
        // CRC over the stored bytes is what catches that.
        let mut damaged = frame.clone();
        let at = damaged.len() / 2;
        damaged[at] ^= 0xFF;
        if let Ok(out) = decompress(&damaged, 8192) {
            assert_eq!(out.len(), 8192);
        }
        // A frame of the empty string names size 0 and makes nothing.
        let empty = zstd::bulk::compress(b"", 1).unwrap();
        assert_eq!(decompress(&empty, 0).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn the_setting_parses_and_prints() {
        assert_eq!("off".parse::<Compression>().unwrap(), Compression::Off);
        assert_eq!(
            "zstd".parse::<Compression>().unwrap(),
            Compression::Zstd {
                level: Compression::DEFAULT_ZSTD_LEVEL
            }
        );
        assert_eq!(
            "zstd:-3".parse::<Compression>().unwrap(),
            Compression::Zstd { level: -3 }
        );
        for c in [Compression::Off, Compression::Zstd { level: 9 }] {
            assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
        }
        assert!("zstd:40"
            .parse::<Compression>()
            .unwrap_err()
            .contains("outside"));
        assert!("lz4"
            .parse::<Compression>()
            .unwrap_err()
            .contains("unknown compression"));
        assert!("zstd:x"
            .parse::<Compression>()
            .unwrap_err()
            .contains("not an integer"));
    }
}
