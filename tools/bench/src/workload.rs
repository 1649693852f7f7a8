//! The two benchmark workloads: promotions to seed and a deterministic stream
//! of order events (CONTRACT.md section 1), keyed by `order_id`.
//!
//! * spread: orders over 1,000 promotions with ample budget and stock;
//! * hot: 95% of the placements carry a line of one flash-sale promotion with
//!   scarce stock (most of them are rejected `stock_insufficient`), the rest
//!   are spread.
//!
//! Both: 10% of the events refund an earlier order (70% in full, 30% half
//! the budget of each line); placements have 1 line (80%), 2 (15%) or 3 (5%).

use deductor_testkit::rng::Rng;

/// Spread promotions.
pub const SPREAD_PROMOTIONS: usize = 1_000;
/// Customers the orders are drawn from.
const CUSTOMERS: u64 = 50_000;
/// Business time of the first event: 2026-11-29T10:00:00Z.
const T0: i64 = 1_795_946_400;
/// Promotion windows: [2026-01-01, 2027-01-01).
const STARTS_AT: i64 = 1_767_225_600;
const ENDS_AT: i64 = 1_798_761_600;
/// The flash-sale promotion of the hot workload.
pub const FLASH: &str = "flash-1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Spread,
    Hot,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Spread => "spread",
            Workload::Hot => "hot",
        }
    }
}

/// One promotion hash (CONTRACT.md section 2); `None` = unlimited.
#[derive(Debug, Clone)]
pub struct Promotion {
    pub id: String,
    pub budget: Option<u64>,
    pub stock: Option<u64>,
    pub per_customer: Option<u64>,
}

impl Promotion {
    /// Field/value pairs of the promotion hash.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut f = vec![
            ("status", "active".to_owned()),
            ("starts_at", STARTS_AT.to_string()),
            ("ends_at", ENDS_AT.to_string()),
        ];
        if let Some(b) = self.budget {
            f.push(("budget", b.to_string()));
            f.push(("initial_budget", b.to_string()));
        }
        if let Some(s) = self.stock {
            f.push(("stock", s.to_string()));
            f.push(("initial_stock", s.to_string()));
        }
        if let Some(c) = self.per_customer {
            f.push(("per_customer", c.to_string()));
        }
        f
    }
}

fn spread_id(i: usize) -> String {
    format!("sp-{i:04}")
}

/// The promotions a workload needs; `flash_stock` is the hot promotion's stock.
pub fn promotions(w: Workload, flash_stock: u64) -> Vec<Promotion> {
    let mut v: Vec<Promotion> = (0..SPREAD_PROMOTIONS)
        .map(|i| Promotion {
            id: spread_id(i),
            budget: Some(1_000_000_000),
            stock: Some(1_000_000),
            per_customer: Some(5),
        })
        .collect();
    if w == Workload::Hot {
        v.push(Promotion {
            id: FLASH.to_owned(),
            budget: None,
            stock: Some(flash_stock),
            per_customer: Some(1),
        });
    }
    v
}

struct Placed {
    order: u64,
    customer: u64,
    /// (promotion id, budget) per line.
    lines: Vec<(String, u64)>,
}

/// One event: the Kafka key (order id), the JSON value, and whether it is a
/// refund.
pub struct Event {
    pub key: String,
    pub value: String,
    pub refund: bool,
}

/// A deterministic event stream. Ids carry `prefix`, so two streams never
/// share an event or order id.
pub struct Generator {
    rng: Rng,
    workload: Workload,
    prefix: String,
    seq: u64,
    next_order: u64,
    placed: Vec<Placed>,
}

impl Generator {
    pub fn new(workload: Workload, prefix: &str, seed: u64) -> Generator {
        Generator {
            rng: Rng::new(seed),
            workload,
            prefix: prefix.to_owned(),
            seq: 0,
            next_order: 0,
            placed: Vec::new(),
        }
    }

    /// The event id of the `i`-th event of this stream.
    pub fn event_id(prefix: &str, i: u64) -> String {
        format!("{prefix}-e{i}")
    }

