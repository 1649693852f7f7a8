//! `deductor check`: the configuration is valid, Kafka answers with the
//! topics, Redis answers and has the scripts. One line per check; secrets
//! never printed.
//!
//! Besides pass / fail, a check may warn about something that works today
//! but can lose or replay data: Redis without AOF or with an evicting
//! `maxmemory-policy`, and a consumer group without committed offsets that
//! `auto.offset.reset=earliest` would start from the beginning of a topic
//! holding records, and a Redis that lost its dataset (the ledger marker
//! gone while the group has committed offsets: [`super::dataset`]).
//! Warnings never fail the check.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::{redact_url, KafkaSettings, Settings};
use crate::error::{EXIT_FAILED, EXIT_UNREACHABLE};
use crate::kafka::consumer::consumer_config;
use crate::ledger::{Ledger, LedgerError};

mod servers;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// A failure's exit code, from the one table in [`crate::exit`]: 3
    /// Kafka or Redis could not be reached, 2 the configuration must change
    /// (credentials refused, a certificate not trusted), else 1. 0 for a
    /// line that did not fail.
    pub code: u8,
}

/// Every check's result, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    fn push(&mut self, name: &'static str, status: Status, detail: String, code: u8) {
        self.lines.push(Line {
            name,
            status,
            detail,
            code,
        });
    }

    fn ok(&mut self, name: &'static str, detail: String) {
        self.push(name, Status::Ok, detail, 0);
    }

    fn warn(&mut self, name: &'static str, detail: String) {
        self.push(name, Status::Warn, detail, 0);
    }

    fn fail(&mut self, name: &'static str, detail: String, unreachable: bool) {
        let code = if unreachable {
            EXIT_UNREACHABLE
        } else {
            EXIT_FAILED
        };
        self.fail_code(name, detail, code);
    }

    /// A failure with the exit code [`crate::exit`] gives its error.
    fn fail_code(&mut self, name: &'static str, detail: String, code: u8) {
        self.push(name, Status::Fail, detail, code.max(EXIT_FAILED));
    }

    /// True when no check failed (warnings allowed).
    pub fn passed(&self) -> bool {
        self.lines.iter().all(|l| l.status != Status::Fail)
    }

    /// 0 passed; else the highest code of the failures: 3 when a
    /// dependency could not be reached, 2 when the configuration must
    /// change (credentials, certificates), else 1.
    pub fn exit_code(&self) -> u8 {
        self.lines
            .iter()
            .filter(|l| l.status == Status::Fail)
            .map(|l| l.code)
            .max()
            .unwrap_or(0)
    }

    /// `ok    name: detail` lines (`WARN`, `FAIL` for the others).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for l in &self.lines {
            let tag = match l.status {
                Status::Ok => "ok   ",
                Status::Warn => "WARN ",
                Status::Fail => "FAIL ",
            };
            out.push_str(&format!("{tag} {}: {}\n", l.name, l.detail));
        }
        out
    }

    pub fn to_json(&self) -> serde_json::Value {
        let checks: Vec<_> = self
            .lines
            .iter()
            .map(|l| {
                serde_json::json!({
                    "name": l.name,
                    "status": l.status.as_str(),
                    "detail": l.detail,
                })
            })
            .collect();
        serde_json::json!({
            "passed": self.passed(),
            "warnings": self.lines.iter().filter(|l| l.status == Status::Warn).count(),
            "checks": checks,
        })
    }
}

/// What Kafka said: the topics and, for the input topic, the group's
/// position.
struct KafkaFacts {
    topics: Vec<(String, usize)>,
    /// The group's position on the input topic, or why it could not be read
    /// (e.g. an ACL without Describe on the group): a warning, not a failure.
    offsets: Result<Uncommitted, String>,
}

struct Uncommitted {
    /// Partitions of the input topic without a committed offset, and the
    /// records they hold (high - low watermark).
    partitions: Vec<(i32, i64)>,
    all: bool,
    /// The ledger marker ids the committed offsets' metadata names.
    markers: BTreeSet<String>,
}

/// A Kafka failure and its exit code.
struct KafkaFailure {
    detail: String,
    code: u8,
}

