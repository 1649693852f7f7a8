//! Loading: `config/default.toml` < `--config FILE` < `DEDUCTOR_*` env <
//! `--set` flags, merged by figment; secrets mounted as files are read here.

use std::path::Path;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;

use super::*;

impl Settings {
    /// Merges every layer. `file` is an optional config file; `overrides`
    /// are `section.key=value` pairs from the command line.
    pub fn load(
        file: Option<&Path>,
        overrides: &[(String, String)],
    ) -> Result<Settings, ConfigError> {
        Settings::load_from_env(file, overrides, std::env::vars())
    }

    /// [`Settings::load`] with an explicit environment, for tests.
    pub fn load_from_env(
        file: Option<&Path>,
        overrides: &[(String, String)],
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut fig = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Load(format!(
                    "config file {} does not exist; pass an existing file to --config or DEDUCTOR_CONFIG",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file(path));
        }
        let env: Vec<(String, String)> = env.into_iter().collect();
        fig = fig.merge(env_provider(&env));
        // librdkafka pass-through from the environment: the property names
        // contain dots, which figment would read as nesting, so they are
        // merged as whole keys here.
        for (name, value) in &env {
            for client in ["consumer", "producer"] {
                let prefix = format!("{ENV_PREFIX}KAFKA_{}_", client.to_uppercase());
                if let Some(prop) = name.strip_prefix(&prefix) {
                    let prop = prop.to_lowercase().replace('_', ".");
                    fig = fig.merge(Serialized::default(
                        "kafka",
                        serde_json::json!({ client: { prop: value } }),
                    ));
                }
            }
        }
        for (key, value) in overrides {
            fig = fig.merge(override_provider(key, value)?);
        }
        let mut settings: Settings = fig.extract().map_err(|e| ConfigError::Load(one_line(&e)))?;
        settings.read_secret_files()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Reads the `*_file` settings into the secrets they stand for:
    /// `redis.password_file` -> `redis.password`,
    /// `redis.sentinel_password_file` -> `redis.sentinel_password`, `kafka.sasl_password_file`
    /// -> `sasl.password` of the consumer and the producer. A secret mounted
    /// as a file stays out of the environment (and of `ps e`, crash dumps and
    /// `kubectl describe`). Each is exclusive with the inline value: with
    /// both set, which one wins would be a guess. Read once, at load: a
    /// rotated file takes effect at the next start.
    fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        if !self.redis.password_file.is_empty() {
            if !self.redis.password.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "redis.password_file",
                    problem: "is set together with redis.password".into(),
                    fix: "set only one of them: the file for a mounted secret, the value otherwise",
                });
            }
            self.redis.password = read_secret("redis.password_file", &self.redis.password_file)?;
        }
        if !self.redis.sentinel_password_file.is_empty() {
            if !self.redis.sentinel_password.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "redis.sentinel_password_file",
                    problem: "is set together with redis.sentinel_password".into(),
                    fix: "set only one of them: the file for a mounted secret, the value otherwise",
                });
            }
            self.redis.sentinel_password = read_secret(
                "redis.sentinel_password_file",
                &self.redis.sentinel_password_file,
            )?;
        }
        let k = &mut self.kafka;
        if !k.sasl_password_file.is_empty() {
            for (client, props) in [("consumer", &k.consumer), ("producer", &k.producer)] {
                if props.contains_key("sasl.password") {
                    return Err(ConfigError::Invalid {
                        key: "kafka.sasl_password_file",
                        problem: format!(
                            "is set together with kafka.{client}.\"sasl.password\""
                        ),
                        fix: "set only one of them: the file for a mounted secret, the property otherwise",
                    });
                }
            }
            let password = read_secret("kafka.sasl_password_file", &k.sasl_password_file)?;
            for props in [&mut k.consumer, &mut k.producer] {
                props.insert("sasl.password".into(), password.clone());
            }
        }
        Ok(())
    }
}

/// `DEDUCTOR_REDIS_KEY_PREFIX` -> `redis.key_prefix`: the first word after the
/// prefix names the section, the rest is the key. Variables of no known
/// section (DEDUCTOR_CONFIG) and the pass-through ones are left out.
fn env_provider(env: &[(String, String)]) -> Serialized<serde_json::Value> {
    let mut tree = serde_json::Map::new();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let rest = rest.to_lowercase();
        let Some((section, key)) = rest.split_once('_') else {
            continue;
        };
        if !SECTIONS.contains(&section) || key.is_empty() {
            continue;
        }
        if section == "kafka" && (key.starts_with("consumer_") || key.starts_with("producer_")) {
            continue;
        }
        // Only the keys config/default.toml documents: other DEDUCTOR_*
        // variables (e.g. DEDUCTOR_REDIS_CLUSTER_URL of scripts/dev-stack)
        // belong to tools and tests, not to the service.
        if !known_key(section, key) {
            continue;
        }
        let entry = tree
            .entry(section.to_owned())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let serde_json::Value::Object(m) = entry {
            m.insert(key.to_owned(), typed(section, key, value));
        }
    }
    Serialized::defaults(serde_json::Value::Object(tree))
}

