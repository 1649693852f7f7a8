//! Connecting: the fred config of `redis.*` (urls, `redis-sentinel://`,
//! TLS, credentials) and the pool with its timeouts and reconnect policy.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{
    Builder, ClientLike, Config, ReconnectPolicy, Server, ServerConfig, TcpConfig,
};
use fred::types::config::{ReconnectError, TlsConnector, UnresponsiveConfig};

use super::batch::{Batcher, Kind};
use super::calls::Ttls;
use super::sentinel::SentinelUrl;
use super::{Ledger, LedgerError, Shared};
use crate::config::RedisSettings;
use crate::domain::keys::Keys;

/// The TLS connector of `rediss://` urls: the system's roots plus
/// `redis.tls_ca_file`, verification off only on request.
fn tls_connector(s: &RedisSettings) -> Result<TlsConnector, LedgerError> {
    TlsConnector::try_from(tls_builder(s, true)?).map_err(|e| LedgerError::redis("connect", e))
}

/// [`tls_connector`]'s native-tls builder; `warn`: log that verification
/// is off.
fn tls_builder(
    s: &RedisSettings,
    warn: bool,
) -> Result<fred::native_tls::TlsConnectorBuilder, LedgerError> {
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
        if warn {
            tracing::warn!(
                "redis.tls_insecure_skip_verify is on: the Redis server's certificate is not checked"
            );
        }
        builder
            .danger_accept_invalid_certs(true)
            .danger_accept_invalid_hostnames(true);
    }
    Ok(builder)
}

/// fred reports a `rediss-sentinel://` whose sentinels all refused the TLS
/// handshake only as "failed to connect to all sentinel nodes" (a
/// connection failure, retried, exit 3), while `rediss://` reports the
/// certificate (exit 2). After such a failure the first sentinel's
/// handshake is tried once more here: a refused certificate is returned as
/// the TLS error it is. `None`: not TLS to sentinels, or the handshake
/// passes (the failure was something else).
async fn sentinel_tls_refusal(s: &RedisSettings) -> Option<LedgerError> {
    let u = SentinelUrl::parse(&s.url).ok().filter(|u| u.tls)?;
    let (host, port) = u.sentinels.first()?.clone();
    let connector = tls_builder(s, false).ok()?.build().ok()?;
    let timeout = Duration::from_millis(s.connect_timeout_ms.max(1));
    let refused = tokio::task::spawn_blocking(move || {
        use std::net::ToSocketAddrs;
        let addr = (host.as_str(), port).to_socket_addrs().ok()?.next()?;
        let tcp = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
        tcp.set_read_timeout(Some(timeout)).ok()?;
        tcp.set_write_timeout(Some(timeout)).ok()?;
        match connector.connect(&host, tcp) {
            Err(fred::native_tls::HandshakeError::Failure(e)) => {
                Some(format!("sentinel {host}:{port}: {e:?}"))
            }
            _ => None,
        }
    })
    .await
    .ok()??;
    Some(LedgerError::redis(
        "connect",
        fred::error::Error::new(fred::error::ErrorKind::Tls, refused),
    ))
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

impl Ledger {
    /// Builds the pool from `settings` and waits (bounded) until every
    /// connection is up. Credentials in `settings` override the URL's.
    pub async fn connect(settings: &RedisSettings) -> Result<Ledger, LedgerError> {
        let config = fred_config(settings)?;
        let clustered = config.server.is_clustered();
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
                // fred follows no redirection: its ASK path (fred 10.1.0,
                // `send_asking_with_policy`) sends ASKING on a pooled
                // connection and takes the reply meant for the next command,
                // after which every reply on that connection is shifted and
                // calls time out until a restart (issue 25, a slot
                // migration). With 0, a MOVED still re-reads the slot map
                // before fred gives up, and an ASK fails at once; both come
                // back as a Cluster error that the ledger's caller retries
                // with backoff, so a migrating slot's promotion waits until
                // the migration ends while every other one goes on.
                c.max_redirections = 0;
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
            if e.class() == super::ErrorClass::Connection && SentinelUrl::is_sentinel(&settings.url)
            {
                if let Some(tls) = sentinel_tls_refusal(settings).await {
                    return Err(tls);
                }
            }
            return Err(e);
        }
        // One script may touch every key only outside a Cluster, and the
        // gate's WAIT covers only the order's own connection.
        let batched = settings.batch_max_lines > 1 && settings.wait_replicas == 0 && !clustered;
        let start = |kind| {
            batched.then(|| {
                Batcher::start(
                    kind,
                    pool.clone(),
                    settings.batch_max_lines,
                    Duration::from_millis(settings.batch_linger_ms),
                    Duration::from_millis(settings.slow_script_ms),
                )
            })
        };
        let (batcher, memo_batcher, rollback_batcher, release_batcher) = (
            start(Kind::Deduct),
            start(Kind::Memo),
            start(Kind::Rollback),
            start(Kind::Release),
        );
        let ledger = Ledger {
            pool,
            shared: Arc::new(Shared {
                batcher,
                memo_batcher,
                rollback_batcher,
                release_batcher,
                wedge: Default::default(),
                layouts: Default::default(),
                bucket_ttl_secs: settings.record_ttl_secs,
                keys: Keys::new(settings.key_prefix.clone()),
                ttl: {
                    let ttl = Ttls::new(settings.record_ttl_secs, settings.refund_ttl_secs);
                    // A Redis Cluster lists slot {P} for `audit P`: no index there.
                    if clustered {
                        ttl
                    } else {
                        ttl.indexed(settings.record_ttl_secs)
                    }
                },
                slow_script: Duration::from_millis(settings.slow_script_ms),
                wait_replicas: settings.wait_replicas,
                wait_timeout,
                command_timeout,
            }),
        };
        ledger.check_gate();
        Ok(ledger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ErrorClass;

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
