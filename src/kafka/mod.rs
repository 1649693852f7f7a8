//! Kafka side: the consumer group, offset watermarks, the producer.

pub mod consumer;
pub mod headers;
pub mod offsets;
pub mod publish;
pub mod publisher;
