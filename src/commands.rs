//! What each subcommand does, on top of the library, and the exit code of
//! an error ([`exit_code`]).

use std::io::BufReader;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::admin::promo::{self as promos, Adjustment, Change};
use crate::admin::{self, AdminError, PromoSpec};
use crate::cli::{
    Command, DlqCommand, DlqFilterArgs, EventCommand, Limit, LookupArgs, OrderCommand, PromoCommand,
};
use crate::config::{ConfigError, Settings};
use crate::domain::event::Id;
use crate::ledger::{ErrorClass, Ledger, LedgerError};
use crate::ops::http;
use crate::pipeline::{self, Status};
use crate::shutdown;

/// Exit code: a check failed, a breach was found, or the command was
/// refused or failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code: a usage or configuration error.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: a dependency (Kafka or Redis) could not be reached.
pub const EXIT_UNREACHABLE: u8 = 3;

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
        if cause
            .downcast_ref::<KafkaError>()
            .is_some_and(kafka_unreachable)
        {
            return EXIT_UNREACHABLE;
        }
    }
    EXIT_FAILED
}

fn redis_exit_code(e: &LedgerError) -> Option<u8> {
    match e.class() {
        ErrorClass::Connection | ErrorClass::Timeout | ErrorClass::Busy | ErrorClass::Cluster => {
            Some(EXIT_UNREACHABLE)
        }
        // Wrong credentials, URL or TLS settings: fix the configuration.
        ErrorClass::Auth | ErrorClass::Config => Some(EXIT_USAGE),
        _ => None,
    }
}

