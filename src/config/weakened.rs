//! Settings that work but turn a protection off: TLS verification of Kafka
//! or Redis, a SASL password sent in clear, an HTTP listener on every
//! interface. `check` reports each as a warning (counted in its JSON) and
//! `run` logs each at start; none of them stops anything.

use std::collections::BTreeMap;

use super::Settings;

/// One weakened setting: the key as an operator writes it, and what it
/// gives away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weakened {
    pub key: String,
    pub why: &'static str,
}

impl std::fmt::Display for Weakened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.why)
    }
}

/// Every weakened setting of `s`, in a fixed order (consumer before
/// producer).
pub fn weakened(s: &Settings) -> Vec<Weakened> {
    let mut out = Vec::new();
    for (client, props) in [
        ("consumer", &s.kafka.consumer),
        ("producer", &s.kafka.producer),
    ] {
        kafka(client, props, &mut out);
    }
    if s.redis.tls_insecure_skip_verify {
        out.push(Weakened {
            key: "redis.tls_insecure_skip_verify = true".to_owned(),
            why: "the Redis server's certificate and name are not checked: anyone on the path \
                  can pose as Redis and read the password",
        });
    }
    if all_interfaces(&s.http.listen) {
        out.push(Weakened {
            key: format!("http.listen = {:?}", s.http.listen),
            why: "/metrics, /healthz and /readyz answer on every interface: listen on the pod \
                  IP or 127.0.0.1, or admit only the scraper with a NetworkPolicy",
        });
    }
    out
}

/// librdkafka's properties, case as librdkafka takes them (names are
/// lower case; values of enums and booleans are not case-sensitive).
fn kafka(client: &str, props: &BTreeMap<String, String>, out: &mut Vec<Weakened>) {
    let get = |k: &str| props.get(k).map(|v| v.trim().to_ascii_lowercase());
    if let Some(v) = get("enable.ssl.certificate.verification") {
        if matches!(v.as_str(), "false" | "0" | "f") {
            out.push(Weakened {
                key: format!("kafka.{client}.\"enable.ssl.certificate.verification\" = {v}"),
                why: "the brokers' certificates are not checked: anyone on the path can pose as \
                      Kafka and read the SASL password",
            });
        }
    }
    if get("ssl.endpoint.identification.algorithm").as_deref() == Some("none") {
        out.push(Weakened {
            key: format!("kafka.{client}.\"ssl.endpoint.identification.algorithm\" = none"),
            why: "the brokers' names are not checked against their certificates: any \
                  certificate of the trusted CA passes for any broker",
        });
    }
    let protocol = get("security.protocol");
    // librdkafka's default mechanism is GSSAPI; PLAIN sends the password.
    let mechanism = get("sasl.mechanisms").or_else(|| get("sasl.mechanism"));
    if protocol.as_deref() == Some("sasl_plaintext") && mechanism.as_deref() == Some("plain") {
        out.push(Weakened {
            key: format!("kafka.{client}.\"security.protocol\" = SASL_PLAINTEXT with PLAIN"),
            why: "the SASL password crosses the network in clear: use SASL_SSL, or SCRAM",
        });
    }
}

/// `0.0.0.0:P` or `[::]:P`.
fn all_interfaces(listen: &str) -> bool {
    listen
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        let mut s = Settings::load_from_env(None, &[], std::iter::empty()).unwrap();
        s.http.listen = "127.0.0.1:9464".to_owned();
        for (k, v) in pairs {
            let (client, prop) = k.split_once('.').unwrap();
            let map = if client == "consumer" {
                &mut s.kafka.consumer
            } else {
                &mut s.kafka.producer
            };
            map.insert(prop.to_owned(), (*v).to_owned());
        }
        s
    }

    #[test]
    fn safe_settings_are_not_reported() {
        let s = settings(&[
            ("consumer.security.protocol", "SASL_SSL"),
            ("consumer.sasl.mechanism", "PLAIN"),
            ("producer.security.protocol", "SASL_PLAINTEXT"),
            ("producer.sasl.mechanism", "SCRAM-SHA-512"),
            ("producer.enable.ssl.certificate.verification", "true"),
            ("producer.ssl.endpoint.identification.algorithm", "https"),
        ]);
        assert_eq!(weakened(&s), []);
    }

    #[test]
    fn every_weakened_setting_is_reported_with_its_key() {
        let mut s = settings(&[
            ("consumer.enable.ssl.certificate.verification", "false"),
            ("producer.ssl.endpoint.identification.algorithm", "None"),
            ("producer.security.protocol", "sasl_plaintext"),
            ("producer.sasl.mechanisms", "PLAIN"),
        ]);
        s.redis.tls_insecure_skip_verify = true;
        s.http.listen = "[::]:9464".to_owned();
        let keys: Vec<String> = weakened(&s).into_iter().map(|w| w.key).collect();
        assert_eq!(
            keys,
            [
                "kafka.consumer.\"enable.ssl.certificate.verification\" = false",
                "kafka.producer.\"ssl.endpoint.identification.algorithm\" = none",
                "kafka.producer.\"security.protocol\" = SASL_PLAINTEXT with PLAIN",
                "redis.tls_insecure_skip_verify = true",
                "http.listen = \"[::]:9464\"",
            ]
        );
        s.http.listen = "0.0.0.0:9464".to_owned();
        assert!(weakened(&s)
            .iter()
            .any(|w| w.key.starts_with("http.listen")));
        s.http.listen = String::new();
        assert!(!weakened(&s)
            .iter()
            .any(|w| w.key.starts_with("http.listen")));
    }
}
