//! What this binary is: the package version, the git commit and the build
//! date (set by build.rs; `unknown` where a build had no git checkout and no
//! `DEDUCTOR_GIT_COMMIT`). Shown by `deductor --version` and carried by the
//! `deductor_build_info` metric's labels.

/// The package version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from (40 hex digits) or `unknown`.
pub const COMMIT: &str = env!("DEDUCTOR_GIT_COMMIT");
/// When it was built, UTC, RFC 3339 (`SOURCE_DATE_EPOCH` when set).
pub const BUILD_DATE: &str = env!("DEDUCTOR_BUILD_DATE");
/// `deductor --version`: `0.1.0 (commit <sha>, built <date>)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("DEDUCTOR_GIT_COMMIT"),
    ", built ",
    env!("DEDUCTOR_BUILD_DATE"),
    ")"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commit_and_date_have_their_shapes() {
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 40 && COMMIT.chars().all(|c| c.is_ascii_hexdigit())),
            "{COMMIT}"
        );
        // 2026-12-01T21:05:00Z
        let d = BUILD_DATE.as_bytes();
        assert_eq!(d.len(), 20, "{BUILD_DATE}");
        assert!(
            BUILD_DATE.starts_with("20") && d[4] == b'-' && d[10] == b'T' && d[19] == b'Z',
            "{BUILD_DATE}"
        );
        assert!(LONG_VERSION.starts_with(VERSION) && LONG_VERSION.contains(COMMIT));
    }
}
