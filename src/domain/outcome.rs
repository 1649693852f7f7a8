//! Decisions -> outcome JSON (CONTRACT.md section 4).
//!
//! Pure: the caller supplies the processing time. The `outcome_id` is derived
//! from the event id and the outcome type, never random, so every repeat of
//! one decision carries the same id and consumers can de-duplicate.

use serde::Serialize;
use serde_json::Value;

use super::decision::{PlaceDecision, Reason, RefundDecision, Remaining};
use super::event::{EventType, Header, InvalidEvent, OrderPlaced, OrderRefunded};

/// The four outcome types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeType {
    DeductAccepted,
    DeductRejected,
    RollbackApplied,
    RollbackRejected,
}

impl OutcomeType {
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeType::DeductAccepted => "DeductAccepted",
            OutcomeType::DeductRejected => "DeductRejected",
            OutcomeType::RollbackApplied => "RollbackApplied",
            OutcomeType::RollbackRejected => "RollbackRejected",
        }
    }

    /// The rejection type answering an event type (for `invalid_event`).
    pub fn rejection_of(t: EventType) -> OutcomeType {
        match t {
            EventType::OrderPlaced => OutcomeType::DeductRejected,
            EventType::OrderRefunded => OutcomeType::RollbackRejected,
        }
    }
}

/// Where the answered event was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// An outcome ready to publish: the Kafka key is `order_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub kind: OutcomeType,
    pub order_id: String,
    pub outcome_id: String,
    /// `reason` of a rejection, for metrics.
    pub reason: Option<Reason>,
    /// `processed_at` of the JSON (the CloudEvents `ce_time` header).
    pub processed_at: String,
    /// The JSON value, serialized once from the decision (no `Value` tree
    /// on the hot path: building and serializing one was ~14% of the
    /// service's CPU per event in the benchmark's profile).
    pub payload: Vec<u8>,
}

impl Outcome {
    pub fn to_bytes(&self) -> &[u8] {
        &self.payload
    }

    /// The payload parsed back, for tests and tools.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.payload).unwrap_or(Value::Null)
    }
}

/// `outcome_id`: the event id and the outcome type. Ids cannot contain `:`,
/// so the pair is unambiguous.
pub fn outcome_id(event_id: &str, kind: OutcomeType) -> String {
    format!("{event_id}:{}", kind.as_str())
}

/// The outcome's JSON object (CONTRACT.md section 4), borrowed from the
/// event and the decision. `None` fields marked `skip` are left out; other
/// `None`s are `null`.
#[derive(Serialize)]
struct Wire<'a, L: Serialize> {
    #[serde(rename = "type")]
    kind: &'static str,
    outcome_id: &'a str,
    event_id: Option<&'a str>,
    order_id: &'a str,
    customer_id: Option<&'a str>,
    duplicate: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    promotion_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    lines: L,
    source: &'a Source,
    processed_at: &'a str,
}

#[derive(Serialize)]
struct RemainingWire {
    budget: Option<u64>,
    stock: Option<u64>,
}

impl From<&Remaining> for RemainingWire {
    fn from(r: &Remaining) -> Self {
        RemainingWire {
            budget: r.budget,
            stock: r.stock,
        }
    }
}

#[derive(Serialize)]
struct AcceptedLineWire<'a> {
    promotion_id: &'a str,
    budget: u64,
    stock: u64,
    remaining: RemainingWire,
}

#[derive(Serialize)]
struct RequestedLineWire<'a> {
    promotion_id: &'a str,
    budget: u64,
    stock: u64,
}

#[derive(Serialize)]
struct RefundLineWire<'a> {
    promotion_id: &'a str,
    status: &'static str,
    budget: u64,
    stock: u64,
    remaining: RemainingWire,
}

fn to_outcome<L: Serialize>(
    wire: &Wire<'_, L>,
    kind: OutcomeType,
    reason: Option<Reason>,
) -> Outcome {
    Outcome {
        kind,
        order_id: wire.order_id.to_owned(),
        outcome_id: wire.outcome_id.to_owned(),
        reason,
        processed_at: wire.processed_at.to_owned(),
        // Serializing these structs cannot fail: string keys, no maps, no floats.
        payload: serde_json::to_vec(wire).unwrap_or_default(),
    }
}

