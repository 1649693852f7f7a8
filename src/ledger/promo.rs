//! The operator's promotion scripts (`lua/promo_*.lua`), sent and decoded:
//! `src/admin/` turns their typed replies into answers and refusals.

use super::calls::{self, SetMode};
use super::reply::{self, AdjustReply, DeleteReply, LimitReply, SetReply, StatusReply};
use super::{Ledger, LedgerError};
use crate::domain::event::Id;

impl Ledger {
    /// Writes promotion `p`'s hash from `fields` (`promo_set.lua`). On a
    /// standalone server, where deduct.lua indexes every record it creates
    /// by day, the new incarnation gets `indexed` (today, the first day its
    /// records can be in an index): `audit P` then reads the index instead
    /// of the keyspace.
    pub async fn promo_set(
        &self,
        p: &Id,
        mode: SetMode,
        mut fields: Vec<(&str, String)>,
    ) -> Result<SetReply, LedgerError> {
        if self.shared.ttl.index.is_some() {
            fields.push(("indexed", calls::today().to_string()));
        }
        let call = calls::promo_set(self.keys(), p, mode, fields);
        reply::decode_promo_set(self.run(call, None, p).await?)
    }

    /// Pauses or resumes `p` (`promo_status.lua`).
    pub async fn promo_status(&self, p: &Id, paused: bool) -> Result<StatusReply, LedgerError> {
        let call = calls::promo_status(self.keys(), p, paused);
        reply::decode_promo_status(self.run(call, None, p).await?)
    }

    /// Moves budget and/or stock by signed deltas (`promo_adjust.lua`).
    pub async fn promo_adjust(
        &self,
        p: &Id,
        budget: Option<i64>,
        stock: Option<i64>,
    ) -> Result<AdjustReply, LedgerError> {
        let call = calls::promo_adjust(self.keys(), p, budget, stock);
        reply::decode_promo_adjust(self.run(call, None, p).await?)
    }

    /// Sets or removes the per-customer limit (`promo_limit.lua`).
    pub async fn promo_limit(
        &self,
        p: &Id,
        per_customer: Option<u64>,
    ) -> Result<LimitReply, LedgerError> {
        let call = calls::promo_limit(self.keys(), p, per_customer);
        reply::decode_promo_limit(self.run(call, None, p).await?)
    }

    /// Deletes `p` (`promo_delete.lua`).
    pub async fn promo_delete(&self, p: &Id, force: bool) -> Result<DeleteReply, LedgerError> {
        let call = calls::promo_delete(self.keys(), p, force);
        reply::decode_promo_delete(self.run(call, None, p).await?)
    }
}
