//! Prints the Lua text the service sends to Redis for one script: as
//! src/ledger/scripts.rs composes it (lib.lua in front) and cuts it down
//! (`scripts::cut_unused`; lua/bucket.lua per operation,
//! `scripts::specialize_bucket`). For `scripts/lua-cost`, which counts the
//! server's instructions per call.
//!
//! ```sh
//! cargo run --quiet --example script_text -- deduct_batch
//! cargo run --quiet --example script_text -- bucket:Start   # bucket.lua's Start
//! cargo run --quiet --example script_text -- bucket         # bucket.lua whole
//! ```

use std::process::ExitCode;

use deductor::ledger::scripts;

fn main() -> ExitCode {
    let arg = std::env::args().nth(1).unwrap_or_default();
    let body = match arg.split_once(':') {
        Some(("bucket", op)) => scripts::bucket(op).map(|s| s.body),
        _ if arg == "bucket" => Some(scripts::BUCKET.body),
        _ => scripts::all()
            .into_iter()
            .find(|s| s.name == arg && s.name != "bucket")
            .map(|s| s.body),
    };
    match body {
        Some(body) => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        None => {
            let mut names: Vec<String> = scripts::all()
                .iter()
                .filter(|s| s.name != "bucket")
                .map(|s| s.name.to_owned())
                .collect();
            names.push("bucket".into());
            names.extend(
                scripts::bucket_ops(scripts::BUCKET.body)
                    .iter()
                    .map(|op| format!("bucket:{op}")),
            );
            eprintln!(
                "script_text: no script {arg:?}; one of {}",
                names.join(", ")
            );
            ExitCode::from(2)
        }
    }
}