fn kafka_checks(k: &KafkaSettings) -> Result<KafkaFacts, KafkaFailure> {
    let failed = |detail: String, e: Option<&KafkaError>| KafkaFailure {
        detail,
        code: e
            .and_then(crate::exit::kafka_exit_code)
            .unwrap_or(EXIT_FAILED),
    };
    let mut config = consumer_config(k, None);
    // No statistics: the default context would print them every interval.
    config.set("statistics.interval.ms", "0");
    // The commands build run's clients before this (kafka::build_clients);
    // should librdkafka still refuse, its text goes out without secrets.
    let consumer: BaseConsumer = config.create().map_err(|e| {
        failed(
            crate::kafka::client_error(k, "consumer", &e).to_string(),
            Some(&e),
        )
    })?;
    let md = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| {
            // A refused login (wrong SASL password) reaches a consumer as
            // an error event, while the metadata request only times out
            // as a transport failure, which alone does not say what to
            // fix. The event carries the code, never the password.
            // A refused handshake is first reported as a transport
            // failure, then (on the retry) as what it is: wait up to 2 s
            // for an error that names the cause.
            let mut cause: Option<KafkaError> = None;
            for _ in 0..20 {
                if let Some(Err(c)) = consumer.poll(Duration::from_millis(100)) {
                    let named = names_the_cause(&c);
                    if cause.is_none() || named {
                        cause = Some(c);
                    }
                    if named {
                        break;
                    }
                }
            }
            refused("consumer", k, &e, cause.as_ref())
        })?;
    producer_check(k)?;
    let mut topics = Vec::new();
    let mut input_partitions = Vec::new();
    for t in [&k.input_topic, &k.outcome_topic, &k.dlq_topic] {
        match md.topics().iter().find(|x| x.name() == t.as_str()) {
            Some(x) if x.error().is_none() => {
                topics.push((t.clone(), x.partitions().len()));
                if *t == k.input_topic {
                    input_partitions = x.partitions().iter().map(|p| p.id()).collect();
                }
            }
            _ => {
                return Err(failed(
                    format!("topic {t} does not exist; create it (scripts/dev-stack topic {t} N)"),
                    None,
                ))
            }
        }
    }
    let offsets = uncommitted(&consumer, k, &input_partitions);
    Ok(KafkaFacts { topics, offsets })
}

/// A client context whose librdkafka log lines are rate-limited and whose
/// errors are left to the caller's result.
#[derive(Default)]
struct Quiet(crate::kafka::refusal::LogThrottle);

impl rdkafka::ClientContext for Quiet {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.log(level, fac, message);
    }
    fn error(&self, _error: KafkaError, _reason: &str) {}
}

impl rdkafka::consumer::ConsumerContext for Quiet {}

/// Whether the group has a committed offset on any partition of the input
/// topic (blocking: librdkafka calls). An error names what could not be read.
pub fn group_has_committed(k: &KafkaSettings) -> Result<bool, String> {
    group_commits(k).map(|(any, _)| any)
}

/// Whether the group has committed offsets on the input topic, and the
/// ledger marker ids those commits name (their metadata, `ledger=<id>`).
pub fn group_commits(k: &KafkaSettings) -> Result<(bool, BTreeSet<String>), String> {
    let mut config = consumer_config(k, None);
    config.set("statistics.interval.ms", "0");
    // `run` asks this in the background at start: librdkafka's own lines
    // about a broker that refuses it are rate-limited as the service's are.
    let consumer: BaseConsumer<Quiet> = config
        .create_with_context(Quiet::default())
        .map_err(|e| e.to_string())?;
    let md = consumer
        .fetch_metadata(Some(&k.input_topic), Duration::from_secs(10))
        .map_err(|e| format!("metadata of {} from {}: {e}", k.input_topic, k.brokers))?;
    let partitions: Vec<i32> = md
        .topics()
        .iter()
        .filter(|t| t.name() == k.input_topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Ok((false, BTreeSet::new()));
    }
    uncommitted(&consumer, k, &partitions).map(|u| (!u.all, u.markers))
}

