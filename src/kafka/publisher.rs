//! The outcome and dead-letter producer: idempotent, `acks=all`. A send
//! returns only once the broker acknowledged the record (G1).
//!
//! Requests are built apart from sending them ([`DeadLetter`], `Outcome`),
//! so the pipeline decides what to send and this module only sends.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Header;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use tokio::sync::Notify;

use crate::config::{Delivery, KafkaSettings};
use crate::domain::event::{InvalidEvent, MAX_EVENT_BYTES};
use crate::domain::outcome::{Outcome, Source};
use crate::error::Disposition;
use crate::kafka::headers::{self, EventSpan, Incoming};
use crate::kafka::offsets::Offsets;
use crate::kafka::transaction::{MakeProducer, ProducerSlot, Ticket, Transactions};

/// A failed send, classified.
#[derive(Debug, thiserror::Error)]
#[error("kafka produce to {topic}: {source}")]
pub struct PublishError {
    pub topic: String,
    #[source]
    pub source: KafkaError,
    /// `exactly_once`: the event's transaction was aborted or doomed; it is
    /// not retried here but redone from the committed offset.
    pub stale: bool,
}

impl PublishError {
    pub fn disposition(&self) -> Disposition {
        if self.stale {
            return Disposition::Fatal;
        }
        classify(&self.source)
    }
}

/// One function decides which Kafka errors are worth retrying: matches on
/// error codes, never on message text.
pub fn classify(e: &KafkaError) -> Disposition {
    use RDKafkaErrorCode as C;
    let Some(code) = e.rdkafka_error_code() else {
        // Client-side errors without a code (e.g. a canceled future) are transient.
        return match e {
            KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => Disposition::Fatal,
            _ => Disposition::Retry,
        };
    };
    match code {
        C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::SaslAuthenticationFailed
        | C::Authentication
        | C::UnknownTopic
        | C::UnknownTopicOrPartition
        | C::InvalidConfig
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        | C::MessageSizeTooLarge
        | C::InvalidRecord
        | C::Fatal
        | C::FencedInstanceId => Disposition::Fatal,
        _ => Disposition::Retry,
    }
}

/// True for a record refused for its size: by librdkafka before sending
/// (larger than the producer's `message.max.bytes`) or by the broker
/// (larger than the topic's `max.message.bytes`: MESSAGE_TOO_LARGE, or
/// RECORD_LIST_TOO_LARGE for a batch beyond the segment size).
pub fn too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

/// A client-level error the producer cannot recover from, with librdkafka's
/// reason (which names the broker and the mechanism, never the password).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct ClientFailure {
    pub reason: String,
    #[source]
    pub source: KafkaError,
}

/// The producer's context. librdkafka reports a refused login (wrong SASL
/// password, TLS handshake refused) only through the error callback, while
/// the records wait until `message.timeout.ms` and then fail as a retryable
/// timeout: without this, the pipeline would retry them forever.
///
/// In `exactly_once` mode a producer can be replaced ([`Transactions`]);
/// each one's context carries its generation, and only the current one's
/// errors count.
#[derive(Default)]
pub struct PublisherContext {
    fatal: Arc<FatalSlot>,
    generation: u64,
}

#[derive(Default)]
struct FatalSlot {
    failure: Mutex<Option<ClientFailure>>,
    notify: Notify,
    /// The generation of the current producer.
    current: std::sync::atomic::AtomicU64,
    /// Refused TLS handshakes: fatal once they persist; and the rate
    /// limit of the producer's error lines.
    refusals: Mutex<crate::kafka::refusal::Refusals>,
    log_throttle: crate::kafka::refusal::LogThrottle,
}

