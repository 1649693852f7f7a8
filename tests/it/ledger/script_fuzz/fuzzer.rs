//! The fuzzer: random keys, stored values (mostly plausible, often not)
//! and arguments for each call.

use super::*;
use crate::common::redis::{encode_record, TestRedis};
use rand::rngs::StdRng;
use rand::Rng;

pub(super) struct Fuzz {
    pub(super) rng: StdRng,
    pub(super) r: TestRedis,
}

impl Fuzz {
    pub(super) fn pick<'a>(&mut self, xs: &'a [&'a str]) -> &'a str {
        xs[self.rng.random_range(0..xs.len())]
    }

    pub(super) fn huge(&mut self) -> String {
        let n = self.rng.random_range(1_000..200_000);
        if self.rng.random_bool(0.5) {
            "9".repeat(n)
        } else {
            "x".repeat(n)
        }
    }

    /// A stored value: mostly plausible, often not.
    pub(super) fn value(&mut self, plausible: &[&str]) -> String {
        match self.rng.random_range(0..10) {
            0..=3 => self.pick(plausible).to_owned(),
            4..=5 => self.pick(GOOD).to_owned(),
            6..=8 => self.pick(WEIRD).to_owned(),
            _ => self.huge(),
        }
    }

    /// A malformed argument.
    pub(super) fn bad_arg(&mut self) -> String {
        match self.rng.random_range(0..10) {
            0..=6 => self.pick(WEIRD).to_owned(),
            7..=8 => self
                .pick(&[
                    "e:1",
                    "{e}",
                    "e 1",
                    "a-very-long-event-id-that-is-longer-than-sixty-four-characters-xx",
                ])
                .to_owned(),
            _ => self.huge(),
        }
    }

    /// Arguments: all valid three times in four, else one or two malformed.
    pub(super) fn args(&mut self, valid: Vec<String>) -> Vec<String> {
        let mut a = valid;
        if self.rng.random_ratio(1, 4) && !a.is_empty() {
            for _ in 0..self.rng.random_range(1..=2) {
                let i = self.rng.random_range(0..a.len());
                a[i] = self.bad_arg();
            }
        }
        a
    }

    /// HSET that first replaces a key of another type.
    pub(super) async fn hset(&self, key: &str, pairs: &[(&str, &str)]) {
        let mut args = Vec::new();
        for (f, v) in pairs {
            args.push((*f).to_owned());
            args.push((*v).to_owned());
        }
        let body =
            "if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then redis.call('DEL', KEYS[1]) end \
                    return redis.call('HSET', KEYS[1], unpack(ARGV))";
        self.r
            .eval(body, vec![key.to_owned()], args)
            .await
            .expect("hset");
    }

    /// Turns `key` into something of the wrong type (or an empty one).
    pub(super) async fn wrong_type(&mut self, key: &str) {
        let body = match self.rng.random_range(0..4) {
            0 => "redis.call('DEL', KEYS[1]); return redis.call('RPUSH', KEYS[1], 'x')",
            1 => "redis.call('DEL', KEYS[1]); return redis.call('SADD', KEYS[1], 'x')",
            2 => "redis.call('DEL', KEYS[1]); return redis.call('ZADD', KEYS[1], 1, 'x')",
            _ => "redis.call('DEL', KEYS[1]); return redis.call('SET', KEYS[1], 'x')",
        };
        self.r
            .eval(body, vec![key.to_owned()], vec![])
            .await
            .expect("write");
    }

    pub(super) async fn wrong_kind(&mut self, key: &str, want_hash: bool) {
        if want_hash || self.rng.random_bool(0.7) {
            self.wrong_type(key).await;
        } else {
            self.r.del(key).await;
            self.hset(key, &[("a", "1")]).await;
        }
    }

    /// Disturbs the stored state of the keys one script call will touch.
    pub(super) async fn disturb(
        &mut self,
        promo: &str,
        used: &str,
        rec: &str,
        memo: &str,
        refund_memo: bool,
    ) {
        // Start over now and then, so that decisions are reached, not only
        // corrupt data left by earlier calls.
        if self.rng.random_bool(0.4) {
            for k in [used, rec, memo] {
                self.r.del(k).await;
            }
        }
        if self.rng.random_bool(0.35) {
            // A sane promotion, to get decisions too.
            self.r.del(promo).await;
            let mut fields = vec![(
                "status",
                self.pick(&["active", "active", "paused"]).to_owned(),
            )];
            for f in ["budget", "stock", "per_customer"] {
                if self.rng.random_bool(0.7) {
                    fields.push((f, self.pick(GOOD).to_owned()));
                }
            }
            if self.rng.random_bool(0.3) {
                fields.push((
                    "starts_at",
                    self.pick(&["0", "1000", "1800000000"]).to_owned(),
                ));
                fields.push((
                    "ends_at",
                    self.pick(&["1", "2000", "1900000000"]).to_owned(),
                ));
            }
            // Operator changes: an initial amount (refunds never lift the
            // remaining past it) and an incarnation (a re-seed changes it).
            if self.rng.random_bool(0.5) {
                fields.push(("initial_budget", self.pick(GOOD).to_owned()));
                fields.push(("initial_stock", self.pick(GOOD).to_owned()));
            }
            if self.rng.random_bool(0.6) {
                fields.push(("gen", self.pick(&["1", "2"]).to_owned()));
            }
            let f: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            self.hset(promo, &f).await;
        }
        let n = [0, 0, 1, 1, 2][self.rng.random_range(0..5)];
        for _ in 0..n {
            match self.rng.random_range(0..12) {
                0 => {
                    let f = self.pick(&[
                        "budget",
                        "stock",
                        "per_customer",
                        "starts_at",
                        "ends_at",
                        "status",
                        "initial_budget",
                        "initial_stock",
                        "gen",
                    ]);
                    let v = self.value(&["active", "paused", "10", "1", "2"]);
                    self.hset(promo, &[(f, &v)]).await;
                }
                1 => self.wrong_kind(promo, true).await,
                2 => {
                    let v = self.value(&["0", "1", "2"]);
                    self.r.set(used, &v).await;
                }
                3 => self.wrong_kind(used, false).await,
                4 => {
                    // A consistent record.
                    let b0 = self.pick(&["0", "5", "100"]);
                    let s0 = self.pick(&["0", "1", "2"]);
                    let state = self.pick(&["deducted", "deducted", "reverted"]);
                    let (b, s) = if state == "reverted" {
                        ("0", "0")
                    } else {
                        (b0, s0)
                    };
                    let ev = self.pick(&["e1", "e2", "e3"]);
                    self.r.del(rec).await;
                    let mut f = vec![
                        ("state", state),
                        ("budget", b),
                        ("stock", s),
                        ("budget0", b0),
                        ("stock0", s0),
                    ];
                    if state == "deducted" || self.rng.random_bool(0.5) {
                        f.push(("event", ev));
                    }
                    // The fields of this version (older records lack them).
                    if self.rng.random_bool(0.7) {
                        f.push(("customer", self.pick(&["c1", "c2"])));
                        f.push(("counted", self.pick(&["0", "1"])));
                    }
                    if self.rng.random_bool(0.5) {
                        f.push(("gen", self.pick(&["1", "2"])));
                    }
                    if self.rng.random_bool(0.3) {
                        f.push(("absorbed", self.pick(&["e1", "e2", "e3"])));
                    }
                    if self.rng.random_bool(0.3) {
                        let field = self.pick(&["refund:e1", "refund:e2", "refund:e3"]);
                        let v = self.pick(&[
                            "applied 0 0",
                            "applied 1 0",
                            "rejected no_deduction",
                            "rejected exceeds_deducted",
                        ]);
                        f.push((field, v));
                    }
                    // Either layout: the lean string of this version, or the
                    // hash of the previous one (a rolling upgrade).
                    if self.rng.random_bool(0.5) {
                        let h = f
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect();
                        self.r.set(rec, &encode_record(&h)).await;
                    } else {
                        self.hset(rec, &f).await;
                    }
                }
                5 => {
                    let f = self.pick(&[
                        "state",
                        "event",
                        "budget",
                        "stock",
                        "budget0",
                        "stock0",
                        "customer",
                        "counted",
                        "gen",
                        "absorbed",
                        "refund:e1",
                    ]);
                    let v = self.value(&["deducted", "reverted", "e1", "c1", "1", "applied 1 0"]);
                    self.hset(rec, &[(f, &v)]).await;
                }
                6 => self.wrong_kind(rec, true).await,
                7 => {
                    let plausible: &[&str] = if refund_memo {
                        &[
                            "applied 1 0",
                            "applied 0 0",
                            "rejected no_deduction",
                            "rejected already_reverted",
                            "rejected corrupt_promotion",
                        ]
                    } else {
                        &[
                            "accepted",
                            "released",
                            "budget_exceeded",
                            "order_reverted",
                            "corrupt_promotion",
                        ]
                    };
                    let v = self.value(plausible);
                    self.r.set(memo, &v).await;
                }
                8 => self.wrong_kind(memo, false).await,
                _ => {
                    let k = self.pick(&[promo, used, rec, memo]).to_owned();
                    self.r.del(&k).await;
                }
            }
        }
    }
}
