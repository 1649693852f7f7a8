//! Wiring only: CLI, settings, telemetry, then the command.

use std::process::ExitCode;

use clap::Parser;

use deductor::cli::Cli;
use deductor::{commands, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    match runtime.block_on(commands::execute(cli.command, settings)) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes.
            eprintln!("deductor: {e:#}");
            ExitCode::FAILURE
        }
    }
}
