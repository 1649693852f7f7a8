//! The exit code of a failed command ([`exit_code`]), from the kinds of
//! the errors in its chain, never from message text. Documented in
//! docs/operations.md: 0 ok; 1 a check failed, a breach was found, or the
//! command was refused or failed; 2 a usage or configuration error; 3 a
//! dependency (Kafka or Redis) could not be reached.

use rdkafka::error::KafkaError;

use crate::admin::AdminError;
use crate::config::ConfigError;
use crate::ledger::{ErrorClass, LedgerError};

pub use crate::error::{EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE};

/// The command line asked for something malformed (an invalid id, a bad
/// combination of flags): exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Kafka or Redis could not be reached: exit 3.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

/// The exit code of a failed command, from the kinds of the errors in its
/// chain (never from message text): usage and configuration errors 2,
/// unreachable dependencies 3, anything else 1.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.is::<UsageError>() || cause.is::<ConfigError>() {
            return EXIT_USAGE;
        }
        if cause.is::<Unreachable>() {
            return EXIT_UNREACHABLE;
        }
        // AdminError::Ledger is transparent: its LedgerError is not a
        // separate link of the chain.
        let ledger = match cause.downcast_ref::<AdminError>() {
            Some(AdminError::Invalid(_)) => return EXIT_USAGE,
            Some(AdminError::Ledger(l)) => Some(l),
            _ => cause.downcast_ref::<LedgerError>(),
        };
        if let Some(code) = ledger.and_then(redis_exit_code) {
            return code;
        }
        if let Some(code) = cause.downcast_ref::<KafkaError>().and_then(kafka_exit_code) {
            return code;
        }
    }
    EXIT_FAILED
}

/// A Kafka error's code: a refused login or TLS handshake (wrong password,
/// an untrusted certificate) is the configuration's to fix, 2, like wrong
/// Redis credentials; a broker out of reach 3.
pub fn kafka_exit_code(e: &KafkaError) -> Option<u8> {
    if crate::kafka::refused(e) {
        Some(EXIT_USAGE)
    } else if crate::kafka::unreachable(e) {
        Some(EXIT_UNREACHABLE)
    } else {
        None
    }
}

/// A Redis error's code: 3 out of reach, 2 credentials, ACL or TLS
/// settings to fix.
pub fn redis_exit_code(e: &LedgerError) -> Option<u8> {
    match e.class() {
        ErrorClass::Connection | ErrorClass::Timeout | ErrorClass::Busy | ErrorClass::Cluster => {
            Some(EXIT_UNREACHABLE)
        }
        // Wrong credentials, URL or TLS settings: fix the configuration.
        ErrorClass::Auth | ErrorClass::Config => Some(EXIT_USAGE),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Id;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn errors_map_to_the_documented_exit_codes() {
        let usage: anyhow::Error = UsageError("promotion id \"a:b\"".into()).into();
        assert_eq!(exit_code(&usage), EXIT_USAGE);
        let invalid: anyhow::Error = AdminError::Invalid("budget".into()).into();
        assert_eq!(exit_code(&invalid.context("promo set")), EXIT_USAGE);
        let p = Id::parse("p").unwrap();
        let refused: anyhow::Error = AdminError::NotFound(p).into();
        assert_eq!(exit_code(&refused), EXIT_FAILED);
        let down = LedgerError::fake("connect", "io");
        let down: anyhow::Error = anyhow::Error::from(down).context("redis");
        assert_eq!(exit_code(&down), EXIT_UNREACHABLE);
        let wrapped: anyhow::Error =
            AdminError::Ledger(LedgerError::fake("hgetall", "timeout")).into();
        assert_eq!(exit_code(&wrapped), EXIT_UNREACHABLE);
        let auth = LedgerError::fake("connect", "auth");
        assert_eq!(exit_code(&auth.into()), EXIT_USAGE);
        let kafka = KafkaError::MetadataFetch(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(
            exit_code(&anyhow::Error::from(kafka).context("dlq")),
            EXIT_UNREACHABLE
        );
        assert_eq!(exit_code(&anyhow::anyhow!("other")), EXIT_FAILED);
    }
}
