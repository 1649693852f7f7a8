//! Secrets as files (`redis.password_file`, `kafka.sasl_password_file`),
//! end to end: `deductor check` logs in to the SASL/SCRAM listener and to a
//! Redis ACL user with passwords read from files, the way the chart mounts
//! a Secret (`secret.mountAsFiles`); a wrong or missing file fails with one
//! line naming the key, and never shows a password.

use std::process::Stdio;

use crate::common::service::{self, Fixture};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// `deductor check` with `env`: (passed, stdout + stderr).
fn check(env: &[(String, String)]) -> (bool, String) {
    let out = service::command(env)
        .arg("check")
        .stdin(Stdio::null())
        .output()
        .expect("running deductor check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A password no log would contain by chance.
fn random_password() -> String {
    format!("pw-{:016x}", rand::random::<u64>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_logs_in_with_passwords_from_files() {
    use fred::prelude::AclInterface;
    let f = Fixture::new("secret-files", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    };

    // A Redis ACL user of this test, and the SCRAM listener's credentials.
    let admin = f.ledger().await;
    let user = format!(
        "deductor-files-{:012x}",
        rand::random::<u64>() & 0xffff_ffff_ffff
    );
    let redis_password = random_password();
    admin
        .pool()
        .acl_setuser(
            user.as_str(),
            vec![
                "reset".to_owned(),
                "on".to_owned(),
                format!(">{redis_password}"),
                "~*".to_owned(),
                "+@all".to_owned(),
            ],
        )
        .await
        .expect("ACL SETUSER");
    let brokers = env_or("DEDUCTOR_KAFKA_SASL_BROKERS", "127.0.0.1:9094");
    let mechanism = env_or("DEDUCTOR_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512");
    let username = env_or("DEDUCTOR_KAFKA_SASL_USERNAME", "deductor");
    let kafka_password = env_or("DEDUCTOR_KAFKA_SASL_PASSWORD", "deductor-secret");

    let redis_file = file("redis-password", &format!("{redis_password}\n"));
    let kafka_file = file("kafka-sasl-password", &kafka_password);
    let wrong = random_password();
    let wrong_file = file("wrong", &wrong);
    let missing = dir.path().join("missing").display().to_string();
    let env = |redis: &str, kafka: &str| {
        let mut extra: Vec<(String, String)> = [
            ("kafka.brokers", brokers.as_str()),
            ("redis.username", user.as_str()),
            ("redis.password_file", redis),
            ("kafka.sasl_password_file", kafka),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for client in ["consumer", "producer"] {
            for (k, v) in [
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", mechanism.as_str()),
                ("sasl.username", username.as_str()),
            ] {
                extra.push((format!("kafka.{client}.{k}"), v.to_owned()));
            }
        }
        let extra: Vec<(&str, &str)> = extra
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        f.env(&extra)
    };

    let results = [
        ("both files right", check(&env(&redis_file, &kafka_file))),
        (
            "wrong Kafka password",
            check(&env(&redis_file, &wrong_file)),
        ),
        (
            "wrong Redis password",
            check(&env(&wrong_file, &kafka_file)),
        ),
        ("missing Kafka file", check(&env(&redis_file, &missing))),
    ];
    let _: Result<i64, _> = admin.pool().acl_deluser(user.as_str()).await;
    admin.quit().await;

    let [(_, right), (_, bad_kafka), (_, bad_redis), (_, no_file)] = &results;
    assert!(
        right.0,
        "check fails with the passwords from files:\n{}",
        right.1
    );
    assert!(
        !bad_kafka.0 && bad_kafka.1.contains("Authentication"),
        "a wrong SASL password from the file is not refused:\n{}",
        bad_kafka.1
    );
    assert!(
        !bad_redis.0,
        "a wrong Redis password from the file passes:\n{}",
        bad_redis.1
    );
    assert!(
        !no_file.0
            && no_file.1.contains("kafka.sasl_password_file")
            && no_file.1.contains(&missing),
        "a missing file is not named with its key:\n{}",
        no_file.1
    );
    for (what, (_, out)) in &results {
        for secret in [&redis_password, &kafka_password, &wrong] {
            assert!(
                !out.contains(secret.as_str()),
                "{what}: the output shows a password:\n{out}"
            );
        }
    }
    f.cleanup().await;
}
