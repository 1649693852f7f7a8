//! `deductor check`'s lines naming the servers it talks to: the Redis or
//! Valkey server and version of every primary (`INFO server`), and the
//! Kafka release the broker's ApiVersions answer matches. Each warns below
//! the supported minimum, the oldest release the test matrix runs
//! (scripts/test; docs/operations.md, "Supported servers"). A warning never
//! fails the check: an older server may work, it is just not tested.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::ClientContext;

use super::Report;
use crate::config::KafkaSettings;
use crate::ledger::Ledger;

/// The oldest tested Redis (Debian 12's 7.0).
const MIN_REDIS: (u32, u32) = (7, 0);
/// The oldest tested Valkey (8.1).
const MIN_VALKEY: (u32, u32) = (8, 1);
/// The oldest tested Kafka (3.9, KRaft).
const MIN_KAFKA: (u32, u32) = (3, 9);

/// `major.minor[.patch...]` -> (major, minor); None when not a version.
fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The server an `INFO server` text names: ("valkey", "8.1.8") from
/// `server_name` / `valkey_version`, else ("redis", `redis_version`)
/// (Redis has no `server_name`; Valkey also reports a `redis_version`, the
/// Redis release it is compatible with, which says nothing of its own).
fn redis_server(info: &str) -> Option<(String, String)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    match field("server_name") {
        Some(name) if name != "redis" => {
            let version = field(&format!("{name}_version")).or_else(|| field("redis_version"))?;
            Some((name, version))
        }
        _ => Some(("redis".to_owned(), field("redis_version")?)),
    }
}

/// Ok(detail) when the server is a tested kind at or above its minimum;
/// Err(why) otherwise.
fn redis_verdict(name: &str, version: &str) -> Result<(), String> {
    let (min, label) = match name {
        "redis" => (MIN_REDIS, "Redis"),
        "valkey" => (MIN_VALKEY, "Valkey"),
        other => {
            return Err(format!(
                "{other} {version} is not a tested server (Redis {}.{}+ or Valkey {}.{}+)",
                MIN_REDIS.0, MIN_REDIS.1, MIN_VALKEY.0, MIN_VALKEY.1
            ))
        }
    };
    match major_minor(version) {
        Some(v) if v >= min => Ok(()),
        Some(_) => Err(format!(
            "{name} {version} is below the supported minimum {label} {}.{}",
            min.0, min.1
        )),
        None => Err(format!(
            "{name} reports version {version:?}, which is not a version"
        )),
    }
}

/// The `redis-server` line: every primary's server and version.
pub(super) async fn redis(r: &mut Report, ledger: &Ledger) {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for node in ledger.primaries_info().await {
        let at = if node.node.is_empty() {
            String::new()
        } else {
            format!(" ({})", node.node)
        };
        match node.info.map(|text| redis_server(&text)) {
            Ok(Some((name, version))) => {
                if let Err(why) = redis_verdict(&name, &version) {
                    problems.push(format!("{why}{at}"));
                }
                seen.entry(format!("{name} {version}"))
                    .or_default()
                    .push(node.node);
            }
            Ok(None) => problems.push(format!("INFO server names no version{at}")),
            Err(e) => problems.push(format!("INFO server failed{at}: {e}")),
        }
    }
    let names = seen.keys().cloned().collect::<Vec<_>>().join(", ");
    if problems.is_empty() {
        r.ok("redis-server", names);
    } else {
        r.warn(
            "redis-server",
            format!(
                "{}{}; tested: Redis {}.{}, Valkey {}.{} (docs/operations.md, \"Supported servers\")",
                if names.is_empty() { String::new() } else { format!("{names}: ") },
                problems.join("; "),
                MIN_REDIS.0,
                MIN_REDIS.1,
                MIN_VALKEY.0,
                MIN_VALKEY.1
            ),
        );
    }
}

// --- Kafka ------------------------------------------------------------------

const PRODUCE: i16 = 0;
const FETCH: i16 = 1;

/// What a broker's ApiVersions answer proves about its release: the first
/// release (newest first) whose mark it shows. Each mark is a protocol
/// change that shipped in that release.
enum Mark {
    /// The API's lowest version is at least this (old versions removed).
    MinAtLeast(i16, i16),
    /// The API's highest version is at least this (a version added).
    MaxAtLeast(i16, i16),
}

const KAFKA_MARKS: &[((u32, u32), Mark)] = &[
    // KIP-896: Kafka 4.0 removed old protocol versions, Fetch v0-v3 among
    // them (Produce v0-v2 were kept for old clients).
    ((4, 0), Mark::MinAtLeast(FETCH, 4)),
    // KIP-853: Fetch v17 (the replica directory id) came with Kafka 3.9.
    ((3, 9), Mark::MaxAtLeast(FETCH, 17)),
];

/// One broker's ApiVersions: api key -> (lowest, highest) version.
type ApiVersions = BTreeMap<i16, (i16, i16)>;

