//! Plain reads for the operator tools (`audit`, `promo list`, `order show`,
//! `event show`, `check`): SCAN over every primary, hash and string reads,
//! and `INFO` of every primary. The service's own decisions never use
//! these; they go through the scripts.

use std::collections::HashMap;

use fred::prelude::{ClientLike, ClusterInterface, HashesInterface, KeysInterface};
use fred::types::scan::ScanType;
use fred::types::InfoKind;
use futures::stream::StreamExt;

use super::calls::{self, AuditMode};
use super::reply::{self, AuditReply, Stored};
use super::{Ledger, LedgerError};
use crate::domain::event::Id;
use crate::domain::stored::record_fields;

/// Which keys a [`Ledger::scan`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    Any,
    Hash,
}

/// `INFO persistence` and `INFO memory` of one primary.
#[derive(Debug)]
pub struct NodeInfo {
    /// `host:port` of a Cluster primary; empty for a single server.
    pub node: String,
    /// Both sections' text, or why they could not be read.
    pub info: Result<String, LedgerError>,
}

impl Ledger {
    /// Whether the ledger is a Redis Cluster.
    pub fn is_clustered(&self) -> bool {
        self.pool().next().is_clustered()
    }

    /// Promotion `p`, its records and counters, read at one instant
    /// (`audit.lua`).
    pub async fn audit_read(&self, p: &Id, mode: AuditMode<'_>) -> Result<AuditReply, LedgerError> {
        let call = calls::audit(self.keys(), p, mode);
        reply::decode_audit(self.run(call, None, p).await?)
    }

    /// Every key matching `pattern` (of type `kind`), with `SCAN` (never
    /// `KEYS`), over every primary of a Cluster.
    pub async fn scan(&self, pattern: &str, kind: KeyType) -> Result<Vec<String>, LedgerError> {
        let kind = match kind {
            KeyType::Any => None,
            KeyType::Hash => Some(ScanType::Hash),
        };
        let client = self.pool().next();
        let mut stream = if client.is_clustered() {
            client
                .scan_cluster_buffered(pattern, Some(1000), kind)
                .boxed()
        } else {
            client.scan_buffered(pattern, Some(1000), kind).boxed()
        };
        let mut out = Vec::new();
        while let Some(k) = stream.next().await {
            let k = match k {
                Ok(k) => k,
                Err(e) => return Err(self.scan_error(pattern, e).await),
            };
            if let Some(s) = k.as_str() {
                out.push(s.to_owned());
            }
        }
        Ok(out)
    }

    /// fred reads a refused `SCAN` (`NOPERM`) as a reply of the wrong shape
    /// ("Expected bulk string array from SCAN"): asked once more directly,
    /// the server's own refusal is reported instead, so a missing ACL
    /// permission reads as one (and exits 2, not 1).
    async fn scan_error(&self, pattern: &str, e: fred::error::Error) -> LedgerError {
        use fred::error::ErrorKind;
        use fred::types::{ClusterHash, CustomCommand};
        if matches!(e.kind(), ErrorKind::Protocol | ErrorKind::Parse) {
            let cmd = CustomCommand::new_static("SCAN", ClusterHash::Random, false);
            let args: Vec<fred::prelude::Value> = vec![
                "0".into(),
                "MATCH".into(),
                pattern.into(),
                "COUNT".into(),
                "1".into(),
            ];
            if let Err(direct) = self
                .pool()
                .next()
                .custom::<fred::prelude::Value, _>(cmd, args)
                .await
            {
                return LedgerError::redis("scan", direct);
            }
        }
        LedgerError::redis("scan", e)
    }

    /// Every field of hash `key` (empty when it does not exist).
    pub async fn hash(&self, key: &str) -> Result<HashMap<String, String>, LedgerError> {
        self.pool()
            .hgetall(key)
            .await
            .map_err(|e| LedgerError::redis("hgetall", e))
    }

    /// One field of hash `key`.
    pub async fn hash_field(&self, key: &str, field: &str) -> Result<Option<String>, LedgerError> {
        self.pool()
            .hget(key, field)
            .await
            .map_err(|e| LedgerError::redis("hget", e))
    }

    /// The string at `key`.
    pub async fn string(&self, key: &str) -> Result<Option<String>, LedgerError> {
        self.pool()
            .get(key)
            .await
            .map_err(|e| LedgerError::redis("get", e))
    }

    /// An order record `promo:{P}:order:{O}` in either layout (docs/contract.md
    /// section 2): `Hash` with its fields (the lean string decoded as lib.lua
    /// decodes it, or the previous layout's hash), `String` with a value that
    /// is no record (corrupt), `Other` with another type, or `Absent`.
    /// One `GET` for a lean record or none, as lib.lua's `read_record` reads
    /// it; the type is asked only when the key holds something else.
    pub async fn record(&self, key: &str) -> Result<Stored, LedgerError> {
        match self.pool().get::<Option<String>, _>(key).await {
            Ok(None) => return Ok(Stored::Absent),
            Ok(Some(v)) => {
                return Ok(match record_fields(&v) {
                    Some(h) => Stored::Hash(h),
                    None => Stored::String(v),
                })
            }
            Err(e) if e.details().contains("WRONGTYPE") => {}
            Err(e) => return Err(LedgerError::redis("get", e)),
        }
        let kind: String = self
            .pool()
            .r#type(key)
            .await
            .map_err(|e| LedgerError::redis("type", e))?;
        Ok(match kind.as_str() {
            "none" => Stored::Absent,
            "hash" => Stored::Hash(self.hash(key).await?),
            other => Stored::Other(other.to_owned()),
        })
    }

    /// Whether `key` exists.
    pub async fn exists(&self, key: &str) -> Result<bool, LedgerError> {
        self.pool()
            .exists(key)
            .await
            .map_err(|e| LedgerError::redis("exists", e))
    }

    /// `INFO persistence`, `INFO memory` and `INFO server` of every primary (of the one
    /// server when not a Cluster).
    pub async fn primaries_info(&self) -> Vec<NodeInfo> {
        let client = self.pool().next();
        let mut nodes = vec![None];
        if client.is_clustered() {
            if let Some(state) = client.cached_cluster_state() {
                nodes = state.unique_primary_nodes().into_iter().map(Some).collect();
            }
        }
        let mut out = Vec::with_capacity(nodes.len());
        for node in nodes {
            let info = |kind| {
                let node = node.clone();
                async move {
                    match node {
                        Some(s) => client.with_cluster_node(s).info::<String>(Some(kind)).await,
                        None => client.info::<String>(Some(kind)).await,
                    }
                }
            };
            let text = match (
                info(InfoKind::Persistence).await,
                info(InfoKind::Memory).await,
                info(InfoKind::Server).await,
            ) {
                (Ok(p), Ok(m), Ok(s)) => Ok(format!("{p}\n{m}\n{s}")),
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                    Err(LedgerError::redis("info", e))
                }
            };
            out.push(NodeInfo {
                node: node.map(|s| s.to_string()).unwrap_or_default(),
                info: text,
            });
        }
        out
    }
}
