//! The Redis key layout of CONTRACT.md section 2, in one place.
//!
//! Every key of promotion `P` carries the hash tag `{P}`, so every key one
//! script touches hashes to one Redis Cluster slot. Ids are [`Id`]s, which
//! cannot contain `:`, `{` or `}`, so no id can forge another key or slot.

use super::event::Id;

/// Builds key names under a configurable prefix (default `promo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

/// The four keys a deduct or rollback script touches for one line, in the
/// order the scripts expect them in KEYS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineKeys {
    pub promotion: String,
    pub used: String,
    pub record: String,
    /// `rejected:{E}` for a placement, `refund:{E}` for a refund.
    pub memo: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `promo:ledger`: the ledger marker (`"<creation id> <unix secs>"`),
    /// written once by the first `promo set`; its absence while the
    /// consumer group has committed offsets means Redis lost its dataset
    /// (`admin::dataset`). No hash tag: it belongs to no promotion, and no
    /// promotion key (`promo:{P}...`) can be named like it.
    pub fn ledger_marker(&self) -> String {
        format!("{}:ledger", self.prefix)
    }

    /// `promo:redriven:<dlq topic>:<partition>:<offset>`: the note that
    /// `deductor dlq replay` sent that dead letter back to the input topic
    /// (`sending <unix ms>` while it sends, then `<input topic>
    /// <partition>@<offset> <time>`), so a second replay skips it. No hash
    /// tag (one key per command); Kafka topic names hold only
    /// `[a-zA-Z0-9._-]`, so no topic can forge a promotion key.
    pub fn redriven(&self, dlq_topic: &str, partition: i32, offset: i64) -> String {
        format!("{}:redriven:{dlq_topic}:{partition}:{offset}", self.prefix)
    }

    /// `promo:{P}`
    pub fn promotion(&self, p: &Id) -> String {
        self.tagged(p, &[])
    }

    /// `promo:{P~s}`: bucket hash of a bucketed promotion P, on its own
    /// slot (docs/buckets.md; `s` from `buckets::bucket_suffixes`).
    pub fn bucket(&self, p: &Id, suffix: u32) -> String {
        format!("{}:{{{}~{}}}", self.prefix, p, suffix)
    }

    /// `promo:{P}:gen`: the last incarnation number of P (`promo_set.lua`).
    pub fn generation(&self, p: &Id) -> String {
        self.tagged(p, &[":gen"])
    }

    /// `promo:{P}:used:{C}`
    pub fn used(&self, p: &Id, customer: &Id) -> String {
        self.tagged(p, &[":used:", customer.as_str()])
    }

    /// `promo:{P}:order:{O}`
    pub fn record(&self, p: &Id, order: &Id) -> String {
        self.tagged(p, &[":order:", order.as_str()])
    }

    /// `promo:{P}:refund:{E}`
    pub fn refund(&self, p: &Id, event: &Id) -> String {
        self.tagged(p, &[":refund:", event.as_str()])
    }

    /// `promo:{P}:rejected:{E}`
    pub fn rejected(&self, p: &Id, event: &Id) -> String {
        self.tagged(p, &[":rejected:", event.as_str()])
    }

    /// `promo:{P}:index:<day>`: the order ids of P's records created on
    /// that unix day (`deduct.lua` on a standalone server), which `audit P`
    /// reads instead of scanning the keyspace.
    pub fn index(&self, p: &Id, day: u64) -> String {
        self.tagged(p, &[":index:", itoa::Buffer::new().format(day)])
    }

    /// `<prefix>:{P}` followed by `parts`, built at its exact length: the
    /// line keys are made for every line of every event, and `format!`
    /// grew its buffer two or three times for each.
    fn tagged(&self, p: &Id, parts: &[&str]) -> String {
        let len =
            self.prefix.len() + 3 + p.as_str().len() + parts.iter().map(|s| s.len()).sum::<usize>();
        let mut key = String::with_capacity(len);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(p.as_str());
        key.push('}');
        for part in parts {
            key.push_str(part);
        }
        key
    }

    /// KEYS of `deduct.lua` and `release.lua` for one placement line.
    pub fn deduct_line(&self, p: &Id, order: &Id, customer: &Id, event: &Id) -> LineKeys {
        LineKeys {
            promotion: self.promotion(p),
            used: self.used(p, customer),
            record: self.record(p, order),
            memo: self.rejected(p, event),
        }
    }

    /// KEYS of `rollback.lua` for one refund line.
    pub fn rollback_line(&self, p: &Id, order: &Id, customer: &Id, event: &Id) -> LineKeys {
        LineKeys {
            promotion: self.promotion(p),
            used: self.used(p, customer),
            record: self.record(p, order),
            memo: self.refund(p, event),
        }
    }

    /// A `SCAN MATCH` pattern for every key of promotion `P`.
    pub fn promotion_pattern(&self, p: &Id) -> String {
        self.tagged(p, &["*"])
    }

    /// A `SCAN MATCH` pattern for every record of promotion `P`.
    pub fn record_pattern(&self, p: &Id) -> String {
        self.tagged(p, &[":order:*"])
    }
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::new("promo")
    }
}

impl LineKeys {
    /// The four keys in KEYS order, moved (one script call per line: no
    /// copy), with room for a fifth (the day index a line script may take).
    pub fn into_vec(self) -> Vec<String> {
        let mut keys = Vec::with_capacity(5);
        keys.extend([self.promotion, self.used, self.record, self.memo]);
        keys
    }

    pub fn as_vec(&self) -> Vec<String> {
        vec![
            self.promotion.clone(),
            self.used.clone(),
            self.record.clone(),
            self.memo.clone(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Id {
        Id::parse(s).unwrap()
    }

    #[test]
    fn layout_matches_the_contract() {
        let k = Keys::default();
        let (p, c, o, e) = (id("flash-42"), id("c-9"), id("o-77"), id("e-1"));
        assert_eq!(k.promotion(&p), "promo:{flash-42}");
        assert_eq!(k.generation(&p), "promo:{flash-42}:gen");
        assert_eq!(k.used(&p, &c), "promo:{flash-42}:used:c-9");
        assert_eq!(k.record(&p, &o), "promo:{flash-42}:order:o-77");
        assert_eq!(k.refund(&p, &e), "promo:{flash-42}:refund:e-1");
        assert_eq!(k.rejected(&p, &e), "promo:{flash-42}:rejected:e-1");
        assert_eq!(k.index(&p, 20_429), "promo:{flash-42}:index:20429");
        assert_eq!(k.index(&p, 0), "promo:{flash-42}:index:0");
        assert_eq!(
            k.index(&p, u64::MAX),
            format!("promo:{{flash-42}}:index:{}", u64::MAX)
        );
        assert_eq!(Keys::new("a").promotion(&p), "a:{flash-42}");
    }

    #[test]
    fn every_key_of_a_line_shares_the_hash_tag() {
        let k = Keys::new("x");
        let line = k.deduct_line(&id("P"), &id("O"), &id("C"), &id("E"));
        for key in line.as_vec() {
            assert!(key.starts_with("x:{P}"), "{key}");
        }
    }
}
