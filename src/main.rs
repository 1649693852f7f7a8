//! Wiring only: CLI, settings, telemetry, then the command.
//!
//! Exit codes: 0 ok; 1 a check failed, a breach was found, or the command
//! was refused or failed; 2 a usage or configuration error (clap's own
//! usage errors exit 2 too); 3 a dependency could not be reached
//! ([`commands::exit_code`]).

use std::process::ExitCode;

use clap::Parser;

use deductor::cli::Cli;
use deductor::{commands, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, deductor::cli::Command::Run { .. }) {
        // An operator command whose output is cut short by a closed pipe
        // (`deductor promo set ... | head -1`) ends quietly, as `cat` does,
        // instead of panicking in println! with a backtrace after its write
        // was applied. Only that pipe: a SIGPIPE from a Redis or Kafka
        // connection the server closed is ignored, so that write fails and
        // the command exits 3 with its message (with SIGPIPE's default it
        // died silently, exit 141). The service (`run`) keeps Rust's
        // default (ignored: a write error is handled where it happens).
        // SAFETY: called first, before any thread exists; the handler is
        // async-signal-safe (poll, signal, raise only).
        unsafe {
            libc::signal(
                libc::SIGPIPE,
                on_sigpipe as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
    let settings = match cli.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("deductor: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(settings.log.format, &settings.log.level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("deductor: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(commands::execute(cli.command, settings));
    // A blocking call abandoned at shutdown (bounded, see
    // `config::SHUTDOWN_BOUND`) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes.
            eprintln!("deductor: {e:#}");
            ExitCode::from(commands::exit_code(&e))
        }
    }
}

/// SIGPIPE of an operator command: when stdout or stderr is a pipe whose
/// reader has gone (poll says POLLERR), end as SIGPIPE's default does;
/// else (a network connection closed by its server) return, and the write
/// fails with EPIPE, handled as a connection error.
extern "C" fn on_sigpipe(_: libc::c_int) {
    for fd in [1, 2] {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no timeout; signal and raise are
        // async-signal-safe, and the raised SIGPIPE is delivered with the
        // default disposition once this handler returns.
        unsafe {
            if libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLERR != 0 {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
                return;
            }
        }
    }
}
