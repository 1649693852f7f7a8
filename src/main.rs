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
        // was applied. The service (`run`) keeps Rust's default (ignored:
        // a write error is handled where it happens).
        // SAFETY: called first, before any thread exists; SIG_DFL is a
        // valid disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
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
