//! The per-order model the checker replays outcomes against.
//!
//! All events of one order share a key, hence a partition, and are decided
//! in offset order; what a line of an order holds depends only on that
//! order's events, except whether a fresh placement line finds stock, budget
//! and per-customer room, which depends on every other order. So the model
//! takes each placement's decision from its outcome, checks that the decision
//! is one the contract allows in the order's state, and predicts every
//! refund's result exactly. Its final state is what Redis must hold.

use std::collections::HashMap;

use deductor::domain::event::{OrderPlaced, OrderRefunded};
use serde_json::Value;

use crate::operator::Effects;
use crate::workload::Promo;

/// What one (order, promotion) holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LineState {
    #[default]
    None,
    Held {
        event: String,
        budget0: u64,
        stock0: u64,
        budget: u64,
        stock: u64,
    },
    /// Reverted by a refund (`event`: the deducting event) or a tombstone
    /// left by a refund that found nothing (`event` None, amounts 0).
    Reverted {
        event: Option<String>,
        budget0: u64,
        stock0: u64,
    },
}

/// The decision an outcome states, without what may differ between
/// deliveries (duplicate, remaining, source, processed_at).
pub fn signature(v: &Value) -> String {
    let t = v["type"].as_str().unwrap_or("?");
    let reason = v["reason"].as_str().unwrap_or("");
    let lines = v["lines"].as_array().cloned().unwrap_or_default();
    match t {
        "DeductAccepted" => {
            let ls: Vec<String> = lines
                .iter()
                .map(|l| {
                    format!(
                        "{}:{}:{}",
                        s(&l["promotion_id"]),
                        n(&l["budget"]),
                        n(&l["stock"])
                    )
                })
                .collect();
            format!("{t}||{}", ls.join(";"))
        }
        "DeductRejected" => format!("{t}|{reason}|{}", s(&v["promotion_id"])),
        "RollbackApplied" | "RollbackRejected" => {
            let ls: Vec<String> = lines
                .iter()
                .map(|l| {
                    format!(
                        "{}:{}:{}:{}",
                        s(&l["promotion_id"]),
                        s(&l["status"]),
                        n(&l["budget"]),
                        n(&l["stock"])
                    )
                })
                .collect();
            format!("{t}|{reason}|{}", ls.join(";"))
        }
        _ => format!("{t}|{reason}|"),
    }
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_owned()
}

fn n(v: &Value) -> String {
    v.as_i64().map_or("?".to_owned(), |x| x.to_string())
}

/// The replay of one order.
#[derive(Debug, Default)]
pub struct Order {
    pub lines: HashMap<String, LineState>,
    pub customer: String,
}

impl Order {
    fn state(&self, p: &str) -> LineState {
        self.lines.get(p).cloned().unwrap_or_default()
    }