impl ClientContext for PublisherContext {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::metrics::kafka_error(&error);
        if self.generation != self.fatal.current.load(std::sync::atomic::Ordering::SeqCst) {
            tracing::debug!(error = %error, reason, "kafka error of a replaced producer");
            return;
        }
        let mut fatal = classify(&error) == Disposition::Fatal;
        // A refused TLS handshake reported as a transport failure counts as
        // the refusal it is (and ends `run` with the same code).
        let handshake = crate::kafka::refused_handshake(&error, reason);
        let error = if handshake {
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::SSL)
        } else {
            error
        };
        if !fatal && crate::kafka::refused(&error) {
            let v = self
                .fatal
                .refusals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .refused(
                    tokio::time::Instant::now(),
                    error
                        .rdkafka_error_code()
                        .unwrap_or(rdkafka::types::RDKafkaErrorCode::SSL),
                );
            if !v.persistent {
                if let Some(times) = v.log {
                    tracing::warn!(error = %error, reason, times, "kafka producer refused; librdkafka retries, the service stops if it persists");
                }
                return;
            }
            fatal = true;
        }
        let mut error = error;
        if !fatal && crate::kafka::unreachable(&error) {
            // Right after a refusal, the connection failures that follow
            // are that refusal repeated (librdkafka reports it once).
            let (v, code) = {
                let mut r = self
                    .fatal
                    .refusals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                (r.continued(tokio::time::Instant::now()), r.code())
            };
            if !v.persistent {
                if let Some(times) = v.log {
                    tracing::warn!(error = %error, reason, times, "kafka producer client error");
                }
                return;
            }
            fatal = true;
            error = KafkaError::Global(code);
        }
        if !fatal {
            let times = self
                .fatal
                .refusals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .quiet(tokio::time::Instant::now());
            if let Some(times) = times {
                tracing::warn!(error = %error, reason, times, "kafka producer client error");
            }
            return;
        }
        tracing::error!(error = %error, reason, "kafka producer: fatal client error");
        let mut slot = self.fatal.failure.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(ClientFailure {
            reason: reason.to_owned(),
            source: error,
        });
        self.fatal.notify.notify_one();
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.fatal.log_throttle.log(level, fac, log_message);
    }
}

/// The producer's default `message.max.bytes`: the broker's default
/// `max.message.bytes` (1 MiB + 12), not librdkafka's 1,000,000, so a dead
/// letter of a record the input topic accepted at the broker default is sent
/// whole when the dead-letter topic is at the default too.
pub const MESSAGE_MAX_BYTES: &str = "1048588";

/// How much of the key and of the value a truncated dead letter keeps: the
/// contract's limit of a whole event, so the kept part is never shorter
/// than any valid event, and the record fits any dead-letter topic that
/// holds the invalid events the service dead-letters whole.
pub const TRUNCATED_BYTES: usize = MAX_EVENT_BYTES;

/// Builds the librdkafka configuration of the producer: our defaults, the
/// user's pass-through, then the settings the guarantees depend on.
pub fn producer_config(k: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("message.max.bytes", MESSAGE_MAX_BYTES);
    for (key, value) in &k.producer {
        c.set(key, value);
    }
    c.set("bootstrap.servers", &k.brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", k.produce_timeout_ms.to_string());
    if k.delivery == Delivery::ExactlyOnce {
        c.set("transactional.id", k.transactional_id());
    }
    c
}

/// The configuration of the operator tools' producers (`publish`, `dlq
/// replay`): [`producer_config`] without `transactional.id` in every
/// delivery mode. They write records to the input topic one by one, which
/// a transaction would not make safer, and the service's
/// `transactional.id` is not theirs to take: `init_transactions` under it
/// would fence the running service's producer and abort its open
/// transaction. Idempotent non-transactional records are visible to
/// `read_committed` readers as soon as they are acknowledged.
pub fn tool_producer_config(k: &KafkaSettings) -> ClientConfig {
    let mut c = producer_config(k);
    c.remove("transactional.id");
    c
}

/// The invalid event's raw record and why it was refused.
pub struct DeadLetter<'a> {
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub error: &'a InvalidEvent,
    pub source: &'a Source,
    /// The source record's timestamp in milliseconds, if it had one.
    pub timestamp_ms: Option<i64>,
    /// The source record's headers and the event's span: kept on the dead letter.
    pub trace: Trace<'a>,
}

#[derive(Clone)]
pub struct Publisher {
    /// Shared with [`Transactions`], which may replace the producer.
    producer: ProducerSlot,
    /// The producer's configuration, for a replacement.
    config: ClientConfig,
    /// Set once in `exactly_once` mode ([`Publisher::start_transactions`]).
    txn: Arc<OnceLock<Arc<Transactions>>>,
    fatal: Arc<FatalSlot>,
    /// `exactly_once`: the source records (topic, partition, offset) whose
    /// whole dead letter the broker refused as too large after it was
    /// queued. That dooms the transaction, and the event is redone after
    /// the rewind: the redo sends it truncated at once (see
    /// [`Publisher::send_dead_letter`]). An entry goes once that is acked.
    cut_on_redo: Arc<Mutex<HashSet<(String, i32, i64)>>>,
    /// `exactly_once`: the outcome ids whose outcome the broker refused as
    /// too large inside a transaction; the redo sends them bare.
    bare_on_redo: Arc<Mutex<HashSet<String>>>,
    outcome_topic: String,
    dlq_topic: String,
    group_id: String,
    ce_source: String,
    timeout: Duration,
}

