//! Lowercase hex for 32-byte digests (keys and fingerprints).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

pub(crate) fn encode_hex(bytes: &[u8], out: &mut String) {
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
}

/// Every byte's two hex digits, by the byte: one load per byte instead of two, and no
/// shifting or masking.
const PAIRS: [[u8; 2]; 256] = {
    let mut pairs = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        pairs[b] = [DIGITS[b >> 4], DIGITS[b & 0xf]];
        b += 1;
    }
    pairs
};

/// Writes `2 * bytes.len()` hex digits into the start of `out`.
pub(crate) fn encode_hex_into(bytes: &[u8], out: &mut [u8]) {
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair.copy_from_slice(&PAIRS[usize::from(*b)]);
    }
}

pub(crate) fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}
