//! What each subcommand does, on top of the library (`dlq` in the
//! submodule of that name), and the exit code of an error ([`exit_code`]).

use std::io::BufReader;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;

use crate::admin::healthcheck;
use crate::admin::promo::{self as promos, Adjustment, Change};
use crate::admin::{self, AdminError, PromoSpec};
use crate::cli::{Command, EventCommand, Limit, LookupArgs, OrderCommand, PromoCommand};
use crate::config::Settings;
use crate::domain::buckets::Units;
use crate::domain::event::Id;
use crate::ledger::Ledger;
use crate::ops::http;
use crate::pipeline::{self, Status};
use crate::shutdown;

mod dlq;

pub use crate::exit::{
    exit_code, Unreachable, UsageError, EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE,
};

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

/// The commands that talk to Kafka: they build its clients first, as `run`
/// does ([`crate::kafka::build_clients`]), so a property librdkafka refuses
/// is a configuration error (exit 2) naming the setting, for `check`
/// exactly as for `run`.
pub fn uses_kafka(command: &Command) -> bool {
    matches!(
        command,
        Command::Run { .. } | Command::Check(_) | Command::Publish(_) | Command::Dlq(_)
    )
}

pub async fn execute(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    if uses_kafka(&command) {
        let k = settings.kafka.clone();
        tokio::task::spawn_blocking(move || crate::kafka::build_clients(&k))
            .await
            .context("building the Kafka clients")??;
    }
    match command {
        Command::Run { .. } => {
            run(settings).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(output) => {
            let report = crate::admin::check::run(&settings).await;
            if output.json() {
                print_json(&report.to_json());
            } else {
                print!("{}", report.text());
            }
            Ok(ExitCode::from(report.exit_code()))
        }
        Command::Promo(c) => promo(c, &settings).await,
        Command::Dlq(c) => dlq::dlq(c, &settings).await,
        Command::Order(OrderCommand::Show(a)) => lookup(a, &settings, false).await,
        Command::Event(EventCommand::Show(a)) => lookup(a, &settings, true).await,
        Command::Publish(a) => {
            let topic = a
                .topic
                .unwrap_or_else(|| settings.kafka.input_topic.clone());
            let n = match a.file.as_deref() {
                None => {
                    crate::admin::publish::publish(&settings.kafka, &topic, std::io::stdin().lock())
                        .await?
                }
                Some(p) if p.as_os_str() == "-" => {
                    crate::admin::publish::publish(&settings.kafka, &topic, std::io::stdin().lock())
                        .await?
                }
                Some(p) => {
                    let f = std::fs::File::open(p)
                        .with_context(|| format!("opening {}", p.display()))?;
                    crate::admin::publish::publish(&settings.kafka, &topic, BufReader::new(f))
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
            // A lost dataset audits clean (nothing left to breach): it fails
            // the audit by itself. Kafka not answering only warns.
            let dataset = crate::admin::dataset::judge(&ledger, &settings.kafka).await?;
            let lost = dataset.is_lost();
            if !matches!(
                dataset,
                crate::admin::dataset::Dataset::Marked(_) | crate::admin::dataset::Dataset::Fresh
            ) {
                eprintln!("audit: {dataset}");
            }
            let clean = if a.output.json() {
                audit_json(&ledger, &ids, &dataset).await?
            } else {
                crate::admin::audit::run(&ledger, &ids).await?
            };
            let clean = clean && !lost;
            Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Healthcheck(a) => {
            let url = match a.url {
                Some(url) => url,
                None => healthcheck::healthz_url(&settings.http.listen)?,
            };
            healthcheck::probe(&url).await?;
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
            if a.force {
                crate::admin::bucketed::refuse_if_bucketed(&ledger, &p, "promo set --force")
                    .await?;
            }
            let result = if let Some(k) = a.buckets {
                crate::admin::bucketed::create(&ledger, &p, spec, k).await?
            } else if a.force && !a.discard_outstanding {
                // Explains what is outstanding (counting records where the
                // hash cannot say); the script checks again as it writes.
                promos::guard_replace(&ledger, &p).await?;
                admin::promo_replace_if_settled(&ledger, &p, spec).await?
            } else {
                admin::promo_set(&ledger, &p, spec, a.force).await?
            };
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
        PromoCommand::Rebalance { promotion } => {
            let p = promotion_id(&promotion)?;
            let ledger = connect(settings).await?;
            let moves = crate::admin::bucketed::rebalance(&ledger, &p).await?;
            if moves.is_empty() {
                println!("promotion {p}: its buckets are even; nothing moved");
            }
            for m in &moves {
                println!(
                    "promotion {p}: moved up to budget {} stock {} from bucket {} to bucket {}",
                    m.n.budget, m.n.stock, m.from, m.to
                );
            }
            if let Some(view) = admin::promo_show(&ledger, &p).await? {
                println!("{view}");
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
            if let Some(done) =
                crate::admin::bucketed::adjust(&ledger, &p, a.budget, a.stock).await?
            {
                println!(
                    "promotion {p} adjusted (bucketed): budget {:+}, stock {:+} (taking away \
                     takes only what the buckets hold free)",
                    done.budget, done.stock
                );
                if let Some(view) = admin::promo_show(&ledger, &p).await? {
                    println!("{view}");
                }
                return Ok(ExitCode::SUCCESS);
            }
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
            let (change, previous) = match crate::admin::bucketed::limit(&ledger, &p, want).await? {
                Some((true, previous)) => (Change::Changed, previous),
                Some((false, previous)) => (Change::Unchanged, previous),
                None => promos::limit(&ledger, &p, want).await?,
            };
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
            let lowered = match (want, previous) {
                (Some(n), Some(was)) => n < was,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if let (Some(n), true) = (want, lowered && change == Change::Changed) {
                // The limit is changed already: a user without SCAN (the
                // operators' user) gets a note instead of a failure.
                let (over, max) = match promos::customers_over(&ledger, &p, n).await {
                    Ok(counted) => counted,
                    Err(AdminError::Ledger(e)) if e.class() == crate::ledger::ErrorClass::Auth => {
                        println!(
                            "note: customers over the new limit not counted ({e}); \
                             `deductor audit` as the readers' user reports them"
                        );
                        (0, 0)
                    }
                    Err(e) => return Err(e.into()),
                };
                if over > 0 {
                    println!(
                        "note: {over} customer(s) already hold more than {n} counted order(s) \
                         (up to {max}); they keep them, new orders of theirs are rejected \
                         user_limit_reached, and audit reports them until refunds bring them down"
                    );
                }
            }
        }
        PromoCommand::Delete { promotion, force } => {
            let p = promotion_id(&promotion)?;
            let ledger = connect(settings).await?;
            if crate::admin::bucketed::delete(&ledger, &p, force)
                .await?
                .is_none()
            {
                promos::delete(&ledger, &p, force).await?;
            }
            println!("promotion {p} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn set_paused(settings: &Settings, promotion: &str, paused: bool) -> anyhow::Result<()> {
    let p = promotion_id(promotion)?;
    let ledger = connect(settings).await?;
    let change = match crate::admin::bucketed::set_paused(&ledger, &p, paused).await? {
        Some(true) => Change::Changed,
        Some(false) => Change::Unchanged,
        None => promos::set_paused(&ledger, &p, paused).await?,
    };
    let state = if paused { "paused" } else { "active" };
    match change {
        Change::Changed => println!("promotion {p} {state}"),
        Change::Unchanged => println!("promotion {p} was already {state}"),
    }
    Ok(())
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
async fn audit_json(
    ledger: &Ledger,
    ids: &[Id],
    dataset: &crate::admin::dataset::Dataset,
) -> anyhow::Result<bool> {
    let ids = if ids.is_empty() {
        crate::admin::audit::promotions(ledger).await?
    } else {
        ids.to_vec()
    };
    let mut clean = true;
    let mut items = Vec::with_capacity(ids.len());
    for p in &ids {
        if let Some(b) = crate::admin::bucketed::audit(ledger, p).await? {
            clean &= b.breaches.is_empty() && b.unsettled.is_empty();
            let u = |x: Units| serde_json::json!({"budget": x.budget, "stock": x.stock});
            items.push(serde_json::json!({
                "promotion_id": p.as_str(),
                "exists": true,
                "bucketed": true,
                "buckets": b.buckets,
                "initial": b.initial.map(u),
                "free": u(b.free),
                "in_transit": u(b.in_transit),
                "deducted": u(b.deducted),
                "per_customer": b.per_customer,
                "held": b.orders_held,
                "max_used": b.max_per_customer,
                "breaches": b.breaches,
                "unsettled": b.unsettled,
            }));
            continue;
        }
        let r = crate::admin::audit::audit_one(ledger, p).await?;
        clean &= r.breaches.is_empty() && r.unsettled.is_empty();
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
            "unsettled": r.unsettled,
        }));
    }
    let lost = dataset.is_lost();
    print_json(&serde_json::json!({
        "clean": clean && !lost,
        "dataset_lost": lost,
        "ledger": dataset.to_string(),
        "audited": items.len(),
        "promotions": items,
    }));
    Ok(clean)
}

/// `deductor run`: the service plus its HTTP endpoints, until SIGTERM. The
/// HTTP server comes up first, so the probes answer while the start waits
/// out Redis or Kafka (/healthz alive, /readyz naming what it waits for);
/// one Redis pool serves both the pipeline and `/readyz`. A server that
/// cannot bind (or fails later) stops the service with its error.
async fn run(settings: Settings) -> anyhow::Result<()> {
    // The same warnings as `deductor check`'s "security" lines.
    for w in crate::config::weakened(&settings) {
        tracing::warn!(setting = %w.key, "weakened setting: {}", w.why);
    }
    let shutdown = shutdown::on_signals();
    // A second before the bound: the process is gone when it ends (and
    // when the chart's grace period, the same length, ends).
    shutdown::watchdog(
        shutdown.clone(),
        settings.drain_timeout() + crate::config::SHUTDOWN_BOUND
            - std::time::Duration::from_secs(1),
    );
    let status = Arc::new(Status::default());
    let mut server = None;
    if !settings.http.listen.is_empty() {
        let handle = http::install_recorder()?;
        let http_settings = settings.http.clone();
        let (status, stop) = (status.clone(), shutdown.child_token());
        let stop_server = stop.clone();
        let task =
            tokio::spawn(async move { http::serve(&http_settings, handle, status, stop).await });
        server = Some((task, stop_server));
    }
    let service = {
        let (settings, shutdown, status) = (settings, shutdown.clone(), status.clone());
        async move {
            let Some(ledger) = pipeline::connect_ledger(&settings, &shutdown, &status).await?
            else {
                return Ok(());
            };
            // In the background: Kafka may be slow to answer, and startup
            // waits for nothing but the pipeline's own dependencies.
            {
                let (ledger, kafka) = (ledger.clone(), settings.kafka.clone());
                tokio::spawn(async move { admin::dataset::at_startup(&ledger, &kafka).await });
            }
            pipeline::run_with_ledger(settings, shutdown, status, ledger).await
        }
    };
    let Some((mut task, stop)) = server else {
        return service.await;
    };
    tokio::pin!(service);
    tokio::select! {
        result = &mut service => {
            stop.cancel();
            match task.await {
                Ok(Err(e)) if result.is_ok() => Err(e),
                _ => result,
            }
        }
        ended = &mut task => {
            // The endpoints are gone (e.g. http.listen cannot be bound):
            // stop the service cleanly, then report why.
            shutdown.cancel();
            let result = service.await;
            match ended {
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => result,
                Err(e) => Err(anyhow::Error::new(e).context("http server task")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cli::Cli;
    use crate::kafka::offsets::Offsets;
    use crate::kafka::publisher::Publisher;
    use clap::Parser as _;

    /// A setting a generated config may carry: good and bad values of the
    /// service's own Kafka settings and of librdkafka pass-through.
    fn setting() -> impl Strategy<Value = (String, String)> {
        let own = prop_oneof![
            (1u64..5_000_000_000)
                .prop_map(|v| ("kafka.produce_timeout_ms".to_owned(), v.to_string())),
            Just(("kafka.delivery".to_owned(), "exactly_once".to_owned())),
            Just(("kafka.group_instance_id".to_owned(), "pod-0".to_owned())),
        ];
        let props = prop_oneof![
            Just("session.timeout.ms"),
            Just("message.timeout.ms"),
            Just("queued.min.messages"),
            Just("linger.ms"),
            Just("compression.type"),
            Just("security.protocol"),
            Just("sasl.mechanisms"),
            Just("sasl.passwrd"),
            Just("sasl.password"),
            Just("enable.idempotence"),
            Just("acks"),
            Just("no.such.property"),
            Just("auto.offset.reset"),
        ];
        let values = prop_oneof![
            (0u64..4_000_000_000).prop_map(|v| v.to_string()),
            Just("zstd".to_owned()),
            Just("lz5".to_owned()),
            Just("SASL_PLAINTEXT".to_owned()),
            Just("PLAIN".to_owned()),
            Just("earliest".to_owned()),
            Just("sideways".to_owned()),
            Just("false".to_owned()),
            Just("-1".to_owned()),
            Just("s3cr3t-value".to_owned()),
        ];
        let client = prop_oneof![Just("consumer"), Just("producer")];
        prop_oneof![
            own,
            (client, props, values).prop_map(|(c, p, v)| (format!("kafka.{c}.{p}"), v)),
        ]
    }

    /// `run`'s own client building: the consumer and the producer the
    /// pipeline creates (pipeline::run_with_ledger), nothing else.
    fn run_builds(k: &crate::config::KafkaSettings) -> bool {
        // The producer's delivery futures need a runtime, as in `run`.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _inside = rt.enter();
        let producer = Publisher::new(k);
        let consumer = crate::kafka::consumer::create(k, Offsets::new(), None, None);
        producer.is_ok() && consumer.is_ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Class check of issue 24: `check` accepts exactly what `run`
        /// accepts. For generated configs, `check`'s verdict (the settings
        /// load, then its client building) equals `run`'s (the same load,
        /// then the clients the pipeline creates); a refusal is a
        /// configuration error (exit 2) that names a kafka key and never
        /// carries a secret-looking value.
        #[test]
        fn check_accepts_exactly_what_run_accepts(sets in proptest::collection::vec(setting(), 0..4)) {
            let mut args = vec!["deductor".to_owned()];
            for (k, v) in &sets {
                args.push("--set".into());
                args.push(format!("{k}={v}"));
            }
            let check = Cli::try_parse_from(args.iter().cloned().chain(["check".to_owned()])).unwrap();
            let run = Cli::try_parse_from(args.iter().cloned().chain(["run".to_owned()])).unwrap();
            prop_assert!(uses_kafka(&check.command) && uses_kafka(&run.command));
            match (check.settings(), run.settings()) {
                (Ok(cs), Ok(rs)) => {
                    let check_verdict = crate::kafka::build_clients(&cs.kafka);
                    let run_verdict = run_builds(&rs.kafka);
                    prop_assert_eq!(check_verdict.is_ok(), run_verdict, "{:?} -> {:?}", sets, check_verdict);
                    if let Err(e) = check_verdict {
                        let code = exit_code(&anyhow::Error::from(e));
                        prop_assert_eq!(code, EXIT_USAGE);
                    }
                }
                (Err(c), Err(r)) => prop_assert_eq!(c.to_string(), r.to_string()),
                (c, r) => prop_assert!(false, "load differs: {:?} / {:?}", c.err(), r.err()),
            }
        }
    }

    /// Issue 24 item 11: `kafka.produce_timeout_ms` past librdkafka's
    /// `message.timeout.ms` range is a configuration error naming the key.
    #[test]
    fn an_overflowing_produce_timeout_names_its_key() {
        let cli = Cli::try_parse_from([
            "deductor",
            "--set",
            "kafka.produce_timeout_ms=3000000000",
            "check",
        ])
        .unwrap();
        let s = cli.settings().unwrap();
        let e = crate::kafka::build_clients(&s.kafka)
            .unwrap_err()
            .to_string();
        assert!(e.contains("config key kafka.produce_timeout_ms"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let cli = Cli::try_parse_from([
            "deductor",
            "--set",
            "kafka.producer.sasl.passwrd=hunter9",
            "check",
        ])
        .unwrap();
        let e = crate::kafka::build_clients(&cli.settings().unwrap().kafka)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kafka.producer.\"sasl.passwrd\""), "{e}");
        assert!(!e.contains("hunter9"), "{e}");
    }
}
