//! CRC-32C (Castagnoli), the checksum of every layer block, value and file, of WAL records and
//! of transfers: one implementation for all of them.
//!
//! Computed by `crc-fast`, which folds 64 bytes at a time with carry-less multiplication
//! (VPCLMULQDQ with AVX-512, else PCLMULQDQ) and picks the code path once per process from what
//! the CPU has. On this project's 2-vCPU AMD EPYC machine that is 2.3 to 2.9× the speed of the
//! `crc32c` crate's SSE4.2 `crc32` instruction loop for 1 KiB to 64 KiB (8 KiB: 175 against
//! 430 ns), and 1.1 to 1.2× for 8 to 120 bytes; the values are the same CRC-32C (the tests
//! below check them against that crate). A CPU without carry-less multiply (x86 without
//! PCLMULQDQ, ARM without PMULL) gets `crc-fast`'s table code instead, which is correct but
//! slower than the `crc32c` crate's use of the CRC instructions such CPUs may have.

use crc_fast::{CrcAlgorithm, Digest};

const ALGORITHM: CrcAlgorithm = CrcAlgorithm::Crc32Iscsi;

/// The CRC-32C of `bytes`.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// The CRC-32C of the bytes whose CRC-32C is `crc` followed by `bytes`.
#[inline]
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // The running state is the complement of the finished checksum.
    let mut digest = Digest::new_with_init_state(ALGORITHM, u64::from(!crc));
    digest.update(bytes);
    digest.finalize() as u32
}

/// The CRC-32C of `a ++ b`, from the CRC-32C of `a`, that of `b` and the length of `b`.
#[inline]
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    if len_b == 0 {
        // `b` is empty (its CRC-32C is 0): `a` alone, whatever `crc_b` says.
        return crc_a;
    }
    crc_fast::checksum_combine(ALGORITHM, u64::from(crc_a), u64::from(crc_b), len_b as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_same_checksums_as_the_reference(
            bytes in proptest::collection::vec(any::<u8>(), 0..20_000),
            split in any::<prop::sample::Index>(),
        ) {
            let at = split.index(bytes.len() + 1);
            let (a, b) = bytes.split_at(at);
            prop_assert_eq!(crc32c(&bytes), ::crc32c::crc32c(&bytes));
            prop_assert_eq!(crc32c_append(crc32c(a), b), ::crc32c::crc32c(&bytes));
            prop_assert_eq!(crc32c_combine(crc32c(a), crc32c(b), b.len()), ::crc32c::crc32c(&bytes));
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(crc32c(b""), 0);
        // The check value of CRC-32C (RFC 3720, B.4).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_append(0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }
}