/// Kafka errors that mean the brokers could not be reached (in time).
pub fn kafka_unreachable(e: &KafkaError) -> bool {
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

pub(crate) fn promotion_id(s: &str) -> anyhow::Result<Id> {
    Id::parse(s).map_err(|rule| UsageError(format!("promotion id {s:?}: {rule}")).into())
}

async fn connect(settings: &Settings) -> anyhow::Result<Ledger> {
    Ledger::connect(&settings.redis).await.context("redis")
}

/// Prints a JSON document; a closed stdout (`| head`) is not an error.
pub(crate) fn print_json(v: &serde_json::Value) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{v:#}");
}

pub async fn execute(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run { .. } => {
            run(settings).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(output) => {
            let report = crate::ops::check::run(&settings).await;
            if output.json() {
                print_json(&report.to_json());
            } else {
                print!("{}", report.text());
            }
            Ok(ExitCode::from(report.exit_code()))
        }
        Command::Promo(c) => promo(c, &settings).await,
        Command::Dlq(c) => dlq(c, &settings).await,
        Command::Order(OrderCommand::Show(a)) => lookup(a, &settings, false).await,
        Command::Event(EventCommand::Show(a)) => lookup(a, &settings, true).await,
        Command::Publish(a) => {
            let topic = a
                .topic
                .unwrap_or_else(|| settings.kafka.input_topic.clone());
            let n = match a.file.as_deref() {
                None => {
                    crate::kafka::publish::publish(&settings.kafka, &topic, std::io::stdin().lock())
                        .await?
                }
                Some(p) if p.as_os_str() == "-" => {
                    crate::kafka::publish::publish(&settings.kafka, &topic, std::io::stdin().lock())
                        .await?
                }
                Some(p) => {
                    let f = std::fs::File::open(p)
                        .with_context(|| format!("opening {}", p.display()))?;
                    crate::kafka::publish::publish(&settings.kafka, &topic, BufReader::new(f))
                        .await?
                }
            };
            println!("published {n} events to {topic}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit(a) => {
            let ledger = connect(&settings).await?;
            let ids = a
                .promotions
                .iter()
                .map(|p| promotion_id(p))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let clean = if a.output.json() {
                audit_json(&ledger, &ids).await?
            } else {
                crate::audit::run(&ledger, &ids).await?
            };
            Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Healthcheck(a) => {
            http::probe(&a.url).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn promo(command: PromoCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    match command {
        PromoCommand::Set(a) => {
            let p = promotion_id(&a.promotion)?;
            let ledger = connect(settings).await?;
            let spec = PromoSpec {
                budget: a.budget,
                stock: a.stock,
                per_customer: a.per_customer,
                starts_at: a.starts_at,
                ends_at: a.ends_at,
                paused: a.paused,
            };
            if a.force && !a.discard_outstanding {
                promos::guard_replace(&ledger, &p).await?;
            }
            let result = admin::promo_set(&ledger, &p, spec, a.force).await?;
            println!("promotion {p} {result}");
            if let Some(view) = admin::promo_show(&ledger, &p).await? {
                println!("{view}");
            }
        }
        PromoCommand::Show { promotion, output } => {
            let p = promotion_id(&promotion)?;
            let ledger = connect(settings).await?;
            match admin::promo_show(&ledger, &p).await? {
                Some(view) if output.json() => print_json(&view.to_json()),
                Some(view) => println!("{view}"),
                None => return Err(AdminError::NotFound(p).into()),
            }
        }
        PromoCommand::List(a) => {
            let after = a.after.as_deref().map(promotion_id).transpose()?;
            let ledger = connect(settings).await?;
            let page = promos::list(&ledger, after.as_ref(), a.limit).await?;
            if a.output.json() {
                let items: Vec<_> = page.iter().map(promos::Listed::to_json).collect();
                print_json(&serde_json::Value::Array(items));
            } else {
                for item in &page {
                    println!("{}", item.line());
                }
                let full = a.limit.is_some_and(|n| page.len() == n);
                match page.last() {
                    Some(last) if full => println!(
                        "{} promotions; next page: promo list --after {}",
                        page.len(),
                        last.promotion_id
                    ),
                    _ => println!("{} promotions", page.len()),
                }
            }
        }
        PromoCommand::Pause { promotion } => set_paused(settings, &promotion, true).await?,
        PromoCommand::Resume { promotion } => set_paused(settings, &promotion, false).await?,
        PromoCommand::Adjust(a) => {
            let p = promotion_id(&a.promotion)?;
            let ledger = connect(settings).await?;
            let adj = Adjustment {
                budget: a.budget,
                stock: a.stock,
            };
            let now = promos::adjust(&ledger, &p, adj).await?;
            println!("promotion {p} adjusted: {now}");
        }
        PromoCommand::Limit(a) => {
            let p = promotion_id(&a.promotion)?;
            let ledger = connect(settings).await?;
            let want = match a.per_customer {
                Limit::None => None,
                Limit::Orders(n) => Some(n),
            };
            let (change, previous) = promos::limit(&ledger, &p, want).await?;
            let words =
                |n: Option<u64>| n.map_or("no limit".to_owned(), |n| format!("{n} per customer"));
            match change {
                Change::Changed => println!(
                    "promotion {p}: {} (was {}); it counts the orders placed from now on",
                    words(want),
                    words(previous)
                ),
                Change::Unchanged => println!("promotion {p}: already {}", words(want)),
            }
        }
        PromoCommand::Delete { promotion, force } => {
            let p = promotion_id(&promotion)?;
            let ledger = connect(settings).await?;
            promos::delete(&ledger, &p, force).await?;
            println!("promotion {p} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn set_paused(settings: &Settings, promotion: &str, paused: bool) -> anyhow::Result<()> {
    let p = promotion_id(promotion)?;
    let ledger = connect(settings).await?;
    let change = promos::set_paused(&ledger, &p, paused).await?;
    let state = if paused { "paused" } else { "active" };
    match change {
        Change::Changed => println!("promotion {p} {state}"),
        Change::Unchanged => println!("promotion {p} was already {state}"),
    }
    Ok(())
}

fn dlq_filter(a: &DlqFilterArgs) -> admin::dlq::Filter {
    admin::dlq::Filter {
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
    filter: admin::dlq::Filter,
) -> anyhow::Result<Vec<admin::dlq::DeadLetter>> {
    let k = settings.kafka.clone();
    let topic = k.dlq_topic.clone();
    tokio::task::spawn_blocking(move || admin::dlq::read(&k, &filter))
        .await
        .context("the dead-letter reader panicked")?
        .with_context(|| format!("reading dead-letter topic {topic}"))
}

async fn dlq(command: DlqCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    use crate::admin::dlq::{self as dl, Verdict};
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
            let records = read_dead_letters(settings, filter).await?;
            let report = dl::replay(k, &records, a.dry_run, a.include_invalid).await?;
            let count = |name: &str| report.iter().filter(|r| r.verdict.as_str() == name).count();
            let (sent, would, skipped, failed) = (
                count("redriven"),
                count("would_redrive"),
                count("skipped"),
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
                    "failed": failed,
                    "records": items,
                }));
            } else {
                for r in &report {
                    println!("{}", r.line(&k.input_topic));
                }
                if a.dry_run {
                    println!(
                        "dry run: {would} would be redriven to {}, {skipped} still invalid; nothing sent",
                        k.input_topic
                    );
                } else {
                    println!(
                        "{sent} redriven to {}, {skipped} skipped (still invalid), {failed} failed",
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

/// `order show` (`event == false`) and `event show`.
async fn lookup(a: LookupArgs, settings: &Settings, event: bool) -> anyhow::Result<ExitCode> {
    use crate::admin::lookup;
    let what = if event { "event" } else { "order" };
    let id =
        Id::parse(&a.id).map_err(|rule| UsageError(format!("{what} id {:?}: {rule}", a.id)))?;
    let p = a.promotion.as_deref().map(promotion_id).transpose()?;
    let ledger = connect(settings).await?;
    let (json, words) = if event {
        let v = lookup::event_show(&ledger, &id, p.as_ref()).await?;
        (v.to_json(), v.words())
    } else {
        let v = lookup::order_show(&ledger, &id, p.as_ref()).await?;
        (v.to_json(), v.words())
    };
    if a.output.json() {
        print_json(&json);
    } else {
        print!("{words}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit --output json`: the figures and breaches `audit::audit_one`
/// finds (its judging untouched), one object per promotion; true when no
/// breach was found.
async fn audit_json(ledger: &Ledger, ids: &[Id]) -> anyhow::Result<bool> {
    let ids = if ids.is_empty() {
        crate::audit::promotions(ledger).await?
    } else {
        ids.to_vec()
    };
    let mut clean = true;
    let mut items = Vec::with_capacity(ids.len());
    for p in &ids {
        let r = crate::audit::audit_one(ledger, p).await?;
        clean &= r.breaches.is_empty();
        items.push(serde_json::json!({
            "promotion_id": r.promotion,
            "exists": r.exists,
            "budget": r.budget,
            "initial_budget": r.initial_budget,
            "outstanding_budget": r.outstanding_budget,
            "stock": r.stock,
            "initial_stock": r.initial_stock,
            "outstanding_stock": r.outstanding_stock,
            "per_customer": r.per_customer,
            "records": r.records,
            "held": r.held,
            "customers": r.customers,
            "max_used": r.max_used,
            "breaches": r.breaches,
        }));
    }
    print_json(&serde_json::json!({
        "clean": clean,
        "audited": items.len(),
        "promotions": items,
    }));
    Ok(clean)
}

/// `deductor run`: the service plus its HTTP endpoints, until SIGTERM.
async fn run(settings: Settings) -> anyhow::Result<()> {
    let shutdown = shutdown::on_signals();
    let status = Arc::new(Status::default());
    let mut server = None;
    if !settings.http.listen.is_empty() {
        let handle = http::install_recorder()?;
        let Some(ledger) = pipeline::connect_ledger(&settings, &shutdown).await? else {
            return Ok(());
        };
        let listen = settings.http.listen.clone();
        let stall = std::time::Duration::from_secs(settings.http.stall_timeout_secs);
        let (status, stop) = (status.clone(), shutdown.child_token());
        let stop_server = stop.clone();
        let task = tokio::spawn(async move {
            http::serve(&listen, handle, status, Some(ledger), stall, stop).await
        });
        server = Some((task, stop_server));
    }
    let result = pipeline::run_with_status(settings, shutdown.clone(), status).await;
    if let Some((task, stop)) = server {
        stop.cancel();
        match task.await {
            Ok(Err(e)) if result.is_ok() => return Err(e),
            _ => {}
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_documented_exit_codes() {
        let usage: anyhow::Error = UsageError("promotion id \"a:b\"".into()).into();
        assert_eq!(exit_code(&usage), EXIT_USAGE);
        let invalid: anyhow::Error = AdminError::Invalid("budget".into()).into();
        assert_eq!(exit_code(&invalid.context("promo set")), EXIT_USAGE);
        let p = Id::parse("p").unwrap();
        let refused: anyhow::Error = AdminError::NotFound(p).into();
        assert_eq!(exit_code(&refused), EXIT_FAILED);
        let down = LedgerError::redis(
            "connect",
            fred::error::Error::new(fred::error::ErrorKind::IO, "refused"),
        );
        let down: anyhow::Error = anyhow::Error::from(down).context("redis");
        assert_eq!(exit_code(&down), EXIT_UNREACHABLE);
        let wrapped: anyhow::Error = AdminError::Ledger(LedgerError::redis(
            "hgetall",
            fred::error::Error::new(fred::error::ErrorKind::Timeout, "slow"),
        ))
        .into();
        assert_eq!(exit_code(&wrapped), EXIT_UNREACHABLE);
        let auth = LedgerError::redis(
            "connect",
            fred::error::Error::new(fred::error::ErrorKind::Auth, "WRONGPASS"),
        );
        assert_eq!(exit_code(&auth.into()), EXIT_USAGE);
        let kafka = KafkaError::MetadataFetch(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(
            exit_code(&anyhow::Error::from(kafka).context("dlq")),
            EXIT_UNREACHABLE
        );
        assert_eq!(exit_code(&anyhow::anyhow!("other")), EXIT_FAILED);
    }
}
