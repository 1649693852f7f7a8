//! The parser: the document's shape, each field's rules, and the salvage of
//! an invalid event's ids for its dead letter.

use std::collections::HashSet;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::*;
/// A JSON field that was present in the document, even as `null`.
/// (`Option<Value>` alone would read `null` as absent.)
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// The document's shape. Deriving `Deserialize` makes serde reject a known
/// field given twice ("duplicate field"), which a `Value` map would silently
/// collapse; unknown fields are ignored.
#[derive(Deserialize)]
struct RawEvent<'de_raw> {
    #[serde(default, rename = "type", deserialize_with = "present")]
    kind: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    event_id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    order_id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    customer_id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    occurred_at: Option<Value>,
    /// Kept as raw text so that a line's duplicate keys are seen too.
    #[serde(default, borrow)]
    lines: Option<&'de_raw RawValue>,
}

#[derive(Deserialize)]
struct RawLine {
    #[serde(default, deserialize_with = "present")]
    promotion_id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    budget: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    stock: Option<Value>,
}

fn invalid(kind: InvalidKind, detail: impl Into<String>) -> InvalidEvent {
    let detail: String = detail.into();
    let detail = match super::clip(&detail, super::MAX_DETAIL_BYTES) {
        std::borrow::Cow::Owned(cut) => cut,
        std::borrow::Cow::Borrowed(_) => detail,
    };
    InvalidEvent {
        kind,
        detail,
        salvage: Salvage::default(),
    }
}

/// Parses and validates one event value.
pub fn parse(bytes: &[u8]) -> Result<Event, InvalidEvent> {
    parse_strict(bytes).map_err(|mut e| {
        e.salvage = salvage(bytes);
        e
    })
}

fn parse_strict(bytes: &[u8]) -> Result<Event, InvalidEvent> {
    if bytes.len() > MAX_EVENT_BYTES {
        return Err(invalid(
            InvalidKind::TooLarge,
            format!(
                "event is {} bytes, the limit is {MAX_EVENT_BYTES}",
                bytes.len()
            ),
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        invalid(
            InvalidKind::NotUtf8,
            format!("event is not valid UTF-8: {e}"),
        )
    })?;
    let raw: RawEvent = serde_json::from_str(text).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            invalid(InvalidKind::NotJson, format!("event is not JSON: {e}"))
        } else {
            invalid(
                InvalidKind::Shape,
                format!("event has the wrong shape: {e}"),
            )
        }
    })?;
    // serde's derived struct visitor also reads a JSON array positionally,
    // so `["OrderPlaced","e","o","c","2026-...Z",[...]]` would parse as a
    // placement. The contract says the value is one JSON object.
    if !text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(invalid(
            InvalidKind::Shape,
            "event must be a JSON object, got an array",
        ));
    }

    let kind = match &raw.kind {
        None => return Err(invalid(InvalidKind::MissingField, "type is required")),
        Some(Value::String(s)) => EventType::from_name(s).ok_or_else(|| {
            invalid(
                InvalidKind::UnknownType,
                format!("type {s:?} is not OrderPlaced or OrderRefunded"),
            )
        })?,
        Some(other) => {
            return Err(invalid(
                InvalidKind::Shape,
                format!("type must be a string, got {}", describe(other)),
            ))
        }
    };
    let header = Header {
        event_id: id_field("event_id", &raw.event_id)?,
        order_id: id_field("order_id", &raw.order_id)?,
        customer_id: id_field("customer_id", &raw.customer_id)?,
        occurred_at: timestamp_field("occurred_at", &raw.occurred_at)?,
    };
    let raw_lines = lines_field(raw.lines)?;

    let mut seen = HashSet::with_capacity(raw_lines.len());
    let mut ids = Vec::with_capacity(raw_lines.len());
    for (i, line) in raw_lines.iter().enumerate() {
        let id = id_field(&format!("lines[{i}].promotion_id"), &line.promotion_id)?;
        if !seen.insert(id.clone()) {
            return Err(invalid(
                InvalidKind::DuplicatePromotion,
                format!("lines[{i}].promotion_id {id} appears more than once"),
            ));
        }
        ids.push(id);
    }

    match kind {
        EventType::OrderPlaced => {
            let mut lines = Vec::with_capacity(raw_lines.len());
            for (i, (line, promotion_id)) in raw_lines.iter().zip(ids).enumerate() {
                lines.push(PlaceLine {
                    promotion_id,
                    budget: amount(i, "budget", &line.budget, MAX_BUDGET)?.unwrap_or(0),
                    stock: amount(i, "stock", &line.stock, MAX_STOCK)?.unwrap_or(0),
                });
            }
            Ok(Event::Placed(OrderPlaced { header, lines }))
        }
        EventType::OrderRefunded => {
            let mut lines = Vec::with_capacity(raw_lines.len());
            for (i, (line, promotion_id)) in raw_lines.iter().zip(ids).enumerate() {
                lines.push(RefundLine {
                    promotion_id,
                    budget: amount(i, "budget", &line.budget, MAX_BUDGET)?,
                    stock: amount(i, "stock", &line.stock, MAX_STOCK)?,
                });
            }
            Ok(Event::Refunded(OrderRefunded { header, lines }))
        }
    }
}

