//! The checker: reads the input, outcome and dead-letter topics, the group's
//! committed offsets and Redis, and prints the figures of the run. Every
//! figure marked "must be 0" is a promise of the contract; the check fails
//! when one is not 0.
//!
//! [`check`] runs the phases in turn: read the topics; match every input
//! record with its outcomes and dead letters, and check one decision per
//! event (`delivery`); replay each order through the model (`orders`);
//! compare Redis's records, promotions and counters with the model and the
//! outcomes (`ledger`); then the committed offsets, and the figures.

mod buckets;
mod delivery;
mod ledger;
mod orders;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use deductor::domain::event::{self, Event};
use deductor::domain::keys::Keys;
use deductor::ledger::Ledger;
use deductor_testkit::topics::{self, Read};
use serde::{Deserialize, Serialize};

use crate::kafka;
use crate::operator;
use crate::stack::redis_settings;
use crate::workload::{read_marker, Promo};

/// How the service publishes (`kafka.delivery`), and so what the checker
/// holds it to. With `exactly_once` the outcomes and dead letters are
/// published in Kafka transactions with the consumed offsets: a
/// `read_committed` reader must see exactly one outcome per input record and
/// one dead letter per invalid record. With `at_least_once` a redelivery may
/// publish them again (same decision): their duplicates are information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    #[default]
    #[value(name = "at_least_once")]
    AtLeastOnce,
    #[value(name = "exactly_once")]
    ExactlyOnce,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "at_least_once",
            Delivery::ExactlyOnce => "exactly_once",
        }
    }
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a run's data lives (`run.json`), so a run can be checked again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    pub brokers: String,
    pub input_topic: String,
    pub outcome_topic: String,
    pub dlq_topic: String,
    pub group: String,
    pub redis_url: String,
    pub key_prefix: String,
}

/// The figures, in print order: (name, value, promised zero).
#[derive(Debug, Default, Serialize)]
pub struct Figures {
    /// The rules the run was checked with.
    pub delivery: Delivery,
    pub rows: Vec<(String, i64, bool)>,
    pub histogram_per_record: BTreeMap<String, i64>,
    pub histogram_per_event: BTreeMap<String, i64>,
    pub dead_letter_reasons: BTreeMap<String, i64>,
    pub decisions: BTreeMap<String, i64>,
    pub ledger: Vec<LedgerRow>,
    pub offsets: Vec<(i32, i64, i64)>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct LedgerRow {
    pub promotion: String,
    pub initial: (Option<i64>, Option<i64>),
    pub remaining: (Option<i64>, Option<i64>),
    pub records: (i64, i64),
    pub by_outcomes: (i64, i64),
    pub held: i64,
    pub max_per_customer: i64,
    pub per_customer: Option<i64>,
    pub ok: bool,
}

impl Figures {
    fn row(&mut self, name: &str, v: usize, zero: bool) {
        self.rows.push((name.to_owned(), v as i64, zero));
    }

