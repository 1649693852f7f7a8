//! A private Redis of the test's own (with TLS and a CA of its own, or
//! without), and the service over TLS with a CA file.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use super::*;
use crate::common::kafka;
use crate::common::service::{self, Fixture};

/// A throwaway `redis-server` of this test on a free port; TLS-only, with a
/// CA and a server certificate for 127.0.0.1 made by openssl in a temp dir,
/// when asked. Killed on drop.
pub(super) struct PrivateRedis {
    pub(super) child: std::process::Child,
    pub(super) port: u16,
    pub(super) ca: PathBuf,
    pub(super) _dir: tempfile::TempDir,
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn run(program: &str, args: &[&str], dir: &std::path::Path) {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(super) async fn private_redis(tls: bool) -> PrivateRedis {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=deductor test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
        d,
    );
    run(
        "openssl",
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
        d,
    );
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
        d,
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(d.join("redis.log")).unwrap();
    // Debian's redis-server, built with TLS, even in the Valkey cell (whose
    // redis-server on PATH is the wheel's Valkey, built without it): these
    // tests are about the client's TLS, not the server's make.
    let debian = std::path::Path::new("/usr/bin/redis-server");
    let bin = if tls && debian.exists() {
        debian.as_os_str()
    } else {
        std::ffi::OsStr::new("redis-server")
    };
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
    if tls {
        cmd.args(["--port", "0", "--tls-port"])
            .arg(port.to_string())
            .args([
                "--tls-cert-file",
                "server.pem",
                "--tls-key-file",
                "server.key",
                "--tls-ca-cert-file",
                "ca.pem",
                "--tls-auth-clients",
                "no",
            ]);
    } else {
        cmd.arg("--port").arg(port.to_string());
    }
    let child = cmd
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting redis-server (Debian's is built with TLS)");
    let mut r = PrivateRedis {
        child,
        port,
        ca: d.join("ca.pem"),
        _dir: dir,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !service::listening(&format!("127.0.0.1:{port}")) {
        if let Ok(Some(s)) = r.child.try_wait() {
            panic!(
                "redis-server exited ({s}): {}",
                std::fs::read_to_string(r._dir.path().join("redis.log")).unwrap_or_default()
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn redis_over_tls_with_a_ca_file() {
    use deductor::ledger::Ledger;
    let server = private_redis(true).await;
    let f = Fixture::new("sec-rtls", 1).await;
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let ca = server.ca.display().to_string();
    let settings = f.settings(&[("redis.url", &url), ("redis.tls_ca_file", &ca)]);

    // The service over TLS: events in, outcomes out, scripts in the TLS Redis.
    let admin = Ledger::connect(&settings.redis)
        .await
        .expect("connecting over TLS with the CA file");
    round_trip_with(&f, &admin, settings.clone()).await;
    let p = deductor::domain::event::Id::parse("sec").unwrap();
    let view = deductor::admin::promo_show(&admin, &p).await.unwrap();
    assert!(view.is_some(), "the promotion lives in the TLS Redis");
    admin.quit().await;

    // Without the CA the server is not trusted: a clear, fatal error.
    let mut untrusted = settings.redis.clone();
    untrusted.tls_ca_file.clear();
    let e = Ledger::connect(&untrusted)
        .await
        .expect_err("a certificate of an unknown CA is refused");
    assert_eq!(e.disposition(), deductor::error::Disposition::Fatal, "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");

    // Opting out of verification connects (throwaway servers only).
    untrusted.tls_insecure_skip_verify = true;
    let insecure = Ledger::connect(&untrusted)
        .await
        .expect("tls_insecure_skip_verify accepts the certificate");
    insecure.ping().await.unwrap();
    insecure.quit().await;

    // Plain redis:// to the TLS port does not get through.
    let mut plain = settings.redis.clone();
    plain.url = format!("redis://127.0.0.1:{}", server.port);
    plain.tls_ca_file.clear();
    plain.connect_timeout_ms = 500;
    assert!(Ledger::connect(&plain).await.is_err());
    let t = &f.topics;
    kafka::delete_topics(&[&t.input, &t.outcome, &t.dlq]).await;
}
