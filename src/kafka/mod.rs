//! Kafka side: the consumer group, offset watermarks, the producer.

pub mod commit;
pub mod consumer;
pub mod headers;
pub mod offsets;
pub mod publisher;
pub mod refusal;
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
