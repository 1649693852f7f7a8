//! The outcome and dead-letter producer: idempotent, `acks=all`. A send
//! returns only once the broker acknowledged the record (G1).
//!
//! Requests are built apart from sending them ([`DeadLetter`], `Outcome`),
//! so the pipeline decides what to send and this module only sends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use tokio::sync::Notify;

use crate::config::KafkaSettings;
use crate::domain::event::InvalidEvent;
use crate::domain::outcome::{Outcome, Source};
use crate::error::Disposition;

/// A failed send, classified.
#[derive(Debug, thiserror::Error)]
#[error("kafka produce to {topic}: {source}")]
pub struct PublishError {
    pub topic: String,
    #[source]
    pub source: KafkaError,
}

impl PublishError {
    pub fn disposition(&self) -> Disposition {
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
#[derive(Default)]
pub struct PublisherContext {
    fatal: Arc<FatalSlot>,
}

#[derive(Default)]
struct FatalSlot {
    failure: Mutex<Option<ClientFailure>>,
    notify: Notify,
}

impl ClientContext for PublisherContext {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::metrics::kafka_error(&error);
        if classify(&error) == Disposition::Fatal {
            tracing::error!(error = %error, reason, "kafka producer: fatal client error");
            let mut slot = self.fatal.failure.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(ClientFailure {
                reason: reason.to_owned(),
                source: error,
            });
            self.fatal.notify.notify_one();
        } else {
            tracing::warn!(error = %error, reason, "kafka producer client error");
        }
    }
}

/// Builds the librdkafka configuration of the producer: the user's
/// pass-through first, then the settings the guarantees depend on.
pub fn producer_config(k: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (key, value) in &k.producer {
        c.set(key, value);
    }
    c.set("bootstrap.servers", &k.brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", k.produce_timeout_ms.to_string());
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
}

#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer<PublisherContext>,
    fatal: Arc<FatalSlot>,
    outcome_topic: String,
    dlq_topic: String,
    group_id: String,
    timeout: Duration,
}

impl Publisher {
    pub fn new(k: &KafkaSettings) -> Result<Publisher, KafkaError> {
        let context = PublisherContext::default();
        let fatal = context.fatal.clone();
        let producer: FutureProducer<PublisherContext> =
            producer_config(k).create_with_context(context)?;
        Ok(Publisher {
            producer,
            fatal,
            outcome_topic: k.outcome_topic.clone(),
            dlq_topic: k.dlq_topic.clone(),
            group_id: k.group_id.clone(),
            // librdkafka fails the record after message.timeout.ms; this only
            // bounds the wait for room in the local queue.
            timeout: Duration::from_millis(k.produce_timeout_ms),
        })
    }

    /// Sends an outcome, keyed by `order_id`, and waits for the ack.
    pub async fn send_outcome(&self, o: &Outcome) -> Result<(), PublishError> {
        let record = FutureRecord::to(&self.outcome_topic)
            .key(o.order_id.as_bytes())
            .payload(o.to_bytes());
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: queued, ack not awaited.
        if crate::pipeline::mutant("no-ack-wait") {
            let queued = self.producer.send_result(record).map(drop);
            return queued.map_err(|(source, _)| PublishError {
                topic: self.outcome_topic.clone(),
                source,
            });
        }
        self.producer
            .send(record, Timeout::After(self.timeout))
            .await
            .map(|_| ())
            .map_err(|(source, _)| PublishError {
                topic: self.outcome_topic.clone(),
                source,
            })
    }

    /// Sends the raw bytes of an invalid event, key kept, with the
    /// `deductor.*` headers of CONTRACT.md section 4, and waits for the ack.
    pub async fn send_dead_letter(&self, d: &DeadLetter<'_>) -> Result<(), PublishError> {
        let partition = d.source.partition.to_string();
        let offset = d.source.offset.to_string();
        let timestamp = d.timestamp_ms.map(|t| t.to_string()).unwrap_or_default();
        let reason = d.error.to_string();
        let headers = OwnedHeaders::new_with_capacity(7)
            .insert(header("deductor.error", &reason))
            .insert(header("deductor.error.kind", d.error.kind.as_str()))
            .insert(header("deductor.source.topic", &d.source.topic))
            .insert(header("deductor.source.partition", &partition))
            .insert(header("deductor.source.offset", &offset))
            .insert(header("deductor.source.timestamp", &timestamp))
            .insert(header("deductor.consumer.group", &self.group_id));
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.dlq_topic).headers(headers);
        if let Some(k) = d.key {
            record = record.key(k);
        }
        if let Some(p) = d.payload {
            record = record.payload(p);
        }
        self.producer
            .send(record, Timeout::After(self.timeout))
            .await
            .map(|_| ())
            .map_err(|(source, _)| PublishError {
                topic: self.dlq_topic.clone(),
                source,
            })
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

    /// Waits for every queued record, for shutdown.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(Timeout::After(timeout))
    }

    pub fn producer(&self) -> &FutureProducer<PublisherContext> {
        &self.producer
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
