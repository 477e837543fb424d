//! The JSON half of the streaming trace reader (`Note [Streaming trace reader]` in
//! [`crate::trace`]): `serde_json`'s streaming deserializer driven by visitors over the
//! document, the `events` array and each row, so no JSON tree is ever built of the rows.

use std::fmt;
use std::io::Read;

use serde::de::{
    self, value::MapAccessDeserializer, value::SeqAccessDeserializer, DeserializeSeed,
    Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serde_json::Value;

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
    let mut de = serde_json::Deserializer::from_reader(input);
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
                    let value: Value = map.next_value()?;
                    // What was there, as the error shows it: each entry of a list (a string
                    // as itself, anything else as JSON), or the whole value if not a list.
                    let found: Vec<String> = match value.as_array() {
                        Some(a) => a
                            .iter()
                            .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_owned))
                            .collect(),
                        None => vec![format!("{value} (not a list)")],
                    };
                    if self.state.saw_events {
                        // Checked at the end (the rows were read with the default layout).
                        self.state.columns = Some(found);
                    } else if let Err(e) = check_columns(found) {
                        return Err(self.state.fail(e));
                    }
                }
                "workload" => {
                    let value: Value = map.next_value()?;
                    self.state.info.workload = value.as_str().map(str::to_owned);
                }
                "alloc_conf" => {
                    let value: Value = map.next_value()?;
                    self.state.info.alloc_conf = value.as_str().map(str::to_owned);
                }
                "stats" => {
                    let value: Value = map.next_value()?;
                    if let Some(stats) = value.as_object() {
                        for (k, v) in stats {
                            if let Some(n) = v.as_i64() {
                                self.state.info.stats.insert(k.clone(), n);
                            }
                        }
                    }
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
        Value::deserialize(MapAccessDeserializer::new(map))?;
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
    /// Anything else (a string that is no action, `null`, an array, ...), kept for the message.
    Other(Value),
}

impl Cell {
    fn to_value(&self) -> Value {
        match self {
            Cell::Action(a) => Value::from(a.as_str()),
            Cell::U64(v) => Value::from(*v),
            Cell::I64(v) => Value::from(*v),
            Cell::F64(v) => Value::from(*v),
            Cell::Other(v) => v.clone(),
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_value().fmt(f)
    }
}

impl<'de> Deserialize<'de> for Cell {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Cell, D::Error> {
        de.deserialize_any(CellVisitor)
    }
}

struct CellVisitor;

impl<'de> Visitor<'de> for CellVisitor {
    type Value = Cell;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Cell, E> {
        Ok(Cell::Other(Value::from(v)))
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
            Err(_) => Cell::Other(Value::from(v)),
        })
    }

    fn visit_unit<E: de::Error>(self) -> Result<Cell, E> {
        Ok(Cell::Other(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Cell, A::Error> {
        Ok(Cell::Other(Value::deserialize(
            SeqAccessDeserializer::new(seq),
        )?))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Cell, A::Error> {
        Ok(Cell::Other(Value::deserialize(
            MapAccessDeserializer::new(map),
        )?))
    }
}

/// A row as parsed: its five cells, or (for a row of another shape) the row itself.
enum RawRow {
    Cells([Cell; 5]),
    Malformed(Value),
}

impl<'de> Deserialize<'de> for RawRow {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<RawRow, D::Error> {
        de.deserialize_any(RowVisitor)
    }
}

struct RowVisitor;

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
        let mut rest = Vec::new();
        while let Some(extra) = seq.next_element::<Value>()? {
            rest.push(extra);
        }
        match <[Cell; 5]>::try_from(cells) {
            Ok(cells) if rest.is_empty() => Ok(RawRow::Cells(cells)),
            Ok(cells) => Ok(RawRow::Malformed(Value::Array(
                cells.iter().map(Cell::to_value).chain(rest).collect(),
            ))),
            Err(cells) => Ok(RawRow::Malformed(Value::Array(
                cells.iter().map(Cell::to_value).collect(),
            ))),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawRow, A::Error> {
        Ok(RawRow::Malformed(Value::deserialize(
            MapAccessDeserializer::new(map),
        )?))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawRow, E> {
        Ok(RawRow::Malformed(Value::from(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawRow, E> {
        Ok(RawRow::Malformed(Value::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawRow, E> {
        Ok(RawRow::Malformed(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawRow, E> {
        Ok(RawRow::Malformed(Value::from(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawRow, E> {
        Ok(RawRow::Malformed(Value::from(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<RawRow, E> {
        Ok(RawRow::Malformed(Value::Null))
    }
}

impl RawRow {
    /// The event, or what was wrong with the row and what was expected.
    fn event(self) -> Result<TraceEvent, String> {
        let cells = match self {
            RawRow::Cells(cells) => cells,
            RawRow::Malformed(row) => {
                return Err(format!(
                    "expected [action, addr, size, stream, time_us], found {row}"
                ))
            }
        };
        let action = match &cells[0] {
            Cell::Action(a) => *a,
            Cell::Other(Value::String(s)) => {
                return Err(crate::snapshot::UnknownTraceAction { action: s.clone() }.to_string())
            }
            other => return Err(format!("action must be a string, found {other}")),
        };
        let uint = |k: usize, name: &str| match cells[k] {
            Cell::U64(v) => Ok(v),
            ref other => Err(format!(
                "{name} must be a non-negative integer, found {other}"
            )),
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
