//! Topic creation: fresh input, outcome and dead-letter topics for a run.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;

/// One topic to create.
pub struct Topic<'a> {
    pub name: &'a str,
    pub partitions: i32,
    /// Broker append timestamps (`LogAppendTime`): a record's timestamp is
    /// when the broker wrote it.
    pub append_time: bool,
}

/// Creates the topics (an existing one is kept) and waits up to `wait`
/// until every partition has a leader.
pub async fn create(brokers: &str, topics: &[Topic<'_>], wait: Duration) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("admin client")?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            let n = NewTopic::new(t.name, t.partitions, TopicReplication::Fixed(1));
            if t.append_time {
                n.set("message.timestamp.type", "LogAppendTime")
            } else {
                n
            }
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics(&new, &opts).await? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => bail!("creating topic {t}: {code}"),
        }
    }
    let deadline = Instant::now() + wait;
    for t in topics {
        loop {
            let md = admin
                .inner()
                .fetch_metadata(Some(t.name), Duration::from_secs(5))?;
            let ready = md.topics().first().is_some_and(|m| {
                m.partitions().len() == t.partitions as usize
                    && m.partitions().iter().all(|p| p.leader() >= 0)
            });
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "topic {} has no leader for every partition after {} s",
                    t.name,
                    wait.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
