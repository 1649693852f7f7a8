//! Kafka side: the consumer group, offset watermarks, the producer.

pub mod commit;
pub mod consumer;
pub mod headers;
pub mod offsets;
pub mod publisher;
pub mod transaction;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

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