/// The trace context of one event, for the headers of what it produces.
#[derive(Debug, Clone, Copy)]
pub struct Trace<'a> {
    pub span: &'a EventSpan,
    pub incoming: &'a Incoming,
    /// `exactly_once`: the event's place in the open transaction.
    pub ticket: Option<Ticket>,
}

impl Publisher {
    pub fn new(k: &KafkaSettings) -> Result<Publisher, KafkaError> {
        let context = PublisherContext::default();
        let fatal = context.fatal.clone();
        let config = producer_config(k);
        let producer: FutureProducer<PublisherContext> = config.create_with_context(context)?;
        Ok(Publisher {
            producer: Arc::new(RwLock::new(producer)),
            config,
            txn: Arc::new(OnceLock::new()),
            fatal,
            cut_on_redo: Arc::default(),
            bare_on_redo: Arc::default(),
            outcome_topic: k.outcome_topic.clone(),
            dlq_topic: k.dlq_topic.clone(),
            group_id: k.group_id.clone(),
            ce_source: headers::ce_source(&k.group_id),
            // librdkafka fails the record after message.timeout.ms; this only
            // bounds the wait for room in the local queue.
            timeout: Duration::from_millis(k.produce_timeout_ms),
        })
    }

    /// Sends an outcome, keyed by `order_id`, with its headers
    /// ([`headers::outcome`]), and waits for the ack.
    ///
    /// The copied headers are capped ([`Incoming::read`]), so an outcome is
    /// a few KiB beyond its event. Should the outcome topic refuse it as too
    /// large all the same (a topic with a small `max.message.bytes`), it is
    /// sent again without the copies (`tracestate`, the propagated headers,
    /// named in `deductor.dropped.headers`): an outcome is never lost, nor
    /// is its partition stopped, for what the input record carried. In
    /// `exactly_once` mode a refusal by the broker dooms the transaction;
    /// the redo sends the bare outcome at once.
    pub async fn send_outcome(&self, o: &Outcome, trace: &Trace<'_>) -> Result<(), PublishError> {
        if self.bare_set().contains(&o.outcome_id) {
            let sent = self.send_outcome_as(o, trace, &trace.incoming.bare()).await;
            if sent.is_ok() {
                self.bare_set().remove(&o.outcome_id);
            }
            return sent;
        }
        match self.send_outcome_as(o, trace, trace.incoming).await {
            Err(e) if too_large(&e.source) && e.stale => {
                tracing::warn!(
                    topic = %self.outcome_topic,
                    error = %e.source,
                    "outcome refused as too large inside the transaction: \
                     the transaction is aborted and the redo sends it without the copied headers"
                );
                self.bare_set().insert(o.outcome_id.clone());
                Err(e)
            }
            Err(e) if too_large(&e.source) => {
                tracing::warn!(
                    topic = %self.outcome_topic,
                    error = %e.source,
                    "outcome too large for Kafka: sending it without the copied headers"
                );
                self.send_outcome_as(o, trace, &trace.incoming.bare())
                    .await
                    .inspect_err(|e| {
                        if too_large(&e.source) {
                            tracing::error!(
                                topic = %self.outcome_topic,
                                error = %e.source,
                                "the outcome topic refuses even a bare outcome: \
                                 its max.message.bytes must be at least 256 KiB"
                            );
                        }
                    })
            }
            r => r,
        }
    }

    async fn send_outcome_as(
        &self,
        o: &Outcome,
        trace: &Trace<'_>,
        incoming: &Incoming,
    ) -> Result<(), PublishError> {
        let record = FutureRecord::to(&self.outcome_topic)
            .key(o.order_id.as_bytes())
            .payload(o.to_bytes())
            .headers(headers::outcome(o, &self.ce_source, trace.span, incoming));
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: queued, ack not awaited.
        if crate::mutants::mutant("no-ack-wait") {
            let queued = self.current().send_result(record).map(drop);
            return queued.map_err(|(source, _)| PublishError {
                topic: self.outcome_topic.clone(),
                source,
                stale: false,
            });
        }
        self.deliver(record, &self.outcome_topic, trace.ticket)
            .await
    }

