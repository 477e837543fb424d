//! The JSON half of the streaming trace reader (`Note [Streaming trace reader]` in
//! [`crate::trace`]): `serde_json`'s streaming deserializer driven by visitors over the
//! document, the `events` array and each row, so no JSON tree is ever built of the rows.

use std::fmt;
use std::io::Read;

use serde::de::{
    self, value::MapAccessDeserializer, DeserializeSeed, Deserializer, IgnoredAny, MapAccess,
    SeqAccess, Visitor,
};
use serde::Deserialize;
use serde_json::Value;

use super::excerpt::{Excerpt, ExcerptSeed, EXCERPT_BYTES};
use super::{EventSink, TraceError, TraceEvent, TraceInfo};
use crate::backend::StreamId;
use crate::snapshot::TraceAction;

/// The only column layout understood.
const COLUMNS: [&str; 5] = ["action", "addr", "size", "stream", "time_us"];

/// What the visitors found besides the events, and the first typed error (visitors can only
/// return `serde_json` errors, so the typed one waits here).
#[derive(Default)]
struct ReadState {
    info: TraceInfo,
    saw_events: bool,
    columns: Option<Vec<String>>,
    error: Option<TraceError>,
}

impl ReadState {
    /// Keeps `error` and returns a `serde_json` error that stops the parse.
    fn fail<E: de::Error>(&mut self, error: TraceError) -> E {
        let message = error.to_string();
        self.error.get_or_insert(error);
        E::custom(message)
    }
}

/// Parses JSON text from `input` (`Note [Streaming trace reader]`).
pub(super) fn parse_json<R: Read, S: EventSink + ?Sized>(
    input: R,
    sink: &mut S,
) -> Result<TraceInfo, TraceError> {
    let mut state = ReadState::default();
    // A UTF-8 byte-order mark (as some Windows editors write) is skipped: it is no JSON value,
    // and serde_json's "expected value at line 1 column 1" did not say what it was.
    let mut input = input;
    let mut head = [0u8; 3];
    let mut n = 0;
    while n < head.len() {
        match input.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(TraceError::Json {
                    line: 1,
                    column: 1,
                    message: e.to_string(),
                })
            }
        }
    }
    let kept: &[u8] = if head[..n] == [0xEF, 0xBB, 0xBF] {
        &[]
    } else {
        &head[..n]
    };
    let mut de = serde_json::Deserializer::from_reader(kept.chain(input));
    let parsed = Document {
        state: &mut state,
        sink,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    if let Some(error) = state.error.take() {
        return Err(error);
    }
    if let Err(e) = parsed {
        return Err(TraceError::Json {
            line: e.line(),
            column: e.column(),
            message: json_message(&e),
        });
    }
    if !state.saw_events {
        return Err(TraceError::NoEvents);
    }
    if let Some(found) = state.columns.take() {
        check_columns(found)?;
    }
    Ok(state.info)
}

fn check_columns(found: Vec<String>) -> Result<(), TraceError> {
    if found == COLUMNS {
        Ok(())
    } else {
        Err(TraceError::Columns { found })
    }
}

/// `serde_json`'s message without its trailing " at line L column C", which
/// [`TraceError::Json`] already says.
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&position).unwrap_or(&text).to_owned()
}

/// The whole document: an object with `events`, or a bare array of rows.
struct Document<'a, S: ?Sized> {
    state: &'a mut ReadState,
    sink: &'a mut S,
}

impl<'de, S: EventSink + ?Sized> DeserializeSeed<'de> for Document<'_, S> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de, S: EventSink + ?Sized> Visitor<'de> for Document<'_, S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object or array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        self.state.saw_events = true;
        Rows {
            state: self.state,
            sink: self.sink,
        }
        .visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "events" => {
                    if self.state.saw_events {
                        return Err(de::Error::custom(
                            "the trace object has two \"events\" keys; expected one",
                        ));
                    }
                    self.state.saw_events = true;
                    map.next_value_seed(Rows {
                        state: &mut *self.state,
                        sink: &mut *self.sink,
                    })?;
                }
                "columns" => {
                    // What was there, as the error shows it, bounded (Note [Bounded trace
                    // excerpts]).
                    let found: Vec<String> = map.next_value_seed(ColumnsSeed)?;
                    if self.state.saw_events {
                        // Checked at the end (the rows were read with the default layout).
                        self.state.columns = Some(found);
                    } else if let Err(e) = check_columns(found) {
                        return Err(self.state.fail(e));
                    }
                }
                "workload" => {
                    self.state.info.workload = map.next_value::<StringOrSkip>()?.0;
                }
                "alloc_conf" => {
                    self.state.info.alloc_conf = map.next_value::<StringOrSkip>()?.0;
                }
                "stats" => {
                    let stats = map.next_value::<Stats>()?;
                    self.state.info.stats.extend(stats.0);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// The `events` array: each row parsed, checked and handed to the sink as it completes.
struct Rows<'a, S: ?Sized> {
    state: &'a mut ReadState,
    sink: &'a mut S,
}

