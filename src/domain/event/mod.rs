//! Bytes -> validated `OrderPlaced` / `OrderRefunded` (CONTRACT.md section 1).
//!
//! Parsing is strict about everything the contract names and lenient about
//! everything it does not (unknown fields are ignored). Every violation maps
//! to an [`InvalidEvent`] whose `kind` is a small fixed set (it becomes the
//! `deductor.error.kind` dead-letter header) and whose `detail` says exactly
//! which field broke which rule.

use std::fmt;

mod parse;
#[cfg(test)]
mod tests;

pub use parse::parse;

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
/// The longest [`InvalidEvent::detail`]: it is written to logs, the dead
/// letter's `deductor.error` header and an `invalid_event` outcome's
/// `error`, and may quote the producer's input (a 60,000-character `type`).
pub const MAX_DETAIL_BYTES: usize = 256;

/// `s` cut to at most `max` bytes (at a character boundary), with what was
/// left out said at the end: for every producer-controlled string deductor
/// writes to a log line, a span or a header text.
pub fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…(+{} bytes)", &s[..end], s.len() - end))
}

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
