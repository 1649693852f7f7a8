//! Redis: the scripts and the order-level logic around them.
//!
//! One script call decides one line atomically ([`scripts`]); this module
//! makes orders out of lines: a multi-line placement is all-or-nothing
//! (earlier lines are released when a later one is rejected) and decides the
//! same way on every delivery (a stored rejection of the event on any line is
//! looked up first, in one round trip). Every command of one order goes over
//! one pooled connection (chosen by the order id), and its writes are awaited
//! one after another.

pub mod durability;
pub mod error;
pub mod scripts;
pub mod sentinel;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{
    Builder, Client, ClientLike, Config, LuaInterface, Pool, ReconnectPolicy, Server, ServerConfig,
    TcpConfig, Value,
};
use fred::types::config::{ReconnectError, TlsConnector, UnresponsiveConfig};

use crate::config::RedisSettings;
use crate::domain::decision::{
    AcceptedLine, PlaceDecision, Reason, RefundDecision, RefundLineResult, Remaining,
};
use crate::domain::event::{Header, Id, OrderPlaced, OrderRefunded, PlaceLine, RefundLine};
use crate::domain::keys::Keys;

pub use error::{classify, ErrorClass, LedgerError};
use scripts::{LineReply, Script};
use sentinel::SentinelUrl;

/// The TLS connector of `rediss://` urls: the system's roots plus
/// `redis.tls_ca_file`, verification off only on request.
fn tls_connector(s: &RedisSettings) -> Result<TlsConnector, LedgerError> {
    let tls_error = |detail: String| {
        LedgerError::redis(
            "connect",
            fred::error::Error::new(fred::error::ErrorKind::Tls, detail),
        )
    };
    let mut builder = fred::native_tls::TlsConnector::builder();
    if !s.tls_ca_file.is_empty() {
        let pem = std::fs::read(&s.tls_ca_file)
            .map_err(|e| tls_error(format!("redis.tls_ca_file {}: {e}", s.tls_ca_file)))?;
        let certs = fred::native_tls::Certificate::stack_from_pem(&pem)
            .map_err(|e| tls_error(format!("redis.tls_ca_file {}: {e}", s.tls_ca_file)))?;
        if certs.is_empty() {
            return Err(tls_error(format!(
                "redis.tls_ca_file {}: no PEM certificate in it",
                s.tls_ca_file
            )));
        }
        for cert in certs {
            builder.add_root_certificate(cert);
        }
    }
    if s.tls_insecure_skip_verify {
        tracing::warn!(
            "redis.tls_insecure_skip_verify is on: the Redis server's certificate is not checked"
        );
        builder
            .danger_accept_invalid_certs(true)
            .danger_accept_invalid_hostnames(true);
    }
    TlsConnector::try_from(builder).map_err(|e| LedgerError::redis("connect", e))
}

/// The fred config of `settings`: the url (our `redis-sentinel://` syntax,
/// fred's for the rest), TLS, and credentials (settings override the url's).
pub fn fred_config(s: &RedisSettings) -> Result<Config, LedgerError> {
    let url_error = |detail: String| {
        LedgerError::redis(
            "connect",
            fred::error::Error::new(fred::error::ErrorKind::Url, detail),
        )
    };
    let nonempty = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    let (mut config, tls) = if SentinelUrl::is_sentinel(&s.url) {
        let u = SentinelUrl::parse(&s.url).map_err(url_error)?;
        let config = Config {
            server: ServerConfig::Sentinel {
                hosts: u
                    .sentinels
                    .iter()
                    .map(|(host, port)| Server::new(host.as_str(), *port))
                    .collect(),
                service_name: u.service,
                username: nonempty(&s.sentinel_username),
                password: nonempty(&s.sentinel_password),
            },
            username: u.username,
            password: u.password,
            ..Config::default()
        };
        (config, u.tls)
    } else {
        let config = Config::from_url(&s.url).map_err(|e| LedgerError::redis("connect", e))?;
        let tls = config.uses_tls();
        (config, tls)
    };
    if tls {
        // fred's default trusts the system's roots only; for Sentinel the
        // sentinels and the data nodes both speak TLS.
        config.tls = Some(tls_connector(s)?.into());
    }
    if let Some(user) = nonempty(&s.username) {
        config.username = Some(user);
    }
    if let Some(password) = nonempty(&s.password) {
        config.password = Some(password);
    }
    // The first connection must succeed (or fail) now; later drops are
    // reconnected by the policy set in `connect`.
    config.fail_fast = true;
    Ok(config)
}