/// An outcome answering a parsed event (placement or refund).
#[allow(clippy::too_many_arguments)]
fn answer<L: Serialize>(
    h: &Header,
    kind: OutcomeType,
    duplicate: bool,
    reason: Option<Reason>,
    promotion_id: Option<&str>,
    lines: L,
    source: &Source,
    processed_at: &str,
) -> Outcome {
    let id = outcome_id(h.event_id.as_str(), kind);
    let wire = Wire {
        kind: kind.as_str(),
        outcome_id: &id,
        event_id: Some(h.event_id.as_str()),
        order_id: h.order_id.as_str(),
        customer_id: Some(h.customer_id.as_str()),
        duplicate,
        reason: reason.map(Reason::as_str),
        promotion_id,
        error: None,
        lines,
        source,
        processed_at,
    };
    to_outcome(&wire, kind, reason)
}

/// The outcome of an `OrderPlaced`.
pub fn placed(e: &OrderPlaced, d: &PlaceDecision, source: &Source, processed_at: &str) -> Outcome {
    let h = &e.header;
    match d {
        PlaceDecision::Accepted { duplicate, lines } => {
            let lines: Vec<AcceptedLineWire<'_>> = lines
                .iter()
                .map(|l| AcceptedLineWire {
                    promotion_id: l.promotion_id.as_str(),
                    budget: l.budget,
                    stock: l.stock,
                    remaining: (&l.remaining).into(),
                })
                .collect();
            let kind = OutcomeType::DeductAccepted;
            answer(h, kind, *duplicate, None, None, lines, source, processed_at)
        }
        PlaceDecision::Rejected {
            duplicate,
            reason,
            promotion_id,
        } => {
            let lines: Vec<RequestedLineWire<'_>> = e
                .lines
                .iter()
                .map(|l| RequestedLineWire {
                    promotion_id: l.promotion_id.as_str(),
                    budget: l.budget,
                    stock: l.stock,
                })
                .collect();
            answer(
                h,
                OutcomeType::DeductRejected,
                *duplicate,
                Some(*reason),
                Some(promotion_id.as_str()),
                lines,
                source,
                processed_at,
            )
        }
    }
}

/// The outcome of an `OrderRefunded`.
pub fn refunded(
    e: &OrderRefunded,
    d: &RefundDecision,
    source: &Source,
    processed_at: &str,
) -> Outcome {
    let (kind, reason) = if d.applied() {
        (OutcomeType::RollbackApplied, None)
    } else {
        (OutcomeType::RollbackRejected, d.first_reason())
    };
    let lines: Vec<RefundLineWire<'_>> = d
        .lines
        .iter()
        .map(|l| RefundLineWire {
            promotion_id: l.promotion_id.as_str(),
            status: match l.status {
                Ok(()) => "applied",
                Err(r) => r.as_str(),
            },
            budget: l.budget,
            stock: l.stock,
            remaining: (&l.remaining).into(),
        })
        .collect();
    answer(
        &e.header,
        kind,
        d.duplicate(),
        reason,
        None,
        lines,
        source,
        processed_at,
    )
}