    pub fn failed(&self) -> Vec<&str> {
        self.rows
            .iter()
            .filter(|(_, v, z)| *z && *v != 0)
            .map(|(n, _, _)| n.as_str())
            .collect()
    }
}

/// What the phases find: the figures, the promised zeros as counted, and
/// the evidence of each broken promise.
#[derive(Default)]
struct Findings {
    figures: Figures,
    zeros: Zeros,
    evidence: Evidence,
}

/// Evidence of each broken promise, written to `anomalies.txt`: at most 50
/// items of each kind, in the order found.
#[derive(Default)]
struct Evidence(BTreeMap<String, Vec<String>>);

impl Evidence {
    fn add(&mut self, what: &str, detail: String) {
        let v = self.0.entry(what.to_owned()).or_default();
        if v.len() < 50 {
            v.push(detail);
        }
    }
}

/// An input record, parsed as the service parses it, with the generator's
/// marker of an invalid event (its expected dead-letter kind, and whether
/// it must also have an `invalid_event` outcome).
struct Input {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    parsed: Result<Event, event::InvalidEvent>,
    marker: Option<(String, bool)>,
}

fn bucket(n: usize) -> String {
    if n >= 4 {
        "4+".to_owned()
    } else {
        n.to_string()
    }
}

/// The promised zeros, as the phases count them.
#[derive(Default)]
struct Zeros {
    lost: usize,
    valid_no_outcome: usize,
    split: usize,
    invalid_split: usize,
    mismatched_event: usize,
    stray: usize,
    malformed_outcomes: usize,
    model_violations: usize,
    /// Orders not verifiable for want of an outcome (not those that broke
    /// the model).
    unverifiable: usize,
    wrong_partition: usize,
    invalid_no_dlq: usize,
    valid_dlq: usize,
    bad_dlq: usize,
    kind_mismatch: usize,
    dlq_payload_mismatch: usize,
    invalid_outcome_missing: usize,
    invalid_outcome_unexpected: usize,
    record_mismatch: usize,
    lost_deductions: usize,
    ledger_mismatch: usize,
    negative: usize,
    negative_in_outcomes: usize,
    above_limit: usize,
    counter_mismatch: usize,
    behind: usize,
}

impl Zeros {
    /// Their rows, in print order.
    fn rows(&self, f: &mut Figures) {
        for (name, v) in [
            ("lost (no outcome, no dead letter)", self.lost),
            ("valid events without an outcome", self.valid_no_outcome),
            ("split decisions (events)", self.split),
            ("split decisions (invalid records)", self.invalid_split),
            (
                "outcomes naming another event than their source",
                self.mismatched_event,
            ),
            ("stray outcomes / dead letters (unknown source)", self.stray),
            ("malformed outcomes", self.malformed_outcomes),
            ("order model violations", self.model_violations),
            ("orders not verifiable (no outcome)", self.unverifiable),
            ("orders spread over partitions", self.wrong_partition),
            ("invalid events without a dead letter", self.invalid_no_dlq),
            ("valid events dead-lettered", self.valid_dlq),
            ("dead letters with missing headers", self.bad_dlq),
            (
                "dead-letter kind differs from the expected",
                self.kind_mismatch,
            ),
            (
                "dead letters not byte-identical to the input",
                self.dlq_payload_mismatch,
            ),
            (
                "invalid_event outcome missing",
                self.invalid_outcome_missing,
            ),
            (
                "unexpected invalid_event outcomes",
                self.invalid_outcome_unexpected,
            ),
            (
                "records that differ from the outcomes",
                self.record_mismatch,
            ),
            (
                "accepted deductions missing from Redis",
                self.lost_deductions,
            ),
            ("ledger mismatches (promotions)", self.ledger_mismatch),
            ("negative remaining (Redis)", self.negative),
            ("negative remaining (outcomes)", self.negative_in_outcomes),
            ("customers above per_customer", self.above_limit),
            (
                "customer counters that differ from held orders",
                self.counter_mismatch,
            ),
            ("partitions with committed offset != log end", self.behind),
        ] {
            f.row(name, v, true);
        }
    }
}

/// How long reading one topic back may take.
const READ_WITHIN: Duration = Duration::from_secs(600);

/// The run's topics as read back, and the group's offsets on the input.
struct Topics {
    inputs: Vec<Input>,
    outcomes: Vec<Read>,
    dlq: Vec<Read>,
    /// Log end and committed offset of each input partition.
    ends: BTreeMap<i32, i64>,
    committed: BTreeMap<i32, i64>,
}

impl Topics {
    async fn read(run: &RunInfo) -> anyhow::Result<Topics> {
        let (b, t) = (run.brokers.clone(), run.input_topic.clone());
        let inputs =
            tokio::task::spawn_blocking(move || topics::read_all(&b, &t, READ_WITHIN)).await??;
        // The outcomes and dead letters as a read_committed consumer sees
        // them: in exactly_once mode what aborted transactions wrote is not
        // there (and the transaction markers take offsets without records).
        let (b, t) = (run.brokers.clone(), run.outcome_topic.clone());
        let outcomes =
            tokio::task::spawn_blocking(move || kafka::read_committed(&b, &t, READ_WITHIN))
                .await??;
        let (b, t) = (run.brokers.clone(), run.dlq_topic.clone());
        let dlq = tokio::task::spawn_blocking(move || kafka::read_committed(&b, &t, READ_WITHIN))
            .await??;
        let (b, t, g) = (
            run.brokers.clone(),
            run.input_topic.clone(),
            run.group.clone(),
        );
        let (ends, committed) = tokio::task::spawn_blocking(move || {
            anyhow::Ok((topics::log_ends(&b, &t)?, kafka::committed(&b, &g, &t)?))
        })
        .await??;
        let inputs = inputs
            .into_iter()
            .map(|r: Read| Input {
                partition: r.partition,
                offset: r.offset,
                parsed: event::parse(&r.payload),
                marker: read_marker(&r.payload),
                key: r.key,
                payload: r.payload,
            })
            .collect();
        Ok(Topics {
            inputs,
            outcomes,
            dlq,
            ends,
            committed,
        })
    }
}

/// Whether the run's faults (`faults.json`, absent before the faults end)
/// include a Redis failover.
fn had_failovers(dir: &Path) -> anyhow::Result<bool> {
    let path = dir.join("faults.json");
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(false);
    };
    let faults: Vec<serde_json::Value> =
        serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?;
    Ok(faults.iter().any(|f| f["kind"] == "failover"))
}

