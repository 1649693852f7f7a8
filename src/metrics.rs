//! Every metric deductor records, named in one place (Prometheus
//! conventions: `deductor_` prefix, `_total` counters, `_seconds`
//! histograms, labels with small fixed value sets).
//!
//! Recording goes through the `metrics` facade; with no exporter installed
//! (tests, CLI commands) it costs next to nothing.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{OnceLock, PoisonError, RwLock};

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, Counter, Histogram, Unit,
};
use rdkafka::error::KafkaError;

pub const EVENTS: &str = "deductor_events_total";
pub const DEAD_LETTERS: &str = "deductor_dead_letters_total";
pub const RETRIES: &str = "deductor_retries_total";
pub const REBALANCES: &str = "deductor_rebalances_total";
pub const KAFKA_ERRORS: &str = "deductor_kafka_errors_total";
pub const REDIS_ERRORS: &str = "deductor_redis_errors_total";
pub const CORRUPT: &str = "deductor_corrupt_data_total";
pub const SCRIPT_DURATION: &str = "deductor_script_duration_seconds";
pub const SLOW_SCRIPTS: &str = "deductor_slow_scripts_total";
pub const ASSIGNED: &str = "deductor_assigned_partitions";
pub const IN_FLIGHT: &str = "deductor_in_flight_events";
pub const LAG: &str = "deductor_consumer_lag";
pub const PREFETCH: &str = "deductor_prefetch_bytes";
pub const PREFETCH_WAITING: &str = "deductor_prefetch_waiting_partitions";
pub const PREFETCH_PAUSES: &str = "deductor_prefetch_pauses_total";
pub const PREFETCH_DROPPED: &str = "deductor_prefetch_dropped_bytes_total";
pub const EVENT_DURATION: &str = "deductor_event_duration_seconds";
pub const END_TO_END: &str = "deductor_end_to_end_latency_seconds";
pub const REFUND_CUSTOMER_MISMATCH: &str = "deductor_refund_customer_mismatch_total";
pub const COMMITS: &str = "deductor_offset_commits_total";
pub const TRANSACTIONS: &str = "deductor_transactions_total";
pub const PRODUCER_RENEWALS: &str = "deductor_producer_renewals_total";
pub const START_SKIPPED: &str = "deductor_start_skipped_records_total";
pub const BATCH_LINES: &str = "deductor_batch_lines";
pub const BUILD_INFO: &str = "deductor_build_info";
pub const DLQ_REDRIVES: &str = "deductor_dlq_redrives_total";
pub const REDIS_WAIT: &str = "deductor_redis_wait_seconds";
pub const REDIS_WAIT_SHORTFALLS: &str = "deductor_redis_wait_shortfalls_total";
pub const REDIS_POOL_RECONNECTS: &str = "deductor_redis_pool_reconnects_total";
pub const EVENT_STAGE: &str = "deductor_event_stage_seconds";

