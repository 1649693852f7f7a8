//! Audits during the run: while the consumers process events and faults
//! are injected, the real `deductor audit` (the run's binary, against the
//! run's Redis) runs every few seconds, in turn over every promotion and
//! over one named promotion, and each result is judged ([`judge`]).
//!
//! `audit` reads each promotion at one instant (`lua/audit.lua`), so a
//! sale in progress never shows a passing difference: any breach it
//! reports while the run is in flight is a false breach, a failure of the
//! run. Two things are not: exit 3 (Redis unreachable) while a fault had
//! Redis down, stalled, cut or failing over ([`Disturbances::redis_down`]),
//! and a breach that consists only of the corrupt field the corruption
//! fault wrote into a promotion on purpose, while it was there.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// After a Redis fault ends, how long an unreachable audit is still put
/// down to it: a client that met the fault may still be reconnecting (a
/// Cluster that failed over settles for a few seconds more).
pub const REDIS_GRACE: Duration = Duration::from_secs(10);

/// The moments when `audit` may not reach Redis, and when a promotion is
/// corrupt on purpose. The fault driver and the operator mark them; the
/// auditor reads them when it judges an audit.
#[derive(Debug, Default)]
pub struct Disturbances {
    redis: Mutex<Vec<Window>>,
    corrupt: Mutex<Vec<(Window, CorruptField)>>,
}

/// A field of a promotion hash made corrupt on purpose: the promotion's
/// key (as `audit` names it) and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptField {
    pub key: String,
    pub field: String,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    from: Instant,
    to: Option<Instant>,
}

impl Window {
    /// Overlaps [from, to] once stretched by `grace` at its end (an open
    /// window lasts until now).
    fn overlaps(&self, from: Instant, to: Instant, grace: Duration) -> bool {
        let end = self.to.map_or(to, |t| t + grace);
        self.from <= to && end >= from
    }
}

impl Disturbances {
    /// A fault that takes Redis away begins; returns its handle.
    pub fn redis_fault_begins(&self) -> usize {
        let mut v = self.redis.lock().expect("disturbances lock");
        v.push(Window {
            from: Instant::now(),
            to: None,
        });
        v.len() - 1
    }

    /// The fault `i` is over (Redis answers again).
    pub fn redis_fault_ends(&self, i: usize) {
        if let Some(w) = self.redis.lock().expect("disturbances lock").get_mut(i) {
            w.to = Some(Instant::now());
        }
    }

    /// A promotion field is about to be made corrupt; returns its handle.
    pub fn corrupt_begins(&self, key: &str, field: &str) -> usize {
        let mut v = self.corrupt.lock().expect("disturbances lock");
        v.push((
            Window {
                from: Instant::now(),
                to: None,
            },
            CorruptField {
                key: key.to_owned(),
                field: field.to_owned(),
            },
        ));
        v.len() - 1
    }

    /// The corrupt field `i` was put back (or never written).
    pub fn corrupt_ends(&self, i: usize) {
        if let Some((w, _)) = self.corrupt.lock().expect("disturbances lock").get_mut(i) {
            w.to = Some(Instant::now());
        }
    }

    /// Redis was down (or within [`REDIS_GRACE`] of coming back) at some
    /// moment between `from` and `to`.
    pub fn redis_down(&self, from: Instant, to: Instant) -> bool {
        self.redis
            .lock()
            .expect("disturbances lock")
            .iter()
            .any(|w| w.overlaps(from, to, REDIS_GRACE))
    }

    /// The fields that were corrupt on purpose at some moment between
    /// `from` and `to`.
    pub fn corrupt_during(&self, from: Instant, to: Instant) -> Vec<CorruptField> {
        self.corrupt
            .lock()
            .expect("disturbances lock")
            .iter()
            .filter(|(w, _)| w.overlaps(from, to, Duration::ZERO))
            .map(|(_, c)| c.clone())
            .collect()
    }
}