pub async fn check(
    run: &RunInfo,
    promos: &[Promo],
    dir: &Path,
    delivery: Delivery,
) -> anyhow::Result<Figures> {
    let Topics {
        inputs,
        outcomes,
        dlq,
        ends,
        committed,
    } = Topics::read(run).await?;
    let mut found = Findings::default();
    // The operator faults' changes: what they allow, and each promotion's
    // initial amounts in its current incarnation.
    let mut fx = operator::effects(promos, &operator::load(dir)?);
    fx.reasons_lost = had_failovers(dir)?;
    let promos: HashMap<String, Promo> = promos.iter().map(|p| (p.id.clone(), p.clone())).collect();

    let f = &mut found.figures;
    f.delivery = delivery;
    let valid = inputs.iter().filter(|i| i.marker.is_none()).count();
    f.row("input records", inputs.len(), false);
    f.row("  valid events", valid, false);
    f.row("  invalid events", inputs.len() - valid, false);
    f.row("outcome records", outcomes.len(), false);
    f.row("dead-letter records", dlq.len(), false);

    // The topics on their own.
    let sources = delivery::Sources::index(&run.input_topic, &outcomes, &dlq, &mut found);
    delivery::duplicates(&sources, delivery, &mut found);
    delivery::match_inputs(&inputs, &sources, &mut found);
    let first_outcome = delivery::decisions(&inputs, &sources, &mut found);

    // The per-order model.
    let replay = orders::replay(&inputs, &sources, &first_outcome, &promos, &fx, &mut found);

    // Redis against the model and the outcomes.
    let settings = redis_settings(&run.redis_url, &run.key_prefix);
    let ledger = Ledger::connect(&settings)
        .await
        .context("connecting to Redis for the check")?;
    let keys = Keys::new(run.key_prefix.clone());
    let pool = ledger.pool().clone();
    let records = ledger::records(&pool, &keys, &replay, &mut found).await?;
    let refunded = ledger::refunded_by_outcomes(&sources.outcomes, &first_outcome);
    let expected = ledger::Expected {
        promos: &promos,
        fx: &fx,
        replay: &replay,
        records: &records,
        refunded: &refunded,
    };
    let cluster = run.redis_url.starts_with("redis-cluster");
    ledger::promotions(&pool, &keys, &expected, cluster, &mut found).await?;
    buckets::check(
        &ledger,
        &inputs,
        &sources.outcomes,
        &first_outcome,
        &promos,
        &mut found,
    )
    .await?;
    let (noscript, evals) = ledger::script_cache(&pool).await;
    ledger.quit().await;

    let Findings {
        figures: mut f,
        mut zeros,
        evidence,
    } = found;
    for (p, end) in &ends {
        let c = committed.get(p).copied().unwrap_or(-1);
        if c != *end && !(c == -1 && *end == 0) {
            zeros.behind += 1;
        }
        f.offsets.push((*p, c, *end));
    }
    zeros.rows(&mut f);
    f.row(
        "NOSCRIPT replies since the last Redis start",
        noscript as usize,
        false,
    );
    f.row(
        "EVAL fallbacks since the last Redis start",
        evals as usize,
        false,
    );

    let mut text = String::new();
    for (what, items) in &evidence.0 {
        let _ = writeln!(text, "== {what}");
        for i in items {
            let _ = writeln!(text, "  {i}");
        }
    }
    std::fs::write(dir.join("anomalies.txt"), text)?;
    std::fs::write(dir.join("figures.json"), serde_json::to_vec_pretty(&f)?)?;
    Ok(f)
}