    /// `exactly_once` mode: registers the transactional id and opens the
    /// first transaction (blocking); from then on every send goes into the
    /// open transaction under its event's ticket.
    /// `stall`: the longest a boundary retries its transaction calls
    /// ([`Transactions`]).
    pub fn start_transactions(
        &self,
        offsets: Offsets,
        topic: &str,
        stall: Duration,
    ) -> Result<Arc<Transactions>, KafkaError> {
        let (config, fatal) = (self.config.clone(), self.fatal.clone());
        let make: MakeProducer = Box::new(move || {
            // The new generation first: from now on only its errors count.
            let generation = fatal
                .current
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            *fatal.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
            config.create_with_context(PublisherContext {
                fatal: fatal.clone(),
                generation,
            })
        });
        let txn = Arc::new(Transactions::init(
            self.producer.clone(),
            make,
            offsets,
            topic,
            self.timeout,
            stall,
        )?);
        let _ = self.txn.set(txn.clone());
        Ok(txn)
    }

    /// Queues `record` and waits for the broker's ack. In `exactly_once`
    /// mode it is queued only under a current ticket, and a failed delivery
    /// dooms the transaction (the event is redone after the abort).
    async fn deliver<K, P>(
        &self,
        record: FutureRecord<'_, K, P>,
        topic: &str,
        ticket: Option<Ticket>,
    ) -> Result<(), PublishError>
    where
        K: rdkafka::message::ToBytes + ?Sized,
        P: rdkafka::message::ToBytes + ?Sized,
    {
        let error = |source, stale| PublishError {
            topic: topic.to_owned(),
            source,
            stale,
        };
        let Some(txn) = self.txn.get() else {
            return self
                .current()
                .send(record, Timeout::After(self.timeout))
                .await
                .map(|_| ())
                .map_err(|(source, _)| error(source, false));
        };
        let Some(ticket) = ticket else {
            return Err(error(KafkaError::Canceled, true));
        };
        let deadline = Instant::now() + self.timeout;
        let mut record = record;
        let delivery = loop {
            // The record comes back boxed when it was not queued.
            let queued = txn.admit(&ticket, |producer| {
                producer.send_result(record).map_err(Box::new)
            });
            match queued {
                None => return Err(error(KafkaError::Canceled, true)),
                Some(Ok(d)) => break d,
                Some(Err(refused)) => {
                    let (e, r) = *refused;
                    if unusable(&e) {
                        // The producer is in its fatal state: replaced by
                        // the next boundary, the event redone after it.
                        txn.poison(&format!("produce to {topic} refused: {e}"));
                        return Err(error(e, true));
                    }
                    if e.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull)
                        || Instant::now() >= deadline
                    {
                        // Refused before it was queued (e.g. too large here):
                        // the transaction is unaffected; retried or
                        // dead-lettered as usual.
                        return Err(error(e, false));
                    }
                    record = r;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => {
                if unusable(&e) {
                    txn.poison(&format!("produce to {topic}: {e}"));
                } else {
                    txn.doom(&ticket, &format!("produce to {topic}: {e}"));
                }
                Err(error(e, true))
            }
            Err(_) => {
                txn.doom(&ticket, "delivery report lost");
                Err(error(KafkaError::Canceled, true))
            }
        }
    }

    /// Sends the raw bytes of an invalid event, key kept, with the
    /// `deductor.*` headers of CONTRACT.md section 4, and waits for the ack.
    ///
    /// A record the input topic accepted may be larger than the producer's
    /// `message.max.bytes` or the dead-letter topic's `max.message.bytes`
    /// (neither is known to match the input topic's). When the whole record
    /// is refused for its size, it is sent again cut to [`TRUNCATED_BYTES`]
    /// of value and of key and to [`headers::MAX_TRUNCATED_HEADER_BYTES`]
    /// of the original headers, with `deductor.truncated` and the original
    /// sizes (and `deductor.original.headers.dropped`) in headers: refusing it would stop the partition on that
    /// offset for good (the size error is fatal, so the service would exit
    /// and crash-loop on it).
    ///
    /// In `exactly_once` mode a refusal by the broker comes after the record
    /// was queued in the transaction, which is then doomed: nothing more can
    /// be sent in it. The source offset is remembered, and the redo of the
    /// event after the rewind sends the dead letter truncated at once
    /// (otherwise every redo would be refused again and the pod would stop
    /// making progress).
    pub async fn send_dead_letter(&self, d: &DeadLetter<'_>) -> Result<(), PublishError> {
        let at = (d.source.topic.clone(), d.source.partition, d.source.offset);
        if self.cut_set().contains(&at) {
            let sent = self
                .send_truncated(d, "refused whole in an aborted transaction")
                .await;
            if sent.is_ok() {
                self.cut_set().remove(&at);
            }
            return sent;
        }
        match self.send_dead_letter_as(d, false).await {
            Err(e) if too_large(&e.source) && e.stale => {
                tracing::warn!(
                    topic = %self.dlq_topic,
                    error = %e.source,
                    "dead letter refused as too large inside the transaction: \
                     the transaction is aborted and the redo sends it truncated"
                );
                self.cut_set().insert(at);
                Err(e)
            }
            Err(e) if too_large(&e.source) => self.send_truncated(d, &e.source.to_string()).await,
            r => r,
        }
    }

    fn bare_set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.bare_on_redo.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cut_set(&self) -> std::sync::MutexGuard<'_, HashSet<(String, i32, i64)>> {
        self.cut_on_redo.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The dead letter cut to [`TRUNCATED_BYTES`], after the whole one was
    /// refused for its size (`why`).
    async fn send_truncated(&self, d: &DeadLetter<'_>, why: &str) -> Result<(), PublishError> {
        let size = |b: Option<&[u8]>| b.map_or(0, <[u8]>::len);
        tracing::warn!(
            topic = %self.dlq_topic,
            value_bytes = size(d.payload),
            key_bytes = size(d.key),
            kept_bytes = TRUNCATED_BYTES,
            error = %why,
            "dead letter too large for Kafka: sending it truncated"
        );
        self.send_dead_letter_as(d, true).await.inspect_err(|e| {
            if too_large(&e.source) {
                tracing::error!(
                    topic = %self.dlq_topic,
                    error = %e.source,
                    "the dead-letter topic refuses even a truncated dead letter: \
                     its max.message.bytes must be at least 2 x {TRUNCATED_BYTES} + {} (headers) + 4096",
                    headers::MAX_TRUNCATED_HEADER_BYTES
                );
            }
        })
    }

    /// One attempt: whole, or with key and value cut to [`TRUNCATED_BYTES`].
    async fn send_dead_letter_as(
        &self,
        d: &DeadLetter<'_>,
        truncate: bool,
    ) -> Result<(), PublishError> {
        let partition = d.source.partition.to_string();
        let offset = d.source.offset.to_string();
        let timestamp = d.timestamp_ms.map(|t| t.to_string()).unwrap_or_default();
        let reason = d.error.to_string();
        let value_size = d.payload.map_or(0, <[u8]>::len);
        let key_size = d.key.map_or(0, <[u8]>::len);
        let headers_size = headers::original_bytes(d.trace.incoming);
        // Only a record that is cut says so: one refused only because it
        // shared a batch with a large one is sent whole again.
        let truncate = truncate
            && (key_size.max(value_size) > TRUNCATED_BYTES
                || headers_size > headers::MAX_TRUNCATED_HEADER_BYTES);
        let (value_size_text, key_size_text) = (value_size.to_string(), key_size.to_string());
        let keep = truncate.then_some(headers::MAX_TRUNCATED_HEADER_BYTES);
        let (headers, left_out) = headers::dead_letter(d.trace.span, d.trace.incoming, keep);
        let left_out_text = left_out.to_string();
        let mut headers = headers
            .insert(header("deductor.error", &reason))
            .insert(header("deductor.error.kind", d.error.kind.as_str()))
            .insert(header("deductor.source.topic", &d.source.topic))
            .insert(header("deductor.source.partition", &partition))
            .insert(header("deductor.source.offset", &offset))
            .insert(header("deductor.source.timestamp", &timestamp))
            .insert(header("deductor.consumer.group", &self.group_id));
        if truncate {
            headers = headers
                .insert(header("deductor.truncated", "true"))
                .insert(header("deductor.original.size", &value_size_text));
            if key_size > TRUNCATED_BYTES {
                headers = headers.insert(header("deductor.original.key.size", &key_size_text));
            }
            if left_out > 0 {
                headers = headers.insert(header(headers::ORIGINAL_HEADERS_DROPPED, &left_out_text));
            }
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.dlq_topic).headers(headers);
        if let Some(k) = d.key {
            record = record.key(cut(k, truncate));
        }
        if let Some(p) = d.payload {
            record = record.payload(cut(p, truncate));
        }
        self.deliver(record, &self.dlq_topic, d.trace.ticket).await
    }

    /// Resolves when the producer reported an error it cannot recover from
    /// (see [`PublisherContext`]); the pipeline then stops.
    pub async fn fatal(&self) -> ClientFailure {
        loop {
            let found = self
                .fatal
                .failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(f) = found {
                // Leave a permit for the next caller too.
                self.fatal.notify.notify_one();
                return f;
            }
            self.fatal.notify.notified().await;
        }
    }

    /// Forgets the fatal error reported so far: `exactly_once` mode hands
    /// it to [`Transactions::poison`] instead of stopping.
    pub fn clear_fatal(&self) {
        *self.fatal.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Waits for every queued record, for shutdown.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.current().flush(Timeout::After(timeout))
    }

    /// The current producer (a renewal in `exactly_once` mode replaces it).
    pub fn current(&self) -> FutureProducer<PublisherContext> {
        crate::kafka::transaction::read(&self.producer)
    }
}

/// The producer's own state refuses the record: librdkafka's fatal state
/// (fenced, or an epoch the broker bumped), from which only a new producer
/// recovers.
pub fn unusable(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::Fenced)
    )
}

