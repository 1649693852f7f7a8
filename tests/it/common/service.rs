//! Running the real service in tests: in-process with a
//! [`CancellationToken`] (`pipeline::run`), or as a child `deductor run`
//! process for kill tests. A [`Fixture`] holds one test's fresh topics,
//! consumer group and Redis key prefix, and builds the settings for both.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use deductor::admin::{self, PromoSpec};
use deductor::config::Settings;
use deductor::domain::event::Id;
use deductor::ledger::Ledger;
use deductor::pipeline;
use fred::prelude::KeysInterface;
use futures::TryStreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::kafka::{self, Topics};
use super::redis;

static TRACING: Once = Once::new();

/// Sets up tracing once per test binary (captured by the test harness;
/// `RUST_LOG` overrides the default filter).
pub fn init_tracing() {
    TRACING.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,deductor=info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// One test's world: fresh topics and group, a fresh Redis key prefix.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub topics: Topics,
    pub prefix: String,
    pub redis_url: String,
    pub brokers: String,
    /// The shared hold on the dev-stack servers (None: the test holds them
    /// exclusively).
    _stack: Option<super::StackGuard>,
}

impl Fixture {
    /// Creates the topics (`partitions` each); fails when Kafka is down.
    /// Holds the dev-stack servers shared while it lives.
    pub async fn new(label: &str, partitions: i32) -> Fixture {
        let stack = super::stack_shared().await;
        Fixture::build(label, partitions, Some(stack)).await
    }

    /// The same, for a test that holds the servers exclusively
    /// ([`super::stack_exclusive`]) because it takes one down.
    pub async fn within(_exclusive: &super::Exclusive, label: &str, partitions: i32) -> Fixture {
        Fixture::build(label, partitions, None).await
    }

    /// The same on the dev stack's Kafka and the Redis at `redis_url` (a
    /// test's own server: [`super::own_redis::OwnRedis`]), holding the
    /// stack shared.
    pub async fn on_redis(label: &str, partitions: i32, redis_url: String) -> Fixture {
        let stack = super::stack_shared().await;
        let mut f = Fixture::build(label, partitions, Some(stack)).await;
        f.redis_url = redis_url;
        f
    }

    async fn build(label: &str, partitions: i32, stack: Option<super::StackGuard>) -> Fixture {
        init_tracing();
        Fixture {
            topics: kafka::fresh_topics(label, partitions).await,
            prefix: redis::unique_prefix(),
            redis_url: redis::redis_url(),
            brokers: kafka::brokers(),
            _stack: stack,
        }
    }