/// Why the metadata request of `client` failed, from the error event that
/// came with it (`cause`), and its exit code: a refused login or TLS
/// handshake is the configuration's to fix (2), anything else is taken as
/// Kafka out of reach (3).
fn refused(
    client: &str,
    k: &KafkaSettings,
    e: &KafkaError,
    cause: Option<&KafkaError>,
) -> KafkaFailure {
    let code = cause
        .and_then(crate::exit::kafka_exit_code)
        .unwrap_or(EXIT_UNREACHABLE);
    let what = match cause.and_then(|c| c.rdkafka_error_code()) {
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
            format!(
                "the broker refused the login (check kafka.{client} sasl.username / sasl.password)"
            )
        }
        Some(RDKafkaErrorCode::SSL) => format!(
            "the TLS handshake failed (check kafka.{client} ssl.ca.location and the brokers' \
             certificates)"
        ),
        _ => String::new(),
    };
    let detail = match cause {
        Some(cause) if !what.is_empty() => {
            format!("{client} metadata from {}: {e}; {what}: {cause}", k.brokers)
        }
        Some(cause) => format!("{client} metadata from {}: {e}; {cause}", k.brokers),
        None => format!("{client} metadata from {}: {e}", k.brokers),
    };
    KafkaFailure { detail, code }
}

/// A refused login or TLS handshake, rather than a transport failure.
fn names_the_cause(e: &KafkaError) -> bool {
    crate::kafka::refused(e)
}

/// Keeps the first error librdkafka reports through the error callback
/// (a producer has no event queue to poll for it).
#[derive(Default)]
struct FirstError(std::sync::Mutex<Option<KafkaError>>);

impl rdkafka::ClientContext for FirstError {
    fn error(&self, error: KafkaError, _reason: &str) {
        let mut first = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // An error that names the cause beats a generic transport failure.
        if first.is_none() || names_the_cause(&error) {
            *first = Some(error);
        }
    }
}

impl rdkafka::producer::ProducerContext for FirstError {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// The producer's own settings reach the brokers: `run` produces with
/// [`kafka.producer`], which may differ from the consumer's (e.g. SASL_SSL
/// set only under `[kafka.consumer]`).
fn producer_check(k: &KafkaSettings) -> Result<(), KafkaFailure> {
    use rdkafka::producer::{BaseProducer, Producer};
    let mut config = crate::kafka::publisher::producer_config(k);
    config.set("statistics.interval.ms", "0");
    // Metadata only: no transaction is started here.
    config.remove("transactional.id");
    let producer: BaseProducer<FirstError> = config
        .create_with_context(FirstError::default())
        .map_err(|e| KafkaFailure {
            detail: format!("producer: {e}"),
            code: crate::exit::kafka_exit_code(&e).unwrap_or(EXIT_FAILED),
        })?;
    let result = producer
        .client()
        .fetch_metadata(Some(&k.outcome_topic), Duration::from_secs(10));
    match result {
        Ok(_) => Ok(()),
        Err(e) => {
            let first = || {
                producer
                    .context()
                    .0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
            };
            for _ in 0..20 {
                if first().as_ref().is_some_and(names_the_cause) {
                    break;
                }
                producer.poll(Duration::from_millis(100));
            }
            let cause = producer
                .context()
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            Err(refused("producer", k, &e, cause.as_ref()))
        }
    }
}

/// The group coordinator is being elected or loaded: ask again.
fn coordinator_moving(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::NotCoordinator | C::CoordinatorLoadInProgress | C::CoordinatorNotAvailable)
    )
}

/// The input partitions the group has no committed offset on, with the
/// records each holds.
fn uncommitted<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    k: &KafkaSettings,
    partitions: &[i32],
) -> Result<Uncommitted, String> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(&k.input_topic, *p);
    }
    // A broker that just started (or a group whose coordinator moves) answers
    // "not coordinator" / "coordinator loading" for a few seconds: transient,
    // so ask again for up to ~10 s before giving up on the question.
    let mut attempt = 0;
    let committed = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Err(e) if attempt < 20 && coordinator_moving(&e) => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            other => {
                break other
                    .map_err(|e| format!("committed offsets of group {}: {e}", k.group_id))?
            }
        }
    };
    let mut out = Vec::new();
    let mut markers = BTreeSet::new();
    for e in committed.elements_for_topic(&k.input_topic) {
        if matches!(e.offset(), Offset::Offset(_)) {
            if let Some(id) = crate::kafka::offsets::ledger_of(e.metadata()) {
                markers.insert(id.to_owned());
            }
            continue;
        }
        let (low, high) = consumer
            .fetch_watermarks(&k.input_topic, e.partition(), Duration::from_secs(10))
            .map_err(|err| format!("watermarks of {}: {err}", k.input_topic))?;
        out.push((e.partition(), (high - low).max(0)));
    }
    Ok(Uncommitted {
        all: out.len() == partitions.len(),
        partitions: out,
        markers,
    })
}

