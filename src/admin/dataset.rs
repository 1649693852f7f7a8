//! Is the Redis dataset the one the consumer group has been deciding
//! against? (Issue 25, item 4.) A Redis restarted without AOF comes back
//! empty, and the redelivered events would then be decided afresh
//! (`promotion_not_found`) with no signal anywhere.
//!
//! The first `promo set` writes the ledger marker (`promo:ledger`, created
//! once; [`crate::ledger::marker`]). When the group has committed offsets on
//! the input topic, events were decided against a dataset that had
//! promotions, so it had the marker: the marker gone and no promotion left
//! means the dataset was lost. `check` and `run` warn then, `audit` fails
//! (docs/operations.md, "A lost Redis dataset"). A dataset that predates
//! the marker (promotions, no marker: an upgrade) is not lost: `run` writes
//! its marker.
//!
//! Every offset the service commits carries the marker it last read
//! (`ledger=<id>` as the commit's metadata). So a lost dataset whose
//! promotions were then set again, which writes a new marker, is seen too:
//! the group's commits name another marker than Redis holds
//! ([`Dataset::Replaced`]).

use std::fmt;

use crate::config::KafkaSettings;
use crate::ledger::marker::Marker;
use crate::ledger::store::KeyType;
use crate::ledger::{Ledger, LedgerError};

/// What the marker and the group's offsets say about the dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dataset {
    /// The marker is there.
    Marked(Marker),
    /// No marker and the group has committed nothing: a new deployment.
    Fresh,
    /// No marker but promotions exist: data written before the marker
    /// existed (an upgrade); `run` marks it.
    Unmarked,
    /// No marker, no promotion, and the group has committed offsets on the
    /// input topic: Redis lost the dataset the group's decisions live in.
    Lost { group: String, topic: String },
    /// A marker, but the group's commits name another one: the dataset the
    /// group decided against was replaced (lost, then set again).
    Replaced {
        group: String,
        topic: String,
        committed_against: String,
        now: Marker,
    },
    /// The marker is absent, and the group's offsets or the promotions
    /// could not be read (the reason).
    Unknown(String),
}

impl fmt::Display for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dataset::Marked(m) => {
                let at = chrono::DateTime::from_timestamp(m.created_at, 0)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| "an unknown time".to_owned());
                write!(f, "ledger marker {} created {at}", m.id)
            }
            Dataset::Fresh => f.write_str("no ledger marker yet (the first promo set writes it)"),
            Dataset::Unmarked => f.write_str(
                "no ledger marker, but promotions exist (written before the marker existed); \
                 deductor run writes it",
            ),
            Dataset::Lost { group, topic } => write!(
                f,
                "the ledger marker is gone and no promotion is left, but group {group} has \
                 committed offsets on {topic}: Redis has lost its dataset (restarted without \
                 AOF?); redelivered events would be decided afresh. Stop the service and see \
                 docs/operations.md, \"A lost Redis dataset\""
            ),
            Dataset::Replaced {
                group,
                topic,
                committed_against,
                now,
            } => write!(
                f,
                "group {group} committed offsets on {topic} for events decided against ledger \
                 marker {committed_against}, but Redis holds ledger marker {} (created {}): the \
                 dataset was replaced (lost, then set again?); redelivered events would be \
                 decided afresh. Stop the service and see docs/operations.md, \"A lost Redis \
                 dataset\"",
                now.id,
                chrono::DateTime::from_timestamp(now.created_at, 0)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| "at an unknown time".to_owned())
            ),
            Dataset::Unknown(why) => write!(
                f,
                "no ledger marker, and {why}: cannot say whether Redis lost its dataset \
                 (deductor audit can)"
            ),
        }
    }
}

impl Dataset {
    /// The dataset the group decided against is gone (lost, or replaced):
    /// `audit` fails.
    pub fn is_lost(&self) -> bool {
        matches!(self, Dataset::Lost { .. } | Dataset::Replaced { .. })
    }
}

/// Reads the marker and the group's committed offsets with their metadata
/// (a blocking librdkafka call, off the runtime), and, when the marker is
/// absent, the promotions.
pub async fn judge(ledger: &Ledger, k: &KafkaSettings) -> Result<Dataset, LedgerError> {
    let marker = ledger.ledger_marker().await?;
    let k = k.clone();
    let (group, topic) = (k.group_id.clone(), k.input_topic.clone());
    let commits = tokio::task::spawn_blocking(move || super::check::group_commits(&k))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    if let Some(m) = marker {
        // The group's commits not readable (Kafka away): the marker is all
        // there is to go on.
        let other = commits
            .ok()
            .and_then(|(_, markers)| markers.into_iter().find(|id| *id != m.id));
        return Ok(match other {
            Some(committed_against) => Dataset::Replaced {
                group,
                topic,
                committed_against,
                now: m,
            },
            None => Dataset::Marked(m),
        });
    }
    let committed = commits.map(|(any, _)| any);
    let committed = match committed {
        Ok(c) => c,
        Err(why) => {
            return Ok(Dataset::Unknown(format!(
                "the group's committed offsets could not be read ({why})"
            )))
        }
    };
    if !committed {
        return Ok(Dataset::Fresh);
    }
    let pattern = format!("{}:{{*}}", ledger.keys().prefix());
    // A user without SCAN (the service's least-privilege ACL) cannot tell.
    let promotions = match ledger.scan(&pattern, KeyType::Hash).await {
        Ok(keys) => keys,
        Err(e) => {
            return Ok(Dataset::Unknown(format!(
                "the promotions could not be listed: {e}"
            )))
        }
    };
    if promotions.is_empty() {
        Ok(Dataset::Lost { group, topic })
    } else {
        Ok(Dataset::Unmarked)
    }
}

/// `deductor run` at startup: an ERROR line (at every start) when the
/// dataset was lost, a warning when it cannot be told, and the marker
/// written for a dataset that predates it. Never stops the service: a
/// dependency unreachable here is waited out by the pipeline as ever.
pub async fn at_startup(ledger: &Ledger, k: &KafkaSettings) {
    match judge(ledger, k).await {
        Ok(d @ (Dataset::Lost { .. } | Dataset::Replaced { .. })) => tracing::error!("{d}"),
        Ok(d @ Dataset::Unknown(_)) => tracing::warn!("{d}"),
        Ok(Dataset::Unmarked) => match ledger.ensure_ledger_marker().await {
            Ok(m) => {
                tracing::info!(marker = %m.id, "ledger marker written for the existing dataset")
            }
            Err(e) => tracing::warn!(error = %e, "could not write the ledger marker"),
        },
        Ok(Dataset::Marked(_) | Dataset::Fresh) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the ledger marker"),
    }
}