/// What one audit counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Exit 0: no breach.
    Clean,
    /// Exit 3, or no answer in time, while a fault had Redis away.
    Unreachable,
    /// Killed by a signal (not ours) while a fault had Redis away: the
    /// operator commands take SIGPIPE's default (src/main.rs, for
    /// `... | head`), so a write to a Redis connection closed under them
    /// kills them silently. A defect, shown apart until it is fixed.
    Signalled,
    /// Exit 1 with, as its only breaches, the fields corrupted on purpose
    /// while the audit ran.
    InjectedCorruption,
    /// Exit 1 for anything else: a breach reported during the sale.
    FalseBreach,
    /// Anything else: exit 3 or no answer with Redis up, a usage error, a
    /// crash, exit 1 without a report (the command failed), a report with
    /// no breach but UNSETTLED lines.
    Failed,
}

/// Judges one audit: its exit code (`None`: killed, no answer in time),
/// its `--output json` report, whether Redis was away meanwhile, and the
/// fields corrupt on purpose meanwhile.
pub fn judge(
    code: Option<i32>,
    signal: Option<i32>,
    stdout: &str,
    redis_down: bool,
    corrupt: &[CorruptField],
) -> Verdict {
    if signal.is_some() {
        return if redis_down {
            Verdict::Signalled
        } else {
            Verdict::Failed
        };
    }
    match code {
        Some(0) => Verdict::Clean,
        Some(3) | None if redis_down => Verdict::Unreachable,
        Some(1) => judge_breach(stdout, corrupt),
        _ => Verdict::Failed,
    }
}

/// Exit 1: a false breach unless every breach is an injected corrupt field.
fn judge_breach(stdout: &str, corrupt: &[CorruptField]) -> Verdict {
    // Exit 1 without a report: the command failed (its error on stderr),
    // it reported no breach.
    let Ok(report) = serde_json::from_str::<serde_json::Value>(stdout) else {
        return Verdict::Failed;
    };
    if report["dataset_lost"] != serde_json::Value::Bool(false) {
        return Verdict::FalseBreach;
    }
    let Some(promos) = report["promotions"].as_array() else {
        return Verdict::FalseBreach;
    };
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().unwrap_or("?").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let injected = |b: &str| {
        corrupt
            .iter()
            .any(|c| b.starts_with(&format!("corrupt {} {}: ", c.key, c.field)))
    };
    let (mut breaches, mut unsettled, mut moving) = (0, 0, 0);
    for p in promos {
        let b = strings(&p["breaches"]);
        if !b.iter().all(|b| injected(b)) {
            return Verdict::FalseBreach;
        }
        breaches += b.len();
        // A bucketed promotion's buckets live on several nodes and are read
        // one after another: while the sale runs its audit can only say
        // "moving" (docs/contract.md section 2b); the check after the run
        // holds it to the exact rule.
        if p["bucketed"] == serde_json::Value::Bool(true) {
            moving += strings(&p["unsettled"]).len();
        } else {
            unsettled += strings(&p["unsettled"]).len();
        }
    }
    if breaches > 0 {
        Verdict::InjectedCorruption
    } else if unsettled > 0 {
        Verdict::Failed
    } else if moving > 0 {
        Verdict::Clean
    } else {
        // Exit 1 and nothing named: not a report to excuse.
        Verdict::FalseBreach
    }
}

/// The command's own error from its stderr: the last line that is not one
/// of its JSON log lines (else the last line).
fn error_line(stderr: &str) -> &str {
    let lines = || stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .rev()
        .find(|l| !l.starts_with('{'))
        .or_else(|| lines().next_back())
        .unwrap_or("")
}

/// One audit as it happened (`audits.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Audit {
    pub at_s: f64,
    pub took_s: f64,
    /// "all" or the promotion named.
    pub what: String,
    pub code: Option<i32>,
    /// The signal that killed it (not the timeout's kill).
    pub signal: Option<i32>,
    pub redis_down: bool,
    pub verdict: Verdict,
    /// The breaches (or the error) it reported, when not clean.
    pub said: String,
}

/// The counts of the audits of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally {
    pub audits: Vec<Audit>,
}

impl Tally {
    pub fn count(&self, v: Verdict) -> usize {
        self.audits.iter().filter(|a| a.verdict == v).count()
    }