    /// The settings every test run uses, as `section.key` pairs: quick
    /// commits and rebalances, no HTTP, short retry caps.
    pub fn overrides(&self) -> Vec<(String, String)> {
        let t = &self.topics;
        [
            ("kafka.brokers", self.brokers.as_str()),
            ("kafka.input_topic", &t.input),
            ("kafka.outcome_topic", &t.outcome),
            ("kafka.dlq_topic", &t.dlq),
            ("kafka.group_id", &t.group),
            ("kafka.consumer.session.timeout.ms", "6000"),
            ("kafka.consumer.heartbeat.interval.ms", "1000"),
            ("redis.url", &self.redis_url),
            ("redis.key_prefix", &self.prefix),
            ("pipeline.commit_interval_ms", "200"),
            ("pipeline.drain_timeout_secs", "20"),
            ("retry.max_interval_ms", "1000"),
            ("http.listen", ""),
            ("log.format", "pretty"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Settings for an in-process run, with `extra` overrides on top.
    pub fn settings(&self, extra: &[(&str, &str)]) -> Settings {
        let mut o = self.overrides();
        o.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Settings::load_from_env(None, &o, Vec::<(String, String)>::new())
            .unwrap_or_else(|e| panic!("test settings: {e}"))
    }

    /// `DEDUCTOR_*` variables that configure a child process like
    /// [`Fixture::settings`], with `extra` (`section.key`) on top.
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut o = self.overrides();
        o.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        o.into_iter().map(|(k, v)| (env_name(&k), v)).collect()
    }

    /// A ledger under this fixture's prefix; fails when Redis is down.
    pub async fn ledger(&self) -> Ledger {
        Ledger::connect(&redis::settings(&self.redis_url, &self.prefix))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach Redis at {} (scripts/dev-stack up): {e}",
                    self.redis_url
                )
            })
    }

    /// Every Redis key under the fixture's prefix.
    pub async fn keys(
        &self,
        ledger: &Ledger,
    ) -> Result<Vec<fred::prelude::Key>, fred::error::Error> {
        ledger
            .pool()
            .next()
            .scan_buffered(format!("{}:*", self.prefix), Some(1000), None)
            .try_collect()
            .await
    }

    /// Deletes the fixture's topics and Redis keys; call it at the end of a
    /// passed test (a failed one keeps them for a look).
    pub async fn cleanup(&self) {
        let t = &self.topics;
        kafka::delete_topics(&[&t.input, &t.outcome, &t.dlq]).await;
        let ledger = self.ledger().await;
        let keys = self.keys(&ledger).await.unwrap_or_default();
        for chunk in keys.chunks(500) {
            let _: Result<i64, _> = ledger.pool().unlink(chunk.to_vec()).await;
        }
        ledger.quit().await;
    }

    /// Creates promotion `p` under this fixture's prefix.
    pub async fn promo(&self, ledger: &Ledger, p: &str, spec: PromoSpec) {
        let id = Id::parse(p).unwrap();
        admin::promo_set(ledger, &id, spec, false)
            .await
            .unwrap_or_else(|e| panic!("promo set {p}: {e}"));
    }
}

/// `kafka.consumer.session.timeout.ms` -> `DEDUCTOR_KAFKA_CONSUMER_SESSION_TIMEOUT_MS`.
fn env_name(key: &str) -> String {
    format!("DEDUCTOR_{}", key.replace('.', "_").to_uppercase())
}

/// The service running in this process.
pub struct InProcess {
    token: CancellationToken,
    handle: JoinHandle<anyhow::Result<()>>,
    pub status: std::sync::Arc<pipeline::Status>,
}

/// Starts `pipeline::run_with_status` on the current runtime.
pub fn start(settings: Settings) -> InProcess {
    init_tracing();
    let token = CancellationToken::new();
    let status = std::sync::Arc::new(pipeline::Status::default());
    let handle = tokio::spawn(pipeline::run_with_status(
        settings,
        token.clone(),
        status.clone(),
    ));
    InProcess {
        token,
        handle,
        status,
    }
}

impl InProcess {
    /// Cancels the token and waits for `run` to return; fails the test when
    /// it does not within `within`. Returns run's result and how long the
    /// stop took.
    pub async fn stop(self, within: Duration) -> (anyhow::Result<()>, Duration) {
        let started = Instant::now();
        self.token.cancel();
        match tokio::time::timeout(within, self.handle).await {
            Ok(Ok(result)) => (result, started.elapsed()),
            Ok(Err(join)) => panic!("the service task panicked: {join}"),
            Err(_) => panic!("the service did not stop within {within:?}"),
        }
    }

    /// True when `run` returned (a fatal error, since nobody cancelled it).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Fails the test with run's error if it stopped by itself.
    pub async fn assert_running(&mut self) {
        if self.handle.is_finished() {
            let r = (&mut self.handle).await;
            panic!("the service stopped by itself: {r:?}");
        }
    }
}

/// Runs `scripts/dev-stack <verb>` (kill-redis, start-redis, kill-kafka,
/// start-kafka, ...); fails the test when it fails.
pub fn dev_stack(verb: &str) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/dev-stack");
    let out = Command::new(&script)
        .arg(verb)
        .output()
        .unwrap_or_else(|e| panic!("running {} {verb}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/dev-stack {verb} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// True when something accepts TCP connections at `host:port`.
pub fn listening(addr: &str) -> bool {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}

/// Waits until nothing answers at `addr` (`host:port`) after `what` took
/// its server down; fails the test after 15 s.
pub async fn wait_closed(addr: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while listening(addr) {
        assert!(
            Instant::now() < deadline,
            "{addr} still answers 15s after {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The path of the `deductor` binary built for these tests.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_deductor"))
}

/// A `deductor` command with the environment cleaned of inherited
/// `DEDUCTOR_*` variables (the dev-stack exports some the config does not
/// know) and set to `env`. `DEDUCTOR_MUTANT` (scripts/check-test-mutants)
/// is passed on: a mutant is built into the child too.
pub fn command(env: &[(String, String)]) -> Command {
    let mut c = Command::new(binary());
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUCTOR_") && k != "DEDUCTOR_MUTANT" {
            c.env_remove(&k);
        }
    }
    c.env_remove("RUST_LOG");
    c.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    c
}