/// Registers descriptions and the build info; call once after installing
/// an exporter.
pub fn describe() {
    describe_counter!(
        EVENTS,
        "Events handled, by event type and outcome (outcome type or rejection reason)."
    );
    describe_counter!(
        DEAD_LETTERS,
        "Invalid events sent to the dead-letter topic, by error kind."
    );
    describe_counter!(
        RETRIES,
        "Retries after a transient error, by stage (redis, kafka)."
    );
    describe_counter!(
        REBALANCES,
        "Consumer group rebalances that revoked partitions from this instance."
    );
    describe_counter!(KAFKA_ERRORS, "Kafka client errors, by kind.");
    describe_histogram!(
        BATCH_LINES,
        "Placement lines per deduct_batch.lua call (redis.batch_max_lines)."
    );
    describe_counter!(
        TRANSACTIONS,
        "kafka.delivery = exactly_once: transactions ended, by result (committed, aborted; renewed: the producer was replaced after a fatal error; unfenced: aborted because the group membership was lost, also counted as aborted)."
    );
    describe_counter!(REDIS_ERRORS, "Redis errors, by kind.");
    describe_counter!(
        CORRUPT,
        "Script calls refused because stored promotion data breaks the contract."
    );
    describe_histogram!(
        SCRIPT_DURATION,
        Unit::Seconds,
        "Duration of one Redis script call, by script."
    );
    describe_counter!(
        SLOW_SCRIPTS,
        "Script calls slower than redis.slow_script_ms, by script."
    );
    describe_gauge!(
        ASSIGNED,
        "Partitions of the input topic assigned to this instance."
    );
    describe_gauge!(IN_FLIGHT, "Events started and not yet acknowledged.");
    describe_gauge!(
        LAG,
        "Consumer lag per partition held, from librdkafka statistics; 0 once revoked."
    );
    describe_gauge!(
        PREFETCH,
        "Bytes read ahead in librdkafka's queues of the partitions held (statistics), against kafka.prefetch_budget_kib."
    );
    describe_gauge!(
        PREFETCH_WAITING,
        "Partitions held but paused, waiting for their fetch turn within kafka.prefetch_budget_kib."
    );
    describe_counter!(
        PREFETCH_PAUSES,
        "Partitions paused to keep the partitions fetched at once within kafka.prefetch_budget_kib."
    );
    describe_counter!(
        PREFETCH_DROPPED,
        "Bytes read ahead that those pauses dropped from librdkafka's queues (fetched again on resume)."
    );
    describe_histogram!(
        EVENT_DURATION,
        Unit::Seconds,
        "From the start of an event to its acknowledged outcome."
    );
    describe_histogram!(
        EVENT_STAGE,
        Unit::Seconds,
        "Where an event's time goes, by stage: fetched (the input record's timestamp to its lane taking it from librdkafka), admitted (taken to started: lane capacity, an earlier event of the same order, a transaction boundary, pipeline.max_in_flight), redis (its scripts: batching, the calls and their retries), publish (its outcome or dead letter sent to acknowledged), commit (acknowledged to the commit that covers its offset)."
    );
    describe_histogram!(
        END_TO_END,
        Unit::Seconds,
        "From the input record's timestamp to its outcome or dead letter acknowledged."
    );
    describe_counter!(
        REFUND_CUSTOMER_MISMATCH,
        "Refund lines whose event named another customer than the deduction's (applied to the deduction's)."
    );
    describe_counter!(COMMITS, "Offset commits, by result (ok, error).");
    describe_counter!(
        PRODUCER_RENEWALS,
        "exactly_once: transactional producers replaced under the same transactional.id, by cause (fatal: librdkafka's fatal error; hung: a transaction call that did not return, or a revoke that gave up waiting for one)."
    );
    describe_counter!(
        START_SKIPPED,
        "Records skipped because librdkafka started their partition below the group's committed offset (its reset after an unstable offset read); decided already."
    );
    describe_histogram!(
        REDIS_WAIT,
        Unit::Seconds,
        "Duration of the durability gate's Redis WAIT (redis.wait_replicas > 0), per event."
    );
    describe_counter!(
        REDIS_WAIT_SHORTFALLS,
        "Events whose WAIT found fewer replicas than redis.wait_replicas with their writes (or whose connection changed); each is retried."
    );
    describe_counter!(
        REDIS_POOL_RECONNECTS,
        "Times the Redis pool was reconnected because its calls kept timing out while a new connection answered (a wedged client)."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the labels carry the version, the git commit and the build date."
    );
    describe_counter!(
        DLQ_REDRIVES,
        "Dead letters handled by `deductor dlq replay`, by result (redriven, would_redrive, skipped, failed)."
    );
    gauge!(
        BUILD_INFO,
        "version" => crate::build_info::VERSION,
        "commit" => crate::build_info::COMMIT,
        "build_date" => crate::build_info::BUILD_DATE
    )
    .set(1.0);
}