/// Runs every check.
pub async fn run(settings: &Settings) -> Report {
    let mut r = Report::default();
    r.ok(
        "config",
        format!(
            "brokers {}, group {}, redis {}",
            settings.kafka.brokers,
            settings.kafka.group_id,
            redact_url(&settings.redis.url)
        ),
    );
    for w in crate::config::weakened(settings) {
        r.warn("security", w.to_string());
    }

    let k = settings.kafka.clone();
    let kafka = tokio::task::spawn_blocking(move || kafka_checks(&k))
        .await
        .unwrap_or_else(|e| {
            Err(KafkaFailure {
                detail: e.to_string(),
                code: EXIT_FAILED,
            })
        });
    match kafka {
        Ok(facts) => {
            r.ok("kafka", format!("{} answers", settings.kafka.brokers));
            for (t, n) in &facts.topics {
                r.ok("topic", format!("{t} ({n} partitions)"));
            }
            offsets_check(&mut r, &settings.kafka, &facts);
            servers::kafka(&mut r, &settings.kafka).await;
        }
        Err(f) => r.fail_code("kafka", f.detail, f.code),
    }

    match tokio::time::timeout(Duration::from_secs(10), Ledger::connect(&settings.redis)).await {
        Err(_) => r.fail(
            "redis",
            format!("{}: no answer in 10s", redact_url(&settings.redis.url)),
            true,
        ),
        Ok(Err(e)) => {
            let code = ledger_code(&e);
            r.fail_code("redis", e.to_string(), code);
        }
        Ok(Ok(ledger)) => {
            match ledger.ping().await {
                Ok(()) => r.ok(
                    "redis",
                    format!("{} answers", redact_url(&settings.redis.url)),
                ),
                Err(e) => {
                    let code = ledger_code(&e);
                    r.fail_code("redis", e.to_string(), code);
                }
            }
            match ledger.load_scripts().await {
                Ok(()) => r.ok("scripts", "loaded".to_owned()),
                Err(e) => {
                    let code = ledger_code(&e);
                    r.fail_code("scripts", e.to_string(), code);
                }
            }
            durability_check(&mut r, &ledger).await;
            servers::redis(&mut r, &ledger).await;
            dataset_check(&mut r, &ledger, &settings.kafka).await;
            ledger.quit().await;
        }
    }
    r
}

/// The exit code of a Redis failure: the same as any command's.
fn ledger_code(e: &LedgerError) -> u8 {
    crate::exit::redis_exit_code(e).unwrap_or(EXIT_FAILED)
}

/// Warns when the group has no committed offset on input partitions that
/// hold records and `auto.offset.reset` is `earliest` (the default): its
/// first start would replay them all.
fn offsets_check(r: &mut Report, k: &KafkaSettings, facts: &KafkaFacts) {
    let u = match &facts.offsets {
        Ok(u) => u,
        Err(e) => {
            r.warn(
                "offsets",
                format!("{e}; cannot say where the group would start"),
            );
            return;
        }
    };
    let reset = k
        .consumer
        .get("auto.offset.reset")
        .map(String::as_str)
        .unwrap_or("latest");
    let records: i64 = u.partitions.iter().map(|(_, n)| n).sum();
    let group = &k.group_id;
    if u.partitions.is_empty() {
        r.ok("offsets", format!("group {group} has committed offsets"));
    } else if reset != "earliest" && reset != "smallest" && reset != "beginning" {
        r.ok(
            "offsets",
            format!(
                "group {group} has no committed offset on {} partition(s); \
                 auto.offset.reset={reset} starts them at the end",
                u.partitions.len()
            ),
        );
    } else if records == 0 {
        r.ok(
            "offsets",
            format!(
                "group {group} has no committed offset on {} partition(s), which hold no records",
                u.partitions.len()
            ),
        );
    } else {
        let which = if u.all {
            "no committed offsets".to_owned()
        } else {
            let ps: Vec<String> = u.partitions.iter().map(|(p, _)| p.to_string()).collect();
            format!("no committed offset on partition(s) {}", ps.join(","))
        };
        r.warn(
            "offsets",
            format!(
                "group {group} has {which} on {}; with auto.offset.reset=earliest its first \
                 start replays {records} record(s) from the beginning (see docs/operations.md, \
                 \"Replaying from an offset\")",
                k.input_topic
            ),
        );
    }
}