/// The Redis side of deductor. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct Ledger {
    pool: Pool,
    shared: Arc<Shared>,
}

struct Shared {
    keys: Keys,
    record_ttl: String,
    refund_ttl: String,
    slow_script: Duration,
    /// The durability gate ([`durability`]): 0 = off.
    wait_replicas: u32,
    wait_timeout: Duration,
    command_timeout: Duration,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("prefix", &self.shared.keys.prefix())
            .field("pool_size", &self.pool.size())
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Builds the pool from `settings` and waits (bounded) until every
    /// connection is up. Credentials in `settings` override the URL's.
    pub async fn connect(settings: &RedisSettings) -> Result<Ledger, LedgerError> {
        let config = fred_config(settings)?;
        let command_timeout = Duration::from_millis(settings.command_timeout_ms.max(1));
        let connect_timeout = Duration::from_millis(settings.connect_timeout_ms.max(1));
        // A blocking WAIT (the durability gate) must not look unresponsive.
        let wait_timeout = Duration::from_millis(settings.wait_timeout_ms);
        let unresponsive = (command_timeout * 2)
            .max(wait_timeout + command_timeout)
            .max(Duration::from_secs(1));
        let pool = Builder::from_config(config)
            .with_performance_config(|p| {
                // fred's default is no timeout: a lost reply would hang a partition.
                p.default_command_timeout = command_timeout;
            })
            .with_connection_config(|c| {
                c.connection_timeout = connect_timeout;
                c.internal_command_timeout = connect_timeout.max(command_timeout);
                // A command in flight when its connection drops is resent (a
                // script may run twice; the records make that harmless).
                c.max_command_attempts = 3;
                c.max_redirections = 5;
                c.unresponsive = UnresponsiveConfig {
                    max_timeout: Some(unresponsive),
                    interval: (unresponsive / 4).max(Duration::from_millis(100)),
                };
                c.tcp = TcpConfig {
                    nodelay: Some(true),
                    ..TcpConfig::default()
                };
                // A primary demoted without dropping its connections (a
                // Sentinel failover after a partition) answers READONLY:
                // reconnect, which asks the sentinels for the new primary.
                c.reconnect_errors = vec![ReconnectError::ReadOnly];
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
            .build_pool(settings.pool_size.max(1))
            .map_err(|e| LedgerError::redis("connect", e))?;

        let wait = connect_timeout * 2 + Duration::from_secs(1);
        let failure = match tokio::time::timeout(wait, pool.init()).await {
            Ok(Ok(_driver)) => None,
            Ok(Err(e)) => Some(LedgerError::redis("connect", e)),
            Err(_) => Some(LedgerError::connect_timeout(wait)),
        };
        if let Some(e) = failure {
            let _ = tokio::time::timeout(Duration::from_secs(1), pool.quit()).await;
            return Err(e);
        }
        let ledger = Ledger {
            pool,
            shared: Arc::new(Shared {
                keys: Keys::new(settings.key_prefix.clone()),
                record_ttl: settings.record_ttl_secs.to_string(),
                refund_ttl: settings.refund_ttl_secs.to_string(),
                slow_script: Duration::from_millis(settings.slow_script_ms),
                wait_replicas: settings.wait_replicas,
                wait_timeout,
                command_timeout,
            }),
        };
        ledger.check_gate();
        Ok(ledger)
    }

    /// The key layout under this ledger's prefix.
    pub fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    /// The underlying pool, for admin tools (audit scans) and tests.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// One round trip, for readiness.
    pub async fn ping(&self) -> Result<(), LedgerError> {
        self.pool
            .ping::<Value>(None)
            .await
            .map(drop)
            .map_err(|e| LedgerError::redis("ping", e))
    }

    /// `SCRIPT LOAD`s every script on every primary (for `deductor check`
    /// and startup; calls would load them lazily anyway).
    pub async fn load_scripts(&self) -> Result<(), LedgerError> {
        for script in scripts::all() {
            self.pool
                .script_load_cluster::<Value, _>(script.body)
                .await
                .map_err(|e| LedgerError::redis("script_load", e))?;
        }
        Ok(())
    }

    /// Closes every connection.
    pub async fn quit(&self) {
        let _ = self.pool.quit().await;
    }

    /// Decides and applies an `OrderPlaced`, all lines or none.
    ///
    /// Corrupt stored data on any line (a `CORRUPT` reply of any script,
    /// memo reads included) ends as a `corrupt_promotion` rejection, never
    /// as an error: deduct.lua remembers it under the line's memo, and the
    /// lines already deducted are released and marked like for any other
    /// rejection, so every delivery of the event repeats the decision.
    ///
    /// With the durability gate on, returns only once enough replicas have
    /// the event's writes ([`durability`]).
    pub async fn place(&self, e: &OrderPlaced) -> Result<PlaceDecision, LedgerError> {
        let gate = self.gate(&e.header.order_id);
        let decision = self.decide_place(e).await?;
        self.durable(gate, e.lines.iter().map(|l| &l.promotion_id))
            .await?;
        Ok(decision)
    }

    async fn decide_place(&self, e: &OrderPlaced) -> Result<PlaceDecision, LedgerError> {
        let h = &e.header;
        if e.lines.len() > 1 {
            // One decision per event: a redelivery of a rejected event is
            // rejected again, whatever the other lines would say now. The
            // first line's stored rejection is read by deduct.lua itself
            // (step 0) before it deducts anything; the other lines' are read
            // here, all at once (one round trip), before the first deduct.
            if let Some((p, reason, duplicate)) = self.stored_rejection(h, &e.lines[1..]).await? {
                // An earlier delivery may have stopped before releasing.
                self.release(h, &e.lines).await?;
                return Ok(rejected(duplicate, reason, p));
            }
        }
        let mut accepted = Vec::with_capacity(e.lines.len());
        let mut all_duplicate = true;
        for (i, line) in e.lines.iter().enumerate() {
            let p = &line.promotion_id;
            let reply = match self.deduct(h, line).await {
                Ok(reply) => reply,
                Err(err) if err.is_corrupt() => {
                    // deduct.lua stored `corrupt_promotion` under this line's
                    // memo (unless the memo itself is what is corrupt).
                    self.report_corrupt(h, p, &err);
                    self.release(h, &e.lines[..i]).await?;
                    return Ok(rejected(false, Reason::CorruptPromotion, p));
                }
                Err(err) => return Err(err),
            };
            match reply.status {
                Ok(()) => {
                    all_duplicate &= reply.duplicate;
                    accepted.push(AcceptedLine {
                        promotion_id: p.clone(),
                        budget: reply.budget,
                        stock: reply.stock,
                        remaining: reply.remaining,
                    });
                }
                Err(_) if reply.released => {
                    // Another delivery of this event decided it while this
                    // one was on its way: repeat that decision, whose reason
                    // is stored on the failing line.
                    self.release(h, &e.lines[..i]).await?;
                    return match self.stored_rejection(h, &e.lines).await? {
                        Some((q, reason, _)) => Ok(rejected(true, reason, q)),
                        None => self.redecide_released(e, i).await,
                    };
                }
                Err(reason) => {
                    self.release(h, &e.lines[..i]).await?;
                    return Ok(rejected(reply.duplicate, reason, p));
                }
            }
        }
        Ok(PlaceDecision::Accepted {
            duplicate: all_duplicate,
            lines: accepted,
        })
    }

    /// Line `i` of `e` is marked released, but no line holds the event's
    /// reason: it expired before the mark, or it was written on a Redis node
    /// that then failed over before replicating it (the event was not
    /// published then: the durability gate had not passed). The lines after
    /// `i` were released or never decided: they are decided again, and the
    /// first rejection is the event's decision (the lines deducted meanwhile
    /// are released). Only when none rejects is the event rejected
    /// `order_reverted`, with every line released: a released line is never
    /// deducted again.
    async fn redecide_released(
        &self,
        e: &OrderPlaced,
        i: usize,
    ) -> Result<PlaceDecision, LedgerError> {
        let h = &e.header;
        for (j, line) in e.lines.iter().enumerate().skip(i + 1) {
            let q = &line.promotion_id;
            let reply = match self.deduct(h, line).await {
                Ok(reply) => reply,
                Err(err) if err.is_corrupt() => {
                    self.report_corrupt(h, q, &err);
                    self.release(h, &e.lines[..j]).await?;
                    return Ok(rejected(false, Reason::CorruptPromotion, q));
                }
                Err(err) => return Err(err),
            };
            match reply.status {
                Ok(()) => {}
                Err(_) if reply.released => {}
                Err(reason) => {
                    self.release(h, &e.lines[..j]).await?;
                    return Ok(rejected(reply.duplicate, reason, q));
                }
            }
        }
        self.release(h, &e.lines).await?;
        Ok(rejected(
            true,
            Reason::OrderReverted,
            &e.lines[i].promotion_id,
        ))
    }

    /// The first stored rejection of the event on `lines` (in line order),
    /// with its promotion and whether it was read back; all memos are read
    /// at once (one round trip). A memo that is itself corrupt is a
    /// `corrupt_promotion` rejection on its line (every delivery meets it).
    async fn stored_rejection<'a>(
        &self,
        h: &Header,
        lines: &'a [PlaceLine],
    ) -> Result<Option<(&'a Id, Reason, bool)>, LedgerError> {
        let lookups = lines.iter().map(|line| {
            let p = &line.promotion_id;
            let memo = self.keys().rejected(p, &h.event_id);
            async move {
                (
                    p,
                    self.run(&scripts::MEMO, Some(&h.order_id), p, vec![memo], vec![])
                        .await,
                )
            }
        });
        for (p, result) in futures::future::join_all(lookups).await {
            match result {
                Ok(reply) => {
                    if let Some(reason) = scripts::decode_memo(reply)? {
                        return Ok(Some((p, reason, true)));
                    }
                }
                Err(err) if err.is_corrupt() => {
                    self.report_corrupt(h, p, &err);
                    return Ok(Some((p, Reason::CorruptPromotion, false)));
                }
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }

    /// Applies an `OrderRefunded`, each line on its own.
    ///
    /// A refund acts on the customer its deduction counted for (stored in
    /// the record), not on the one the refund event names: when they
    /// differ, rollback.lua writes nothing and names the stored customer,
    /// and the line is applied again with that customer's counter. The
    /// mismatch is logged and counted in
    /// `deductor_refund_customer_mismatch_total`.
    ///
    /// With the durability gate on, returns only once enough replicas have
    /// the event's writes ([`durability`]).
    pub async fn refund(&self, e: &OrderRefunded) -> Result<RefundDecision, LedgerError> {
        let gate = self.gate(&e.header.order_id);
        let decision = self.decide_refund(e).await?;
        self.durable(gate, e.lines.iter().map(|l| &l.promotion_id))
            .await?;
        Ok(decision)
    }

    async fn decide_refund(&self, e: &OrderRefunded) -> Result<RefundDecision, LedgerError> {
        let h = &e.header;
        let mut lines = Vec::with_capacity(e.lines.len());
        for line in &e.lines {
            let p = &line.promotion_id;
            let result = match self.rollback(h, line).await {
                Ok(r) => refund_line(p, r),
                Err(err) if err.is_corrupt() => {
                    self.report_corrupt(h, p, &err);
                    RefundLineResult {
                        promotion_id: p.clone(),
                        status: Err(Reason::CorruptPromotion),
                        duplicate: false,
                        budget: 0,
                        stock: 0,
                        remaining: Remaining::default(),
                    }
                }
                Err(err) => return Err(err),
            };
            lines.push(result);
        }
        Ok(RefundDecision { lines })
    }

    async fn rollback(&self, h: &Header, line: &RefundLine) -> Result<LineReply, LedgerError> {
        let p = &line.promotion_id;
        let mut customer = h.customer_id.clone();
        // At most one switch is expected; a record that changes hands again
        // meanwhile (a racing delivery) gets one more try.
        for _ in 0..3 {
            let keys = self
                .keys()
                .rollback_line(p, &h.order_id, &customer, &h.event_id);
            let args = vec![
                line.budget.map(|b| b.to_string()).unwrap_or_default(),
                line.stock.map(|s| s.to_string()).unwrap_or_default(),
                self.shared.record_ttl.clone(),
                self.shared.refund_ttl.clone(),
                h.event_id.to_string(),
                customer.to_string(),
            ];
            let reply = self
                .run(
                    &scripts::ROLLBACK,
                    Some(&h.order_id),
                    p,
                    keys.as_vec(),
                    args,
                )
                .await?;
            match scripts::decode_rollback(reply)? {
                scripts::RollbackReply::Line(r) => return Ok(r),
                scripts::RollbackReply::Customer(stored) => {
                    tracing::warn!(
                        promotion = %p,
                        order = %h.order_id,
                        event = %h.event_id,
                        named = %h.customer_id,
                        stored = %stored,
                        "refund names another customer than the deduction; applied to the deduction's customer"
                    );
                    crate::metrics::refund_customer_mismatch();
                    customer = stored;
                }
            }
        }
        Err(LedgerError::malformed(
            scripts::ROLLBACK.name,
            "the record's customer kept changing",
        ))
    }

    async fn deduct(&self, h: &Header, line: &PlaceLine) -> Result<LineReply, LedgerError> {
        let p = &line.promotion_id;
        let keys = self
            .keys()
            .deduct_line(p, &h.order_id, &h.customer_id, &h.event_id);
        let args = vec![
            line.budget.to_string(),
            line.stock.to_string(),
            h.occurred_at.to_string(),
            h.event_id.to_string(),
            self.shared.record_ttl.clone(),
            self.shared.refund_ttl.clone(),
            h.customer_id.to_string(),
        ];
        let reply = self
            .run(&scripts::DEDUCT, Some(&h.order_id), p, keys.as_vec(), args)
            .await?;
        scripts::decode_line(&scripts::DEDUCT, "accepted", reply)
    }

    /// Releases what this event deducted on `lines` (no-op where it deducted
    /// nothing) and marks each line's memo `released`, so a slower delivery
    /// of the event repeats the decision instead of deducting afresh. A line
    /// with corrupt data is reported and skipped: it keeps its (consistent)
    /// record, and the other lines are still released.
    async fn release(&self, h: &Header, lines: &[PlaceLine]) -> Result<(), LedgerError> {
        for line in lines {
            let p = &line.promotion_id;
            let k = self
                .keys()
                .deduct_line(p, &h.order_id, &h.customer_id, &h.event_id);
            let args = vec![
                h.event_id.to_string(),
                self.shared.refund_ttl.clone(),
                h.customer_id.to_string(),
            ];
            match self
                .run(&scripts::RELEASE, Some(&h.order_id), p, k.as_vec(), args)
                .await
            {
                Ok(reply) => {
                    if scripts::decode_release(reply)? {
                        tracing::debug!(promotion = %p, order = %h.order_id, "released line");
                    }
                }
                Err(err) if err.is_corrupt() => self.report_corrupt(h, p, &err),
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// The connection that carries every command of `order`: an order's
    /// commands are sent in order over one connection (and its concurrent
    /// memo lookups go out in one write); orders spread over the pool.
    fn connection(&self, order: &Id) -> &Client {
        let clients = self.pool.clients();
        let mut h = std::hash::DefaultHasher::new();
        order.as_str().hash(&mut h);
        &clients[(h.finish() % clients.len() as u64) as usize]
    }

    /// Runs one script for promotion `p`, timed: over the order's connection
    /// when `order` is given, else over any connection of the pool.
    pub(crate) async fn run(
        &self,
        script: &Script,
        order: Option<&Id>,
        p: &Id,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, LedgerError> {
        let start = Instant::now();
        let client = match order {
            Some(o) => self.connection(o),
            None => self.pool.next(),
        };
        let result = scripts::eval(client, script, keys, args).await;
        let took = start.elapsed();
        crate::metrics::script_duration(script.name, took.as_secs_f64());
        if took > self.shared.slow_script {
            tracing::warn!(
                script = script.name,
                promotion = %p,
                elapsed_ms = took.as_millis() as u64,
                "slow Redis script"
            );
            crate::metrics::slow_script(script.name);
        }
        result.map_err(|e| LedgerError::redis(script.name, e))
    }

    fn report_corrupt(&self, h: &Header, p: &Id, err: &LedgerError) {
        tracing::error!(
            promotion = %p,
            order = %h.order_id,
            event = %h.event_id,
            error = %err,
            "corrupt promotion data; the line is rejected corrupt_promotion (remembered for a placement)"
        );
        crate::metrics::corrupt_data();
    }
}

fn rejected(duplicate: bool, reason: Reason, p: &Id) -> PlaceDecision {
    PlaceDecision::Rejected {
        duplicate,
        reason,
        promotion_id: p.clone(),
    }
}

fn refund_line(p: &Id, r: LineReply) -> RefundLineResult {
    RefundLineResult {
        promotion_id: p.clone(),
        status: r.status,
        duplicate: r.duplicate,
        budget: r.budget,
        stock: r.stock,
        remaining: r.remaining,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> RedisSettings {
        let mut s = crate::config::Settings::load_from_env(None, &[], Vec::new())
            .expect("defaults are valid")
            .redis;
        s.url = url.to_owned();
        s
    }

    #[test]
    fn sentinel_url_becomes_a_sentinel_config() {
        let mut s = settings("redis-sentinel://u:url-pw@10.0.0.1:26380,10.0.0.2/mymaster");
        s.sentinel_username = "watcher".into();
        s.sentinel_password = "sentinel-pw".into();
        let c = fred_config(&s).unwrap();
        match &c.server {
            ServerConfig::Sentinel {
                hosts,
                service_name,
                username,
                password,
            } => {
                assert_eq!(
                    hosts,
                    &vec![
                        Server::new("10.0.0.1", 26380),
                        Server::new("10.0.0.2", 26379)
                    ]
                );
                assert_eq!(service_name, "mymaster");
                assert_eq!(username.as_deref(), Some("watcher"));
                assert_eq!(password.as_deref(), Some("sentinel-pw"));
            }
            other => panic!("not a sentinel config: {other:?}"),
        }
        // The data nodes' credentials: the url's, overridden by the settings.
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some("url-pw"));
        assert!(c.tls.is_none());
        assert!(c.fail_fast);
        s.password = "settings-pw".into();
        assert_eq!(
            fred_config(&s).unwrap().password.as_deref(),
            Some("settings-pw")
        );
    }

    #[test]
    fn sentinel_without_credentials_sends_none_to_the_sentinels() {
        let c = fred_config(&settings("rediss-sentinel://h/svc")).unwrap();
        assert!(c.tls.is_some(), "rediss-sentinel:// is TLS");
        match c.server {
            ServerConfig::Sentinel {
                username, password, ..
            } => assert_eq!((username, password), (None, None)),
            other => panic!("not a sentinel config: {other:?}"),
        }
        assert_eq!((c.username, c.password), (None, None));
    }

    #[test]
    fn other_urls_stay_fred_urls() {
        let c = fred_config(&settings("redis://127.0.0.1:6390/2")).unwrap();
        assert_eq!(c.server, ServerConfig::new_centralized("127.0.0.1", 6390));
        assert_eq!(c.database, Some(2));
        let c = fred_config(&settings(
            "redis-cluster://127.0.0.1:7001?node=127.0.0.1:7002",
        ))
        .unwrap();
        assert!(c.server.is_clustered());
        let e = fred_config(&settings("redis-sentinel://h:x/svc")).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Config, "{e}");
    }
}
