//! FNV-1a 64: a fast, stable hash of bytes (streams of the generated values, store keys and
//! checksums, the tail of a file name cut to length).

/// FNV-1a 64 of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
