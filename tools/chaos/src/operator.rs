//! The operator faults: a live promotion changed while events flow, with the
//! service's own `deductor promo` commands (pause and resume, adjust, a
//! forced re-seed), and corrupt data injected while a consumer is a zombie.
//!
//! Every change is logged to `operator.json` in the run dir, and the checker
//! replays the log ([`effects`]): which promotions may reject a fresh line
//! `promotion_inactive` or `corrupt_promotion`, and each promotion's initial
//! amounts in its current incarnation.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context as _;
use deductor::domain::event::Id;
use deductor::domain::keys::Keys;
use deductor::ledger::Ledger;
use deductor_testkit::rng::Rng;
use deductor_testkit::service;
use fred::prelude::*;
use serde::{Deserialize, Serialize};

use crate::workload::Promo;

/// One change an operator made, as the checker needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Operation {
    Pause {
        promo: String,
    },
    Resume {
        promo: String,
    },
    /// `promo adjust`; `applied` false when the command refused it (then
    /// nothing was written).
    Adjust {
        promo: String,
        budget: Option<i64>,
        stock: Option<i64>,
        applied: bool,
    },
    /// `promo set --force --discard-outstanding` with the definition the run
    /// seeded: a new incarnation with the seeded amounts.
    Reseed {
        promo: String,
    },
    /// A field of the promotion hash overwritten with a non-canonical value.
    Corrupt {
        promo: String,
        field: String,
        value: String,
    },
    /// The field put back as it was (nothing can change it while corrupt).
    Repair {
        promo: String,
        field: String,
    },
}

/// What the operator log means for the checker.
#[derive(Debug, Default)]
pub struct Effects {
    /// Paused by an operator at some moment: a fresh line may be rejected
    /// `promotion_inactive`.
    pub inactive: HashSet<String>,
    /// Corrupt at some moment: a fresh placement line, or a refund line,
    /// may be rejected `corrupt_promotion`.
    pub corrupt: HashSet<String>,
    /// The initial (budget, stock) of each promotion's current incarnation.
    pub initial: HashMap<String, (Option<i64>, Option<i64>)>,
    /// Re-seeded at least once.
    pub reseeded: HashSet<String>,
    /// The run failed Redis over (its `failover` faults): a rejection's
    /// stored reason may be lost with writes that the failed node had not
    /// replicated (they were not acknowledged: the event was not published
    /// yet). A later delivery that then finds a line `released` and no
    /// reason decides the lines after it again, and when none rejects the
    /// event is rejected `order_reverted` on the released line (contract
    /// section 3, "a released line is never deducted again").
    pub reasons_lost: bool,
}

/// Replays the log over the seeded promotions.
pub fn effects(promos: &[Promo], ops: &[Operation]) -> Effects {
    let seeded = |p: &str| {
        promos.iter().find(|x| x.id == p).map_or((None, None), |x| {
            (x.budget.map(|v| v as i64), x.stock.map(|v| v as i64))
        })
    };
    let mut e = Effects {
        initial: promos
            .iter()
            .map(|p| (p.id.clone(), seeded(&p.id)))
            .collect(),
        ..Effects::default()
    };
    for op in ops {
        match op {
            Operation::Pause { promo } => {
                e.inactive.insert(promo.clone());
            }
            Operation::Resume { .. } | Operation::Repair { .. } => {}
            Operation::Corrupt { promo, .. } => {
                e.corrupt.insert(promo.clone());
            }
            Operation::Reseed { promo } => {
                e.reseeded.insert(promo.clone());
                e.initial.insert(promo.clone(), seeded(promo));
            }
            Operation::Adjust {
                promo,
                budget,
                stock,
                applied: true,
            } => {
                let i = e.initial.entry(promo.clone()).or_default();
                if let (Some(x), Some(d)) = (i.0.as_mut(), budget) {
                    *x += d;
                }
                if let (Some(x), Some(d)) = (i.1.as_mut(), stock) {
                    *x += d;
                }
            }
            Operation::Adjust { .. } => {}
        }
    }
    e
}