/// The handles of the metrics recorded for every event or script call,
/// registered with the installed recorder once ([`cache_handles`]) instead of
/// looked up on each record: a lookup of a labelled metric builds its key
/// (three allocations) and hashes it, and an event records seven of them.
struct Hot {
    stages: [Histogram; STAGES.len()],
    event_duration: Histogram,
    end_to_end: Histogram,
    events: RwLock<HashMap<(&'static str, &'static str), Counter>>,
    scripts: RwLock<HashMap<&'static str, Histogram>>,
}

static HOT: OnceLock<Hot> = OnceLock::new();

/// Registers the per-event metrics' handles with the recorder installed
/// now. Call once, after installing the process's global recorder (a
/// handle taken before would record nowhere, for good); until then, and
/// in processes that install none, every record looks its metric up.
pub fn cache_handles() {
    HOT.get_or_init(|| Hot {
        stages: STAGES.map(|s| metrics::histogram!(EVENT_STAGE, "stage" => s)),
        event_duration: metrics::histogram!(EVENT_DURATION),
        end_to_end: metrics::histogram!(END_TO_END),
        events: RwLock::default(),
        scripts: RwLock::default(),
    });
}

/// Runs `f` on the handle cached under `k`, registering it with `make` the
/// first time.
fn with_cached<K: Eq + Hash, H>(
    map: &RwLock<HashMap<K, H>>,
    k: K,
    f: impl FnOnce(&H),
    make: impl FnOnce() -> H,
) {
    if let Some(h) = map.read().unwrap_or_else(PoisonError::into_inner).get(&k) {
        return f(h);
    }
    let mut map = map.write().unwrap_or_else(PoisonError::into_inner);
    f(map.entry(k).or_insert_with(make));
}

pub fn event(event_type: &'static str, outcome: &'static str) {
    let make = || counter!(EVENTS, "type" => event_type, "outcome" => outcome);
    match HOT.get() {
        Some(hot) => with_cached(&hot.events, (event_type, outcome), |c| c.increment(1), make),
        None => make().increment(1),
    }
}

pub fn dead_letter(kind: &'static str) {
    counter!(DEAD_LETTERS, "kind" => kind).increment(1);
}

pub fn dlq_redrive(result: &'static str) {
    counter!(DLQ_REDRIVES, "result" => result).increment(1);
}

pub fn retry(stage: &'static str) {
    counter!(RETRIES, "stage" => stage).increment(1);
}

pub fn rebalance() {
    counter!(REBALANCES).increment(1);
}

pub fn commit(ok: bool) {
    counter!(COMMITS, "result" => if ok { "ok" } else { "error" }).increment(1);
}

pub fn batch_lines(n: usize) {
    metrics::histogram!(BATCH_LINES).record(n as f64);
}

pub fn transaction(result: &'static str) {
    counter!(TRANSACTIONS, "result" => result).increment(1);
}

pub fn producer_renewal(cause: &'static str) {
    counter!(PRODUCER_RENEWALS, "cause" => cause).increment(1);
}

pub fn start_skipped() {
    counter!(START_SKIPPED).increment(1);
}

pub fn assigned(n: usize) {
    gauge!(ASSIGNED).set(n as f64);
}

pub fn in_flight(n: usize) {
    gauge!(IN_FLIGHT).set(n as f64);
}

pub fn event_duration(seconds: f64) {
    match HOT.get() {
        Some(hot) => hot.event_duration.record(seconds),
        None => metrics::histogram!(EVENT_DURATION).record(seconds),
    }
}

/// The stages an event's time is split into (`deductor_event_stage_seconds`'s
/// `stage` label), in the order an event passes them.
pub const STAGES: [&str; 5] = ["fetched", "admitted", "redis", "publish", "commit"];

/// One stage of one event (see [`EVENT_STAGE`]'s description).
pub fn stage(stage: &'static str, seconds: f64) {
    match HOT.get().zip(STAGES.iter().position(|s| *s == stage)) {
        Some((hot, i)) => hot.stages[i].record(seconds),
        None => metrics::histogram!(EVENT_STAGE, "stage" => stage).record(seconds),
    }
}

