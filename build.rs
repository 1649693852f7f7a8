//! Build metadata for `deductor --version` and the `deductor_build_info`
//! metric (src/build_info.rs): the git commit and the build date, as
//! `DEDUCTOR_GIT_COMMIT` and `DEDUCTOR_BUILD_DATE` at compile time.
//!
//! - The commit: `DEDUCTOR_GIT_COMMIT` from the environment when set (the
//!   Dockerfile passes its `REVISION` build argument: the image's context
//!   has no .git), else `git rev-parse HEAD` of the checkout this package is
//!   the top of, else `unknown` (a tarball, no git).
//! - The date: `SOURCE_DATE_EPOCH` when set (reproducible builds), else now;
//!   UTC, RFC 3339, to the second. It is the time this script last ran,
//!   which is on the first build and whenever HEAD moves.
//!
//! Never fails the build: anything missing is `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEDUCTOR_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = std::env::var("DEDUCTOR_GIT_COMMIT")
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty() && c.chars().all(|ch| ch.is_ascii_alphanumeric()))
        .or_else(|| git_commit(&dir))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=DEDUCTOR_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=DEDUCTOR_BUILD_DATE={}", build_date());
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// HEAD of the git checkout whose top is `dir` (not of a repository that
/// merely contains an unpacked tarball), and the files to watch for it.
fn git_commit(dir: &Path) -> Option<String> {
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(Path::new(&top), dir) {
        return None;
    }
    let commit = git(dir, &["rev-parse", "HEAD"])?;
    if !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    // Run again when HEAD moves: HEAD itself (a worktree has its own), the
    // branch it points to, and packed-refs.
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", &name]) {
            let path = dir.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    Some(commit)
}

/// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
fn build_date() -> String {
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs())
        });
    let Some(secs) = secs else {
        return "unknown".to_owned();
    };
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}
