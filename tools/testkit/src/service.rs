//! The service under test: a `deductor` binary that a tool runs.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context as _;

/// `bin` as a command without this process's `DEDUCTOR_*` variables: the
/// tools give the service each setting as a flag, and the variables that
/// the dev-stack exports (its ports and urls) are not its settings.
pub fn command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.as_encoded_bytes().starts_with(b"DEDUCTOR_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// [`command`] with no input and its output, stdout and stderr, to a new
/// file `log`.
pub fn logged(bin: &Path, log: &Path) -> anyhow::Result<Command> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = command(bin);
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    Ok(cmd)
}