/// The input record's timestamp to now, in seconds (None: no timestamp, or
/// one from the future).
pub fn since_record(record_timestamp_ms: Option<i64>) -> Option<f64> {
    let ts = record_timestamp_ms?;
    let now = chrono::Utc::now().timestamp_millis();
    (now >= ts).then(|| (now - ts) as f64 / 1000.0)
}

/// From the input record's timestamp (its producer's create time, or the
/// broker's append time) to its outcome or dead letter acknowledged. A
/// record without a timestamp, or one from the future (clock skew), is not
/// recorded.
pub fn end_to_end(record_timestamp_ms: Option<i64>) {
    if let Some(s) = since_record(record_timestamp_ms) {
        match HOT.get() {
            Some(hot) => hot.end_to_end.record(s),
            None => metrics::histogram!(END_TO_END).record(s),
        }
    }
}

pub fn script_duration(script: &'static str, seconds: f64) {
    let make = || metrics::histogram!(SCRIPT_DURATION, "script" => script);
    match HOT.get() {
        Some(hot) => with_cached(&hot.scripts, script, |h| h.record(seconds), make),
        None => make().record(seconds),
    }
}

pub fn slow_script(script: &'static str) {
    counter!(SLOW_SCRIPTS, "script" => script).increment(1);
}

pub fn corrupt_data() {
    counter!(CORRUPT).increment(1);
}

/// A Redis error, by its class (`ErrorClass::as_str`).
pub fn redis_error(kind: &'static str) {
    counter!(REDIS_ERRORS, "kind" => kind).increment(1);
}

/// A refund named another customer than the one its deduction counted for.
pub fn refund_customer_mismatch() {
    counter!(REFUND_CUSTOMER_MISMATCH).increment(1);
}

/// One durability-gate `WAIT` (all nodes of one event), in seconds.
pub fn redis_wait(seconds: f64) {
    metrics::histogram!(REDIS_WAIT).record(seconds);
}

/// The wedge watchdog reconnected the pool ([`crate::ledger::wedge`]).
pub fn redis_pool_reconnected() {
    counter!(REDIS_POOL_RECONNECTS).increment(1);
}

/// An event the durability gate sent back for a retry.
pub fn redis_wait_shortfall() {
    counter!(REDIS_WAIT_SHORTFALLS).increment(1);
}

pub fn consumer_lag(partition: i32, lag: i64) {
    gauge!(LAG, "partition" => partition.to_string()).set(lag as f64);
}

pub fn prefetch_bytes(bytes: u64) {
    gauge!(PREFETCH).set(bytes as f64);
}

pub fn fetch_turns(paused: usize, dropped: u64, waiting: usize) {
    counter!(PREFETCH_PAUSES).increment(paused as u64);
    counter!(PREFETCH_DROPPED).increment(dropped);
    gauge!(PREFETCH_WAITING).set(waiting as f64);
}

/// A partition revoked from this instance reads 0 from then on (until it is
/// assigned again). The `metrics` facade cannot remove one series, and the
/// exporter's idle timeout would also drop the gauges that are set rarely
/// (build info, assigned partitions); 0 is harmless to the group-lag
/// expression `max by (partition)`, which takes the owner's value.
pub fn consumer_lag_revoked(partition: i32) {
    gauge!(LAG, "partition" => partition.to_string()).set(0.0);
}

/// Kafka errors by a small fixed set of kinds.
pub fn kafka_error(e: &KafkaError) {
    let kind = match e {
        KafkaError::MessageProduction(_) => "produce",
        KafkaError::MessageConsumption(_) | KafkaError::MessageConsumptionFatal(_) => "consume",
        KafkaError::ConsumerCommit(_) => "commit",
        KafkaError::Global(_) => "global",
        KafkaError::MetadataFetch(_) => "metadata",
        _ => "other",
    };
    counter!(KAFKA_ERRORS, "kind" => kind).increment(1);
}
