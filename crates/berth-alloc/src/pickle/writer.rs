//! A Python pickle writer for [`PickleValue`] trees: protocol 4 with framing, as `pickle.dump`
//! writes by default since Python 3.8 (Python `Lib/pickle.py` `_Pickler`).

use std::collections::HashMap;

use super::opcodes as op;
use super::value::PickleValue;

/// Protocol written by [`to_vec`]: 4, readable by every Python since 3.4.
pub const PROTOCOL: u8 = 4;

/// Target frame size in bytes (Python's `_Framer._FRAME_SIZE_TARGET`).
const FRAME_SIZE_TARGET: usize = 64 * 1024;

/// Items per `SETITEMS` / `APPENDS` batch (Python's `_BATCHSIZE`).
const BATCH_SIZE: usize = 1000;

/// Encodes `value` as a protocol-4 pickle that Python's `pickle.load` reads back to the equal
/// object (dicts keep their order; [`PickleValue::BigInt`] and every other variant round-trip).
///
/// Like Python, repeated strings are written once and referenced by `BINGET` afterwards (every
/// dict key of a snapshot repeats thousands of times), and the output is cut into frames of about
/// 64 KiB.
///
/// # Examples
///
/// ```
/// use berth_alloc::pickle::{from_slice, to_vec, PickleValue};
/// let v = PickleValue::dict([("segments", PickleValue::List(vec![])), ("n", PickleValue::Int(7))]);
/// assert_eq!(from_slice(&to_vec(&v))?, v);
/// # Ok::<(), berth_alloc::pickle::PickleError>(())
/// ```
pub fn to_vec(value: &PickleValue) -> Vec<u8> {
    let mut w = Writer {
        out: vec![op::PROTO, PROTOCOL],
        frame: Vec::new(),
        memo: HashMap::new(),
        next_memo: 0,
    };
    w.save(value);
    w.frame.push(op::STOP);
    w.end_frame();
    w.out
}

struct Writer<'v> {
    /// Finished frames (and the PROTO header).
    out: Vec<u8>,
    /// Opcodes of the frame being written.
    frame: Vec<u8>,
    /// Memo index of every string written so far.
    memo: HashMap<&'v str, u32>,
    next_memo: u32,
}

impl<'v> Writer<'v> {
    /// Closes the current frame if it reached the target size (called between opcodes only).
    fn maybe_end_frame(&mut self) {
        if self.frame.len() >= FRAME_SIZE_TARGET {
            self.end_frame();
        }
    }

    fn end_frame(&mut self) {
        if self.frame.is_empty() {
            return;
        }
        // Python writes no FRAME header for frames under 4 bytes.
        if self.frame.len() >= 4 {
            self.out.push(op::FRAME);
            self.out
                .extend_from_slice(&(self.frame.len() as u64).to_le_bytes());
        }
        self.out.append(&mut self.frame);
    }