    /// The figures: (name, value, promised zero). With audits enabled, a
    /// run without one clean audit fails too: an auditor that never
    /// reaches a verdict proves nothing.
    pub fn rows(&self, every: u64) -> Vec<(String, i64, bool)> {
        let n = |v| self.count(v) as i64;
        let mut rows = vec![
            (
                format!("audits during the run (deductor audit every {every} s)"),
                self.audits.len() as i64,
                false,
            ),
            (
                "audits unreachable during a Redis fault (exit 3)".into(),
                n(Verdict::Unreachable),
                false,
            ),
            (
                "audits killed by a signal during a Redis fault".into(),
                n(Verdict::Signalled),
                false,
            ),
            (
                "audits meeting corrupt data injected on purpose".into(),
                n(Verdict::InjectedCorruption),
                false,
            ),
            (
                "audit_false_breaches (breach during the sale)".into(),
                n(Verdict::FalseBreach),
                true,
            ),
            (
                "audits failing otherwise (exit 3 with Redis up...)".into(),
                n(Verdict::Failed),
                true,
            ),
        ];
        if every > 0 {
            rows.push((
                "no clean audit during the run".into(),
                i64::from(n(Verdict::Clean) == 0),
                true,
            ));
        }
        rows
    }
}

/// Runs `deductor audit` against the run's Redis.
pub struct Auditor {
    pub bin: PathBuf,
    /// The settings: Redis url, key prefix, brokers, group and input topic.
    pub settings: Vec<String>,
    /// The promotions named in turn (every other audit names one).
    pub promos: Vec<String>,
    pub every: Duration,
    /// An audit that has not answered by then is killed (`code` None).
    pub timeout: Duration,
    pub disturbances: Arc<Disturbances>,
    pub started: Instant,
}