impl<'de, S: EventSink + ?Sized> DeserializeSeed<'de> for Rows<'_, S> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de, S: EventSink + ?Sized> Visitor<'de> for Rows<'_, S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of rows")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        while let Some(row) = seq.next_element::<RawRow>()? {
            let event = match row.event() {
                Ok(event) => event,
                Err(message) => return Err(self.state.fail(TraceError::Row { index, message })),
            };
            if let Err(message) = self.sink.event(index, event) {
                return Err(self.state.fail(TraceError::Rejected { index, message }));
            }
            index += 1;
            self.state.info.events = index;
        }
        Ok(())
    }

    // Anything but an array under "events": as if there were none.
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        IgnoredAny::deserialize(MapAccessDeserializer::new(map))?;
        Err(self.state.fail(TraceError::NoEvents))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.state.fail(TraceError::NoEvents))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(self.state.fail(TraceError::NoEvents))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(self.state.fail(TraceError::NoEvents))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(self.state.fail(TraceError::NoEvents))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(self.state.fail(TraceError::NoEvents))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(self.state.fail(TraceError::NoEvents))
    }
}

/// One cell of a row, as parsed: the common cases without allocating.
#[derive(Debug)]
enum Cell {
    Action(TraceAction),
    U64(u64),
    I64(i64),
    F64(f64),
    /// A string that is no action, cut to [`EXCERPT_BYTES`] (with `…` when cut).
    Str(String),
    /// Anything else (`null`, a bool, an array, an object), as a bounded excerpt.
    Other(Excerpt),
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Action(a) => write!(f, "\"{}\"", a.as_str()),
            Cell::U64(v) => write!(f, "{v}"),
            Cell::I64(v) => write!(f, "{v}"),
            Cell::F64(v) => write!(f, "{}", Value::from(*v)),
            Cell::Str(s) => write!(f, "{}", Value::from(s.as_str())),
            Cell::Other(e) => write!(f, "{e}"),
        }
    }
}

