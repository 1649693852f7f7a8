//! The ledger marker (`promo:ledger`, contract section 2): one string key
//! written once, by the first `promo set`, holding a random creation id and
//! the creation time. A Redis that restarts empty (AOF off) loses it with
//! everything else; `admin::dataset` compares its absence with the consumer
//! group's committed offsets.

use fred::prelude::KeysInterface;
use fred::types::{Expiration, SetOptions};

use super::{Ledger, LedgerError};

/// The marker as stored: `"<id> <created_at>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// 32 hex digits, random.
    pub id: String,
    /// Unix seconds of its creation (0 when the stored value has none).
    pub created_at: i64,
}

impl Marker {
    fn parse(raw: &str) -> Marker {
        let mut parts = raw.split_whitespace();
        let id = parts.next().unwrap_or_default().to_owned();
        let created_at = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
        Marker { id, created_at }
    }
}

impl Ledger {
    /// The marker, `None` when absent.
    pub async fn ledger_marker(&self) -> Result<Option<Marker>, LedgerError> {
        let raw: Option<String> = self
            .pool()
            .get(self.keys().ledger_marker())
            .await
            .map_err(|e| LedgerError::redis("get", e))?;
        Ok(raw.as_deref().map(Marker::parse))
    }

    /// Writes the marker unless it exists (`SET NX`: created once, never
    /// replaced) and returns the stored one.
    pub async fn ensure_ledger_marker(&self) -> Result<Marker, LedgerError> {
        let value = format!(
            "{:032x} {}",
            fastrand::u128(..),
            chrono::Utc::now().timestamp()
        );
        let _: Option<String> = self
            .pool()
            .set(
                self.keys().ledger_marker(),
                value,
                None::<Expiration>,
                Some(SetOptions::NX),
                false,
            )
            .await
            .map_err(|e| LedgerError::redis("set", e))?;
        match self.ledger_marker().await? {
            Some(m) => Ok(m),
            None => Err(LedgerError::malformed(
                "set",
                "the ledger marker vanished right after SET NX",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_writes_and_tolerates_the_rest() {
        assert_eq!(
            Marker::parse("0123abcd 1800000000"),
            Marker {
                id: "0123abcd".into(),
                created_at: 1_800_000_000
            }
        );
        assert_eq!(Marker::parse("x").created_at, 0);
        assert_eq!(Marker::parse("").id, "");
    }
}
