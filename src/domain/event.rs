//! Bytes -> validated `OrderPlaced` / `OrderRefunded` (CONTRACT.md section 1).
//!
//! Parsing is strict about everything the contract names and lenient about
//! everything it does not (unknown fields are ignored). Every violation maps
//! to an [`InvalidEvent`] whose `kind` is a small fixed set (it becomes the
//! `deductor.error.kind` dead-letter header) and whose `detail` says exactly
//! which field broke which rule.

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// Largest accepted event value, in bytes.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Most lines one event may carry.
pub const MAX_LINES: usize = 32;
/// Largest `budget` of one line, in minor currency units.
pub const MAX_BUDGET: u64 = 1_000_000_000_000;
/// Largest `stock` of one line, in units.
pub const MAX_STOCK: u64 = 1_000_000;
/// Longest id, in characters.
pub const MAX_ID_LEN: usize = 64;

/// An identifier that satisfies the contract's id rule: 1 to 64 characters of
/// `A-Z a-z 0-9 _ . -`. Holding one proves it cannot forge a key or hash slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(String);

impl Id {
    /// Validates `s` against the id rule.
    pub fn parse(s: &str) -> Result<Id, &'static str> {
        if s.is_empty() {
            return Err("must not be empty");
        }
        if s.len() > MAX_ID_LEN {
            return Err("must be at most 64 characters");
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err("may only contain A-Z a-z 0-9 _ . -");
        }
        Ok(Id(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Id {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The two event types of the order topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    OrderPlaced,
    OrderRefunded,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::OrderPlaced => "OrderPlaced",
            EventType::OrderRefunded => "OrderRefunded",
        }
    }

    fn from_name(s: &str) -> Option<EventType> {
        match s {
            "OrderPlaced" => Some(EventType::OrderPlaced),
            "OrderRefunded" => Some(EventType::OrderRefunded),
            _ => None,
        }
    }
}

/// Fields every event carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub event_id: Id,
    pub order_id: Id,
    pub customer_id: Id,
    /// `occurred_at` as unix seconds (floored): the business time that
    /// promotion windows are judged against.
    pub occurred_at: i64,
}

/// One promotion line of a placement; absent amounts are 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceLine {
    pub promotion_id: Id,
    pub budget: u64,
    pub stock: u64,
}

/// One promotion line of a refund; `None` means "everything still outstanding".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundLine {
    pub promotion_id: Id,
    pub budget: Option<u64>,
    pub stock: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPlaced {
    pub header: Header,
    pub lines: Vec<PlaceLine>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRefunded {
    pub header: Header,
    pub lines: Vec<RefundLine>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Placed(OrderPlaced),
    Refunded(OrderRefunded),
}

impl Event {
    pub fn header(&self) -> &Header {
        match self {
            Event::Placed(e) => &e.header,
            Event::Refunded(e) => &e.header,
        }
    }

    pub fn event_type(&self) -> EventType {
        match self {
            Event::Placed(_) => EventType::OrderPlaced,
            Event::Refunded(_) => EventType::OrderRefunded,
        }
    }
}

/// Why an event is invalid. The names are the `deductor.error.kind` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidKind {
    TooLarge,
    NotUtf8,
    NotJson,
    Shape,
    MissingField,
    UnknownType,
    InvalidId,
    InvalidTimestamp,
    InvalidLines,
    DuplicatePromotion,
    InvalidAmount,
}

impl InvalidKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidKind::TooLarge => "too_large",
            InvalidKind::NotUtf8 => "not_utf8",
            InvalidKind::NotJson => "not_json",
            InvalidKind::Shape => "wrong_shape",
            InvalidKind::MissingField => "missing_field",
            InvalidKind::UnknownType => "unknown_type",
            InvalidKind::InvalidId => "invalid_id",
            InvalidKind::InvalidTimestamp => "invalid_timestamp",
            InvalidKind::InvalidLines => "invalid_lines",
            InvalidKind::DuplicatePromotion => "duplicate_promotion",
            InvalidKind::InvalidAmount => "invalid_amount",
        }
    }
}