fn opt(v: Option<i64>) -> String {
    v.map_or("-".to_owned(), |x| x.to_string())
}

/// The table.
pub fn print(f: &Figures) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{:<52} {:>9}", "figure", "value");
    for (name, v, zero) in &f.rows {
        let mark = if *zero {
            if *v == 0 {
                "  ok (must be 0)"
            } else {
                "  FAIL (must be 0)"
            }
        } else {
            ""
        };
        let _ = writeln!(o, "{name:<52} {v:>9}{mark}");
    }
    let _ = writeln!(
        o,
        "\noutcomes per valid input record: {}",
        hist(&f.histogram_per_record)
    );
    let _ = writeln!(
        o,
        "outcomes per event id:    {}",
        hist(&f.histogram_per_event)
    );
    let _ = writeln!(o, "\ndecisions (first outcome per event):");
    for (k, v) in &f.decisions {
        let _ = writeln!(o, "  {k:<40} {v:>8}");
    }
    let _ = writeln!(o, "\ndead letters by kind:");
    for (k, v) in &f.dead_letter_reasons {
        let _ = writeln!(o, "  {k:<40} {v:>8}");
    }
    let _ = writeln!(
        o,
        "\nledger (budget | stock): initial - remaining == sum of outstanding records \
         == accepted - refunded per the outcomes"
    );
    let _ = writeln!(
        o,
        "  {:<8} {:>21} {:>21} {:>21} {:>21} {:>6} {:>9}  ok",
        "promo", "initial", "remaining", "records", "accepted-refunded", "held", "max/limit"
    );
    for r in &f.ledger {
        let pair = |a: Option<i64>, b: Option<i64>| format!("{} | {}", opt(a), opt(b));
        let _ = writeln!(
            o,
            "  {:<8} {:>21} {:>21} {:>21} {:>21} {:>6} {:>9}  {}",
            r.promotion,
            pair(r.initial.0, r.initial.1),
            pair(r.remaining.0, r.remaining.1),
            pair(Some(r.records.0), Some(r.records.1)),
            pair(Some(r.by_outcomes.0), Some(r.by_outcomes.1)),
            r.held,
            format!("{}/{}", r.max_per_customer, opt(r.per_customer)),
            if r.ok { "yes" } else { "NO" }
        );
    }
    let _ = writeln!(o, "\ncommitted offsets (partition: committed / log end):");
    let parts: Vec<String> = f
        .offsets
        .iter()
        .map(|(p, c, e)| format!("{p}: {c}/{e}"))
        .collect();
    let _ = writeln!(o, "  {}", parts.join("  "));
    o
}

fn hist(h: &BTreeMap<String, i64>) -> String {
    h.iter()
        .map(|(k, v)| format!("{k}x: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