/// The ledger marker against the group's committed offsets
/// ([`super::dataset`]): a lost dataset is a warning here (`audit` fails).
async fn dataset_check(r: &mut Report, ledger: &Ledger, k: &KafkaSettings) {
    use super::dataset::Dataset;
    match super::dataset::judge(ledger, k).await {
        Ok(d @ (Dataset::Lost { .. } | Dataset::Replaced { .. } | Dataset::Unknown(_))) => {
            r.warn("ledger", d.to_string())
        }
        Ok(d) => r.ok("ledger", d.to_string()),
        Err(e) => r.warn(
            "ledger",
            format!("the ledger marker could not be read: {e}"),
        ),
    }
}

/// `INFO persistence` / `INFO memory` of every primary: warns when AOF is
/// off or `maxmemory-policy` may evict keys (records carry TTLs, so even
/// `volatile-*` policies evict them). `INFO` is in the service's ACL; a
/// refusal is a warning too (durability could not be checked).
async fn durability_check(r: &mut Report, ledger: &Ledger) {
    let mut problems = Vec::new();
    for node in ledger.primaries_info().await {
        let name = if node.node.is_empty() {
            String::new()
        } else {
            format!("{} ", node.node)
        };
        match node.info {
            Ok(text) => problems.extend(
                durability_problems(&text)
                    .into_iter()
                    .map(|p| format!("{name}{p}")),
            ),
            Err(e) => problems.push(format!("{name}INFO failed, durability not checked: {e}")),
        }
    }
    if problems.is_empty() {
        r.ok(
            "durability",
            "AOF on, maxmemory-policy noeviction".to_owned(),
        );
    } else {
        r.warn(
            "durability",
            format!(
                "{}: acknowledged deductions can be lost (see docs/operations.md, \"Redis durability\")",
                problems.join("; ")
            ),
        );
    }
}

/// What is not durable in an `INFO` text.
fn durability_problems(info: &str) -> Vec<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    let mut out = Vec::new();
    match field("aof_enabled").as_deref() {
        Some("1") => {}
        Some(_) => out.push("AOF is off (appendonly no)".to_owned()),
        None => out.push("INFO does not say whether AOF is on".to_owned()),
    }
    match field("maxmemory_policy").as_deref() {
        Some("noeviction") | None => {}
        Some(p) => out.push(format!(
            "maxmemory-policy {p} may evict promotion keys (use noeviction)"
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_moving_coordinator_is_asked_again() {
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode as C;
        for code in [
            C::NotCoordinator,
            C::CoordinatorLoadInProgress,
            C::CoordinatorNotAvailable,
        ] {
            assert!(
                super::coordinator_moving(&KafkaError::MetadataFetch(code)),
                "{code:?}"
            );
        }
        assert!(!super::coordinator_moving(&KafkaError::MetadataFetch(
            C::GroupAuthorizationFailed
        )));
    }

    use super::*;

    #[test]
    fn durability_problems_are_named() {
        let good = "# Persistence\r\naof_enabled:1\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n";
        assert!(durability_problems(good).is_empty());
        let bad = "aof_enabled:0\r\nmaxmemory_policy:volatile-lru\r\n";
        let p = durability_problems(bad);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("AOF is off"), "{p:?}");
        assert!(p[1].contains("volatile-lru"), "{p:?}");
    }

    #[test]
    fn exit_codes_prefer_unreachable() {
        let mut r = Report::default();
        r.ok("config", String::new());
        r.warn("durability", String::new());
        assert_eq!(r.exit_code(), 0);
        assert!(r.passed());
        r.fail("kafka", "topic missing".into(), false);
        assert_eq!(r.exit_code(), EXIT_FAILED);
        r.fail("redis", "refused".into(), true);
        assert_eq!(r.exit_code(), EXIT_UNREACHABLE);
        assert_eq!(r.to_json()["passed"], false);
        assert_eq!(r.to_json()["warnings"], 1);
    }
}
