//! `redis-sentinel://` urls: our syntax, parsed without fred so that config
//! validation can name the problem.
//!
//! `redis-sentinel://[USER@]HOST[:PORT][,HOST[:PORT]...]/SERVICE`
//! (`rediss-sentinel://` for TLS to the sentinels and the data nodes). The
//! hosts are sentinels (port 26379 when left out); SERVICE is the name the
//! sentinels monitor the primary under. USER is the data nodes' (like
//! `redis.username`, which overrides it); their password comes only from
//! `redis.password` or `redis.password_file` (config validation refuses a
//! password in any Redis url, without echoing it);
//! the sentinels' own are `redis.sentinel_username` / `redis.sentinel_password`.
//! fred's own sentinel url (`?sentinelServiceName=...&node=...`) is not
//! accepted: one syntax, checked at start.

/// The parts of a sentinel url.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    pub tls: bool,
    /// The sentinels, in the order given (tried in that order).
    pub sentinels: Vec<(String, u16)>,
    /// The primary's name as the sentinels know it (`sentinel monitor NAME ...`).
    pub service: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// The sentinels' port when a host gives none.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

impl SentinelUrl {
    /// True when `url` has a sentinel scheme (then [`SentinelUrl::parse`] applies).
    pub fn is_sentinel(url: &str) -> bool {
        url.starts_with("redis-sentinel://") || url.starts_with("rediss-sentinel://")
    }

    /// Parses a sentinel url; the error says what is wrong (never the password).
    pub fn parse(url: &str) -> Result<SentinelUrl, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis-sentinel://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss-sentinel://") {
            (true, rest)
        } else {
            return Err("the scheme is not redis-sentinel:// or rediss-sentinel://".into());
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (hosts, service) = rest
            .split_once('/')
            .ok_or("no /SERVICE after the sentinel hosts")?;
        if service.is_empty() || service.contains(['/', '?', '#', ' ', '@', ',']) {
            return Err(format!(
                "the service name {service:?} is empty or contains / ? # @ , or a space"
            ));
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            sentinels.push(parse_host(host)?);
        }
        let (username, password) = match auth {
            None => (None, None),
            Some(auth) => {
                let (user, pass) = match auth.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (auth, None),
                };
                let user = (!user.is_empty()).then(|| user.to_owned());
                let pass = pass.filter(|p| !p.is_empty()).map(str::to_owned);
                (user, pass)
            }
        };
        Ok(SentinelUrl {
            tls,
            sentinels,
            service: service.to_owned(),
            username,
            password,
        })
    }
}

fn parse_host(host: &str) -> Result<(String, u16), String> {
    if host.is_empty() {
        return Err("an empty sentinel host (two commas, or none before /)".into());
    }
    // [v6]:port, host:port or host.
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (name, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{host:?} lacks the closing ]"))?;
        match after {
            "" => (name, None),
            p => (
                name,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("{host:?}: expected :PORT after ]"))?,
                ),
            ),
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() || name.contains(['/', '?', '#', ' ', '@']) {
        return Err(format!("{host:?} is not a host[:port]"));
    }
    let port = match port {
        None => DEFAULT_SENTINEL_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("{host:?} has no valid port (1 to 65535)")),
        },
    };
    Ok((name.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_service_and_credentials() {
        let u = SentinelUrl::parse("redis-sentinel://a:26380,b,[::1]:26381/mymaster").unwrap();
        assert!(!u.tls);
        assert_eq!(
            u.sentinels,
            vec![
                ("a".to_owned(), 26380),
                ("b".to_owned(), 26379),
                ("::1".to_owned(), 26381)
            ]
        );
        assert_eq!(u.service, "mymaster");
        assert_eq!((u.username, u.password), (None, None));

        let u = SentinelUrl::parse("rediss-sentinel://app:s3cr:et@h:1/svc").unwrap();
        assert!(u.tls);
        assert_eq!(u.username.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("s3cr:et"));
        let u = SentinelUrl::parse("redis-sentinel://:pw@h/svc").unwrap();
        assert_eq!((u.username, u.password.as_deref()), (None, Some("pw")));
    }

    #[test]
    fn refuses_malformed_urls_with_a_reason() {
        for (url, says) in [
            ("redis://h:1", "scheme"),
            ("redis-sentinel://h:26379", "/SERVICE"),
            ("redis-sentinel://h:26379/", "service name"),
            ("redis-sentinel://h:26379/a/b", "service name"),
            ("redis-sentinel://h:26379,/m", "empty sentinel host"),
            ("redis-sentinel://h:0/m", "port"),
            ("redis-sentinel://h:x/m", "port"),
            ("redis-sentinel://h:70000/m", "port"),
            ("redis-sentinel://[::1/m", "]"),
            ("redis-sentinel://user:secret@h:x/m", "port"),
        ] {
            let e = SentinelUrl::parse(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: {e}");
        }
    }
}