/// The log of a run dir (none when the run had no operator faults).
pub fn load(dir: &Path) -> anyhow::Result<Vec<Operation>> {
    let path = dir.join("operator.json");
    if !path.exists() {
        return Ok(Vec::new());
    }
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}

/// Runs the operator's commands against the run's Redis and logs them.
pub struct Operator {
    pub bin: PathBuf,
    pub redis_url: String,
    pub key_prefix: String,
    pub promos: Vec<Promo>,
    pub dir: PathBuf,
    pub log: std::sync::Mutex<Vec<Operation>>,
    /// Where a corruption is marked while it lasts, for the auditor.
    pub disturbances: std::sync::Arc<crate::auditor::Disturbances>,
}

impl Operator {
    fn record(&self, op: Operation) -> anyhow::Result<()> {
        let mut log = self.log.lock().expect("operator log lock");
        log.push(op);
        std::fs::write(
            self.dir.join("operator.json"),
            serde_json::to_vec_pretty(&*log)?,
        )?;
        Ok(())
    }

    /// `deductor promo ARGS...` against the run's Redis; its exit code and
    /// output. The dev-stack's `DEDUCTOR_*` variables are not settings, so
    /// they are removed, as for the consumers.
    async fn promo(&self, args: Vec<String>) -> anyhow::Result<(i32, String)> {
        let mut cmd = service::command(&self.bin);
        cmd.arg("promo")
            .args(&args)
            .arg(format!("--redis-url={}", self.redis_url))
            .arg(format!("--set=redis.key_prefix={}", self.key_prefix))
            .stdin(Stdio::null());
        let shown = format!("deductor promo {}", args.join(" "));
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await?
            .with_context(|| format!("running {shown}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.code().unwrap_or(-1), text.trim().to_owned()))
    }

    /// Runs a command that must succeed (exit 0).
    async fn promo_ok(&self, args: Vec<String>) -> anyhow::Result<String> {
        let shown = args.join(" ");
        let (code, text) = self.promo(args).await?;
        anyhow::ensure!(code == 0, "deductor promo {shown}: exit {code}: {text}");
        Ok(text)
    }

    /// A seeded, active promotion at random; with `limited`, one with a
    /// budget or a stock.
    fn pick(&self, rng: &mut Rng, limited: bool) -> Option<Promo> {
        let live: Vec<&Promo> = self
            .promos
            .iter()
            .filter(|p| p.seeded && !p.paused && p.buckets.is_none())
            .filter(|p| !limited || p.budget.is_some() || p.stock.is_some())
            .collect();
        (!live.is_empty()).then(|| live[rng.below(live.len())].clone())
    }

    /// Pause then resume, adjust, or re-seed a live promotion (`n` picks
    /// which, in turn); a pause lasts `hold`.
    pub async fn live_change(
        &self,
        rng: &mut Rng,
        n: usize,
        hold: std::time::Duration,
    ) -> anyhow::Result<String> {
        let change = self.plain_change(rng, n, hold).await?;
        // Every change also rebalances the bucketed promotions while the
        // events flow (issue 28: `promo rebalance` is safe meanwhile).
        let mut rebalanced = Vec::new();
        for p in self
            .promos
            .iter()
            .filter(|p| p.seeded && p.buckets.is_some())
        {
            self.promo_ok(vec!["rebalance".into(), p.id.clone()])
                .await?;
            rebalanced.push(p.id.clone());
        }
        if rebalanced.is_empty() {
            return Ok(change);
        }
        Ok(format!("{change}; rebalanced {}", rebalanced.join(", ")))
    }

    async fn plain_change(
        &self,
        rng: &mut Rng,
        n: usize,
        hold: std::time::Duration,
    ) -> anyhow::Result<String> {
        match n % 3 {
            0 => {
                let Some(p) = self.pick(rng, false) else {
                    return Ok("no live promotion: skipped".to_owned());
                };
                self.promo_ok(vec!["pause".into(), p.id.clone()]).await?;
                self.record(Operation::Pause {
                    promo: p.id.clone(),
                })?;
                tokio::time::sleep(hold).await;
                self.promo_ok(vec!["resume".into(), p.id.clone()]).await?;
                self.record(Operation::Resume {
                    promo: p.id.clone(),
                })?;
                Ok(format!(
                    "promo {} paused for {} ms, resumed",
                    p.id,
                    hold.as_millis()
                ))
            }
            1 => {
                let Some(p) = self.pick(rng, true) else {
                    return Ok("no limited promotion: skipped".to_owned());
                };
                // Mostly more, sometimes less (which may be refused below 0).
                let mut delta = |limit: Option<u64>| {
                    limit.map(|l| {
                        let k = rng.range(1, (l / 10).max(2)) as i64;
                        if rng.chance(0.3) {
                            -k
                        } else {
                            k
                        }
                    })
                };
                let (budget, stock) = (delta(p.budget), delta(p.stock));
                let mut args = vec!["adjust".to_owned(), p.id.clone()];
                if let Some(d) = budget {
                    args.push(format!("--budget={d:+}"));
                }
                if let Some(d) = stock {
                    args.push(format!("--stock={d:+}"));
                }
                let shown = args.join(" ");
                let (code, text) = self.promo(args).await?;
                // 0 adjusted, 1 refused (nothing written); anything else
                // leaves the outcome unknown, which would void the check.
                anyhow::ensure!(
                    code == 0 || code == 1,
                    "deductor promo {shown}: exit {code}: {text}"
                );
                let applied = code == 0;
                self.record(Operation::Adjust {
                    promo: p.id.clone(),
                    budget,
                    stock,
                    applied,
                })?;
                Ok(format!(
                    "promo {} adjusted by budget {budget:?} stock {stock:?}: {}",
                    p.id,
                    if applied { "applied" } else { "refused" }
                ))
            }
            _ => {
                let Some(p) = self.pick(rng, true) else {
                    return Ok("no limited promotion: skipped".to_owned());
                };
                let mut args = vec![
                    "set".to_owned(),
                    p.id.clone(),
                    "--force".to_owned(),
                    "--discard-outstanding".to_owned(),
                ];
                for (flag, v) in [
                    ("budget", p.budget.map(|x| x as i64)),
                    ("stock", p.stock.map(|x| x as i64)),
                    ("per-customer", p.per_customer.map(|x| x as i64)),
                    ("starts-at", p.starts_at),
                    ("ends-at", p.ends_at),
                ] {
                    if let Some(v) = v {
                        args.push(format!("--{flag}={v}"));
                    }
                }
                self.promo_ok(args).await?;
                self.record(Operation::Reseed {
                    promo: p.id.clone(),
                })?;
                Ok(format!(
                    "promo {} re-seeded (forced: a new incarnation)",
                    p.id
                ))
            }
        }
    }

    /// Overwrites a limited promotion's budget or stock with a
    /// non-canonical value, in one step that returns the value it replaced;
    /// `None` when there is no such promotion.
    pub async fn corrupt(&self, rng: &mut Rng) -> anyhow::Result<Option<Corruption>> {
        let Some(p) = self.pick(rng, true) else {
            return Ok(None);
        };
        let field = if p.stock.is_some() { "stock" } else { "budget" };
        let value = ["1e3", "-3", "007", "abc", " 5"][rng.below(5)];
        let ledger = self.connect().await?;
        let key = Keys::new(self.key_prefix.clone()).promotion(&id(&p.id)?);
        // Marked before it is written, so that an audit that sees it is
        // covered; ended once it is put back (or was never written).
        let window = self.disturbances.corrupt_begins(&key, field);
        let script = "local v = redis.call('HGET', KEYS[1], ARGV[1]) \
                      if not v then return false end \
                      redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return v";
        let was: Option<String> = ledger
            .pool()
            .next()
            .eval(script, vec![key.clone()], vec![field, value])
            .await
            .context("corrupting a promotion")?;
        let Some(was) = was else {
            self.disturbances.corrupt_ends(window);
            ledger.quit().await;
            anyhow::bail!("promotion {} has no {field} to corrupt", p.id);
        };
        self.record(Operation::Corrupt {
            promo: p.id.clone(),
            field: field.to_owned(),
            value: value.to_owned(),
        })?;
        Ok(Some(Corruption {
            promo: p.id,
            key,
            field: field.to_owned(),
            value: value.to_owned(),
            was,
            ledger,
            window,
        }))
    }

    /// Puts the corrupted field back. Every script refuses to write a
    /// promotion it finds corrupt, so the value it had is still right.
    pub async fn repair(&self, c: Corruption) -> anyhow::Result<()> {
        let ledger = &c.ledger;
        let script = "if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then \
                      return redis.error_reply('changed while corrupt') end \
                      redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) return 1";
        let _: i64 = ledger
            .pool()
            .next()
            .eval(
                script,
                vec![c.key.clone()],
                vec![c.field.as_str(), c.value.as_str(), c.was.as_str()],
            )
            .await
            .with_context(|| format!("repairing {} {}", c.promo, c.field))?;
        self.disturbances.corrupt_ends(c.window);
        ledger.quit().await;
        self.record(Operation::Repair {
            promo: c.promo.clone(),
            field: c.field.clone(),
        })
    }

    async fn connect(&self) -> anyhow::Result<Ledger> {
        let settings = crate::stack::redis_settings(&self.redis_url, &self.key_prefix);
        Ledger::connect(&settings)
            .await
            .context("connecting to the chaos Redis")
    }
}

fn id(s: &str) -> anyhow::Result<Id> {
    Id::parse(s).map_err(|e| anyhow::anyhow!("{e}"))
}

/// A corrupted field and what it held.
pub struct Corruption {
    pub promo: String,
    key: String,
    pub field: String,
    pub value: String,
    was: String,
    ledger: Ledger,
    /// Its mark in the disturbances.
    window: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promo(id: &str, budget: Option<u64>, stock: Option<u64>) -> Promo {
        Promo {
            id: id.to_owned(),
            budget,
            stock,
            per_customer: None,
            starts_at: None,
            ends_at: None,
            paused: false,
            seeded: true,
            buckets: None,
        }
    }

    #[test]
    fn effects_follow_the_log_in_order() {
        let promos = [
            promo("flash", None, Some(100)),
            promo("combo", Some(500), Some(50)),
        ];
        let adjust = |p: &str, b, s, applied| Operation::Adjust {
            promo: p.to_owned(),
            budget: b,
            stock: s,
            applied,
        };
        let ops = [
            adjust("flash", None, Some(10), true),
            adjust("flash", None, Some(-500), false),
            adjust("combo", Some(-20), Some(5), true),
            Operation::Reseed {
                promo: "combo".into(),
            },
            adjust("combo", Some(7), None, true),
            Operation::Pause {
                promo: "flash".into(),
            },
            Operation::Corrupt {
                promo: "combo".into(),
                field: "stock".into(),
                value: "1e3".into(),
            },
        ];
        let e = effects(&promos, &ops);
        assert_eq!(e.initial["flash"], (None, Some(110)));
        // The re-seed drops the earlier adjustment; the later one counts.
        assert_eq!(e.initial["combo"], (Some(507), Some(50)));
        assert!(e.inactive.contains("flash") && !e.inactive.contains("combo"));
        assert!(e.corrupt.contains("combo") && !e.corrupt.contains("flash"));
        assert!(e.reseeded.contains("combo") && !e.reseeded.contains("flash"));
    }

    #[test]
    fn the_log_round_trips_through_json() {
        let ops = vec![
            Operation::Adjust {
                promo: "p".into(),
                budget: Some(-3),
                stock: None,
                applied: true,
            },
            Operation::Repair {
                promo: "p".into(),
                field: "stock".into(),
            },
        ];
        let back: Vec<Operation> =
            serde_json::from_slice(&serde_json::to_vec(&ops).expect("json")).expect("parse");
        assert_eq!(back, ops);
    }
}