    pub fn next_event(&mut self) -> Event {
        let i = self.seq;
        self.seq += 1;
        let event_id = Generator::event_id(&self.prefix, i);
        let occurred_at = rfc3339(T0 + (i / 50) as i64);
        if !self.placed.is_empty() && self.rng.percent(10) {
            let at = self.rng.below(self.placed.len());
            let p = self.placed.swap_remove(at);
            let full = self.rng.percent(70);
            let lines: Vec<String> = p
                .lines
                .iter()
                .map(|(promo, budget)| {
                    if full {
                        format!(r#"{{"promotion_id":"{promo}"}}"#)
                    } else {
                        format!(r#"{{"promotion_id":"{promo}","budget":{}}}"#, budget / 2)
                    }
                })
                .collect();
            let order = format!("{}-o{}", self.prefix, p.order);
            let value = format!(
                r#"{{"type":"OrderRefunded","event_id":"{event_id}","order_id":"{order}","customer_id":"c{}","occurred_at":"{occurred_at}","lines":[{}]}}"#,
                p.customer,
                lines.join(",")
            );
            return Event {
                key: order,
                value,
                refund: true,
            };
        }
        let n = match self.rng.below(100) {
            0..80 => 1,
            80..95 => 2,
            _ => 3,
        };
        let hot = self.workload == Workload::Hot && self.rng.percent(95);
        let mut lines: Vec<(String, u64, u64)> = Vec::with_capacity(n);
        if hot {
            lines.push((FLASH.to_owned(), 1_000, 1));
        }
        while lines.len() < n {
            let promo = spread_id(self.rng.below(SPREAD_PROMOTIONS));
            if lines.iter().all(|(p, _, _)| *p != promo) {
                let budget = self.rng.range(100, 5_000);
                lines.push((promo, budget, 1));
            }
        }
        if hot && n > 1 {
            // The flash line is not always first: a later rejection releases
            // the lines before it.
            let at = self.rng.below(n);
            lines.swap(0, at);
        }
        let customer = self.rng.range(0, CUSTOMERS - 1);
        let order_n = self.next_order;
        self.next_order += 1;
        let order = format!("{}-o{order_n}", self.prefix);
        let json_lines: Vec<String> = lines
            .iter()
            .map(|(p, b, s)| format!(r#"{{"promotion_id":"{p}","budget":{b},"stock":{s}}}"#))
            .collect();
        let value = format!(
            r#"{{"type":"OrderPlaced","event_id":"{event_id}","order_id":"{order}","customer_id":"c{customer}","occurred_at":"{occurred_at}","lines":[{}]}}"#,
            json_lines.join(",")
        );
        self.placed.push(Placed {
            order: order_n,
            customer,
            lines: lines.into_iter().map(|(p, b, _)| (p, b)).collect(),
        });
        Event {
            key: order,
            value,
            refund: false,
        }
    }
}

fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deductor::domain::event::{self, Event as Parsed};

    #[test]
    fn every_event_is_valid_and_refunds_follow_their_placement() {
        for w in [Workload::Spread, Workload::Hot] {
            let mut g = Generator::new(w, "t", 7);
            let mut placed = std::collections::HashSet::new();
            let (mut refunds, mut multi, mut flash) = (0, 0, 0);
            for _ in 0..5_000 {
                let e = g.next_event();
                match event::parse(e.value.as_bytes()).expect("valid event") {
                    Parsed::Placed(p) => {
                        assert_eq!(p.header.order_id.as_str(), e.key);
                        assert!(placed.insert(e.key.clone()));
                        multi += usize::from(p.lines.len() > 1);
                        flash +=
                            usize::from(p.lines.iter().any(|l| l.promotion_id.as_str() == FLASH));
                    }
                    Parsed::Refunded(r) => {
                        assert!(placed.contains(r.header.order_id.as_str()));
                        refunds += 1;
                    }
                }
            }
            assert!((350..650).contains(&refunds), "{refunds}");
            assert!((700..1_200).contains(&multi), "{multi}");
            match w {
                Workload::Spread => assert_eq!(flash, 0),
                Workload::Hot => assert!(flash > 4_000, "{flash}"),
            }
        }
    }
}
