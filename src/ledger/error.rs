//! Ledger errors and their classification, in one function.
//!
//! Redis errors are classified by the reply's error code (its first word:
//! `BUSY`, `NOPERM`, our scripts' `CORRUPT` / `BADARG`, ...; or the code a
//! script's `ERR` wrapping carries, see [`error_code`]) and otherwise by
//! fred's [`ErrorKind`]; never by message text.

use std::fmt;
use std::time::Duration;

use fred::error::{Error as RedisError, ErrorKind};

use crate::error::Disposition;

/// What kind of failure a Redis error is; a small fixed set, also the `kind`
/// label of `deductor_redis_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The connection failed, closed or was canceled.
    Connection,
    /// No reply within the command (or connect) timeout.
    Timeout,
    /// The server is temporarily unable: BUSY, LOADING, TRYAGAIN, MASTERDOWN,
    /// READONLY (failover), MISCONF, OOM, NOREPLICAS.
    Busy,
    /// Cluster state in flux: CLUSTERDOWN, MOVED/ASK beyond the redirection limit.
    Cluster,
    /// The durability gate: `WAIT` found fewer replicas with the event's
    /// writes than `redis.wait_replicas` (or the connection changed under it).
    Replicas,
    /// The node's script cache lacks the script (handled by reloading).
    NoScript,
    /// WRONGPASS, NOAUTH, NOPERM: the credentials or ACL are wrong.
    Auth,
    /// Bad URL, TLS or client configuration.
    Config,
    /// A script refused its arguments (`BADARG`) or the keys span slots: our bug.
    BadArg,
    /// A script found stored data that breaks the contract (`CORRUPT`).
    Corrupt,
    /// The release of a rejected placement's deducted line met corrupt data:
    /// the event waits (is retried) until the data is repaired, since giving
    /// up would leave a rejected event holding its deduction.
    ReleaseBlocked,
    /// A plain script met a bucketed promotion's directory (`BUCKETED`):
    /// nothing was written; the line is walked on the buckets instead. Or
    /// a bucket is gone (`NOBUCKET`: the promotion was deleted): its
    /// layout is read again.
    Bucketed,
    /// A reply of the wrong shape.
    Reply,
    /// Anything else (e.g. an `ERR` from a script runtime error).
    Other,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Connection => "connection",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Busy => "busy",
            ErrorClass::Cluster => "cluster",
            ErrorClass::Replicas => "replicas",
            ErrorClass::NoScript => "noscript",
            ErrorClass::Auth => "auth",
            ErrorClass::Config => "config",
            ErrorClass::BadArg => "bad_argument",
            ErrorClass::Corrupt => "corrupt",
            ErrorClass::ReleaseBlocked => "release_blocked",
            ErrorClass::Bucketed => "bucketed",
            ErrorClass::Reply => "reply",
            ErrorClass::Other => "other",
        }
    }

    /// Transient failures are retried; corrupt data rejects the event (but
    /// a release it blocks is retried until the data is repaired); the rest
    /// means the service (or its code) cannot work as it is.
    pub fn disposition(self) -> Disposition {
        match self {
            ErrorClass::Connection
            | ErrorClass::Timeout
            | ErrorClass::Busy
            | ErrorClass::Cluster
            | ErrorClass::Replicas
            | ErrorClass::NoScript
            | ErrorClass::ReleaseBlocked
            | ErrorClass::Bucketed => Disposition::Retry,
            ErrorClass::Corrupt => Disposition::Reject,
            ErrorClass::Auth
            | ErrorClass::Config
            | ErrorClass::BadArg
            | ErrorClass::Reply
            | ErrorClass::Other => Disposition::Fatal,
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error code of a Redis error reply, wherever it sits.
///
/// Mostly the first word (`OOM command not allowed ...`). A command error
/// that a script re-raised as a Lua error comes back wrapped in `ERR`, with
/// the command's code right after it (Redis 7: `ERR OOM command not allowed
/// ... script: <sha>, on @user_script:207.`) or after the script's location
/// (Redis 6: `ERR Error running script (call to f_<sha>):
/// @user_script:207: OOM command not allowed ...`). lua/lib.lua's `run()`
/// replies with the command's own error, but a script outside it, an older
/// script cache, or another Redis version may still wrap it. A word counts as
/// a code when it is all capital letters (as Redis's codes are), so `ERR
/// Unknown Redis command ...` stays `ERR`.
pub fn error_code(details: &str) -> &str {
    fn is_code(word: &str) -> bool {
        word.len() >= 2 && word.bytes().all(|b| b.is_ascii_uppercase())
    }
    let mut words = details.split_whitespace();
    let first = words.next().unwrap_or("");
    if first != "ERR" {
        return first;
    }
    let mut rest = details.trim_start()[3..].trim_start();
    if let Some(wrapped) = rest.strip_prefix("Error running script") {
        // Past "(call to f_<sha>): @user_script:<n>: ".
        if let Some(at) = wrapped.find("@user_script:") {
            let located = &wrapped[at..];
            if let Some((_, after)) = located.split_once(": ") {
                rest = after;
            }
        }
    }
    // Redis 7.0 and Valkey 8 refuse a command a script runs for its ACL
    // user with no code of their own: read it as the refusal it is.
    if rest.starts_with("The user executing the script can't run this command")
        || rest.starts_with("ACL failure in script:")
    {
        return "NOPERM";
    }
    match rest.split_whitespace().next() {
        Some(word) if is_code(word) && word != "ERR" => word,
        _ => first,
    }
}

/// fred's error when a new Cluster connection finds `cluster_state` other
/// than `ok` (fred 10, `check_cluster_state`).
const FRED_CLUSTER_STATE_NOT_OK: &str = "Invalid or missing cluster state.";

/// fred's error when a command finds no connection to go over (fred 10,
/// `router::commands::write_command`: the connection dropped and the
/// reconnect has not happened yet); its kind is `Unknown`.
const FRED_NO_ROUTE: &str = "Failed to route command.";

/// The one place Redis errors are classified.
pub fn classify(e: &RedisError) -> ErrorClass {
    match error_code(e.details()) {
        "CORRUPT" => return ErrorClass::Corrupt,
        // (NOBUCKET: lua/bucket.lua met no bucket hash, the promotion was
        // deleted: its layout is read again.)
        "BUCKETED" | "NOBUCKET" => return ErrorClass::Bucketed,
        "BADARG" | "CROSSSLOT" => return ErrorClass::BadArg,
        "NOSCRIPT" => return ErrorClass::NoScript,
        "BUSY" | "LOADING" | "TRYAGAIN" | "MASTERDOWN" | "READONLY" | "MISCONF" | "OOM"
        | "NOREPLICAS" => return ErrorClass::Busy,
        "CLUSTERDOWN" | "MOVED" | "ASK" => return ErrorClass::Cluster,
        "WRONGPASS" | "NOAUTH" | "NOPERM" => return ErrorClass::Auth,
        _ => {}
    }
    // fred's check of a new Cluster connection (`CLUSTER INFO` not saying
    // `cluster_state:ok`, e.g. while a failover runs) is a Protocol error
    // with this text and no code: the cluster is down for now, not a
    // malformed reply (found by the chaos suite's audits: `audit` exited 1
    // during a Cluster failover instead of 3).
    if e.kind() == &ErrorKind::Protocol && e.details() == FRED_CLUSTER_STATE_NOT_OK {
        return ErrorClass::Cluster;
    }
    // A command that found its connection gone (Redis killed or stopped,
    // the reconnect not done yet) is a connection error: retried, and an
    // operator command exits 3 (found by the chaos suite's --long run:
    // `audit` exited 1 while Redis was down, on its SCAN).
    if e.kind() == &ErrorKind::Unknown && e.details() == FRED_NO_ROUTE {
        return ErrorClass::Connection;
    }
    match e.kind() {
        // Sentinel: no sentinel answered, or none names a primary yet (a
        // failover in progress): reconnecting gets there.
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Backpressure | ErrorKind::Sentinel => {
            ErrorClass::Connection
        }
        ErrorKind::Timeout => ErrorClass::Timeout,
        ErrorKind::Cluster | ErrorKind::Routing => ErrorClass::Cluster,
        ErrorKind::Auth => ErrorClass::Auth,
        ErrorKind::Config | ErrorKind::Url | ErrorKind::Tls => ErrorClass::Config,
        ErrorKind::Protocol | ErrorKind::Parse | ErrorKind::NotFound => ErrorClass::Reply,
        _ => ErrorClass::Other,
    }
}

/// A fred error for people: a TLS failure in one line that says what
/// was refused and what to check, instead of OpenSSL's error stack.
fn describe(e: &RedisError) -> String {
    if *e.kind() != ErrorKind::Tls {
        return e.to_string();
    }
    match tls_summary(e.details()) {
        Some(reason) => format!(
            "TLS handshake failed: {reason}; check redis.tls_ca_file (the CA that signed the \
             server's certificate) and that the url's host is in the certificate"
        ),
        None => e.to_string(),
    }
}

/// The reasons in native-tls / OpenSSL's debug text (`reason: "certificate
/// verify failed"`, `X509VerifyResult { .., error: "self-signed
/// certificate in certificate chain" }`), joined; `None` when it has none.
/// For display only: classification never reads text.
fn tls_summary(details: &str) -> Option<String> {
    let quoted = |key: &str| {
        let start = details.find(key)? + key.len();
        let end = details[start..].find('"')?;
        Some(details[start..start + end].to_owned())
    };
    let parts: Vec<String> = [
        quoted("reason: \""),
        quoted("X509VerifyResult { code: ").and(quoted("error: \"")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        None
    } else {
        Some(parts.join(": "))
    }
}

/// A ledger operation failed; [`LedgerError::disposition`] says what to do.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Redis (or the connection to it) failed; `op` is the script or command.
    #[error("redis {op} failed ({class}): {}", describe(.cause))]
    Redis {
        op: &'static str,
        class: ErrorClass,
        cause: RedisError,
    },
    /// A script replied with something other than its documented shape.
    #[error("script {script} gave a malformed reply: {detail}")]
    MalformedReply {
        script: &'static str,
        detail: String,
    },
    /// No connection within the connect timeout.
    #[error("redis did not connect within {0:?}")]
    ConnectTimeout(Duration),
    /// The durability gate could not confirm the event's writes on enough
    /// replicas; the event is retried, never committed.
    #[error("redis WAIT: {detail}")]
    NotDurable { detail: String },
    /// A rejected placement could not give back a line it deducted: the
    /// release met corrupt data (`cause`). Retried until it is repaired.
    #[error("the release of order {order} on promotion {promotion} is blocked by corrupt data until it is repaired: {cause}")]
    ReleaseBlocked {
        promotion: String,
        order: String,
        cause: Box<LedgerError>,
    },
}

impl LedgerError {
    /// Wraps a fred error, classifies it and counts it.
    pub(crate) fn redis(op: &'static str, cause: RedisError) -> LedgerError {
        let e = LedgerError::Redis {
            op,
            class: classify(&cause),
            cause,
        };
        e.count();
        e
    }

    /// TEST-ONLY: the error fred reports for `op` when the connection is
    /// refused (`"io"`), times out (`"timeout"`) or the login is refused
    /// (`"auth"`), for the tests of modules that must not import fred.
    #[cfg(test)]
    pub(crate) fn fake(op: &'static str, what: &str) -> LedgerError {
        use fred::error::ErrorKind;
        let kind = match what {
            "io" => ErrorKind::IO,
            "timeout" => ErrorKind::Timeout,
            "auth" => ErrorKind::Auth,
            other => panic!("no fake Redis error {other:?}"),
        };
        LedgerError::redis(op, RedisError::new(kind, what.to_owned()))
    }

    pub(crate) fn malformed(script: &'static str, detail: impl Into<String>) -> LedgerError {
        let e = LedgerError::MalformedReply {
            script,
            detail: detail.into(),
        };
        e.count();
        e
    }

    pub(crate) fn connect_timeout(after: Duration) -> LedgerError {
        let e = LedgerError::ConnectTimeout(after);
        e.count();
        e
    }

    pub(crate) fn not_durable(detail: impl Into<String>) -> LedgerError {
        let e = LedgerError::NotDurable {
            detail: detail.into(),
        };
        e.count();
        e
    }

    /// `cause` (a corrupt-data error of release.lua) blocks the release of
    /// `order`'s line on `promotion`. Not counted again: `cause` was.
    pub(crate) fn release_blocked(
        promotion: impl Into<String>,
        order: impl Into<String>,
        cause: LedgerError,
    ) -> LedgerError {
        LedgerError::ReleaseBlocked {
            promotion: promotion.into(),
            order: order.into(),
            cause: Box::new(cause),
        }
    }

    fn count(&self) {
        crate::metrics::redis_error(self.class().as_str());
    }

    pub fn class(&self) -> ErrorClass {
        match self {
            LedgerError::Redis { class, .. } => *class,
            LedgerError::MalformedReply { .. } => ErrorClass::Reply,
            LedgerError::ConnectTimeout(_) => ErrorClass::Timeout,
            LedgerError::NotDurable { .. } => ErrorClass::Replicas,
            LedgerError::ReleaseBlocked { .. } => ErrorClass::ReleaseBlocked,
        }
    }

    pub fn disposition(&self) -> Disposition {
        self.class().disposition()
    }

    /// A rejected placement's release waits for corrupt data to be repaired.
    pub fn is_release_blocked(&self) -> bool {
        self.class() == ErrorClass::ReleaseBlocked
    }

    /// Stored data broke the contract; the script wrote nothing.
    pub fn is_corrupt(&self) -> bool {
        self.class() == ErrorClass::Corrupt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_read_as_one_line_without_the_openssl_stack() {
        let dump = "TLS Error: Ssl(Error { code: ErrorCode(1), cause: Some(Ssl(ErrorStack([Error { \
            code: 167772294, library: \"SSL routines\", function: \"tls_post_process_server_certificate\", \
            reason: \"certificate verify failed\", file: \"../ssl/statem/statem_clnt.c\", line: 1889 }]))) }, \
            X509VerifyResult { code: 19, error: \"self-signed certificate in certificate chain\" })";
        let e = LedgerError::redis("connect", RedisError::new(ErrorKind::Tls, dump));
        let text = e.to_string();
        assert_eq!(e.class(), ErrorClass::Config);
        assert!(
            text.contains(
                "certificate verify failed: self-signed certificate in certificate chain"
            ),
            "{text}"
        );
        assert!(text.contains("redis.tls_ca_file"), "{text}");
        assert!(!text.contains("statem") && !text.contains('\n'), "{text}");
        // Other errors keep fred's text.
        let e = LedgerError::redis("get", RedisError::new(ErrorKind::IO, "refused"));
        assert!(e.to_string().ends_with("refused"), "{e}");
    }

    fn reply(details: &'static str) -> RedisError {
        // fred gives server error replies without a recognized code the kind `Unknown`.
        RedisError::new(ErrorKind::Unknown, details)
    }

    #[test]
    fn codes_win_over_kinds() {
        for (details, class) in [
            ("CORRUPT promo:{p} budget: -3", ErrorClass::Corrupt),
            ("BADARG budget: x", ErrorClass::BadArg),
            ("NOSCRIPT No matching script", ErrorClass::NoScript),
            ("BUSY Redis is busy running a script", ErrorClass::Busy),
            ("LOADING Redis is loading", ErrorClass::Busy),
            ("TRYAGAIN Multiple keys request", ErrorClass::Busy),
            ("CLUSTERDOWN The cluster is down", ErrorClass::Cluster),
            ("NOPERM this user has no permissions", ErrorClass::Auth),
            (
                "ERR The user executing the script can't run this command or subcommand script: 1a2b, on @user_script:3.",
                ErrorClass::Auth,
            ),
            (
                "ERR ACL failure in script: User deductor-reader has no permissions to run the 'hset' command script: 1a2b, on @user_script:3.",
                ErrorClass::Auth,
            ),
            ("ERR user_script:1: oops", ErrorClass::Other),
        ] {
            assert_eq!(classify(&reply(details)), class, "{details}");
        }
        assert_eq!(
            classify(&RedisError::new(ErrorKind::Auth, "WRONGPASS invalid")),
            ErrorClass::Auth
        );
    }

    /// Issue 25: every error a script's Redis command can produce, as
    /// Redis replies with it raw, as lua/lib.lua's `run()` re-raised it
    /// through Redis 7's Lua error wrapping (`ERR <reply> script: <sha>, on
    /// @user_script:<n>.`, the shape that made an OOM fatal), and as Redis 6
    /// wrapped it; each keeps its class.
    #[test]
    fn script_errors_keep_their_code_however_wrapped() {
        let sha = "0c2c486c570c82ec292d7bb902613906a9e2aa8a";
        for (raw, class) in [
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                ErrorClass::Busy,
            ),
            (
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
                ErrorClass::Busy,
            ),
            ("NOSCRIPT No matching script. Please use EVAL.", ErrorClass::NoScript),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                ErrorClass::Busy,
            ),
            ("MOVED 3999 127.0.0.1:7001", ErrorClass::Cluster),
            ("ASK 3999 127.0.0.1:7002", ErrorClass::Cluster),
            (
                "READONLY You can't write against a read only replica.",
                ErrorClass::Busy,
            ),
            (
                "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
                ErrorClass::Busy,
            ),
            ("LOADING Redis is loading the dataset in memory", ErrorClass::Busy),
            (
                "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
                ErrorClass::Busy,
            ),
            (
                "NOREPLICAS Not enough good replicas to write.",
                ErrorClass::Busy,
            ),
            ("CLUSTERDOWN The cluster is down", ErrorClass::Cluster),
            (
                "NOPERM User deductor has no permissions to run the 'del' command",
                ErrorClass::Auth,
            ),
            ("CORRUPT promo:{p} stock: 007", ErrorClass::Corrupt),
        ] {
            let redis7 = format!("ERR {raw} script: {sha}, on @user_script:207.");
            let redis6 = format!("ERR Error running script (call to f_{sha}): @user_script:207: {raw}");
            for details in [raw.to_owned(), redis7, redis6] {
                assert_eq!(
                    classify(&RedisError::new(ErrorKind::Unknown, details.clone())),
                    class,
                    "{details}"
                );
            }
        }
        // Errors without a code stay `other` (fatal), wrapped or not.
        for details in [
            "ERR Unknown Redis command called from script script: abc, on @user_script:1.",
            "ERR user_script:12: attempt to index local 'x' (a nil value) script: abc, on @user_script:12.",
            "ERR Error running script (call to f_abc): @user_script:12: user_script:12: attempt to index a nil value",
            "ERR",
            "ERR ERR nested",
            "",
        ] {
            assert_eq!(
                classify(&RedisError::new(ErrorKind::Unknown, details)),
                ErrorClass::Other,
                "{details:?}"
            );
        }
        assert_eq!(error_code("ERR OOM command not allowed"), "OOM");
        assert_eq!(ErrorClass::Busy.disposition(), Disposition::Retry);
    }

    #[test]
    fn kinds_without_codes() {
        for (kind, class) in [
            (ErrorKind::IO, ErrorClass::Connection),
            (ErrorKind::Canceled, ErrorClass::Connection),
            (ErrorKind::Timeout, ErrorClass::Timeout),
            (ErrorKind::Sentinel, ErrorClass::Connection),
            (ErrorKind::Cluster, ErrorClass::Cluster),
            (ErrorKind::Url, ErrorClass::Config),
            (ErrorKind::Config, ErrorClass::Config),
            (ErrorKind::Protocol, ErrorClass::Reply),
        ] {
            assert_eq!(
                classify(&RedisError::new(kind.clone(), "x")),
                class,
                "{kind:?}"
            );
        }
    }

    /// A Cluster whose state is not ok (failing over) is unreachable for
    /// now (exit 3, retried), not a malformed reply.
    #[test]
    fn a_cluster_state_not_ok_is_a_cluster_error() {
        let e = RedisError::new(ErrorKind::Protocol, "Invalid or missing cluster state.");
        assert_eq!(classify(&e), ErrorClass::Cluster);
        assert_eq!(
            LedgerError::redis("connect", e).disposition(),
            ErrorClass::Cluster.disposition()
        );
        assert_eq!(
            classify(&RedisError::new(ErrorKind::Protocol, "other")),
            ErrorClass::Reply
        );
    }

    /// A command that found no connection (Redis down, the reconnect not
    /// done yet) is a connection error: exit 3, retried.
    #[test]
    fn a_command_without_a_connection_is_a_connection_error() {
        let e = RedisError::new(ErrorKind::Unknown, "Failed to route command.");
        assert_eq!(classify(&e), ErrorClass::Connection);
        assert_eq!(
            crate::exit::redis_exit_code(&LedgerError::redis("scan", e)),
            Some(crate::error::EXIT_UNREACHABLE)
        );
        assert_eq!(
            classify(&RedisError::new(ErrorKind::Unknown, "other")),
            ErrorClass::Other
        );
    }

    #[test]
    fn dispositions() {
        assert_eq!(ErrorClass::Timeout.disposition(), Disposition::Retry);
        assert_eq!(ErrorClass::Busy.disposition(), Disposition::Retry);
        assert_eq!(ErrorClass::Replicas.disposition(), Disposition::Retry);
        assert_eq!(
            LedgerError::not_durable("0 of 1").disposition(),
            Disposition::Retry
        );
        assert_eq!(ErrorClass::Corrupt.disposition(), Disposition::Reject);
        let corrupt = LedgerError::redis("release", reply("CORRUPT promo:{p} stock: 007"));
        let blocked = LedgerError::release_blocked("p", "o1", corrupt);
        assert_eq!(blocked.disposition(), Disposition::Retry);
        assert!(
            !blocked.is_corrupt(),
            "a blocked release is not a rejection"
        );
        assert!(blocked.to_string().contains("stock: 007"), "{blocked}");
        assert_eq!(ErrorClass::Auth.disposition(), Disposition::Fatal);
        assert_eq!(ErrorClass::BadArg.disposition(), Disposition::Fatal);
        assert_eq!(ErrorClass::Reply.disposition(), Disposition::Fatal);
    }
}
