//! `deductor dlq list | show | replay` (the reading and sending are in
//! `admin::dlq`): filters from the flags, reports, the metrics file.

use std::process::ExitCode;

use anyhow::Context as _;

use super::{print_json, Unreachable, UsageError};
use crate::admin::dlq::{self as dl, Verdict};
use crate::cli::{DlqCommand, DlqFilterArgs};
use crate::config::Settings;
use crate::ops::http;

fn dlq_filter(a: &DlqFilterArgs) -> dl::Filter {
    dl::Filter {
        kind: a.kind.clone(),
        partition: a.partition,
        from_offset: a.from_offset,
        to_offset: a.to_offset,
        since_ms: a.since.map(|s| s.saturating_mul(1000)),
        // Inclusive: the whole last second.
        until_ms: a.until.map(|s| s.saturating_mul(1000).saturating_add(999)),
        limit: a.limit,
    }
}

async fn read_dead_letters(
    settings: &Settings,
    filter: dl::Filter,
) -> anyhow::Result<Vec<dl::DeadLetter>> {
    let k = settings.kafka.clone();
    let topic = k.dlq_topic.clone();
    tokio::task::spawn_blocking(move || dl::read(&k, &filter))
        .await
        .context("the dead-letter reader panicked")?
        .with_context(|| format!("reading dead-letter topic {topic}"))
}

/// Runs one `dlq` subcommand.
pub(super) async fn dlq(command: DlqCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    match command {
        DlqCommand::List(a) => {
            let records = read_dead_letters(settings, dlq_filter(&a.filter)).await?;
            if a.output.json() {
                let items: Vec<_> = records.iter().map(dl::DeadLetter::to_json).collect();
                print_json(&serde_json::Value::Array(items));
            } else {
                for r in &records {
                    println!("{}", r.line());
                }
                println!(
                    "{} dead letter(s) in {}",
                    records.len(),
                    settings.kafka.dlq_topic
                );
            }
        }
        DlqCommand::Show(a) => {
            let filter = dl::Filter {
                partition: Some(a.partition),
                from_offset: Some(a.offset),
                to_offset: Some(a.offset),
                ..dl::Filter::default()
            };
            let records = read_dead_letters(settings, filter).await?;
            let Some(r) = records.first() else {
                anyhow::bail!(
                    "no record at {}@{} of {}",
                    a.partition,
                    a.offset,
                    settings.kafka.dlq_topic
                );
            };
            if a.output.json() {
                print_json(&r.to_json());
            } else {
                print!("{}", r.words());
            }
        }
        DlqCommand::Replay(a) => {
            let k = &settings.kafka;
            if k.input_topic == k.dlq_topic {
                return Err(UsageError(format!(
                    "kafka.input_topic and kafka.dlq_topic are both {}: nothing to redrive to",
                    k.input_topic
                ))
                .into());
            }
            let filter = dlq_filter(&a.filter);
            if filter.is_empty() && !a.all {
                return Err(UsageError(
                    "dlq replay needs a filter (--kind, --partition, --from-offset,                      --to-offset, --since, --until, --limit) or --all"
                        .to_owned(),
                )
                .into());
            }
            let metrics = match &a.metrics_file {
                Some(_) => Some(http::install_recorder()?),
                None => None,
            };
            // The redrive notes (each dead letter is sent once) live in Redis.
            let notes = super::connect(settings).await?;
            let records = read_dead_letters(settings, filter).await?;
            let how = dl::Options {
                dry_run: a.dry_run,
                include_invalid: a.include_invalid,
                again: a.again,
            };
            let report = dl::replay(k, &notes, &records, how).await;
            notes.quit().await;
            let report = report.map_err(|e| match e {
                dl::ReplayError::Kafka(e) => anyhow::Error::new(e),
                notes => anyhow::Error::new(notes),
            })?;
            let count = |name: &str| report.iter().filter(|r| r.verdict.as_str() == name).count();
            let (sent, would, skipped, already, failed) = (
                count("redriven"),
                count("would_redrive"),
                count("skipped"),
                count("already_redriven"),
                count("failed"),
            );
            if a.output.json() {
                let items: Vec<_> = report.iter().map(dl::Replayed::to_json).collect();
                print_json(&serde_json::json!({
                    "dry_run": a.dry_run,
                    "input_topic": k.input_topic,
                    "redriven": sent,
                    "would_redrive": would,
                    "skipped": skipped,
                    "already_redriven": already,
                    "failed": failed,
                    "records": items,
                }));
            } else {
                for r in &report {
                    println!("{}", r.line(&k.input_topic));
                }
                if a.dry_run {
                    println!(
                        "dry run: {would} would be redriven to {}, {already} already redriven, \
                         {skipped} still invalid; nothing sent",
                        k.input_topic
                    );
                } else {
                    println!(
                        "{sent} redriven to {}, {already} already redriven (not sent again), \
                         {skipped} skipped (still invalid), {failed} failed",
                        k.input_topic
                    );
                }
            }
            if let (Some(path), Some(handle)) = (&a.metrics_file, metrics) {
                write_file(path, &handle.render())?;
            }
            let unreachable = report.iter().any(|r| {
                matches!(
                    r.verdict,
                    Verdict::Failed {
                        unreachable: true,
                        ..
                    }
                )
            });
            if failed > 0 {
                let e = anyhow::anyhow!(
                    "{failed} of {} dead letter(s) could not be sent",
                    report.len()
                );
                return Err(if unreachable {
                    e.context(Unreachable(format!("kafka {}", k.brokers)))
                } else {
                    e
                });
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to `path` through a temporary file and a rename, so a
/// reader (a textfile collector) never sees half a file.
fn write_file(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}
