//! The `deductor run` processes of one consumer group, and what is done to
//! them: SIGKILL and restart, SIGSTOP past the session timeout then SIGCONT
//! (a zombie), SIGTERM (a graceful leave, which must exit 0: G4) and joins.
//!
//! A process that exits without being told to is an unexpected exit: it is
//! counted (it must not happen) and restarted; except one that exits 2 (a
//! usage or configuration error) within [`REFUSAL_WINDOW`] of its start:
//! it refused its settings, every restart would too, and the run stops
//! ([`Fleet::refused`]).

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use deductor_testkit::service;

/// How soon after its start an exit 2 counts as refusing the settings.
const REFUSAL_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// SIGSTOPped.
    Frozen,
    /// SIGTERM sent; its exit is expected.
    Leaving,
    /// No process, on purpose.
    Off,
    /// Exited unasked; restarted at this moment.
    Crashed(Instant),
}

struct Slot {
    child: Option<Child>,
    state: State,
    started: u32,
    /// When the current process was started.
    since: Option<Instant>,
}

/// What happened to the processes, for the report.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FleetStats {
    pub started: u32,
    pub killed: u32,
    pub frozen: u32,
    pub terminated: u32,
    /// Exit codes of SIGTERMed processes other than 0 (must be none).
    pub bad_term_exits: Vec<String>,
    /// Processes that exited without being told to while running (must be none).
    pub unexpected_exits: Vec<String>,
    /// The last lines of each such process's log, and of each SIGTERMed
    /// one that did not exit 0 in time, for the evidence: the exit's own
    /// line alone rarely tells why.
    pub unexpected_tails: Vec<String>,
    /// Processes that refused to start because Redis was unreachable (exit 1
    /// with "connecting to Redis"): the service fails fast at startup; they
    /// are restarted a second later.
    pub refused_starts: Vec<String>,
}