impl Auditor {
    /// Audits every `every` until `stop` turns true; returns them all.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) -> Tally {
        let mut tally = Tally::default();
        let mut n = 0usize;
        while !*stop.borrow() {
            let what = if n % 2 == 1 && !self.promos.is_empty() {
                Some(self.promos[(n / 2) % self.promos.len()].clone())
            } else {
                None
            };
            n += 1;
            tally.audits.push(self.once(what).await);
            tokio::select! {
                () = tokio::time::sleep(self.every) => {}
                _ = stop.changed() => {}
            }
        }
        tally
    }

    async fn once(&self, what: Option<String>) -> Audit {
        let mut cmd = tokio::process::Command::from(deductor_testkit::service::command(&self.bin));
        cmd.arg("audit")
            .arg("--output=json")
            .args(&self.settings)
            .args(what.iter())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let from = Instant::now();
        let (code, signal, stdout, stderr) = match cmd.spawn() {
            Err(e) => (Some(-1), None, String::new(), format!("cannot start: {e}")),
            Ok(child) => match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
                Ok(Ok(out)) => (
                    out.status.code(),
                    std::os::unix::process::ExitStatusExt::signal(&out.status),
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                ),
                Ok(Err(e)) => (Some(-1), None, String::new(), format!("waiting: {e}")),
                Err(_) => (
                    None,
                    None,
                    String::new(),
                    format!("no answer in {} s: killed", self.timeout.as_secs()),
                ),
            },
        };
        let to = Instant::now();
        let redis_down = self.disturbances.redis_down(from, to);
        let corrupt = self.disturbances.corrupt_during(from, to);
        let verdict = judge(code, signal, &stdout, redis_down, &corrupt);
        let said = if verdict == Verdict::Clean {
            String::new()
        } else {
            let breaches: Vec<String> = serde_json::from_str::<serde_json::Value>(&stdout)
                .ok()
                .and_then(|r| {
                    r["promotions"].as_array().map(|ps| {
                        ps.iter()
                            .filter_map(|p| {
                                let b = p["breaches"].as_array()?;
                                (!b.is_empty())
                                    .then(|| format!("{}: {}", p["promotion_id"], p["breaches"]))
                            })
                            .collect()
                    })
                })
                .unwrap_or_default();
            let mut s = breaches.join("; ");
            if s.is_empty() {
                s = stdout.trim().chars().take(2_000).collect();
            }
            if let Some(sig) = signal {
                s = format!("{s} [killed by signal {sig}]");
            }
            let err = error_line(&stderr);
            if !err.is_empty() {
                s = format!("{s} [{}]", err.chars().take(2_000).collect::<String>());
            }
            s
        };
        if verdict != Verdict::Clean {
            eprintln!(
                "chaos [{:>6.1}s] audit {}: exit {code:?}, {verdict:?}{}: {said}",
                self.started.elapsed().as_secs_f64(),
                what.as_deref().unwrap_or("(all)"),
                if redis_down {
                    " (a Redis fault meanwhile)"
                } else {
                    ""
                },
            );
        }
        Audit {
            at_s: (from - self.started).as_secs_f64(),
            took_s: (to - from).as_secs_f64(),
            what: what.unwrap_or_else(|| "all".to_owned()),
            code,
            signal,
            redis_down,
            verdict,
            said,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(breaches: &[(&str, &[&str])]) -> String {
        let promos: Vec<serde_json::Value> = breaches
            .iter()
            .map(|(p, b)| serde_json::json!({"promotion_id": p, "breaches": b, "unsettled": []}))
            .collect();
        serde_json::json!({"clean": breaches.iter().all(|(_, b)| b.is_empty()),
            "dataset_lost": false, "promotions": promos})
        .to_string()
    }

    fn field(key: &str, field: &str) -> CorruptField {
        CorruptField {
            key: key.into(),
            field: field.into(),
        }
    }

    /// Exit code + fault state -> what the audit counts as.
    #[test]
    fn exit_codes_and_faults_decide_the_verdict() {
        let clean = report(&[("a", &[])]);
        assert_eq!(judge(Some(0), None, &clean, false, &[]), Verdict::Clean);
        assert_eq!(judge(Some(0), None, &clean, true, &[]), Verdict::Clean);
        // Unreachable: fine only while Redis was away.
        assert_eq!(judge(Some(3), None, "", true, &[]), Verdict::Unreachable);
        assert_eq!(judge(Some(3), None, "", false, &[]), Verdict::Failed);
        assert_eq!(judge(None, None, "", true, &[]), Verdict::Unreachable);
        assert_eq!(judge(None, None, "", false, &[]), Verdict::Failed);
        // A breach is a false breach, Redis fault or not.
        let breach = report(&[
            ("a", &[]),
            (
                "b",
                &["stock: initial 10 - remaining 3 = 7 but records hold 6"],
            ),
        ]);
        assert_eq!(
            judge(Some(1), None, &breach, false, &[]),
            Verdict::FalseBreach
        );
        assert_eq!(
            judge(Some(1), None, &breach, true, &[]),
            Verdict::FalseBreach
        );
        // Killed by a signal: shown apart during a Redis fault (SIGPIPE),
        // a failure with Redis up.
        assert_eq!(judge(None, Some(13), "", true, &[]), Verdict::Signalled);
        assert_eq!(judge(None, Some(13), "", false, &[]), Verdict::Failed);
        // Usage errors and crashes are failures.
        for code in [2, 101, -1] {
            assert_eq!(judge(Some(code), None, &clean, true, &[]), Verdict::Failed);
        }
    }

    /// A breach is excused only when every breach is a field corrupted on
    /// purpose, of that promotion, while the audit ran.
    #[test]
    fn only_the_injected_corrupt_field_is_excused() {
        let injected = [field("chaosx:{flash}", "stock")];
        let only = report(&[("flash", &["corrupt chaosx:{flash} stock: abc"])]);
        assert_eq!(
            judge(Some(1), None, &only, false, &injected),
            Verdict::InjectedCorruption
        );
        // Not while it was not corrupt on purpose.
        assert_eq!(
            judge(Some(1), None, &only, false, &[]),
            Verdict::FalseBreach
        );
        // Another field, another promotion, a record: not excused.
        for other in [
            "corrupt chaosx:{flash} budget: abc",
            "corrupt chaosx:{other} stock: abc",
            "corrupt chaosx:{flash}:order:o1 stock: 7",
            "budget: initial 10 - remaining 3 = 7 but records hold 6",
        ] {
            let r = report(&[("flash", &["corrupt chaosx:{flash} stock: abc", other])]);
            assert_eq!(
                judge(Some(1), None, &r, false, &injected),
                Verdict::FalseBreach,
                "{other}"
            );
        }
        // A breach on another promotion in the same audit is not excused.
        let two = report(&[
            ("flash", &["corrupt chaosx:{flash} stock: abc"]),
            ("combo", &["remaining stock -1 < 0"]),
        ]);
        assert_eq!(
            judge(Some(1), None, &two, false, &injected),
            Verdict::FalseBreach
        );
    }

    #[test]
    fn an_exit_1_without_a_readable_breach_is_not_excused() {
        let injected = [field("k", "stock")];
        // No report at all: the command failed (e.g. exit 1 for an error
        // that is not a breach), a failure either way.
        for down in [false, true] {
            assert_eq!(judge(Some(1), None, "", down, &injected), Verdict::Failed);
        }
        assert_eq!(
            judge(Some(1), None, "not json", false, &injected),
            Verdict::Failed
        );
        // Nothing named at all.
        assert_eq!(
            judge(Some(1), None, &report(&[("a", &[])]), false, &injected),
            Verdict::FalseBreach
        );
        // A lost dataset is a breach of its own.
        let lost = serde_json::json!({"dataset_lost": true, "promotions": []}).to_string();
        assert_eq!(
            judge(Some(1), None, &lost, true, &injected),
            Verdict::FalseBreach
        );
        // A bucketed promotion's buckets moving while they were read: not
        // a breach, and what a sale in progress shows.
        let moving = serde_json::json!({"dataset_lost": false, "promotions": [
            {"promotion_id": "hot", "bucketed": true, "breaches": [], "unsettled": ["x"]}]})
        .to_string();
        assert_eq!(judge(Some(1), None, &moving, false, &[]), Verdict::Clean);
        let moving_and_breach = serde_json::json!({"dataset_lost": false, "promotions": [
            {"promotion_id": "hot", "bucketed": true, "breaches": ["y"], "unsettled": ["x"]}]})
        .to_string();
        assert_eq!(
            judge(Some(1), None, &moving_and_breach, false, &[]),
            Verdict::FalseBreach
        );
        // UNSETTLED is not a breach, nor a clean audit.
        let unsettled = serde_json::json!({"dataset_lost": false, "promotions": [
            {"promotion_id": "a", "breaches": [], "unsettled": ["x"]}]})
        .to_string();
        assert_eq!(
            judge(Some(1), None, &unsettled, false, &[]),
            Verdict::Failed
        );
    }

    #[test]
    fn the_error_line_skips_log_lines() {
        let stderr =
            "{\"level\":\"WARN\"}\ndeductor: redis: connect failed\n{\"level\":\"WARN\"}\n";
        assert_eq!(error_line(stderr), "deductor: redis: connect failed");
        assert_eq!(error_line("{\"a\":1}\n"), "{\"a\":1}");
        assert_eq!(error_line(""), "");
    }

    #[test]
    fn windows_cover_their_fault_and_redis_the_grace_after_it() {
        let d = Disturbances::default();
        let t0 = Instant::now();
        let i = d.redis_fault_begins();
        let c = d.corrupt_begins("k", "stock");
        // Open windows last until now.
        let now = Instant::now();
        assert!(d.redis_down(t0, now));
        assert_eq!(d.corrupt_during(t0, now), vec![field("k", "stock")]);
        d.redis_fault_ends(i);
        d.corrupt_ends(c);
        let end = Instant::now();
        // An audit that starts after the end: Redis within the grace,
        // the corruption not at all.
        let later = end + Duration::from_millis(1);
        assert!(d.redis_down(later, later + Duration::from_secs(1)));
        assert!(d.corrupt_during(later, later).is_empty());
        let past = end + REDIS_GRACE + Duration::from_secs(1);
        assert!(!d.redis_down(past, past + Duration::from_secs(1)));
        // An audit that ended before the fault began.
        assert!(!Disturbances::default().redis_down(t0, t0));
        let d2 = Disturbances::default();
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        d2.redis_fault_begins();
        assert!(!d2.redis_down(before - Duration::from_secs(1), before));
    }
}
