//! The command line: `run | check | promo ... | order show | event show |
//! dlq ... | publish | audit | healthcheck`.
//!
//! Exit codes (every command): 0 ok; 1 a check failed, a breach was found, or
//! the command was refused or failed; 2 a usage or configuration error; 3 a
//! dependency (Kafka or Redis) could not be reached.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{ConfigError, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "deductor",
    version = crate::build_info::LONG_VERSION,
    about = "Applies promotion deductions from Kafka events with atomic Redis scripts",
    after_help = "Exit codes: 0 ok; 1 a check failed, a breach was found, or the command was \
                  refused or failed; 2 a usage or configuration error; 3 Kafka or Redis could \
                  not be reached (docs/operations.md)."
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

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Lines in words.
    #[default]
    Text,
    /// One JSON document on stdout.
    Json,
}

#[derive(Debug, Clone, Copy, Default, Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

impl OutputArgs {
    pub fn json(&self) -> bool {
        self.output == OutputFormat::Json
    }
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
    Check(OutputArgs),
    /// Create, show, list, pause, resume, adjust, limit or delete promotions.
    #[command(subcommand)]
    Promo(PromoCommand),
    /// Show what the ledger holds for an order.
    ///
    /// Its records, what they hold, and their refund results.
    #[command(subcommand)]
    Order(OrderCommand),
    /// Show what the ledger remembers of an event.
    ///
    /// Placement decisions (memos), refund results, and the records it touched.
    #[command(subcommand)]
    Event(EventCommand),
    /// List, show or replay (redrive) records of the dead-letter topic.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Produce events from a JSON-lines file (or stdin), keyed by order_id.
    Publish(PublishArgs),
    /// Check the ledger invariant of every (or the named) promotion.
    ///
    /// Exits 1 when a breach is found.
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
        #[command(flatten)]
        output: OutputArgs,
    },
    /// List the promotions, sorted by id.
    ///
    /// Found with SCAN under the key prefix; a page at a time with --limit
    /// and --after.
    List(PromoListArgs),
    /// Pause a promotion.
    ///
    /// Placements are rejected promotion_inactive until it is resumed;
    /// refunds still return their amounts. Only the status is written, so it
    /// is safe while the service runs.
    Pause {
        /// Promotion id.
        promotion: String,
    },
    /// Resume a paused promotion.
    Resume {
        /// Promotion id.
        promotion: String,
    },
    /// Even out a bucketed promotion's buckets.
    ///
    /// Finishes what a crashed delivery or change left, then moves free
    /// units between the buckets so that each holds its share. Safe while
    /// the service runs (docs/operations.md, "Bucketed promotions").
    Rebalance {
        /// Promotion id.
        promotion: String,
    },
    /// Add to or take from a live promotion's budget and/or stock.
    ///
    /// The remaining and the initial amount move together (audit keeps
    /// holding); never below 0 or above 999999999999999; refused for an
    /// unlimited dimension.
    #[command(allow_negative_numbers = true)]
    Adjust(PromoAdjustArgs),
    /// Set or remove a live promotion's per-customer limit.
    ///
    /// A limit counts only the orders placed while it is in force: orders
    /// placed without a limit never count towards one set later, and only
    /// orders that counted give their slot back when refunded. Lowering it
    /// takes no order away: the command says how many customers already
    /// hold more.
    Limit(PromoLimitArgs),
    /// Delete a promotion.
    ///
    /// Refused while orders still hold deductions, unless --force. Only the
    /// hash is deleted: records, memos and per-customer counters expire
    /// with their TTLs.
    Delete {
        /// Promotion id.
        promotion: String,
        /// Delete it even though orders hold deductions: refunds of those
        /// orders then return nothing to it.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum OrderCommand {
    /// An order's records on each promotion (or on the one given).
    Show(LookupArgs),
}

#[derive(Debug, Subcommand)]
pub enum EventCommand {
    /// An event's decisions and records on each promotion (or on the one given).
    Show(LookupArgs),
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// One line per dead letter: partition@offset, time, kind, key, error.
    List(DlqListArgs),
    /// One dead letter in full, and what the parser says of it now.
    Show(DlqShowArgs),
    /// Send dead letters back to the input topic, each at most once.
    ///
    /// Only to kafka.input_topic; the key and the producer's headers kept,
    /// deductor.* headers of the dead-lettering dropped, deductor.redrive.*
    /// provenance headers added. Each record is run through the event
    /// parser first: still-invalid ones are skipped unless
    /// --include-invalid; truncated ones always. Each dead letter sent is
    /// noted in Redis (promo:redriven:<dlq topic>:<partition>:<offset>, 90
    /// days): a later replay reports it as already_redriven and does not
    /// send it again, unless --again.
    Replay(DlqReplayArgs),
}

