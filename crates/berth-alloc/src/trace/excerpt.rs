//! A bounded excerpt of a JSON value, made while the value is skipped.
//!
//! Note [Bounded trace excerpts]: a malformed row, or a `columns` list, can be any size (a
//! 97 KB `.json.gz` holding one row of 5·10⁷ cells used to be held whole as a
//! `serde_json::Value`, 3.1 GB, and then printed whole in a 100 MB error line: newcomer defect
//! 3). What the reader keeps of a value it will only quote is at most [`EXCERPT_BYTES`] of
//! compact JSON text (as `serde_json` prints a value), ending in `…` when cut; the rest of the value is parsed and dropped as it
//! streams past. (A single JSON string is still buffered whole by `serde_json` while it is
//! read; that is bounded by the input's size, and what is kept of it is not.)

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The most bytes of JSON text kept to quote a malformed value (see Note [Bounded trace
/// excerpts]).
pub(super) const EXCERPT_BYTES: usize = 160;

/// At most [`EXCERPT_BYTES`] of a value's JSON text; `…` marks a cut.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Excerpt {
    text: String,
    cut: bool,
}

impl Excerpt {
    /// Appends `s`, cutting at a character boundary once [`EXCERPT_BYTES`] is reached.
    pub fn push(&mut self, s: &str) {
        if self.cut {
            return;
        }
        let room = EXCERPT_BYTES.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
            return;
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&s[..end]);
        self.cut = true;
    }

    /// Appends a JSON string literal of `s` (itself cut to the room left).
    pub fn push_str_literal(&mut self, s: &str) {
        let mut end = s.len().min(EXCERPT_BYTES + 1);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.push(&serde_json::Value::from(&s[..end]).to_string());
        if end < s.len() {
            self.cut = true;
        }
    }

    /// Whether the text was cut.
    #[cfg(test)]
    pub fn is_cut(&self) -> bool {
        self.cut
    }
}

impl fmt::Display for Excerpt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)?;
        if self.cut {
            f.write_str("…")?;
        }
        Ok(())
    }
}

/// Reads one value into an [`Excerpt`], after `sep` (the separator before it in its list).
pub(super) struct ExcerptSeed<'a> {
    /// Where the text goes.
    pub out: &'a mut Excerpt,
    /// Written before the value ("," between list entries), if any.
    pub sep: Option<&'static str>,
}

impl<'de> DeserializeSeed<'de> for ExcerptSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl ExcerptSeed<'_> {
    fn lead(&mut self) {
        if let Some(sep) = self.sep {
            self.out.push(sep);
        }
    }
}

impl<'de> Visitor<'de> for ExcerptSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(mut self, v: bool) -> Result<(), E> {
        self.lead();
        self.out.push(if v { "true" } else { "false" });
        Ok(())
    }

    fn visit_i64<E: de::Error>(mut self, v: i64) -> Result<(), E> {
        self.lead();
        self.out.push(&v.to_string());
        Ok(())
    }

    fn visit_u64<E: de::Error>(mut self, v: u64) -> Result<(), E> {
        self.lead();
        self.out.push(&v.to_string());
        Ok(())
    }

    fn visit_f64<E: de::Error>(mut self, v: f64) -> Result<(), E> {
        self.lead();
        self.out.push(&serde_json::Value::from(v).to_string());
        Ok(())
    }

    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<(), E> {
        self.lead();
        self.out.push_str_literal(v);
        Ok(())
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.lead();
        self.out.push("null");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.lead();
        self.out.push("[");
        let mut sep = None;
        while seq
            .next_element_seed(ExcerptSeed {
                out: &mut *self.out,
                sep,
            })?
            .is_some()
        {
            sep = Some(",");
        }
        self.out.push("]");
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.lead();
        self.out.push("{");
        let mut sep = None;
        while map
            .next_key_seed(ExcerptSeed {
                out: &mut *self.out,
                sep,
            })?
            .is_some()
        {
            map.next_value_seed(ExcerptSeed {
                out: &mut *self.out,
                sep: Some(":"),
            })?;
            sep = Some(",");
        }
        self.out.push("}");
        Ok(())
    }
}

/// The excerpt of the JSON text `json` (tests and callers holding a small value).
#[cfg(test)]
pub(super) fn excerpt_of(json: &str) -> Excerpt {
    let mut out = Excerpt::default();
    let mut de = serde_json::Deserializer::from_str(json);
    ExcerptSeed {
        out: &mut out,
        sep: None,
    }
    .deserialize(&mut de)
    .unwrap();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_quoted_whole() {
        assert_eq!(
            excerpt_of(r#"[1, -2, 0.5, "a\"b", null, true, {"k": [ ]}]"#).to_string(),
            r#"[1,-2,0.5,"a\"b",null,true,{"k":[]}]"#
        );
    }

    #[test]
    fn a_long_value_is_cut_at_the_bound() {
        let json = format!("[{}0]", "0,".repeat(100_000));
        let e = excerpt_of(&json);
        assert!(e.is_cut());
        let text = e.to_string();
        assert!(text.len() <= EXCERPT_BYTES + "…".len(), "{}", text.len());
        assert!(text.starts_with("[0,0,0"), "{text}");
        assert!(text.ends_with('…'));
        let long = format!("\"{}\"", "é".repeat(1000));
        let e = excerpt_of(&long);
        assert!(e.is_cut() && e.to_string().len() <= EXCERPT_BYTES + "…".len());
    }
}