/// The `invalid_event` rejection of an invalid event, when its `order_id`
/// and a known `type` could still be read. Without a readable `event_id` the
/// source coordinates stand in for it, which are just as stable.
pub fn invalid(e: &InvalidEvent, source: &Source, processed_at: &str) -> Option<Outcome> {
    let s = &e.salvage;
    let (Some(t), Some(order_id)) = (s.event_type, s.order_id.as_ref()) else {
        return None;
    };
    let kind = OutcomeType::rejection_of(t);
    let event_key = match &s.event_id {
        Some(id) => id.to_string(),
        None => format!("{}-{}-{}", source.topic, source.partition, source.offset),
    };
    let id = outcome_id(&event_key, kind);
    let wire = Wire {
        kind: kind.as_str(),
        outcome_id: &id,
        event_id: s.event_id.as_ref().map(|_| event_key.as_str()),
        order_id: order_id.as_str(),
        customer_id: s.customer_id.as_ref().map(|c| c.as_str()),
        duplicate: false,
        reason: Some(Reason::InvalidEvent.as_str()),
        promotion_id: None,
        error: Some(e.detail.as_str()),
        lines: [(); 0],
        source,
        processed_at,
    };
    Some(to_outcome(&wire, kind, Some(Reason::InvalidEvent)))
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T10:00:00.012Z`.
pub fn timestamp(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::decision::{AcceptedLine, RefundLineResult};
    use crate::domain::event::{parse, Event, Id};
    use serde_json::json;

    fn src() -> Source {
        Source {
            topic: "orders".into(),
            partition: 3,
            offset: 1207,
        }
    }

    fn placed_event() -> OrderPlaced {
        let raw = br#"{"type": "OrderPlaced", "event_id": "e-1001", "order_id": "o-77",
 "customer_id": "c-9", "occurred_at": "2026-11-29T10:00:00Z",
 "lines": [{"promotion_id": "flash-42", "budget": 1500, "stock": 1},
           {"promotion_id": "full-200-30", "budget": 3000}]}"#;
        match parse(raw).unwrap() {
            Event::Placed(p) => p,
            Event::Refunded(_) => unreachable!(),
        }
    }

    fn id(s: &str) -> Id {
        Id::parse(s).unwrap()
    }

    #[test]
    fn accepted_matches_the_contract_example() {
        let e = placed_event();
        let d = PlaceDecision::Accepted {
            duplicate: false,
            lines: vec![
                AcceptedLine {
                    promotion_id: id("flash-42"),
                    budget: 1500,
                    stock: 1,
                    remaining: Remaining {
                        budget: Some(98500),
                        stock: Some(41),
                    },
                },
                AcceptedLine {
                    promotion_id: id("full-200-30"),
                    budget: 3000,
                    stock: 0,
                    remaining: Remaining {
                        budget: Some(7000),
                        stock: None,
                    },
                },
            ],
        };
        let o = placed(&e, &d, &src(), "2026-11-29T10:00:00.012Z");
        assert_eq!(o.kind, OutcomeType::DeductAccepted);
        assert_eq!(o.order_id, "o-77");
        let j = &o.json();
        assert_eq!(j["type"], "DeductAccepted");
        assert_eq!(j["event_id"], "e-1001");
        assert_eq!(j["order_id"], "o-77");
        assert_eq!(j["customer_id"], "c-9");
        assert_eq!(j["duplicate"], false);
        assert_eq!(j["outcome_id"], "e-1001:DeductAccepted");
        assert_eq!(
            j["lines"][0],
            json!({"promotion_id": "flash-42", "budget": 1500, "stock": 1, "remaining": {"budget": 98500, "stock": 41}})
        );
        assert_eq!(j["lines"][1]["remaining"]["stock"], Value::Null);
        assert_eq!(
            j["source"],
            json!({"topic": "orders", "partition": 3, "offset": 1207})
        );
        assert_eq!(j["processed_at"], "2026-11-29T10:00:00.012Z");
    }

    #[test]
    fn rejected_names_reason_and_promotion() {
        let e = placed_event();
        let d = PlaceDecision::Rejected {
            duplicate: true,
            reason: Reason::StockInsufficient,
            promotion_id: id("flash-42"),
        };
        let o = placed(&e, &d, &src(), "t");
        assert_eq!(o.json()["type"], "DeductRejected");
        assert_eq!(o.json()["reason"], "stock_insufficient");
        assert_eq!(o.json()["promotion_id"], "flash-42");
        assert_eq!(o.json()["duplicate"], true);
        assert_eq!(
            o.json()["lines"][1],
            json!({"promotion_id": "full-200-30", "budget": 3000, "stock": 0})
        );
        assert_eq!(o.outcome_id, "e-1001:DeductRejected");
    }

    #[test]
    fn outcome_id_is_stable_and_differs_by_type() {
        assert_eq!(
            outcome_id("e-1", OutcomeType::DeductAccepted),
            outcome_id("e-1", OutcomeType::DeductAccepted)
        );
        assert_ne!(
            outcome_id("e-1", OutcomeType::DeductAccepted),
            outcome_id("e-1", OutcomeType::DeductRejected)
        );
    }

    fn refund_event() -> OrderRefunded {
        let raw = br#"{"type": "OrderRefunded", "event_id": "e-1002", "order_id": "o-77",
 "customer_id": "c-9", "occurred_at": "2026-11-30T08:00:00Z",
 "lines": [{"promotion_id": "flash-42"}, {"promotion_id": "full-200-30", "budget": 1000}]}"#;
        match parse(raw).unwrap() {
            Event::Refunded(r) => r,
            Event::Placed(_) => unreachable!(),
        }
    }

    #[test]
    fn rollback_applied_when_any_line_applied() {
        let e = refund_event();
        let d = RefundDecision {
            lines: vec![
                RefundLineResult {
                    promotion_id: id("flash-42"),
                    status: Ok(()),
                    duplicate: false,
                    budget: 1500,
                    stock: 1,
                    remaining: Remaining {
                        budget: Some(100000),
                        stock: Some(42),
                    },
                },
                RefundLineResult {
                    promotion_id: id("full-200-30"),
                    status: Err(Reason::ExceedsDeducted),
                    duplicate: false,
                    budget: 0,
                    stock: 0,
                    remaining: Remaining::default(),
                },
            ],
        };
        let o = refunded(&e, &d, &src(), "t");
        assert_eq!(o.json()["type"], "RollbackApplied");
        assert!(o.json().get("reason").is_none());
        assert_eq!(o.json()["lines"][0]["status"], "applied");
        assert_eq!(o.json()["lines"][1]["status"], "exceeds_deducted");
        assert_eq!(o.json()["lines"][0]["budget"], 1500);
    }

    #[test]
    fn rollback_rejected_carries_first_reason() {
        let e = refund_event();
        let d = RefundDecision {
            lines: vec![
                RefundLineResult {
                    promotion_id: id("flash-42"),
                    status: Err(Reason::NoDeduction),
                    duplicate: true,
                    budget: 0,
                    stock: 0,
                    remaining: Remaining::default(),
                },
                RefundLineResult {
                    promotion_id: id("full-200-30"),
                    status: Err(Reason::AlreadyReverted),
                    duplicate: true,
                    budget: 0,
                    stock: 0,
                    remaining: Remaining::default(),
                },
            ],
        };
        let o = refunded(&e, &d, &src(), "t");
        assert_eq!(o.json()["type"], "RollbackRejected");
        assert_eq!(o.json()["reason"], "no_deduction");
        assert_eq!(o.json()["duplicate"], true);
        assert_eq!(o.reason, Some(Reason::NoDeduction));
    }

    #[test]
    fn invalid_event_outcome_needs_order_id_and_type() {
        let bad = parse(br#"{"type":"OrderPlaced","event_id":"e-5","order_id":"o-5","customer_id":"c","occurred_at":"2026-01-01T00:00:00Z","lines":[{"promotion_id":"p","budget":1.5}]}"#).unwrap_err();
        let o = invalid(&bad, &src(), "t").expect("order id and type readable");
        assert_eq!(o.json()["type"], "DeductRejected");
        assert_eq!(o.json()["reason"], "invalid_event");
        assert_eq!(o.json()["order_id"], "o-5");
        assert_eq!(o.outcome_id, "e-5:DeductRejected");

        let no_order = parse(br#"{"type":"OrderRefunded","event_id":"e-5"}"#).unwrap_err();
        assert!(invalid(&no_order, &src(), "t").is_none());
        let no_type = parse(br#"{"type":"Nope","order_id":"o-1"}"#).unwrap_err();
        assert!(invalid(&no_type, &src(), "t").is_none());
    }

    #[test]
    fn invalid_event_without_event_id_uses_source() {
        let bad = parse(br#"{"type":"OrderRefunded","order_id":"o-5"}"#).unwrap_err();
        let o = invalid(&bad, &src(), "t").unwrap();
        assert_eq!(o.json()["type"], "RollbackRejected");
        assert_eq!(o.outcome_id, "orders-3-1207:RollbackRejected");
        assert_eq!(o.json()["event_id"], Value::Null);
    }
}
