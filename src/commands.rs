//! What each subcommand does, on top of the library.

use std::io::BufReader;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;

use crate::admin::{self, PromoSpec};
use crate::cli::{Command, PromoCommand};
use crate::config::Settings;
use crate::domain::event::Id;
use crate::ledger::Ledger;
use crate::ops::http;
use crate::pipeline::{self, Status};
use crate::shutdown;

fn promotion_id(s: &str) -> anyhow::Result<Id> {
    Id::parse(s).map_err(|rule| anyhow::anyhow!("promotion id {s:?}: {rule}"))
}

pub async fn execute(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run { .. } => {
            run(settings).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check => Ok(if crate::ops::check::run(&settings).await {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }),
        Command::Promo(PromoCommand::Set(a)) => {
            let p = promotion_id(&a.promotion)?;
            let ledger = Ledger::connect(&settings.redis).await.context("redis")?;
            let spec = PromoSpec {
                budget: a.budget,
                stock: a.stock,
                per_customer: a.per_customer,
                starts_at: a.starts_at,
                ends_at: a.ends_at,
                paused: a.paused,
            };
            let result = admin::promo_set(&ledger, &p, spec, a.force).await?;
            println!("promotion {p} {result}");
            if let Some(view) = admin::promo_show(&ledger, &p).await? {
                println!("{view}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Promo(PromoCommand::Show { promotion }) => {
            let p = promotion_id(&promotion)?;
            let ledger = Ledger::connect(&settings.redis).await.context("redis")?;
            match admin::promo_show(&ledger, &p).await? {
                Some(view) => {
                    println!("{view}");
                    Ok(ExitCode::SUCCESS)
                }
                None => anyhow::bail!("promotion {p} does not exist"),
            }
        }
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
            let ledger = Ledger::connect(&settings.redis).await.context("redis")?;
            let ids = a
                .promotions
                .iter()
                .map(|p| promotion_id(p))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let clean = crate::audit::run(&ledger, &ids).await?;
            Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Healthcheck(a) => {
            let url = match a.url {
                Some(url) => url,
                None => http::healthz_url(&settings.http.listen)?,
            };
            http::probe(&url).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
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
