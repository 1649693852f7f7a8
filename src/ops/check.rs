//! `deductor check`: the configuration is valid, Kafka answers with the
//! topics, Redis answers and has the scripts. One line per check; secrets
//! never printed.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;

use crate::config::{redact_url, Settings};
use crate::kafka::consumer::consumer_config;
use crate::ledger::Ledger;

/// Runs every check, printing one line each; true when all passed.
pub async fn run(settings: &Settings) -> bool {
    let mut ok = true;
    let mut line = |name: &str, result: Result<String, String>| match result {
        Ok(detail) => println!("ok    {name}: {detail}"),
        Err(detail) => {
            ok = false;
            println!("FAIL  {name}: {detail}");
        }
    };
    line(
        "config",
        Ok(format!(
            "brokers {}, group {}, redis {}",
            settings.kafka.brokers,
            settings.kafka.group_id,
            redact_url(&settings.redis.url)
        )),
    );

    let k = settings.kafka.clone();
    let kafka = tokio::task::spawn_blocking(move || -> Result<Vec<(String, usize)>, String> {
        let mut config = consumer_config(&k);
        // No statistics: the default context would print them every interval.
        config.set("statistics.interval.ms", "0");
        let consumer: BaseConsumer = config.create().map_err(|e| e.to_string())?;
        let md = consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .map_err(|e| {
                // A refused login (wrong SASL password) reaches a consumer as
                // an error event, while the metadata request only times out
                // as a transport failure, which alone does not say what to
                // fix. The event carries the code, never the password.
                let cause = (0..5).find_map(|_| match consumer.poll(Duration::from_millis(100)) {
                    Some(Err(cause)) => Some(cause),
                    _ => None,
                });
                let refused = cause
                    .as_ref()
                    .and_then(|c| c.rdkafka_error_code())
                    .is_some_and(|c| {
                        matches!(
                            c,
                            RDKafkaErrorCode::Authentication
                                | RDKafkaErrorCode::SaslAuthenticationFailed
                        )
                    });
                match cause {
                    Some(cause) if refused => format!(
                        "metadata from {}: {e}; the broker refused the login \
                         (check kafka.consumer sasl.username / sasl.password): {cause}",
                        k.brokers
                    ),
                    Some(cause) => format!("metadata from {}: {e}; {cause}", k.brokers),
                    None => format!("metadata from {}: {e}", k.brokers),
                }
            })?;
        let mut found = Vec::new();
        for t in [&k.input_topic, &k.outcome_topic, &k.dlq_topic] {
            match md.topics().iter().find(|x| x.name() == t.as_str()) {
                Some(x) if x.error().is_none() => found.push((t.clone(), x.partitions().len())),
                _ => {
                    return Err(format!(
                        "topic {t} does not exist; create it (scripts/dev-stack topic {t} N)"
                    ))
                }
            }
        }
        Ok(found)
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    match kafka {
        Ok(topics) => {
            line("kafka", Ok(format!("{} answers", settings.kafka.brokers)));
            for (t, n) in topics {
                line("topic", Ok(format!("{t} ({n} partitions)")));
            }
        }
        Err(e) => line("kafka", Err(e)),
    }

    match tokio::time::timeout(Duration::from_secs(10), Ledger::connect(&settings.redis)).await {
        Err(_) => line(
            "redis",
            Err(format!(
                "{}: no answer in 10s",
                redact_url(&settings.redis.url)
            )),
        ),
        Ok(Err(e)) => line("redis", Err(e.to_string())),
        Ok(Ok(ledger)) => {
            line(
                "redis",
                ledger
                    .ping()
                    .await
                    .map(|_| format!("{} answers", redact_url(&settings.redis.url)))
                    .map_err(|e| e.to_string()),
            );
            line(
                "scripts",
                ledger
                    .load_scripts()
                    .await
                    .map(|_| "loaded".to_owned())
                    .map_err(|e| e.to_string()),
            );
            ledger.quit().await;
        }
    }
    ok
}
