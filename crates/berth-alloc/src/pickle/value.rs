//! [`PickleValue`]: the tree of plain Python data a pickle decodes to.

use std::fmt;

/// A decoded Python object, restricted to the plain data that `pickle.dump` of dicts, lists, tuples,
/// `str`, `bytes`, `int`, `float`, `bool` and `None` produces.
///
/// Dicts keep their insertion order (Python 3.7+ semantics) as a list of pairs, so a value read and
/// written back produces the same key order. Shared references in the pickle (memo `GET`s) are
/// materialised as copies: the tree never aliases.
#[derive(Debug, Clone, PartialEq)]
pub enum PickleValue {
    /// Python `None`.
    None,
    /// Python `bool`.
    Bool(bool),
    /// Python `int` that fits in 64 bits (signed).
    Int(i64),
    /// Python `int` outside the `i64` range: little-endian two's-complement bytes, as `LONG1` /
    /// `LONG4` carry them (for example addresses or sizes of 2^63 bytes and above).
    BigInt(Vec<u8>),
    /// Python `float` (IEEE 754 double).
    Float(f64),
    /// Python `str`.
    Str(String),
    /// Python `bytes` or `bytearray`.
    Bytes(Vec<u8>),
    /// Python `list`.
    List(Vec<PickleValue>),
    /// Python `tuple`.
    Tuple(Vec<PickleValue>),
    /// Python `dict`, in insertion order.
    Dict(Vec<(PickleValue, PickleValue)>),
}

impl PickleValue {
    /// The Python type name of this value (`"dict"`, `"int"`, ...), used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            PickleValue::None => "None",
            PickleValue::Bool(_) => "bool",
            PickleValue::Int(_) | PickleValue::BigInt(_) => "int",
            PickleValue::Float(_) => "float",
            PickleValue::Str(_) => "str",
            PickleValue::Bytes(_) => "bytes",
            PickleValue::List(_) => "list",
            PickleValue::Tuple(_) => "tuple",
            PickleValue::Dict(_) => "dict",
        }
    }

    /// Builds a `str`.
    pub fn str(s: impl Into<String>) -> Self {
        PickleValue::Str(s.into())
    }

    /// Builds a dict with `str` keys, keeping the given order.
    pub fn dict<K: Into<String>>(items: impl IntoIterator<Item = (K, PickleValue)>) -> Self {
        PickleValue::Dict(
            items
                .into_iter()
                .map(|(k, v)| (PickleValue::Str(k.into()), v))
                .collect(),
        )
    }

    /// Looks up `key` in a dict with `str` keys; `None` if `self` is not a dict or lacks the key.
    /// The last occurrence wins, as in Python when a pickle sets a key twice.
    pub fn get(&self, key: &str) -> Option<&PickleValue> {
        match self {
            PickleValue::Dict(items) => items
                .iter()
                .rev()
                .find(|(k, _)| matches!(k, PickleValue::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The keys of a dict that are `str`, in order (empty for other values).
    pub fn str_keys(&self) -> Vec<&str> {
        match self {
            PickleValue::Dict(items) => items
                .iter()
                .filter_map(|(k, _)| match k {
                    PickleValue::Str(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The value as `i64`: `Int`, or `Bool` (Python's `bool` is an `int`); `None` otherwise.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            PickleValue::Int(i) => Some(*i),
            PickleValue::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// The value as `f64`: `Float`, or `Int` converted (possibly rounding); `None` otherwise.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            PickleValue::Float(f) => Some(*f),
            PickleValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The value as `bool`; `None` if it is not a `bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            PickleValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value as `&str`; `None` if it is not a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PickleValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a `list` or `tuple`; `None` for other values.
    pub fn as_seq(&self) -> Option<&[PickleValue]> {
        match self {
            PickleValue::List(v) | PickleValue::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The pairs of a `dict`; `None` for other values.
    pub fn as_dict(&self) -> Option<&[(PickleValue, PickleValue)]> {
        match self {
            PickleValue::Dict(v) => Some(v),
            _ => None,
        }
    }
}

impl From<bool> for PickleValue {
    fn from(v: bool) -> Self {
        PickleValue::Bool(v)
    }
}

impl From<i64> for PickleValue {
    fn from(v: i64) -> Self {
        PickleValue::Int(v)
    }
}

impl From<u64> for PickleValue {
    /// Values above `i64::MAX` become [`PickleValue::BigInt`], so nothing is truncated.
    fn from(v: u64) -> Self {
        match i64::try_from(v) {
            Ok(i) => PickleValue::Int(i),
            Err(_) => {
                // Nine bytes: the value's eight little-endian bytes plus a zero sign byte.
                let mut bytes = v.to_le_bytes().to_vec();
                bytes.push(0);
                PickleValue::BigInt(bytes)
            }
        }
    }
}

impl From<usize> for PickleValue {
    fn from(v: usize) -> Self {
        PickleValue::from(v as u64)
    }
}

impl From<f64> for PickleValue {
    fn from(v: f64) -> Self {
        PickleValue::Float(v)
    }
}

impl From<&str> for PickleValue {
    fn from(v: &str) -> Self {
        PickleValue::Str(v.to_owned())
    }
}

impl From<String> for PickleValue {
    fn from(v: String) -> Self {
        PickleValue::Str(v)
    }
}

impl fmt::Display for PickleValue {
    /// Formats the value roughly as Python's `repr` would (`BigInt` as hex bytes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn seq(f: &mut fmt::Formatter<'_>, items: &[PickleValue]) -> fmt::Result {
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{v}")?;
            }
            Ok(())
        }
        match self {
            PickleValue::None => f.write_str("None"),
            PickleValue::Bool(true) => f.write_str("True"),
            PickleValue::Bool(false) => f.write_str("False"),
            PickleValue::Int(i) => write!(f, "{i}"),
            PickleValue::BigInt(b) => {
                f.write_str("int(le=0x")?;
                for byte in b.iter().rev() {
                    write!(f, "{byte:02x}")?;
                }
                f.write_str(")")
            }
            PickleValue::Float(x) => write!(f, "{x:?}"),
            PickleValue::Str(s) => write!(f, "{s:?}"),
            PickleValue::Bytes(b) => write!(f, "b<{} bytes>", b.len()),
            PickleValue::List(v) => {
                f.write_str("[")?;
                seq(f, v)?;
                f.write_str("]")
            }
            PickleValue::Tuple(v) => {
                f.write_str("(")?;
                seq(f, v)?;
                if v.len() == 1 {
                    f.write_str(",")?;
                }
                f.write_str(")")
            }
            PickleValue::Dict(items) => {
                f.write_str("{")?;
                for (i, (k, v)) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}