/// What could still be read from an invalid event, so that an
/// `invalid_event` outcome can be published when `order_id` and a known
/// `type` are readable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Salvage {
    pub event_type: Option<EventType>,
    pub order_id: Option<Id>,
    pub event_id: Option<Id>,
    pub customer_id: Option<Id>,
}

/// An event that breaks a rule of the contract, section 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidEvent {
    pub kind: InvalidKind,
    /// Human-readable: the field and the rule it breaks.
    pub detail: String,
    pub salvage: Salvage,
}

impl fmt::Display for InvalidEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.detail)
    }
}

impl std::error::Error for InvalidEvent {}

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
    InvalidEvent {
        kind,
        detail: detail.into(),
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
    let field = format!("lines[{i}].{name}");
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(x) if x <= max => Ok(Some(x)),
            Some(x) => Err(invalid(
                InvalidKind::InvalidAmount,
                format!("{field} {x} is above the limit {max}"),
            )),
            None if n.is_i64() => Err(invalid(
                InvalidKind::InvalidAmount,
                format!("{field} {n} is negative"),
            )),
            None => Err(invalid(
                InvalidKind::InvalidAmount,
                format!("{field} {n} is not an integer (no fractions or exponents)"),
            )),
        },
        other => Err(invalid(
            InvalidKind::InvalidAmount,
            format!("{field} must be a JSON integer, got {}", describe(other)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"type": "OrderPlaced", "event_id": "e-1001", "order_id": "o-77",
               "customer_id": "c-9", "occurred_at": "2026-11-29T10:00:00Z",
               "lines": [{"promotion_id": "flash-42", "budget": 1500, "stock": 1},
                         {"promotion_id": "full-200-30", "budget": 3000}]})
    }

    const ABSENT: &str = "<absent>";

    fn with(path: &[&str], v: Value) -> Vec<u8> {
        let mut doc = base();
        let mut cur = &mut doc;
        for (i, p) in path.iter().enumerate() {
            if i + 1 == path.len() {
                if v == json!(ABSENT) {
                    cur.as_object_mut().unwrap().remove(*p);
                } else {
                    cur[*p] = v.clone();
                }
                break;
            }
            cur = match p.parse::<usize>() {
                Ok(n) => &mut cur[n],
                Err(_) => &mut cur[*p],
            };
        }
        serde_json::to_vec(&doc).unwrap()
    }

    fn kind_of(bytes: &[u8]) -> InvalidKind {
        match parse(bytes) {
            Ok(e) => panic!(
                "expected invalid, got {e:?} for {}",
                String::from_utf8_lossy(bytes)
            ),
            Err(e) => e.kind,
        }
    }

    #[test]
    fn contract_examples_parse() {
        let Event::Placed(p) = parse(&serde_json::to_vec(&base()).unwrap()).unwrap() else {
            panic!("not a placement")
        };
        assert_eq!(p.header.event_id.as_str(), "e-1001");
        assert_eq!(p.header.occurred_at, 1_795_946_400);
        assert_eq!(
            p.lines[0],
            PlaceLine {
                promotion_id: Id::parse("flash-42").unwrap(),
                budget: 1500,
                stock: 1
            }
        );
        assert_eq!(p.lines[1].stock, 0, "absent stock is 0 on a placement");

        let refund = br#"{"type": "OrderRefunded", "event_id": "e-1002", "order_id": "o-77",
 "customer_id": "c-9", "occurred_at": "2026-11-30T08:00:00Z",
 "lines": [{"promotion_id": "flash-42"},
           {"promotion_id": "full-200-30", "budget": 1000}]}"#;
        let Event::Refunded(r) = parse(refund).unwrap() else {
            panic!("not a refund")
        };
        assert_eq!(r.lines[0].budget, None, "absent is everything outstanding");
        assert_eq!(r.lines[1].budget, Some(1000));
        assert_eq!(r.lines[1].stock, None);
    }

    #[test]
    fn valid_edge_cases() {
        let ok = [
            with(&["unknown"], json!({"x": 1})),
            with(&["lines", "0", "extra"], json!("ignored")),
            with(&["event_id"], json!("a".repeat(64))),
            with(&["event_id"], json!("A-Z_a.z-09")),
            with(&["lines", "0", "budget"], json!(1_000_000_000_000u64)),
            with(&["lines", "0", "stock"], json!(1_000_000)),
            with(&["lines", "0", "budget"], json!(0)),
            with(&["occurred_at"], json!("2026-11-29T10:00:00.123+01:00")),
            with(
                &["lines"],
                json!((0..32)
                    .map(|i| json!({"promotion_id": format!("p{i}")}))
                    .collect::<Vec<_>>()),
            ),
        ];
        for doc in ok {
            assert!(parse(&doc).is_ok(), "{}", String::from_utf8_lossy(&doc));
        }
    }

    #[test]
    fn every_rule_has_its_reason() {
        use InvalidKind::*;
        let cases: Vec<(&str, Vec<u8>, InvalidKind)> = vec![
            ("not json", b"{nope".to_vec(), NotJson),
            ("empty", b"".to_vec(), NotJson),
            ("array", b"[1,2]".to_vec(), Shape),
            ("positional array", br#" ["OrderPlaced","e1","o1","c1","2026-11-29T10:00:00Z",[{"promotion_id":"p"}]]"#.to_vec(), Shape),
            ("string", b"\"x\"".to_vec(), Shape),
            ("not utf8", b"{\"type\":\"OrderPlaced\xff\"}".to_vec(), NotUtf8),
            ("too large", {
                let mut v = base();
                v["pad"] = json!("x".repeat(MAX_EVENT_BYTES));
                serde_json::to_vec(&v).unwrap()
            }, TooLarge),
            ("duplicate key", br#"{"type":"OrderPlaced","type":"OrderRefunded","event_id":"e","order_id":"o","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#.to_vec(), Shape),
            ("duplicate key in line", br#"{"type":"OrderPlaced","event_id":"e","order_id":"o","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p","budget":1,"budget":2}]}"#.to_vec(), Shape),
            ("no type", with(&["type"], json!(ABSENT)), MissingField),
            ("unknown type", with(&["type"], json!("OrderCancelled")), UnknownType),
            ("type case", with(&["type"], json!("orderplaced")), UnknownType),
            ("type number", with(&["type"], json!(1)), Shape),
            ("no event_id", with(&["event_id"], json!(ABSENT)), MissingField),
            ("no order_id", with(&["order_id"], json!(ABSENT)), MissingField),
            ("no customer_id", with(&["customer_id"], json!(ABSENT)), MissingField),
            ("no occurred_at", with(&["occurred_at"], json!(ABSENT)), MissingField),
            ("no lines", with(&["lines"], json!(ABSENT)), MissingField),
            ("empty id", with(&["event_id"], json!("")), InvalidId),
            ("long id", with(&["order_id"], json!("a".repeat(65))), InvalidId),
            ("colon", with(&["order_id"], json!("o:1")), InvalidId),
            ("brace", with(&["customer_id"], json!("c{1}")), InvalidId),
            ("close brace", with(&["lines", "0", "promotion_id"], json!("p}")), InvalidId),
            ("space", with(&["event_id"], json!("e 1")), InvalidId),
            ("tab", with(&["event_id"], json!("e\t1")), InvalidId),
            ("unicode", with(&["event_id"], json!("é")), InvalidId),
            ("numeric id", with(&["order_id"], json!(77)), InvalidId),
            ("null id", with(&["order_id"], json!(null)), InvalidId),
            ("bad time", with(&["occurred_at"], json!("yesterday")), InvalidTimestamp),
            ("date only", with(&["occurred_at"], json!("2026-11-29")), InvalidTimestamp),
            ("no zone", with(&["occurred_at"], json!("2026-11-29T10:00:00")), InvalidTimestamp),
            ("time number", with(&["occurred_at"], json!(1_700_000_000)), InvalidTimestamp),
            ("lines object", with(&["lines"], json!({"promotion_id": "p"})), InvalidLines),
            ("lines empty", with(&["lines"], json!([])), InvalidLines),
            ("33 lines", with(&["lines"], json!((0..33).map(|i| json!({"promotion_id": format!("p{i}")})).collect::<Vec<_>>())), InvalidLines),
            ("line not object", with(&["lines"], json!(["p"])), InvalidLines),
            ("duplicate promotion", with(&["lines", "1", "promotion_id"], json!("flash-42")), DuplicatePromotion),
            ("float", with(&["lines", "0", "budget"], json!(15.5)), InvalidAmount),
            ("float whole", with(&["lines", "0", "budget"], json!(1500.0)), InvalidAmount),
            ("exponent", b"{\"type\":\"OrderPlaced\",\"event_id\":\"e\",\"order_id\":\"o\",\"customer_id\":\"c\",\"occurred_at\":\"2026-11-29T10:00:00Z\",\"lines\":[{\"promotion_id\":\"p\",\"budget\":1e3}]}".to_vec(), InvalidAmount),
            ("negative", with(&["lines", "0", "stock"], json!(-1)), InvalidAmount),
            ("string amount", with(&["lines", "0", "budget"], json!("1500")), InvalidAmount),
            ("null amount", with(&["lines", "0", "stock"], json!(null)), InvalidAmount),
            ("budget over", with(&["lines", "0", "budget"], json!(1_000_000_000_001u64)), InvalidAmount),
            ("stock over", with(&["lines", "0", "stock"], json!(1_000_001)), InvalidAmount),
            ("beyond u64", b"{\"type\":\"OrderPlaced\",\"event_id\":\"e\",\"order_id\":\"o\",\"customer_id\":\"c\",\"occurred_at\":\"2026-11-29T10:00:00Z\",\"lines\":[{\"promotion_id\":\"p\",\"stock\":18446744073709551616}]}".to_vec(), InvalidAmount),
        ];
        for (name, bytes, want) in cases {
            assert_eq!(kind_of(&bytes), want, "case {name}");
        }
    }

    #[test]
    fn refund_amounts_follow_the_same_rules() {
        let mut doc = base();
        doc["type"] = json!("OrderRefunded");
        doc["lines"][0]["budget"] = json!(-5);
        assert_eq!(
            kind_of(&serde_json::to_vec(&doc).unwrap()),
            InvalidKind::InvalidAmount
        );
    }

    #[test]
    fn detail_names_the_field() {
        let e = parse(&with(&["lines", "1", "budget"], json!(2.5))).unwrap_err();
        assert!(e.detail.contains("lines[1].budget"), "{}", e.detail);
        let e = parse(&with(&["customer_id"], json!("a:b"))).unwrap_err();
        assert!(e.detail.contains("customer_id"), "{}", e.detail);
    }

    #[test]
    fn salvage_reads_type_and_order_of_invalid_events() {
        let e = parse(&with(&["lines", "0", "budget"], json!(1.5))).unwrap_err();
        assert_eq!(e.salvage.event_type, Some(EventType::OrderPlaced));
        assert_eq!(e.salvage.order_id.as_ref().map(Id::as_str), Some("o-77"));
        assert_eq!(e.salvage.event_id.as_ref().map(Id::as_str), Some("e-1001"));
        let e = parse(&with(&["order_id"], json!("o:forged"))).unwrap_err();
        assert_eq!(e.salvage.order_id, None, "an invalid id is not salvaged");
        let e = parse(b"garbage").unwrap_err();
        assert_eq!(e.salvage, Salvage::default());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn accepted_ids_never_forge_keys(s in "\\PC{0,70}") {
            if let Ok(id) = Id::parse(&s) {
                let forged = id.as_str().contains([':', '{', '}', ' ']);
                proptest::prop_assert!(!forged, "id {} could forge a key", id);
                proptest::prop_assert!((1..=64).contains(&id.as_str().len()));
            }
        }
    }
}