/// `b`, or its first [`TRUNCATED_BYTES`] when `truncate`.
fn cut(b: &[u8], truncate: bool) -> &[u8] {
    if truncate {
        &b[..b.len().min(TRUNCATED_BYTES)]
    } else {
        b
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarantees_cannot_be_overridden() {
        let mut k = crate::config::Settings::load_from_env(None, &[], Vec::new())
            .unwrap()
            .kafka;
        k.producer.insert("acks".into(), "1".into());
        k.producer
            .insert("enable.idempotence".into(), "false".into());
        let c = producer_config(&k);
        assert_eq!(c.get("acks"), Some("all"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn the_tools_never_take_the_services_transactional_id() {
        let mut k = crate::config::Settings::load_from_env(None, &[], Vec::new())
            .unwrap()
            .kafka;
        k.delivery = Delivery::ExactlyOnce;
        assert!(producer_config(&k).get("transactional.id").is_some());
        let c = tool_producer_config(&k);
        assert_eq!(c.get("transactional.id"), None);
        assert_eq!(c.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn message_max_bytes_is_the_broker_default_unless_set() {
        let mut k = crate::config::Settings::load_from_env(None, &[], Vec::new())
            .unwrap()
            .kafka;
        assert_eq!(
            producer_config(&k).get("message.max.bytes"),
            Some("1048588")
        );
        k.producer
            .insert("message.max.bytes".into(), "4000000".into());
        assert_eq!(
            producer_config(&k).get("message.max.bytes"),
            Some("4000000")
        );
    }

    #[test]
    fn size_refusals_are_recognised() {
        let big = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(too_large(&big));
        let batch = KafkaError::MessageProduction(RDKafkaErrorCode::MessageBatchTooLarge);
        assert!(too_large(&batch));
        let timeout = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert!(!too_large(&timeout));
        assert!(cut(&[7; TRUNCATED_BYTES + 1], true).len() == TRUNCATED_BYTES);
        assert!(cut(&[7; 10], true).len() == 10);
        assert!(cut(&[7; TRUNCATED_BYTES + 1], false).len() == TRUNCATED_BYTES + 1);
    }

    #[test]
    fn transport_errors_retry_and_auth_errors_are_fatal() {
        let timeout = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert_eq!(classify(&timeout), Disposition::Retry);
        let down = KafkaError::MessageProduction(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(classify(&down), Disposition::Retry);
        let auth = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert_eq!(classify(&auth), Disposition::Fatal);
        let sasl = KafkaError::MessageProduction(RDKafkaErrorCode::SaslAuthenticationFailed);
        assert_eq!(classify(&sasl), Disposition::Fatal);
    }
}
