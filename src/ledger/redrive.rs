//! The redrive notes of `deductor dlq replay` (contract section 2,
//! `promo:redriven:...`): one string per dead letter sent back to the input
//! topic, so that running a replay twice sends each dead letter once.
//! Plain `GET` / `SET` / `DEL`, the commands the operators' ACL user has.

use std::time::Duration;

use fred::prelude::KeysInterface;
use fred::types::{Expiration, SetOptions};

use super::{Ledger, LedgerError};

/// How long a note is kept: longer than a dead-letter topic keeps its
/// records (docs/operations.md suggests 30 days), so a dead letter that can
/// still be read is still known as redriven.
pub const REDRIVE_NOTE_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

impl Ledger {
    /// The note of dead letter `partition@offset` of `dlq_topic`, if any.
    pub async fn redrive_note(
        &self,
        dlq_topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<Option<String>, LedgerError> {
        self.pool()
            .get(self.keys().redriven(dlq_topic, partition, offset))
            .await
            .map_err(|e| LedgerError::redis("get", e))
    }

    /// Writes the note; with `only_new`, only when there is none yet
    /// (`SET NX`: false when another replay has one). Kept for
    /// [`REDRIVE_NOTE_TTL`].
    pub async fn set_redrive_note(
        &self,
        dlq_topic: &str,
        partition: i32,
        offset: i64,
        value: &str,
        only_new: bool,
    ) -> Result<bool, LedgerError> {
        let set: Option<String> = self
            .pool()
            .set(
                self.keys().redriven(dlq_topic, partition, offset),
                value,
                Some(Expiration::EX(REDRIVE_NOTE_TTL.as_secs() as i64)),
                only_new.then_some(SetOptions::NX),
                false,
            )
            .await
            .map_err(|e| LedgerError::redis("set", e))?;
        Ok(set.is_some())
    }

    /// Removes the note (a send that failed gives its claim back).
    pub async fn clear_redrive_note(
        &self,
        dlq_topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), LedgerError> {
        let _: i64 = self
            .pool()
            .del(self.keys().redriven(dlq_topic, partition, offset))
            .await
            .map_err(|e| LedgerError::redis("del", e))?;
        Ok(())
    }
}
