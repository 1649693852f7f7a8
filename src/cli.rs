//! The command line: `run | check | promo set/show | publish | audit | healthcheck`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{ConfigError, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "deductor",
    version,
    about = "Applies promotion deductions from Kafka events with atomic Redis scripts"
)]
pub struct Cli {
    /// A TOML config file layered over the defaults (see config/default.toml).
    #[arg(
        short,
        long,
        global = true,
        env = "DEDUCTOR_CONFIG",
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,

    /// Override one setting, e.g. --set redis.pool_size=8 or
    /// --set kafka.consumer.session.timeout.ms=6000 (repeatable; beats env).
    #[arg(long = "set", global = true, value_name = "SECTION.KEY=VALUE", value_parser = parse_override)]
    pub overrides: Vec<(String, String)>,

    /// Kafka bootstrap servers (kafka.brokers).
    #[arg(long, global = true, value_name = "HOST:PORT,...")]
    pub brokers: Option<String>,

    /// Redis url (redis.url).
    #[arg(long, global = true, value_name = "URL")]
    pub redis_url: Option<String>,

    /// Log format (log.format).
    #[arg(long, global = true)]
    pub log_format: Option<LogFormatArg>,

    /// Log filter (log.level), e.g. info or deductor=debug.
    #[arg(long, global = true)]
    pub log_level: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Json,
    Pretty,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service: consume orders, deduct, publish outcomes.
    Run {
        /// Exit 0 once every assigned partition is processed to its end
        /// (pipeline.exit_when_drained): for demos, benchmarks, replays.
        #[arg(long)]
        until_drained: bool,
    },
    /// Validate the configuration and reach Kafka, Redis and the topics.
    Check,
    /// Create, replace or show a promotion.
    #[command(subcommand)]
    Promo(PromoCommand),
    /// Produce events from a JSON-lines file (or stdin), keyed by order_id.
    Publish(PublishArgs),
    /// Check the ledger invariant of every (or the named) promotion.
    Audit(AuditArgs),
    /// Exit 0 iff the service's /healthz answers 200 (for images without curl).
    Healthcheck(HealthcheckArgs),
}

#[derive(Debug, Subcommand)]
pub enum PromoCommand {
    /// Create a promotion (refuses to overwrite one without --force).
    Set(PromoSetArgs),
    /// Show a promotion's remaining budget and stock, limit, status, window.
    Show {
        /// Promotion id.
        promotion: String,
    },
}

#[derive(Debug, Args)]
pub struct PromoSetArgs {
    /// Promotion id (1-64 of A-Z a-z 0-9 _ . -).
    pub promotion: String,
    /// Budget in minor currency units; absent = unlimited.
    #[arg(long)]
    pub budget: Option<u64>,
    /// Units in stock; absent = unlimited.
    #[arg(long)]
    pub stock: Option<u64>,
    /// Orders one customer may hold; absent = unlimited.
    #[arg(long)]
    pub per_customer: Option<u64>,
    /// Window start (inclusive): unix seconds or RFC 3339.
    #[arg(long, value_parser = parse_time)]
    pub starts_at: Option<i64>,
    /// Window end (exclusive): unix seconds or RFC 3339.
    #[arg(long, value_parser = parse_time)]
    pub ends_at: Option<i64>,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// Replace an existing promotion.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// JSON-lines file; `-` or absent reads stdin.
    pub file: Option<PathBuf>,
    /// Topic to produce to (default: kafka.input_topic).
    #[arg(long)]
    pub topic: Option<String>,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Promotions to audit; none = every promotion under the key prefix.
    pub promotions: Vec<String>,
}

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// The endpoint to ask [default: /healthz on http.listen, with a
    /// wildcard address (0.0.0.0, [::]) asked on loopback].
    #[arg(long)]
    pub url: Option<String>,
}

fn parse_override(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not SECTION.KEY=VALUE")),
    }
}

/// Unix seconds or RFC 3339.
pub fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(n) = s.parse::<i64>() {
        return Ok(n);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp())
        .map_err(|_| format!("{s:?} is neither unix seconds nor an RFC 3339 time"))
}

impl Cli {
    /// Loads the settings with this command line's flags as the top layer.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let mut overrides = Vec::new();
        if let Command::Run {
            until_drained: true,
        } = self.command
        {
            overrides.push(("pipeline.exit_when_drained".to_owned(), "true".to_owned()));
        }
        if let Some(b) = &self.brokers {
            overrides.push(("kafka.brokers".to_owned(), b.clone()));
        }
        if let Some(u) = &self.redis_url {
            overrides.push(("redis.url".to_owned(), u.clone()));
        }
        if let Some(f) = self.log_format {
            let f = match f {
                LogFormatArg::Json => "json",
                LogFormatArg::Pretty => "pretty",
            };
            overrides.push(("log.format".to_owned(), f.to_owned()));
        }
        if let Some(l) = &self.log_level {
            overrides.push(("log.level".to_owned(), l.clone()));
        }
        overrides.extend(self.overrides.iter().cloned());
        Settings::load(self.config.as_deref(), &overrides)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn times_accept_unix_and_rfc3339() {
        assert_eq!(parse_time("1700000000"), Ok(1_700_000_000));
        assert_eq!(parse_time("1970-01-01T00:01:00Z"), Ok(60));
        assert!(parse_time("tomorrow").is_err());
    }

    #[test]
    fn promo_set_parses() {
        let cli = Cli::try_parse_from([
            "deductor",
            "promo",
            "set",
            "flash-42",
            "--budget",
            "100",
            "--stock",
            "5",
            "--per-customer",
            "1",
            "--force",
        ])
        .unwrap();
        let Command::Promo(PromoCommand::Set(a)) = cli.command else {
            panic!()
        };
        assert_eq!(
            (a.budget, a.stock, a.per_customer, a.force),
            (Some(100), Some(5), Some(1), true)
        );
        assert!(Cli::try_parse_from(["deductor", "promo", "set", "p", "--stock", "-1"]).is_err());
    }
}