/// True when `section.key` is a key of the defaults.
fn known_key(section: &str, key: &str) -> bool {
    default_value(section, key).is_some()
}

/// The default of `section.key` (config/default.toml), None for a key it
/// does not list.
fn default_value(section: &str, key: &str) -> Option<&'static serde_json::Value> {
    static DEFAULTS: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    let defaults = DEFAULTS.get_or_init(|| {
        Figment::from(Toml::string(DEFAULT_TOML))
            .extract::<serde_json::Value>()
            .unwrap_or_default()
    });
    defaults.get(section).and_then(|s| s.get(key))
}

fn override_provider(key: &str, value: &str) -> Result<Serialized<serde_json::Value>, ConfigError> {
    let Some((section, rest)) = key.split_once('.') else {
        return Err(ConfigError::Load(format!(
            "--set {key}: expected section.key=value, e.g. --set redis.pool_size=8"
        )));
    };
    let value = match rest.split_once('.') {
        // kafka.consumer.<librdkafka property>
        Some((client @ ("consumer" | "producer"), prop)) if section == "kafka" => {
            serde_json::json!({ client: { prop: value } })
        }
        _ => serde_json::json!({ rest: typed(section, rest, value) }),
    };
    Ok(Serialized::default(section, value))
}

/// An environment or flag value (always text) typed after the key's default:
/// a string key keeps the text whatever it looks like (a password `111111`,
/// a group id `20261130`), a number or boolean key gets a number or boolean
/// when the text is one. Text a typed key cannot take stays text, so the
/// extract reports the key and the expected type.
fn typed(section: &str, key: &str, v: &str) -> serde_json::Value {
    use serde_json::Value;
    let number = || -> Option<Value> {
        if let Ok(n) = v.parse::<u64>() {
            return Some(n.into());
        }
        if let Ok(n) = v.parse::<i64>() {
            return Some(n.into());
        }
        v.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number))
    };
    let boolean = || match v {
        "true" => Some(Value::Bool(true)),
        "false" => Some(Value::Bool(false)),
        _ => None,
    };
    let typed = match default_value(section, key) {
        Some(Value::String(_)) => None,
        // A list: comma separated (`--set kafka.propagate_headers=a,b`).
        Some(Value::Array(_)) => Some(Value::Array(
            v.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| Value::String(x.to_owned()))
                .collect(),
        )),
        Some(Value::Number(_)) => number(),
        Some(Value::Bool(_)) => boolean(),
        // Not a key of the defaults (refused by the extract, which names
        // it): the best guess, so that the error is about the key.
        _ => number().or_else(boolean),
    };
    typed.unwrap_or_else(|| v.into())
}

/// The secret held by the file `path` (setting `key`), without the line
/// break an editor or `echo` leaves at its end. A missing, unreadable, empty
/// or non-UTF-8 file is an error naming the key: starting without the
/// secret would fail later, at the first connection, far from the cause.
fn read_secret(key: &'static str, path: &str) -> Result<String, ConfigError> {
    let fix = "point it at a readable file that holds only the secret, or leave it empty";
    let bad = |problem: String| ConfigError::Invalid { key, problem, fix };
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| bad(format!("{path} is not UTF-8 text")))?;
    let secret = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if secret.is_empty() {
        return Err(bad(format!("{path} is empty")));
    }
    Ok(secret.to_owned())
}

fn one_line(e: &figment::Error) -> String {
    let mut msgs = Vec::new();
    for err in e.clone() {
        let path = err.path.join(".");
        // Name a file source; the other layers (defaults, environment,
        // flags) are built in code, whose location means nothing to a user.
        let from = match err.metadata.as_ref().and_then(|m| m.source.as_ref()) {
            Some(figment::Source::File(path)) => format!(" (in {})", path.display()),
            _ => String::new(),
        };
        if path.is_empty() {
            msgs.push(format!("{}{from}", err.kind));
        } else {
            msgs.push(format!("key {path}: {}{from}", err.kind));
        }
    }
    msgs.join("; ")
}
