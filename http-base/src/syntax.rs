//! The byte classes and small readers of RFC 9110 that every head check
//! is made of, and how peer bytes are quoted in a message.

use std::fmt::Write as _;

/// RFC 9110 `tchar`: what a field name (a token) is made of.
pub fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Visible ASCII, space, tab and obs-text: what a field value or a reason
/// phrase may hold.
pub fn is_field_byte(b: u8) -> bool {
    b == b'\t' || b == b' ' || b.is_ascii_graphic() || b >= 0x80
}

/// A non-empty run of at most `max_digits` decimal digits that fits a
/// `u64` (no sign, no spaces, no list).
pub fn parse_decimal(v: &[u8], max_digits: usize) -> Option<u64> {
    if v.is_empty() || v.len() > max_digits || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Peer bytes for a message: printable ASCII as is, the rest escaped, cut
/// at 64 bytes, in backquotes.
pub fn quote(b: &[u8]) -> String {
    let mut s = String::from("`");
    for &c in b.iter().take(64) {
        if c.is_ascii_graphic() || c == b' ' {
            s.push(c as char);
        } else {
            let _ = write!(s, "\\x{c:02x}");
        }
    }
    if b.len() > 64 {
        s.push_str("...");
    }
    s.push('`');
    s
}