fn describe(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

fn id_field(name: &str, v: &Option<Value>) -> Result<Id, InvalidEvent> {
    match v {
        None => Err(invalid(
            InvalidKind::MissingField,
            format!("{name} is required"),
        )),
        Some(Value::String(s)) => Id::parse(s).map_err(|rule| {
            invalid(
                InvalidKind::InvalidId,
                format!("{name} {}: {rule}", describe(&Value::String(s.clone()))),
            )
        }),
        Some(other) => Err(invalid(
            InvalidKind::InvalidId,
            format!("{name} must be a string, got {}", describe(other)),
        )),
    }
}

fn timestamp_field(name: &str, v: &Option<Value>) -> Result<i64, InvalidEvent> {
    match v {
        None => Err(invalid(
            InvalidKind::MissingField,
            format!("{name} is required"),
        )),
        Some(Value::String(s)) => chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| t.timestamp())
            .map_err(|e| {
                invalid(
                    InvalidKind::InvalidTimestamp,
                    format!("{name} {s:?} is not an RFC 3339 timestamp: {e}"),
                )
            }),
        Some(other) => Err(invalid(
            InvalidKind::InvalidTimestamp,
            format!("{name} must be an RFC 3339 string, got {}", describe(other)),
        )),
    }
}

fn lines_field(raw: Option<&RawValue>) -> Result<Vec<RawLine>, InvalidEvent> {
    let Some(raw) = raw else {
        return Err(invalid(InvalidKind::MissingField, "lines is required"));
    };
    let shape: Value = serde_json::from_str(raw.get())
        .map_err(|e| invalid(InvalidKind::NotJson, format!("lines is not JSON: {e}")))?;
    let items = match &shape {
        Value::Array(items) => items,
        other => {
            return Err(invalid(
                InvalidKind::InvalidLines,
                format!("lines must be an array, got {}", describe(other)),
            ))
        }
    };
    if items.is_empty() || items.len() > MAX_LINES {
        return Err(invalid(
            InvalidKind::InvalidLines,
            format!(
                "lines has {} entries, it must have 1 to {MAX_LINES}",
                items.len()
            ),
        ));
    }
    if let Some((i, item)) = items.iter().enumerate().find(|(_, it)| !it.is_object()) {
        return Err(invalid(
            InvalidKind::InvalidLines,
            format!("lines[{i}] must be an object, got {}", describe(item)),
        ));
    }
    // From the raw text, not the Value: a Value keeps only the last of two
    // equal keys, serde's derive reports them.
    serde_json::from_str::<Vec<RawLine>>(raw.get()).map_err(|e| {
        invalid(
            InvalidKind::Shape,
            format!("lines has the wrong shape: {e}"),
        )
    })
}

/// A non-negative JSON integer no larger than `max`. serde_json reads
/// `1e3`, `1.0` and anything beyond u64 as floats, so "is a u64" is exactly
/// "is a plain non-negative integer literal".
fn amount(i: usize, name: &str, v: &Option<Value>, max: u64) -> Result<Option<u64>, InvalidEvent> {
    let Some(v) = v else { return Ok(None) };
    // Named only for an error: a valid amount costs no allocation.
    let field = || format!("lines[{i}].{name}");
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(x) if x <= max => Ok(Some(x)),
            Some(x) => Err(invalid(
                InvalidKind::InvalidAmount,
                format!("{} {x} is above the limit {max}", field()),
            )),
            None if n.is_i64() => Err(invalid(
                InvalidKind::InvalidAmount,
                format!("{} {n} is negative", field()),
            )),
            None => Err(invalid(
                InvalidKind::InvalidAmount,
                format!(
                    "{} {n} is not an integer (no fractions or exponents)",
                    field()
                ),
            )),
        },
        other => Err(invalid(
            InvalidKind::InvalidAmount,
            format!(
                "{} must be a JSON integer, got {}",
                field(),
                describe(other)
            ),
        )),
    }
}

/// Best effort: the type and ids of a document that failed validation.
fn salvage(bytes: &[u8]) -> Salvage {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(bytes) else {
        return Salvage::default();
    };
    let id = |k: &str| {
        map.get(k)
            .and_then(Value::as_str)
            .and_then(|s| Id::parse(s).ok())
    };
    Salvage {
        event_type: map
            .get("type")
            .and_then(Value::as_str)
            .and_then(EventType::from_name),
        order_id: id("order_id"),
        event_id: id("event_id"),
        customer_id: id("customer_id"),
    }
}