pub struct Fleet {
    bin: PathBuf,
    args: Vec<String>,
    logs: PathBuf,
    slots: Vec<Slot>,
    pub stats: FleetStats,
    /// DEDUCTOR_MUTANT for every process (a `mutants` build; see `--mutant`).
    pub mutant: Option<String>,
    /// Set when a process refused its settings (exit 2 at its start): the
    /// process and its last log line. The run cannot go on.
    pub refused: Option<String>,
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Fleet {
    pub fn new(bin: PathBuf, args: Vec<String>, logs: PathBuf) -> Fleet {
        Fleet {
            bin,
            args,
            logs,
            slots: Vec::new(),
            stats: FleetStats::default(),
            mutant: None,
            refused: None,
        }
    }

    /// Starts a process in slot `i` (a new slot when `i` is the slot count).
    pub fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        if i == self.slots.len() {
            self.slots.push(Slot {
                child: None,
                state: State::Off,
                started: 0,
                since: None,
            });
        }
        let slot = &mut self.slots[i];
        slot.started += 1;
        let log = self.logs.join(format!("consumer-{i}.{}.log", slot.started));
        let mut cmd = service::logged(&self.bin, &log)?;
        if let Some(m) = &self.mutant {
            cmd.env("DEDUCTOR_MUTANT", m);
        }
        let child = cmd
            .args(&self.args)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let pids = self.logs.join("pids");
        let mut all = std::fs::read_to_string(&pids).unwrap_or_default();
        all.push_str(&format!("{}\n", child.id()));
        std::fs::write(&pids, all)?;
        slot.child = Some(child);
        slot.since = Some(Instant::now());
        slot.state = State::Running;
        self.stats.started += 1;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slots with a running (not frozen, not leaving) process.
    pub fn running(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].state == State::Running)
            .collect()
    }

    /// The running process started longest ago: the likeliest to own
    /// partitions (a process restarted a moment ago may still wait for the
    /// rebalance that gives it some).
    pub fn oldest_running(&self) -> Option<usize> {
        self.running()
            .into_iter()
            .min_by_key(|&i| self.slots[i].since)
    }

    pub fn kill(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(mut c) = slot.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            self.stats.killed += 1;
        }
        slot.state = State::Off;
    }

    pub fn freeze(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(c) = &slot.child {
            signal(c.id(), "STOP");
            slot.state = State::Frozen;
            self.stats.frozen += 1;
        }
    }

    pub fn thaw(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(c) = &slot.child {
            signal(c.id(), "CONT");
        }
        if slot.state == State::Frozen {
            slot.state = State::Running;
        }
    }

    /// Sends SIGTERM; [`Fleet::poll`] collects the exit.
    pub fn terminate(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(c) = &slot.child {
            signal(c.id(), "CONT");
            signal(c.id(), "TERM");
            slot.state = State::Leaving;
            self.stats.terminated += 1;
        }
    }

    /// True while slot `i` has a process that was told to leave.
    pub fn leaving(&self, i: usize) -> bool {
        self.slots[i].state == State::Leaving
    }

    /// Lines the consumers have met corrupt data on promotion `promo` and
    /// rejected (their `corrupt promotion data; the line is rejected`
    /// log records), over every consumer log of the run. The service logs
    /// it whatever the scripts remember, so it counts in a mutant that
    /// forgets the decision too.
    pub fn corrupt_lines(&self, promo: &str) -> u64 {
        let Ok(dir) = std::fs::read_dir(&self.logs) else {
            return 0;
        };
        let field = format!("\"promotion\":\"{promo}\"");
        dir.flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("consumer-") && name.ends_with(".log")
            })
            .map(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| {
                        l.contains("corrupt promotion data; the line is rejected")
                            && l.contains(&field)
                    })
                    .count() as u64
            })
            .sum()
    }

    /// The log of slot `i`'s current (or last) process.
    pub fn log_of(&self, i: usize) -> PathBuf {
        self.logs
            .join(format!("consumer-{i}.{}.log", self.slots[i].started))
    }

    /// Keeps `what` with the last 12 lines of slot `i`'s log, for the
    /// evidence of a stop that went wrong.
    fn keep_tail(&mut self, i: usize, what: &str) {
        let text = std::fs::read_to_string(self.log_of(i)).unwrap_or_default();
        self.stats.unexpected_tails.push(tail(&text, what, 12));
    }

    pub fn is_off(&self, i: usize) -> bool {
        self.slots[i].state == State::Off
    }

    /// Reaps exits: a leaving process's exit code is checked, any other exit
    /// is unexpected and the slot is restarted.
    pub fn poll(&mut self) -> anyhow::Result<()> {
        for i in 0..self.slots.len() {
            if let State::Crashed(due) = self.slots[i].state {
                if Instant::now() >= due {
                    self.spawn(i)?;
                }
                continue;
            }
            let status: Option<ExitStatus> = match self.slots[i].child.as_mut() {
                Some(c) => c.try_wait().ok().flatten(),
                None => None,
            };
            let Some(status) = status else { continue };
            self.slots[i].child = None;
            let started = self.slots[i].started;
            match self.slots[i].state {
                State::Leaving => {
                    if !status.success() {
                        let what = format!("consumer-{i}.{started}: {status} after SIGTERM");
                        self.keep_tail(i, &what);
                        self.stats.bad_term_exits.push(what);
                    }
                    self.slots[i].state = State::Off;
                }
                _ => {
                    let log = self.logs.join(format!("consumer-{i}.{started}.log"));
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let last = text.lines().last().unwrap_or_default();
                    let what = format!("consumer-{i}.{started}: {status}: {last}");
                    let young = self.slots[i]
                        .since
                        .is_some_and(|t| t.elapsed() < REFUSAL_WINDOW);
                    if status.code() == Some(2) && young {
                        // Refused its settings: not restarted.
                        eprintln!("chaos: {what}");
                        self.refused.get_or_insert(what);
                        self.slots[i].state = State::Off;
                        continue;
                    }
                    if last.starts_with("deductor: connecting to Redis") {
                        self.stats.refused_starts.push(what);
                    } else {
                        eprintln!("chaos: {what}; restarting");
                        self.stats.unexpected_tails.push(tail(&text, &what, 12));
                        self.stats.unexpected_exits.push(what);
                    }
                    self.slots[i].state = State::Crashed(Instant::now() + Duration::from_secs(1));
                }
            }
        }
        Ok(())
    }

    /// Terminates every process and waits (SIGKILL after `grace`).
    pub async fn stop_all(&mut self, grace: Duration) -> anyhow::Result<()> {
        for i in 0..self.slots.len() {
            // A process that exited unasked moments ago is not restarted now:
            // [`Fleet::poll`] below would start it untold to leave, and it
            // would count as not stopping in time.
            if matches!(self.slots[i].state, State::Crashed(_)) {
                self.slots[i].state = State::Off;
            }
            if self.slots[i].child.is_some() && !self.leaving(i) {
                self.terminate(i);
            }
        }
        let deadline = Instant::now() + grace;
        while self.slots.iter().any(|s| s.child.is_some()) {
            self.poll()?;
            if Instant::now() > deadline {
                for i in 0..self.slots.len() {
                    if self.slots[i].child.is_some() {
                        let what = format!("consumer-{i}: still running {grace:?} after SIGTERM");
                        self.keep_tail(i, &what);
                        self.stats.bad_term_exits.push(what);
                        self.kill(i);
                    }
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// SIGKILLs whatever is left (on errors).
    pub fn kill_all(&mut self) {
        for i in 0..self.slots.len() {
            self.kill(i);
        }
    }
}

/// `what` and the last `n` lines of a log, each cut to 400 characters.
fn tail(text: &str, what: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = format!("{what}\n");
    for l in &lines[lines.len().saturating_sub(n)..] {
        let cut: String = l.chars().take(400).collect();
        out.push_str("    ");
        out.push_str(&cut);
        out.push('\n');
    }
    out
}