/// `s` cut to [`EXCERPT_BYTES`] at a character boundary, `…` marking a cut.
fn cut_str(s: &str) -> String {
    if s.len() <= EXCERPT_BYTES {
        return s.to_owned();
    }
    let mut end = EXCERPT_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl<'de> Deserialize<'de> for Cell {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Cell, D::Error> {
        de.deserialize_any(CellVisitor)
    }
}

struct CellVisitor;

impl CellVisitor {
    fn other<F, E>(read: F) -> Result<Cell, E>
    where
        F: FnOnce(ExcerptSeed<'_>) -> Result<(), E>,
    {
        let mut out = Excerpt::default();
        read(ExcerptSeed {
            out: &mut out,
            sep: None,
        })?;
        Ok(Cell::Other(out))
    }
}

impl<'de> Visitor<'de> for CellVisitor {
    type Value = Cell;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Cell, E> {
        Self::other(|seed| seed.visit_bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Cell, E> {
        Ok(Cell::I64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Cell, E> {
        Ok(Cell::U64(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Cell, E> {
        Ok(Cell::F64(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Cell, E> {
        Ok(match v.parse::<TraceAction>() {
            Ok(a) => Cell::Action(a),
            Err(_) => Cell::Str(cut_str(v)),
        })
    }

    fn visit_unit<E: de::Error>(self) -> Result<Cell, E> {
        Self::other(|seed| seed.visit_unit())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Cell, A::Error> {
        Self::other(|seed| seed.visit_seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Cell, A::Error> {
        Self::other(|seed| seed.visit_map(map))
    }
}

/// A row as parsed: its five cells, or (for a row of another shape) a bounded excerpt of it
/// and, for a list, its number of cells.
enum RawRow {
    Cells([Cell; 5]),
    Malformed {
        excerpt: Excerpt,
        cells: Option<u64>,
    },
}

impl<'de> Deserialize<'de> for RawRow {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<RawRow, D::Error> {
        de.deserialize_any(RowVisitor)
    }
}

struct RowVisitor;

impl RowVisitor {
    fn malformed<F, E>(read: F) -> Result<RawRow, E>
    where
        F: FnOnce(ExcerptSeed<'_>) -> Result<(), E>,
    {
        let mut excerpt = Excerpt::default();
        read(ExcerptSeed {
            out: &mut excerpt,
            sep: None,
        })?;
        Ok(RawRow::Malformed {
            excerpt,
            cells: None,
        })
    }
}

impl<'de> Visitor<'de> for RowVisitor {
    type Value = RawRow;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a row [action, addr, size, stream, time_us]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawRow, A::Error> {
        let mut cells: Vec<Cell> = Vec::with_capacity(5);
        while cells.len() < 5 {
            match seq.next_element::<Cell>()? {
                Some(cell) => cells.push(cell),
                None => break,
            }
        }
        let quote = |cells: &[Cell]| {
            let mut excerpt = Excerpt::default();
            excerpt.push("[");
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    excerpt.push(",");
                }
                excerpt.push(&c.to_string());
            }
            excerpt
        };
        if cells.len() < 5 {
            let mut excerpt = quote(&cells);
            excerpt.push("]");
            return Ok(RawRow::Malformed {
                excerpt,
                cells: Some(cells.len() as u64),
            });
        }
        // Extra cells: quoted into the bounded excerpt and counted as they stream past.
        let mut excerpt = quote(&cells);
        let mut count = 5u64;
        while seq
            .next_element_seed(ExcerptSeed {
                out: &mut excerpt,
                sep: Some(","),
            })?
            .is_some()
        {
            count += 1;
        }
        if count == 5 {
            return match <[Cell; 5]>::try_from(cells) {
                Ok(cells) => Ok(RawRow::Cells(cells)),
                Err(_) => unreachable!("five cells were read"),
            };
        }
        excerpt.push("]");
        Ok(RawRow::Malformed {
            excerpt,
            cells: Some(count),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawRow, A::Error> {
        Self::malformed(|seed| seed.visit_map(map))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawRow, E> {
        Self::malformed(|seed| seed.visit_bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawRow, E> {
        Self::malformed(|seed| seed.visit_i64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawRow, E> {
        Self::malformed(|seed| seed.visit_u64(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawRow, E> {
        Self::malformed(|seed| seed.visit_f64(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawRow, E> {
        Self::malformed(|seed| seed.visit_str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<RawRow, E> {
        Self::malformed(|seed| seed.visit_unit())
    }
}

impl RawRow {
    /// The event, or what was wrong with the row and what was expected.
    fn event(self) -> Result<TraceEvent, String> {
        let cells = match self {
            RawRow::Cells(cells) => cells,
            RawRow::Malformed { excerpt, cells } => {
                let count = match cells {
                    Some(1) => " (1 cell)".to_owned(),
                    Some(n) => format!(" ({n} cells)"),
                    None => String::new(),
                };
                return Err(format!(
                    "expected [action, addr, size, stream, time_us], found {excerpt}{count}"
                ));
            }
        };
        let action = match &cells[0] {
            Cell::Action(a) => *a,
            Cell::Str(s) => {
                return Err(crate::snapshot::UnknownTraceAction { action: s.clone() }.to_string())
            }
            other => return Err(format!("action must be a string, found {other}")),
        };
        let uint = |k: usize, name: &str| {
            match cells[k] {
            Cell::U64(v) => Ok(v),
            // An integer past u64 reaches serde_json as a float (2^64 is 1.8446744073709552e19):
            // say what it was, not its float spelling.
            Cell::F64(v) if v.fract() == 0.0 && v >= 18_446_744_073_709_551_615.0 => Err(format!(
                "{name} {v:.0} is more than 18446744073709551615 (2^64 − 1), the largest a trace can hold"
            )),
            ref other => Err(format!(
                "{name} must be a non-negative integer, found {other}"
            )),
        }
        };
        let time_us = match cells[4] {
            Cell::I64(v) => v,
            // As `serde_json::Value::as_f64` then `as`: saturating.
            Cell::U64(v) => i64::try_from(v).unwrap_or(i64::MAX),
            Cell::F64(v) => v as i64,
            ref other => return Err(format!("time_us must be a number, found {other}")),
        };
        Ok(TraceEvent {
            action,
            addr: uint(1, "addr")?,
            size: uint(2, "size")?,
            stream: StreamId(uint(3, "stream")?),
            time_us,
        })
    }
}

/// The most `columns` entries kept to quote (one more than the layout has).
const COLUMNS_KEPT: usize = COLUMNS.len() + 1;

/// Reads `columns` into what the error shows (Note [Bounded trace excerpts]): each entry of a
/// list (a string as itself, anything else as JSON, each cut to [`EXCERPT_BYTES`]), at most
/// [`COLUMNS_KEPT`] of them and then "… (N columns in all)"; or the value, if not a list.
struct ColumnsSeed;

impl<'de> DeserializeSeed<'de> for ColumnsSeed {
    type Value = Vec<String>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Vec<String>, D::Error> {
        de.deserialize_any(ColumnsVisitor)
    }
}

struct ColumnsVisitor;

impl ColumnsVisitor {
    fn not_a_list<F, E>(read: F) -> Result<Vec<String>, E>
    where
        F: FnOnce(ExcerptSeed<'_>) -> Result<(), E>,
    {
        let mut excerpt = Excerpt::default();
        read(ExcerptSeed {
            out: &mut excerpt,
            sep: None,
        })?;
        Ok(vec![format!("{excerpt} (not a list)")])
    }
}

impl<'de> Visitor<'de> for ColumnsVisitor {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of column names")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let mut found = Vec::new();
        let mut count = 0u64;
        while let Some(cell) = seq.next_element::<Cell>()? {
            count += 1;
            if found.len() < COLUMNS_KEPT {
                found.push(match cell {
                    Cell::Action(a) => a.as_str().to_owned(),
                    Cell::Str(s) => s,
                    other => other.to_string(),
                });
            }
        }
        if count > COLUMNS_KEPT as u64 {
            found.push(format!("… ({count} columns in all)"));
        }
        Ok(found)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<String>, A::Error> {
        Self::not_a_list(|seed| seed.visit_map(map))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Vec<String>, E> {
        Self::not_a_list(|seed| seed.visit_bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Vec<String>, E> {
        Self::not_a_list(|seed| seed.visit_i64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Vec<String>, E> {
        Self::not_a_list(|seed| seed.visit_u64(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Vec<String>, E> {
        Self::not_a_list(|seed| seed.visit_f64(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<String>, E> {
        Self::not_a_list(|seed| seed.visit_str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Vec<String>, E> {
        Self::not_a_list(|seed| seed.visit_unit())
    }
}

/// A string value, or `None` for anything else (skipped without being held).
struct StringOrSkip(Option<String>);

impl<'de> Deserialize<'de> for StringOrSkip {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<StringOrSkip, D::Error> {
        de.deserialize_any(StringOrSkipVisitor)
    }
}

struct StringOrSkipVisitor;

impl<'de> Visitor<'de> for StringOrSkipVisitor {
    type Value = StringOrSkip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<StringOrSkip, E> {
        Ok(StringOrSkip(Some(v.to_owned())))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<StringOrSkip, E> {
        Ok(StringOrSkip(None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<StringOrSkip, E> {
        Ok(StringOrSkip(None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<StringOrSkip, E> {
        Ok(StringOrSkip(None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<StringOrSkip, E> {
        Ok(StringOrSkip(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<StringOrSkip, E> {
        Ok(StringOrSkip(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StringOrSkip, A::Error> {
        IgnoredAny.visit_seq(seq)?;
        Ok(StringOrSkip(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StringOrSkip, A::Error> {
        IgnoredAny.visit_map(map)?;
        Ok(StringOrSkip(None))
    }
}

/// The most `stats` entries kept; the rest are skipped without being held.
const STATS_KEPT: usize = 1024;

/// The integer entries of `stats` (at most [`STATS_KEPT`]); anything else is skipped.
struct Stats(Vec<(String, i64)>);

impl<'de> Deserialize<'de> for Stats {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Stats, D::Error> {
        de.deserialize_any(StatsVisitor)
    }
}

struct StatsVisitor;

impl<'de> Visitor<'de> for StatsVisitor {
    type Value = Stats;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of statistics")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Stats, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<StringOrSkip>()? {
            let value = map.next_value::<Cell>()?;
            let n = match value {
                Cell::I64(n) => Some(n),
                Cell::U64(n) => i64::try_from(n).ok(),
                _ => None,
            };
            if let (Some(k), Some(n)) = (key.0, n) {
                if out.len() < STATS_KEPT {
                    out.push((k, n));
                }
            }
        }
        Ok(Stats(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Stats, A::Error> {
        IgnoredAny.visit_seq(seq)?;
        Ok(Stats(Vec::new()))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Stats, E> {
        Ok(Stats(Vec::new()))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Stats, E> {
        Ok(Stats(Vec::new()))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Stats, E> {
        Ok(Stats(Vec::new()))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Stats, E> {
        Ok(Stats(Vec::new()))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Stats, E> {
        Ok(Stats(Vec::new()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Stats, E> {
        Ok(Stats(Vec::new()))
    }
}
