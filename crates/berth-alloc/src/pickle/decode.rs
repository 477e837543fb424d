//! Decoding of opcode arguments: integers of any size and protocol-0 text forms.

use super::value::PickleValue;

/// Decodes a little-endian two's-complement integer (`LONG1` / `LONG4`), normalising it to
/// [`PickleValue::Int`] whenever it fits in `i64`.
pub(crate) fn int_from_le(bytes: &[u8]) -> PickleValue {
    if bytes.is_empty() {
        return PickleValue::Int(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0x00 };
    // Drop sign-extension bytes that carry no information.
    let mut len = bytes.len();
    while len > 1 && bytes[len - 1] == fill && (bytes[len - 2] & 0x80 != 0) == negative {
        len -= 1;
    }
    let bytes = &bytes[..len];
    if len <= 8 {
        let mut buf = [fill; 8];
        buf[..len].copy_from_slice(bytes);
        PickleValue::Int(i64::from_le_bytes(buf))
    } else {
        PickleValue::BigInt(bytes.to_vec())
    }
}

/// A pickled `LONG` (little-endian two's complement, as [`int_from_le`] reads it) in decimal:
/// the inverse of [`decimal_int`], for messages.
pub(crate) fn int_to_decimal(bytes: &[u8]) -> String {
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    // The magnitude, little-endian: the bytes themselves, or their two's complement.
    let mut mag: Vec<u8> = bytes.to_vec();
    if negative {
        let mut carry = 1u16;
        for b in &mut mag {
            let v = u16::from(!*b) + carry;
            *b = v as u8;
            carry = v >> 8;
        }
    }
    let mut digits = Vec::new();
    while mag.iter().any(|&b| b != 0) {
        // Divide the magnitude by 10, most significant byte first.
        let mut rem = 0u16;
        for b in mag.iter_mut().rev() {
            let v = (rem << 8) | u16::from(*b);
            *b = (v / 10) as u8;
            rem = v % 10;
        }
        digits.push(b'0' + rem as u8);
    }
    if digits.is_empty() {
        digits.push(b'0');
    }
    if negative {
        digits.push(b'-');
    }
    digits.reverse();
    String::from_utf8(digits).unwrap_or_default()
}

/// Parses a decimal integer of any size (protocol 0 `INT` / `LONG`).
pub(crate) fn decimal_int(text: &[u8]) -> Option<PickleValue> {
    let s = std::str::from_utf8(text).ok()?.trim();
    if let Ok(i) = s.parse::<i64>() {
        return Some(PickleValue::Int(i));
    }
    let (negative, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude as little-endian base-256 digits.
    let mut mag: Vec<u8> = vec![0];
    for d in digits.bytes() {
        let mut carry = u32::from(d - b'0');
        for byte in mag.iter_mut() {
            let x = u32::from(*byte) * 10 + carry;
            *byte = (x & 0xff) as u8;
            carry = x >> 8;
        }
        if carry > 0 {
            mag.push(carry as u8);
        }
    }
    mag.push(0); // room for the sign bit
    if negative {
        // Two's complement: invert and add one.
        let mut carry = 1u16;
        for byte in mag.iter_mut() {
            let x = u16::from(!*byte) + carry;
            *byte = (x & 0xff) as u8;
            carry = x >> 8;
        }
    }
    Some(int_from_le(&mag))
}

/// Decodes Python's `raw-unicode-escape` (protocol 0 `UNICODE`): bytes are Latin-1 except
/// `\uXXXX` and `\UXXXXXXXX`.
pub(crate) fn raw_unicode_escape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' && i + 1 < bytes.len() && (bytes[i + 1] == b'u' || bytes[i + 1] == b'U') {
            let n = if bytes[i + 1] == b'u' { 4 } else { 8 };
            let hex = bytes.get(i + 2..i + 2 + n)?;
            let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(char::from_u32(code)?);
            i += 2 + n;
        } else {
            out.push(char::from(b));
            i += 1;
        }
    }
    Some(out)
}

/// Decodes a quoted Python 2 string literal (protocol 0 `STRING`) with the common escapes.
pub(crate) fn python_string_literal(line: &[u8]) -> Option<String> {
    let q = *line.first()?;
    if line.len() < 2 || (q != b'\'' && q != b'"') || line[line.len() - 1] != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = String::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b != b'\\' {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let e = *body.get(i + 1)?;
        i += 2;
        match e {
            b'n' => out.push('\n'),
            b't' => out.push('\t'),
            b'r' => out.push('\r'),
            b'\\' => out.push('\\'),
            b'\'' => out.push('\''),
            b'"' => out.push('"'),
            b'x' => {
                let hex = body.get(i..i + 2)?;
                out.push(char::from(
                    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?,
                ));
                i += 2;
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_from_le_matches_python_encode_long() {
        // pickle.encode_long values
        assert_eq!(int_from_le(&[]), PickleValue::Int(0));
        assert_eq!(int_from_le(&[0xff, 0x00]), PickleValue::Int(255));
        assert_eq!(int_from_le(&[0xff]), PickleValue::Int(-1));
        assert_eq!(int_from_le(&[0x00, 0xff]), PickleValue::Int(-256));
        assert_eq!(
            int_from_le(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            PickleValue::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0x80, 0])
        );
        assert_eq!(
            int_from_le(&[0, 0, 0, 0, 0, 0, 0, 0x80]),
            PickleValue::Int(i64::MIN)
        );
    }

    #[test]
    fn big_ints_print_in_decimal() {
        // 10^30 and -(2^64), as Python pickles them (LONG1: little-endian two's complement).
        let ten_30: Vec<u8> = {
            let mut v = 1_000_000_000_000_000_000_000_000_000_000u128
                .to_le_bytes()
                .to_vec();
            while v.len() > 1 && v[v.len() - 1] == 0 && v[v.len() - 2] & 0x80 == 0 {
                v.pop();
            }
            v
        };
        assert_eq!(int_to_decimal(&ten_30), "1000000000000000000000000000000");
        let minus_2_64 = (-(1i128 << 64)).to_le_bytes()[..9].to_vec();
        assert_eq!(int_to_decimal(&minus_2_64), "-18446744073709551616");
        assert_eq!(int_to_decimal(&[]), "0");
        assert_eq!(int_to_decimal(&[0xff]), "-1");
    }

    #[test]
    fn decimal_int_handles_big_values() {
        assert_eq!(decimal_int(b"-42"), Some(PickleValue::Int(-42)));
        // 2**64 = 18446744073709551616 -> 00..00 01 00
        assert_eq!(
            decimal_int(b"18446744073709551616"),
            Some(PickleValue::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]))
        );
        // -(2**64)
        assert_eq!(
            decimal_int(b"-18446744073709551616"),
            Some(PickleValue::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 0xff]))
        );
        assert_eq!(decimal_int(b"12a"), None);
    }
}