/// What the ApiVersions say, at least: Some((major, minor)) of the newest
/// release whose mark they show, None when older than every mark.
fn kafka_release(apis: &ApiVersions) -> Option<(u32, u32)> {
    KAFKA_MARKS.iter().find_map(|(release, mark)| {
        let shows = match *mark {
            Mark::MinAtLeast(key, v) => apis.get(&key).is_some_and(|&(min, _)| min >= v),
            Mark::MaxAtLeast(key, v) => apis.get(&key).is_some_and(|&(_, max)| max >= v),
        };
        shows.then_some(*release)
    })
}

/// The release's name in a line: the newest mark is "4.0 or later" (the
/// protocol of later releases is not told apart here), 3.9 is the last 3.x.
fn kafka_release_text(release: Option<(u32, u32)>) -> String {
    match release {
        Some((4, 0)) => "Kafka 4.0 or later".to_owned(),
        Some((major, minor)) => format!("Kafka {major}.{minor}"),
        None => format!("Kafka older than {}.{}", MIN_KAFKA.0, MIN_KAFKA.1),
    }
}

/// One librdkafka `APIVERSION` debug line, `<broker>:   ApiKey Produce (0)
/// Versions 0..11` (after a `[thrd:...]: ` prefix): (broker, key, min, max).
fn parse_api_line(line: &str) -> Option<(String, i16, i16, i16)> {
    let at = line.find("ApiKey ")?;
    let head = line[..at].trim_end().trim_end_matches(':');
    let broker = head.rsplit("]: ").next().unwrap_or(head).trim().to_owned();
    let rest = &line[at..];
    let key = rest[rest.find('(')? + 1..rest.find(')')?]
        .trim()
        .parse()
        .ok()?;
    let versions = rest[rest.find("Versions ")? + "Versions ".len()..].trim();
    let (min, max) = versions.split_once("..")?;
    Some((
        broker,
        key,
        min.trim().parse().ok()?,
        max.trim().parse().ok()?,
    ))
}

/// Collects librdkafka's `APIVERSION` debug lines (debug=feature): the
/// broker's ApiVersions answer as the client received it, over whatever
/// security protocol the settings use.
#[derive(Default)]
struct ApiVersionLog(Mutex<Vec<String>>);

impl ClientContext for ApiVersionLog {
    fn log(&self, _level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == "APIVERSION" && log_message.contains("ApiKey ") {
            if let Ok(mut lines) = self.0.lock() {
                lines.push(log_message.to_owned());
            }
        }
    }
}

impl ConsumerContext for ApiVersionLog {}