    fn save(&mut self, v: &'v PickleValue) {
        self.maybe_end_frame();
        match v {
            PickleValue::None => self.frame.push(op::NONE),
            PickleValue::Bool(true) => self.frame.push(op::NEWTRUE),
            PickleValue::Bool(false) => self.frame.push(op::NEWFALSE),
            PickleValue::Int(i) => self.save_int(*i),
            PickleValue::BigInt(bytes) => {
                self.save_long_bytes(bytes);
            }
            PickleValue::Float(f) => {
                self.frame.push(op::BINFLOAT);
                self.frame.extend_from_slice(&f.to_be_bytes());
            }
            PickleValue::Str(s) => self.save_str(s),
            PickleValue::Bytes(b) => {
                if b.len() < 256 {
                    self.frame.push(op::SHORT_BINBYTES);
                    self.frame.push(b.len() as u8);
                } else if let Ok(n) = u32::try_from(b.len()) {
                    self.frame.push(op::BINBYTES);
                    self.frame.extend_from_slice(&n.to_le_bytes());
                } else {
                    self.frame.push(op::BINBYTES8);
                    self.frame
                        .extend_from_slice(&(b.len() as u64).to_le_bytes());
                }
                self.frame.extend_from_slice(b);
            }
            PickleValue::List(items) => {
                self.frame.push(op::EMPTY_LIST);
                for chunk in items.chunks(BATCH_SIZE) {
                    if chunk.len() == 1 {
                        self.save(&chunk[0]);
                        self.frame.push(op::APPEND);
                    } else {
                        self.frame.push(op::MARK);
                        for item in chunk {
                            self.save(item);
                        }
                        self.frame.push(op::APPENDS);
                    }
                }
            }
            PickleValue::Tuple(items) => match items.len() {
                0 => self.frame.push(op::EMPTY_TUPLE),
                n @ 1..=3 => {
                    for item in items {
                        self.save(item);
                    }
                    self.frame.push(op::TUPLE1 + (n as u8 - 1));
                }
                _ => {
                    self.frame.push(op::MARK);
                    for item in items {
                        self.save(item);
                    }
                    self.frame.push(op::TUPLE);
                }
            },
            PickleValue::Dict(pairs) => {
                self.frame.push(op::EMPTY_DICT);
                for chunk in pairs.chunks(BATCH_SIZE) {
                    if chunk.len() == 1 {
                        self.save(&chunk[0].0);
                        self.save(&chunk[0].1);
                        self.frame.push(op::SETITEM);
                    } else {
                        self.frame.push(op::MARK);
                        for (k, v) in chunk {
                            self.save(k);
                            self.save(v);
                        }
                        self.frame.push(op::SETITEMS);
                    }
                }
            }
        }
    }

    /// Integers as Python's `save_long`: BININT1, BININT2, BININT, else LONG1.
    fn save_int(&mut self, i: i64) {
        if (0..=0xff).contains(&i) {
            self.frame.push(op::BININT1);
            self.frame.push(i as u8);
        } else if (0..=0xffff).contains(&i) {
            self.frame.push(op::BININT2);
            self.frame.extend_from_slice(&(i as u16).to_le_bytes());
        } else if let Ok(v) = i32::try_from(i) {
            self.frame.push(op::BININT);
            self.frame.extend_from_slice(&v.to_le_bytes());
        } else {
            // Shortest little-endian two's complement, as `pickle.encode_long`.
            let bytes = i.to_le_bytes();
            let fill = if i < 0 { 0xff } else { 0x00 };
            let mut len = 8;
            while len > 1 && bytes[len - 1] == fill && (bytes[len - 2] & 0x80 != 0) == (i < 0) {
                len -= 1;
            }
            self.save_long_bytes(&bytes[..len]);
        }
    }

    fn save_long_bytes(&mut self, bytes: &[u8]) {
        if bytes.len() < 256 {
            self.frame.push(op::LONG1);
            self.frame.push(bytes.len() as u8);
        } else {
            self.frame.push(op::LONG4);
            self.frame
                .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        }
        self.frame.extend_from_slice(bytes);
    }

    fn save_str(&mut self, s: &'v str) {
        if let Some(&idx) = self.memo.get(s) {
            match u8::try_from(idx) {
                Ok(i) => {
                    self.frame.push(op::BINGET);
                    self.frame.push(i);
                }
                Err(_) => {
                    self.frame.push(op::LONG_BINGET);
                    self.frame.extend_from_slice(&idx.to_le_bytes());
                }
            }
            return;
        }
        let b = s.as_bytes();
        if b.len() < 256 {
            self.frame.push(op::SHORT_BINUNICODE);
            self.frame.push(b.len() as u8);
        } else if let Ok(n) = u32::try_from(b.len()) {
            self.frame.push(op::BINUNICODE);
            self.frame.extend_from_slice(&n.to_le_bytes());
        } else {
            self.frame.push(op::BINUNICODE8);
            self.frame
                .extend_from_slice(&(b.len() as u64).to_le_bytes());
        }
        self.frame.extend_from_slice(b);
        if self.next_memo < u32::MAX {
            self.frame.push(op::MEMOIZE);
            self.memo.insert(s, self.next_memo);
            self.next_memo += 1;
        }
    }
}
