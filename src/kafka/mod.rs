//! Kafka side: the consumer group, offset watermarks, the producer.

pub mod commit;
pub mod consumer;
pub mod headers;
pub mod membership;
pub mod offsets;
pub mod publisher;
pub mod refusal;
pub mod start;
pub mod transaction;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The brokers refused the client: its login (SASL) or its TLS handshake
/// (a certificate not trusted, a name not in it). Retrying does not help;
/// the configuration must change.
pub fn refused(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::Authentication
                | C::SaslAuthenticationFailed
                | C::SSL
                | C::UnsupportedSASLMechanism
                | C::IllegalSASLState
        )
    )
}

/// A transport failure whose reason is a refused TLS handshake. librdkafka
/// reports a failed certificate check sometimes as an `SSL` error and
/// sometimes only as a broker transport failure, with the handshake's
/// failure in its reason: the reason is all there is to tell them apart.
pub fn refused_handshake(e: &KafkaError, reason: &str) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::BrokerTransportFailure)
        && (reason.contains("certificate verify failed") || reason.contains("SSL handshake failed"))
}

/// Kafka errors that mean the brokers could not be reached (in time).
pub fn unreachable(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::Resolve
                | C::MessageTimedOut
                | C::OperationTimedOut
                | C::RequestTimedOut
                | C::NetworkException
                | C::BrokerNotAvailable
                | C::LeaderNotAvailable
        )
    )
}

/// Builds both librdkafka clients exactly as `run` configures them
/// ([`consumer::consumer_config`], [`publisher::producer_config`]) and drops
/// them: librdkafka's own validation (unknown properties, values out of
/// range such as `kafka.produce_timeout_ms` past `message.timeout.ms`'s
/// maximum, conflicting settings) becomes a configuration error naming the
/// setting to fix. `check`, `run`, `publish` and `dlq` call it first, so
/// `check` accepts exactly what `run` accepts. No broker is contacted
/// before the clients are dropped.
pub fn build_clients(k: &crate::config::KafkaSettings) -> Result<(), crate::config::ConfigError> {
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::producer::BaseProducer;
    consumer::consumer_config(k, None)
        .create::<BaseConsumer>()
        .map(drop)
        .map_err(|e| client_error(k, "consumer", &e))?;
    publisher::producer_config(k)
        .create::<BaseProducer>()
        .map(drop)
        .map_err(|e| client_error(k, "producer", &e))
}

/// The configuration error of a client librdkafka refused to create: the
/// setting behind the property (the settings the service sets itself map
/// back to their own keys), and the problem without any secret-looking
/// value.
pub fn client_error(
    k: &crate::config::KafkaSettings,
    client: &str,
    e: &KafkaError,
) -> crate::config::ConfigError {
    use crate::config::is_secret_property;
    let fix = "correct or remove the setting (librdkafka's CONFIGURATION.md lists the \
               properties and their ranges)";
    // Every secret-looking pass-through value, and every value of a
    // property librdkafka does not know (a misspelled secret), is cut out
    // of librdkafka's text.
    let props = if client == "consumer" {
        &k.consumer
    } else {
        &k.producer
    };
    let scrub = |text: &str, unknown: Option<&str>| -> String {
        // One line (librdkafka ends some texts with a line break).
        let mut out = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for (name, value) in props {
            if !value.is_empty() && (is_secret_property(name) || unknown == Some(name.as_str())) {
                out = out.replace(value.as_str(), "***");
            }
        }
        out
    };
    match e {
        KafkaError::ClientConfig(code, desc, prop, _value) => {
            let unknown = matches!(code, rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN);
            let key = match prop.as_str() {
                "message.timeout.ms" if client == "producer" => {
                    "kafka.produce_timeout_ms".to_owned()
                }
                "bootstrap.servers" => "kafka.brokers".to_owned(),
                "group.id" => "kafka.group_id".to_owned(),
                "group.instance.id" => "kafka.group_instance_id".to_owned(),
                "transactional.id" => "kafka.transactional_id".to_owned(),
                other => format!("kafka.{client}.\"{other}\""),
            };
            crate::config::ConfigError::Client {
                key,
                problem: scrub(desc, unknown.then_some(prop.as_str())),
                fix,
            }
        }
        other => crate::config::ConfigError::Client {
            key: format!("kafka.{client}"),
            problem: scrub(&other.to_string(), None),
            fix,
        },
    }
}

#[cfg(test)]
mod refused_tests {
    use super::*;

    #[test]
    fn a_handshake_refused_as_a_transport_failure_is_a_refusal() {
        let transport = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(refused_handshake(
            &transport,
            "sasl_ssl://127.0.0.1:9095/bootstrap: error:0A000086:SSL routines::certificate verify failed (after 5ms in state SSL_HANDSHAKE)"
        ));
        assert!(!refused_handshake(
            &transport,
            "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
        ));
        let down = KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        assert!(!refused_handshake(&down, "SSL handshake failed"));
    }
}

#[cfg(test)]
mod codec_tests {
    /// Every compression codec docs/operations.md offers is built into
    /// librdkafka: `zstd` was refused at start ("libzstd not available at
    /// build time") before rdkafka's zstd feature was turned on.
    #[test]
    fn every_documented_compression_codec_is_accepted() {
        for codec in ["none", "lz4", "zstd", "gzip", "snappy"] {
            let mut k = crate::config::Settings::load_from_env(None, &[], Vec::new())
                .unwrap()
                .kafka;
            k.producer.insert("compression.type".into(), codec.into());
            assert!(
                super::build_clients(&k).is_ok(),
                "compression.type={codec} refused: {:?}",
                super::build_clients(&k).err()
            );
        }
        let mut k = crate::config::Settings::load_from_env(None, &[], Vec::new())
            .unwrap()
            .kafka;
        k.producer
            .insert("compression.type".into(), "brotli".into());
        assert!(
            super::build_clients(&k).is_err(),
            "an unknown codec is refused"
        );
    }
}