/// Each broker's ApiVersions, from a short-lived client of the same
/// settings (the check's own consumer keeps its default logging).
fn probe(k: &KafkaSettings) -> Result<BTreeMap<String, ApiVersions>, String> {
    let mut config = crate::kafka::consumer::consumer_config(k, None);
    config.set("statistics.interval.ms", "0");
    config.set("debug", "feature");
    config.set_log_level(RDKafkaLogLevel::Debug);
    let consumer: BaseConsumer<ApiVersionLog> = config
        .create_with_context(ApiVersionLog::default())
        .map_err(|e| e.to_string())?;
    // The metadata request follows the ApiVersions exchange on the broker.
    consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    // rdkafka routes librdkafka's log lines through the client's queue
    // (log.queue): polling delivers them to the context. A broker's answer
    // is ~80 lines at once; poll until some came and no more come.
    let seen = || consumer.context().0.lock().map(|l| l.len()).unwrap_or(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut last = 0;
    while std::time::Instant::now() < deadline {
        let _ = consumer.poll(Duration::from_millis(50));
        let now = seen();
        if now > 0 && now == last {
            break;
        }
        last = now;
    }
    let lines = consumer
        .context()
        .0
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    // One entry per broker address: librdkafka logs a broker under its
    // bootstrap name (`host:port/bootstrap`) and its id (`host:port/1`);
    // its logical coordinator handles (`GroupCoordinator/1`) are no others.
    let mut brokers: BTreeMap<String, ApiVersions> = BTreeMap::new();
    for (broker, key, min, max) in lines.iter().filter_map(|l| parse_api_line(l)) {
        let address = broker.split('/').next().unwrap_or(&broker).to_owned();
        if address.contains(':') {
            brokers.entry(address).or_default().insert(key, (min, max));
        }
    }
    Ok(brokers)
}

/// The `kafka-broker` line: the Kafka release of every broker the client
/// spoke to, and a warning below the supported minimum.
pub(super) async fn kafka(r: &mut Report, k: &KafkaSettings) {
    let settings = k.clone();
    let probed = tokio::task::spawn_blocking(move || probe(&settings))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    let brokers = match probed {
        Ok(b) if !b.is_empty() => b,
        Ok(_) => {
            r.warn(
                "kafka-broker",
                "the broker's ApiVersions answer was not seen; its release is unknown".to_owned(),
            );
            return;
        }
        Err(e) => {
            r.warn(
                "kafka-broker",
                format!("ApiVersions: {e}; its release is unknown"),
            );
            return;
        }
    };
    match kafka_line(&brokers) {
        (true, detail) => r.ok("kafka-broker", detail),
        (false, detail) => r.warn("kafka-broker", detail),
    }
}

/// (ok, detail) of the `kafka-broker` line: the oldest broker decides.
fn kafka_line(brokers: &BTreeMap<String, ApiVersions>) -> (bool, String) {
    // None (older than every mark) sorts first.
    let release = brokers.values().map(kafka_release).min().flatten();
    let range = |apis: &ApiVersions, key| {
        apis.get(&key)
            .map(|(min, max)| format!("v{min}-{max}"))
            .unwrap_or_else(|| "none".to_owned())
    };
    let per_broker: Vec<String> = brokers
        .iter()
        .map(|(b, apis)| {
            format!(
                "{b}: Produce {}, Fetch {}, {} APIs",
                range(apis, PRODUCE),
                range(apis, FETCH),
                apis.len()
            )
        })
        .collect();
    let detail = format!(
        "{} (ApiVersions of {})",
        kafka_release_text(release),
        per_broker.join("; ")
    );
    match release {
        Some(v) if v >= MIN_KAFKA => (true, detail),
        _ => (
            false,
            format!(
                "{detail}: below the supported minimum Kafka {}.{} (docs/operations.md, \"Supported servers\")",
                MIN_KAFKA.0, MIN_KAFKA.1
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_and_its_own_version_are_read_from_info() {
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
        assert_eq!(redis_server(redis), Some(("redis".into(), "7.0.15".into())));
        // Valkey reports the Redis release it is compatible with too.
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
        assert_eq!(
            redis_server(valkey),
            Some(("valkey".into(), "8.1.8".into()))
        );
        assert_eq!(redis_server("# Server\r\nos:Linux\r\n"), None);
    }

    #[test]
    fn servers_below_the_tested_minimum_are_named() {
        assert_eq!(redis_verdict("redis", "7.0.15"), Ok(()));
        assert_eq!(redis_verdict("redis", "7.4.1"), Ok(()));
        assert_eq!(redis_verdict("valkey", "8.1.8"), Ok(()));
        assert_eq!(redis_verdict("valkey", "9.0.0"), Ok(()));
        let old = redis_verdict("redis", "6.2.14").unwrap_err();
        assert!(
            old.contains("below the supported minimum Redis 7.0"),
            "{old}"
        );
        // Valkey 8.0 says redis_version 7.2.4, above Redis' minimum: the
        // verdict is on valkey_version.
        let old = redis_verdict("valkey", "8.0.2").unwrap_err();
        assert!(
            old.contains("below the supported minimum Valkey 8.1"),
            "{old}"
        );
        let other = redis_verdict("keydb", "6.3.4").unwrap_err();
        assert!(other.contains("not a tested server"), "{other}");
        assert!(redis_verdict("redis", "unstable").is_err());
    }

    #[test]
    fn librdkafka_apiversion_lines_are_parsed() {
        let l = "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap:   ApiKey Produce (0) Versions 0..13";
        assert_eq!(
            parse_api_line(l),
            Some(("127.0.0.1:9092/bootstrap".into(), 0, 0, 13))
        );
        let l = "127.0.0.1:9092/1:   ApiKey Fetch (1) Versions 0..17";
        assert_eq!(
            parse_api_line(l),
            Some(("127.0.0.1:9092/1".into(), 1, 0, 17))
        );
        assert_eq!(parse_api_line("Broker API support:"), None);
    }

    fn apis(pairs: &[(i16, i16, i16)]) -> ApiVersions {
        pairs.iter().map(|&(k, min, max)| (k, (min, max))).collect()
    }

    #[test]
    fn api_versions_map_to_a_kafka_release_and_old_ones_warn() {
        // As Kafka 4.4.0 and 3.9.1 answer (scripts/dev-stack).
        let k4 = apis(&[(PRODUCE, 0, 13), (FETCH, 4, 18)]);
        let k39 = apis(&[(PRODUCE, 0, 11), (FETCH, 0, 17)]);
        let k38 = apis(&[(PRODUCE, 0, 11), (FETCH, 0, 16)]);
        assert_eq!(kafka_release(&k4), Some((4, 0)));
        assert_eq!(kafka_release(&k39), Some((3, 9)));
        assert_eq!(kafka_release(&k38), None);

        let one = |a: &ApiVersions| BTreeMap::from([("b:9092/1".to_owned(), a.clone())]);
        let (ok, d) = kafka_line(&one(&k4));
        assert!(ok && d.starts_with("Kafka 4.0 or later"), "{d}");
        let (ok, d) = kafka_line(&one(&k39));
        assert!(ok && d.starts_with("Kafka 3.9 "), "{d}");
        let (ok, d) = kafka_line(&one(&k38));
        assert!(!ok, "{d}");
        assert!(
            d.starts_with("Kafka older than 3.9")
                && d.contains("below the supported minimum Kafka 3.9"),
            "{d}"
        );
        // A cluster is as old as its oldest broker.
        let mixed = BTreeMap::from([("a/1".to_owned(), k4), ("b/2".to_owned(), k38)]);
        let (ok, d) = kafka_line(&mixed);
        assert!(!ok && d.contains("older than 3.9"), "{d}");
    }
}