/// A `deductor run` child process; its output goes to a log file.
pub struct ChildService {
    child: std::process::Child,
    pub log: PathBuf,
    dir: Option<tempfile::TempDir>,
}

/// Spawns `deductor <args>` with `env` (see [`command`]).
pub fn spawn(env: &[(String, String)], args: &[&str]) -> ChildService {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("deductor.log");
    let out = std::fs::File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = command(env)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {}: {e}", binary().display()));
    ChildService {
        child,
        log,
        dir: Some(dir),
    }
}

impl ChildService {
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `within` for the exit status.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -TERM {pid} failed");
        self.wait(within)
            .unwrap_or_else(|| panic!("deductor did not exit within {within:?} of SIGTERM"))
    }

    /// Waits up to `within` for the process to exit.
    pub fn wait(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status if the process already exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// The last `n` lines of the process's output.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// How often `needle` occurs in the process's output so far.
    pub fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches(needle)
            .count()
    }

    /// Waits until the output contains `needle`; fails the test if the
    /// process exits or `within` passes first.
    pub async fn wait_for_log(&mut self, needle: &str, within: Duration) {
        self.wait_for_log_count(needle, 1, within).await;
    }

    /// Waits until the output contains `needle` `n` times; fails the test if
    /// the process exits or `within` passes first.
    pub async fn wait_for_log_count(&mut self, needle: &str, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.log_count(needle) < n {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "{n} x {needle:?} not in the output after {within:?}; log:\n{}",
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fails the test (with the log) if the process exited.
    pub fn assert_running(&mut self) {
        if let Some(s) = self.exited() {
            panic!(
                "deductor exited by itself ({s}); log:\n{}",
                self.log_tail(40)
            );
        }
    }
}

impl Drop for ChildService {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // A failed test keeps the process's log for a look.
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!("deductor log kept: {}", kept.join("deductor.log").display());
            }
        }
    }
}

/// Waits until the group committed the whole input (at most `wait`), stops
/// the child with SIGTERM (exit 0 expected), and reads both output topics.
pub async fn finish_child(
    f: &Fixture,
    mut child: ChildService,
    wait: Duration,
) -> (Vec<kafka::Record>, Vec<kafka::Record>) {
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, f.topics.partitions, wait).await;
    child.assert_running();
    let (status, tail) = tokio::task::spawn_blocking(move || {
        let status = child.terminate(Duration::from_secs(30));
        (status, child.log_tail(40))
    })
    .await
    .unwrap();
    assert!(
        status.success(),
        "deductor run exits 0 on SIGTERM: {status}; log:\n{tail}"
    );
    (
        kafka::read_all(&f.topics.outcome).await,
        kafka::read_all(&f.topics.dlq).await,
    )
}

/// A GET through the service's own HTTP client: (status code, body), None
/// when nothing answers.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    deductor::admin::healthcheck::fetch(&format!("http://{addr}{path}"))
        .await
        .ok()
        .map(|r| (r.status, r.body))
}

pub fn free_local_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// Polls `path` until `want` holds for its answer; fails with the child's log.
pub async fn wait_probe(
    child: &mut ChildService,
    addr: &str,
    path: &str,
    within: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        child.assert_running();
        if let Some((code, body)) = http_get(addr, path).await {
            if want(code, &body) {
                return (code, body);
            }
            last = Some((code, body));
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered as wanted within {within:?} (last: {last:?}); log:\n{}",
            child.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