    /// Checks an observed placement decision (`v`: its first outcome) and
    /// applies it; returns what is wrong with it, if anything.
    /// `fx`: what the operator faults allow besides (a promotion paused or
    /// corrupt at some moment may reject a fresh line for it).
    pub fn place(
        &mut self,
        e: &OrderPlaced,
        v: &Value,
        promos: &HashMap<String, Promo>,
        fx: &Effects,
    ) -> Result<(), String> {
        let ev = e.header.event_id.as_str();
        let t = e.header.occurred_at;
        // Can line i be accepted, and with which amounts?
        let acceptable = |o: &Order, i: usize| -> Result<(u64, u64), String> {
            let l = &e.lines[i];
            let p = l.promotion_id.as_str();
            match o.state(p) {
                LineState::Held {
                    budget0, stock0, ..
                } => Ok((budget0, stock0)),
                LineState::Reverted {
                    event: Some(x),
                    budget0,
                    stock0,
                } if x == ev => Ok((budget0, stock0)),
                LineState::Reverted { .. } => {
                    Err(format!("line {p} is reverted: must reject order_reverted"))
                }
                LineState::None => match promos.get(p).and_then(|x| x.fixed_rejection(t)) {
                    Some(r) => Err(format!("line {p} must reject {r}")),
                    None if !promos.contains_key(p) => Err(format!("line {p}: unknown promotion")),
                    None => Ok((l.budget, l.stock)),
                },
            }
        };
        match v["type"].as_str() {
            Some("DeductAccepted") => {
                let got = v["lines"].as_array().cloned().unwrap_or_default();
                if got.len() != e.lines.len() {
                    return Err(format!(
                        "accepted with {} lines, the event has {}",
                        got.len(),
                        e.lines.len()
                    ));
                }
                let mut fresh = Vec::new();
                for (i, l) in e.lines.iter().enumerate() {
                    let (b, st) = acceptable(self, i)?;
                    let p = l.promotion_id.as_str();
                    let g = &got[i];
                    if g["promotion_id"].as_str() != Some(p)
                        || g["budget"].as_u64() != Some(b)
                        || g["stock"].as_u64() != Some(st)
                    {
                        return Err(format!(
                            "accepted line {i} is {g}, expected {p} budget {b} stock {st}"
                        ));
                    }
                    if self.state(p) == LineState::None {
                        fresh.push((p.to_owned(), b, st));
                    }
                }
                for (p, b, st) in fresh {
                    self.lines.insert(
                        p,
                        LineState::Held {
                            event: ev.to_owned(),
                            budget0: b,
                            stock0: st,
                            budget: b,
                            stock: st,
                        },
                    );
                }
                Ok(())
            }
            Some("DeductRejected") => {
                let reason = v["reason"].as_str().unwrap_or("");
                let p = v["promotion_id"].as_str().unwrap_or("");
                let Some(j) = e.lines.iter().position(|l| l.promotion_id.as_str() == p) else {
                    return Err(format!("rejected on {p}, which is not a line of the event"));
                };
                for i in 0..j {
                    acceptable(self, i)
                        .map_err(|w| format!("rejected {reason} on line {j}, but earlier {w}"))?;
                }
                let l = &e.lines[j];
                let promo = promos.get(p);
                let ok = match self.state(p) {
                    LineState::Held { .. } => false,
                    LineState::Reverted { event: Some(x), .. } if x == ev => false,
                    // Reverted by another event (or a refund's tombstone):
                    // the script reads and checks the promotion before it
                    // answers, so corrupt data there answers instead.
                    LineState::Reverted { .. } => {
                        reason == "order_reverted"
                            || (reason == "corrupt_promotion" && fx.corrupt.contains(p))
                    }
                    // The documented fallback of a delivery that meets a
                    // released line whose event's reason was lost in a
                    // failover (only a multi-line order releases lines).
                    LineState::None
                        if reason == "order_reverted" && fx.reasons_lost && e.lines.len() > 1 =>
                    {
                        true
                    }
                    LineState::None => match promo.and_then(|x| x.fixed_rejection(t)) {
                        Some(r) => reason == r,
                        None if reason == "promotion_inactive" => fx.inactive.contains(p),
                        None if reason == "corrupt_promotion" => fx.corrupt.contains(p),
                        None => promo.is_some_and(|x| match reason {
                            "budget_exceeded" => x.budget.is_some() && l.budget > 0,
                            "stock_insufficient" => x.stock.is_some() && l.stock > 0,
                            "user_limit_reached" => x.per_customer.is_some(),
                            _ => false,
                        }),
                    },
                };
                if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "rejected {reason} on {p}, which the line's state {:?} does not allow",
                        self.state(p)
                    ))
                }
            }
            other => Err(format!("a placement answered with {other:?}")),
        }
    }

    /// Predicts a refund exactly, applies it, and returns the expected
    /// signature. The one thing it cannot predict is whether a line met
    /// corrupt data: a line of a promotion corrupt at some moment (`fx`)
    /// that the outcome `v` reports `corrupt_promotion` changed nothing.
    pub fn refund(&mut self, e: &OrderRefunded, v: &Value, fx: &Effects) -> String {
        let mut lines = Vec::new();
        let mut applied = false;
        let mut first_reason = None;
        let observed = v["lines"].as_array().cloned().unwrap_or_default();
        for (i, l) in e.lines.iter().enumerate() {
            let p = l.promotion_id.as_str().to_owned();
            let met_corrupt = fx.corrupt.contains(&p)
                && observed.get(i).is_some_and(|o| {
                    o["promotion_id"].as_str() == Some(p.as_str())
                        && o["status"] == "corrupt_promotion"
                });
            let (status, b, s) = match self.state(&p) {
                _ if met_corrupt => ("corrupt_promotion", 0, 0),
                LineState::None => {
                    self.lines.insert(
                        p.clone(),
                        LineState::Reverted {
                            event: None,
                            budget0: 0,
                            stock0: 0,
                        },
                    );
                    ("no_deduction", 0, 0)
                }
                LineState::Reverted { .. } => ("already_reverted", 0, 0),
                LineState::Held {
                    event,
                    budget0,
                    stock0,
                    budget,
                    stock,
                } => {
                    let rb = l.budget.unwrap_or(budget);
                    let rs = l.stock.unwrap_or(stock);
                    if rb > budget || rs > stock {
                        ("exceeds_deducted", 0, 0)
                    } else {
                        let (lb, ls) = (budget - rb, stock - rs);
                        let next = if lb == 0 && ls == 0 {
                            LineState::Reverted {
                                event: Some(event),
                                budget0,
                                stock0,
                            }
                        } else {
                            LineState::Held {
                                event,
                                budget0,
                                stock0,
                                budget: lb,
                                stock: ls,
                            }
                        };
                        self.lines.insert(p.clone(), next);
                        ("applied", rb, rs)
                    }
                }
            };
            if status == "applied" {
                applied = true;
            } else if first_reason.is_none() {
                first_reason = Some(status);
            }
            lines.push(format!("{p}:{status}:{b}:{s}"));
        }
        let (t, reason) = if applied {
            ("RollbackApplied", "")
        } else {
            ("RollbackRejected", first_reason.unwrap_or(""))
        };
        format!("{t}|{reason}|{}", lines.join(";"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn placed(lines: Value) -> OrderPlaced {
        let v = json!({"type": "OrderPlaced", "event_id": "e1", "order_id": "o1",
            "customer_id": "c1", "occurred_at": "2026-11-29T10:00:00Z", "lines": lines});
        match deductor::domain::event::parse(v.to_string().as_bytes()) {
            Ok(deductor::domain::event::Event::Placed(e)) => e,
            other => panic!("not an OrderPlaced: {other:?}"),
        }
    }

    fn promos() -> HashMap<String, Promo> {
        ["a", "b"]
            .iter()
            .map(|p| {
                let mut x = Promo::new(p);
                x.budget = Some(1000);
                (p.to_string(), x)
            })
            .collect()
    }

    /// `order_reverted` on a fresh line is the documented fallback after a
    /// reason lost in a Redis failover, and only then (a run without
    /// failovers must not accept it), and only for a multi-line order.
    #[test]
    fn order_reverted_on_a_fresh_line_only_after_a_failover() {
        let two = placed(json!([{"promotion_id": "a", "budget": 5},
            {"promotion_id": "b", "budget": 5}]));
        let one = placed(json!([{"promotion_id": "a", "budget": 5}]));
        let v = json!({"type": "DeductRejected", "reason": "order_reverted", "promotion_id": "a"});
        let calm = Effects::default();
        let failed_over = Effects {
            reasons_lost: true,
            ..Effects::default()
        };
        assert!(Order::default().place(&two, &v, &promos(), &calm).is_err());
        assert!(Order::default()
            .place(&one, &v, &promos(), &failed_over)
            .is_err());
        assert_eq!(
            Order::default().place(&two, &v, &promos(), &failed_over),
            Ok(())
        );
    }
}