/// Which dead letters: all bounds optional and combined.
#[derive(Debug, Clone, Args)]
pub struct DlqFilterArgs {
    /// Only records whose deductor.error.kind header is KIND (e.g. not_json).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only this partition of the dead-letter topic.
    #[arg(long)]
    pub partition: Option<i32>,
    /// First offset (inclusive), in each partition read.
    #[arg(long, value_name = "OFFSET")]
    pub from_offset: Option<i64>,
    /// Last offset (inclusive), in each partition read.
    #[arg(long, value_name = "OFFSET")]
    pub to_offset: Option<i64>,
    /// Records at or after this time (unix seconds or RFC 3339).
    #[arg(long, value_parser = parse_time, value_name = "TIME")]
    pub since: Option<i64>,
    /// Records at or before this time (unix seconds or RFC 3339).
    #[arg(long, value_parser = parse_time, value_name = "TIME")]
    pub until: Option<i64>,
    /// At most N records (the first by partition and offset).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Debug, Args)]
pub struct DlqListArgs {
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DlqShowArgs {
    /// Partition of the dead-letter topic.
    #[arg(long)]
    pub partition: i32,
    /// Offset of the record.
    #[arg(long)]
    pub offset: i64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DlqReplayArgs {
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// Replay the whole topic (required when no filter is given).
    #[arg(long)]
    pub all: bool,
    /// Parse and report each record; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also send records the parser still refuses (they will be
    /// dead-lettered again).
    #[arg(long)]
    pub include_invalid: bool,
    /// Also send dead letters an earlier replay already sent (noted in
    /// Redis); without it each dead letter is sent once.
    #[arg(long)]
    pub again: bool,
    /// Write deductor_dlq_redrives_total (Prometheus text format) to FILE,
    /// e.g. for node_exporter's textfile collector.
    #[arg(long, value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct LookupArgs {
    /// The order (or event) id.
    pub id: String,
    /// Look only under this promotion (else SCAN every promotion's keys).
    #[arg(long, value_name = "P")]
    pub promotion: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct PromoListArgs {
    /// Print at most N promotions.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Start after this promotion id (the last one of the previous page).
    #[arg(long, value_name = "ID")]
    pub after: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct PromoAdjustArgs {
    /// Promotion id.
    pub promotion: String,
    /// Change of the stock: +N or -N.
    #[arg(long, value_parser = parse_delta, allow_hyphen_values = true, value_name = "+N|-N")]
    pub stock: Option<i64>,
    /// Change of the budget (minor currency units): +N or -N.
    #[arg(long, value_parser = parse_delta, allow_hyphen_values = true, value_name = "+N|-N")]
    pub budget: Option<i64>,
}

#[derive(Debug, Args)]
pub struct PromoLimitArgs {
    /// Promotion id.
    pub promotion: String,
    /// Orders one customer may hold, or `none` for no limit.
    #[arg(long, value_parser = parse_limit, value_name = "N|none")]
    pub per_customer: Limit,
}

/// `promo limit --per-customer`: a number, or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    None,
    Orders(u64),
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
    /// Split it into K buckets on K hash tags (on a Redis Cluster, spread
    /// over the primaries), so one hot promotion's work spreads over K
    /// Redis threads (docs/operations.md, "Bucketed promotions"). Needs
    /// --budget and --stock; only for a new promotion.
    #[arg(long, value_name = "K", conflicts_with = "force")]
    pub buckets: Option<usize>,
    /// Replace an existing promotion (its whole hash: initial and remaining
    /// amounts start afresh). Refused while orders hold deductions unless
    /// --discard-outstanding is given too; prefer promo adjust / limit /
    /// pause / resume for a live promotion.
    #[arg(long)]
    pub force: bool,
    /// With --force: replace it even though orders hold deductions. The new
    /// promotion forgets them: their refunds give nothing back, and audit
    /// counts them apart ("from a replaced incarnation"), not as a breach.
    #[arg(long, requires = "force")]
    pub discard_outstanding: bool,
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
    #[command(flatten)]
    pub output: OutputArgs,
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

/// `+N`, `-N` or `N`, for `promo adjust`.
pub fn parse_delta(s: &str) -> Result<i64, String> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not +N or -N"));
    }
    s.parse::<i64>()
        .map_err(|_| format!("{s:?} is out of range"))
}

/// A number of orders, or `none`.
pub fn parse_limit(s: &str) -> Result<Limit, String> {
    if s == "none" {
        return Ok(Limit::None);
    }
    s.parse()
        .map(Limit::Orders)
        .map_err(|_| format!("{s:?} is neither a number of orders nor `none`"))
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
        assert!(
            Cli::try_parse_from(["deductor", "promo", "set", "p", "--discard-outstanding"])
                .is_err(),
            "--discard-outstanding only with --force"
        );
    }

    #[test]
    fn adjust_takes_signed_deltas_and_limit_takes_none() {
        let cli = Cli::try_parse_from([
            "deductor", "promo", "adjust", "p", "--stock", "-5", "--budget", "+100",
        ])
        .unwrap();
        let Command::Promo(PromoCommand::Adjust(a)) = cli.command else {
            panic!()
        };
        assert_eq!((a.stock, a.budget), (Some(-5), Some(100)));
        assert!(parse_delta("5x").is_err());
        assert!(parse_delta("+").is_err());
        assert!(parse_delta("--5").is_err());
        assert_eq!(parse_limit("none"), Ok(Limit::None));
        assert_eq!(parse_limit("2"), Ok(Limit::Orders(2)));
        assert!(parse_limit("-1").is_err());
        let cli = Cli::try_parse_from(["deductor", "promo", "list", "--output", "json"]).unwrap();
        let Command::Promo(PromoCommand::List(a)) = cli.command else {
            panic!()
        };
        assert!(a.output.json());
    }

    /// Issue 24 item 15: the help says what audit does with the records a
    /// `--discard-outstanding` replacement forgets.
    #[test]
    fn discard_outstanding_help_matches_audit() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let set = cmd
            .find_subcommand_mut("promo")
            .and_then(|c| c.find_subcommand_mut("set"))
            .expect("promo set");
        let help = set.render_long_help().to_string();
        assert!(!help.contains("audit reports a breach"), "{help}");
        assert!(help.contains("not as a breach"), "{help}");
    }
}
