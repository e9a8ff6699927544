//! The adapter's configuration (SPEC.md section 3): every key, its default and its rules.
//!
//! Read once at start-up; any problem is a [`ConfigError`] whose one line names the key, and
//! the shell exits 2 with it. Values are parsed key by key so a type error names its key
//! (serde alone would not), and unknown keys are refused with the closest known one.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Image names that are built in; a `custom_images` entry may not reuse them.
pub const PRESET_NAMES: &[&str] = &["python", "node"];

/// Per-image ceilings on what a create may ask for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageCaps {
    pub max_cpus: Option<u32>,
    pub max_memory_mb: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub auto_install: bool,
    pub image_allowlist: Vec<String>,
    pub default_idle_timeout_secs: u64,
    pub max_concurrent_sandboxes: usize,
    /// Already normalised: a configured 0 is 1.
    pub max_concurrent_exec_per_sandbox: usize,
    pub max_exec_timeout_ms: u64,
    pub default_cpus: u32,
    pub default_memory_mb: u32,
    pub per_image_caps: BTreeMap<String, ImageCaps>,
    pub custom_images: BTreeMap<String, String>,
    /// Registry host -> mirror `host[:port]` (e.g. `docker.io` -> a local mirror).
    pub registry_mirrors: BTreeMap<String, String>,
    /// Registries (`host:port`) spoken to over plain http.
    pub insecure_registries: Vec<String>,
    /// Image cache; default `~/.iii/cache`.
    pub image_cache_dir: Option<PathBuf>,
    /// Docker credential file; default `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
    pub registry_auth_file: Option<PathBuf>,
    /// Where sandboxes keep their writable layers; default `~/.iii/sandbox`.
    pub state_dir: Option<PathBuf>,
    /// What one image may weigh, compressed and unpacked (decompression-bomb guard).
    pub max_image_size_mb: u64,
    /// Processes (and threads) one sandbox may hold at once (its cgroup's `pids.max`).
    pub max_pids_per_sandbox: u32,
    /// The size of each sandbox's (and worker VM's) writable layer, in MiB: past it the
    /// sandbox sees ENOSPC. SPEC's create has no disk field, so this is every sandbox's size.
    pub default_disk_mb: u32,
    /// Ceiling on `default_disk_mb` (and on any per-request disk size the contract may add).
    pub max_disk_mb: u32,
    /// Ceiling on any create's `cpus`, whatever `per_image_caps` says (default: the host's
    /// cores, and never below `default_cpus`).
    pub max_cpus: u32,
    /// Ceiling on any create's `memory_mb`, whatever `per_image_caps` says (default: half the
    /// host's memory, and never below `default_memory_mb`).
    pub max_memory_mb: u32,
    /// The egress policy of sandboxes with `network: true` (`network_allow`, `network_deny`).
    pub egress: crate::network::Egress,
    /// Image name -> how many sandboxes of it to keep booted and idle (see `warm_pool.rs`).
    pub warm_pool: BTreeMap<String, usize>,
    /// A backend that cannot bound a sandbox's cpus, memory and pids on this host (bwrap
    /// run by an ordinary user without a delegated cgroup) boots it anyway, saying so in
    /// `adapter::info` and each create's log line; false: such a create is S300.
    pub allow_unbounded_sandboxes: bool,
    /// Sandboxes on the bus (`sandbox_bus_access`, `sandbox_bus_call`, `sandbox_bus_register`).
    pub bus: crate::bus::BusConfig,
    /// How long a sandbox may stay paused before it is stopped: a paused sandbox holds its
    /// memory and slot, so pausing cannot keep them for ever.
    pub max_paused_secs: u64,
    /// What every snapshot's files together may take on disk (`snapshot::create`, `fork`),
    /// in MiB; past it S400. 0 turns snapshots and fork off.
    pub max_snapshot_disk_mb: u64,
    /// The host address exposed ports (`port::expose`) listen on: loopback by default, or
    /// one of the host's own addresses, never the unspecified one (every interface).
    pub expose_address: IpAddr,
    /// A running background process (`exec {background: true}`) keeps its sandbox from its
    /// idle timeout; false (the default): only calls do, and the idle timeout ends the
    /// sandbox and its background processes.
    pub background_keeps_alive: bool,
}

/// `max_snapshot_disk_mb` when the configuration names none: 10 GiB.
pub const DEFAULT_MAX_SNAPSHOT_DISK_MB: u64 = 10 * 1024;

/// `max_paused_secs` when the configuration names none: one hour.
pub const DEFAULT_MAX_PAUSED_SECS: u64 = 3600;

/// `max_pids_per_sandbox` when the configuration names none.
pub const DEFAULT_MAX_PIDS_PER_SANDBOX: u32 = 1024;
/// `default_disk_mb` / `max_disk_mb` when the configuration names none.
pub const DEFAULT_DISK_MB: u32 = 1024;
pub const DEFAULT_MAX_DISK_MB: u32 = 16 * 1024;

impl Default for Config {
    fn default() -> Self {
        Self {
            auto_install: true,
            image_allowlist: PRESET_NAMES.iter().map(|s| s.to_string()).collect(),
            default_idle_timeout_secs: 300,
            max_concurrent_sandboxes: 32,
            max_concurrent_exec_per_sandbox: 4,
            max_exec_timeout_ms: 300_000,
            default_cpus: 1,
            default_memory_mb: 512,
            per_image_caps: BTreeMap::new(),
            custom_images: BTreeMap::new(),
            registry_mirrors: BTreeMap::new(),
            insecure_registries: Vec::new(),
            image_cache_dir: None,
            registry_auth_file: None,
            state_dir: None,
            max_image_size_mb: 16 * 1024,
            max_pids_per_sandbox: DEFAULT_MAX_PIDS_PER_SANDBOX,
            default_disk_mb: DEFAULT_DISK_MB,
            max_disk_mb: DEFAULT_MAX_DISK_MB,
            max_cpus: host_cpus().max(1),
            max_memory_mb: (host_memory_mb() / 2).max(512),
            egress: crate::network::Egress::default(),
            warm_pool: BTreeMap::new(),
            allow_unbounded_sandboxes: false,
            bus: crate::bus::BusConfig::default(),
            max_paused_secs: DEFAULT_MAX_PAUSED_SECS,
            max_snapshot_disk_mb: DEFAULT_MAX_SNAPSHOT_DISK_MB,
            expose_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            background_keeps_alive: false,
        }
    }
}

/// The host's cores (1 when unknown).
fn host_cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1)
}

/// The host's memory in MiB, from `/proc/meminfo` (`MemTotal`); 1024 when unknown (no
/// `/proc`, as on macOS), which makes the default ceiling 512 MiB.
fn host_memory_mb() -> u32 {
    let kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        });
    kib.map_or(1024, |kib| u32::try_from(kib / 1024).unwrap_or(u32::MAX))
}

/// Every key the configuration may hold, in the order of SPEC.md, then ours.
pub const KNOWN_KEYS: &[&str] = &[
    "auto_install",
    "image_allowlist",
    "default_idle_timeout_secs",
    "max_concurrent_sandboxes",
    "max_concurrent_exec_per_sandbox",
    "max_exec_timeout_ms",
    "default_cpus",
    "default_memory_mb",
    "per_image_caps",
    "custom_images",
    "registry_mirrors",
    "insecure_registries",
    "image_cache_dir",
    "registry_auth_file",
    "state_dir",
    "max_image_size_mb",
    "max_pids_per_sandbox",
    "default_disk_mb",
    "max_disk_mb",
    "max_cpus",
    "max_memory_mb",
    "network_allow",
    "network_deny",
    "network_dns",
    "network_link_v4",
    "network_link_v6",
    "warm_pool",
    "allow_unbounded_sandboxes",
    "max_paused_secs",
    "max_snapshot_disk_mb",
    "expose_address",
    "background_keeps_alive",
    crate::bus::ACCESS_KEY,
    crate::bus::CALL_KEY,
    crate::bus::REGISTER_KEY,
    crate::bus::WORKER_HTTP_KEY,
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("configuration must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error(
        "configuration uses the old wrapped shape {{\"sandbox\": {{...}}}}: move the keys inside `sandbox` to the top level"
    )]
    WrappedShape,
    #[error("unknown configuration key `{key}`{}", hint(.closest))]
    UnknownKey {
        key: String,
        closest: Option<String>,
    },
    #[error("configuration key `{key}`: {reason}")]
    WrongType { key: String, reason: String },
    #[error("configuration key `custom_images.{0}` reuses the name of a preset image; pick another name")]
    CustomReusesPreset(String),
}

fn hint(closest: &Option<String>) -> String {
    closest
        .as_ref()
        .map(|k| format!(" (did you mean `{k}`?)"))
        .unwrap_or_default()
}

impl Config {
    /// Parses and validates a configuration value.
    pub fn from_json(value: &Value) -> Result<Self, ConfigError> {
        let object = match value {
            Value::Object(object) => object,
            other => return Err(ConfigError::NotAnObject(json_type_name(other))),
        };
        if object.len() == 1 && matches!(object.get("sandbox"), Some(Value::Object(_))) {
            return Err(ConfigError::WrappedShape);
        }
        if let Some(key) = object.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(ConfigError::UnknownKey {
                key: key.clone(),
                closest: closest_known_key(key),
            });
        }
        let mut config = Config::default();
        let keys = Keys(object);
        keys.read("auto_install", &mut config.auto_install)?;
        keys.read("image_allowlist", &mut config.image_allowlist)?;
        keys.read(
            "default_idle_timeout_secs",
            &mut config.default_idle_timeout_secs,
        )?;
        keys.read(
            "max_concurrent_sandboxes",
            &mut config.max_concurrent_sandboxes,
        )?;
        keys.read(
            "max_concurrent_exec_per_sandbox",
            &mut config.max_concurrent_exec_per_sandbox,
        )?;
        keys.read("max_exec_timeout_ms", &mut config.max_exec_timeout_ms)?;
        keys.read("default_cpus", &mut config.default_cpus)?;
        keys.read("default_memory_mb", &mut config.default_memory_mb)?;
        keys.read("per_image_caps", &mut config.per_image_caps)?;
        keys.read("custom_images", &mut config.custom_images)?;
        keys.read("registry_mirrors", &mut config.registry_mirrors)?;
        keys.read("insecure_registries", &mut config.insecure_registries)?;
        keys.read_optional("image_cache_dir", &mut config.image_cache_dir)?;
        keys.read_optional("registry_auth_file", &mut config.registry_auth_file)?;
        keys.read_optional("state_dir", &mut config.state_dir)?;
        keys.read("max_image_size_mb", &mut config.max_image_size_mb)?;
        keys.read("max_pids_per_sandbox", &mut config.max_pids_per_sandbox)?;
        keys.read("default_disk_mb", &mut config.default_disk_mb)?;
        config.max_disk_mb = config.max_disk_mb.max(config.default_disk_mb);
        keys.read("max_disk_mb", &mut config.max_disk_mb)?;
        // The host's values are only defaults: they never refuse the configured defaults.
        config.max_cpus = config.max_cpus.max(config.default_cpus);
        config.max_memory_mb = config.max_memory_mb.max(config.default_memory_mb);
        keys.read("max_cpus", &mut config.max_cpus)?;
        keys.read("max_memory_mb", &mut config.max_memory_mb)?;
        for (key, list) in [
            ("network_allow", &mut config.egress.allow),
            ("network_deny", &mut config.egress.deny),
        ] {
            if let Some(value) = object.get(key) {
                *list = crate::network::parse_list(key, value).map_err(|reason| {
                    ConfigError::WrongType {
                        key: key.into(),
                        reason,
                    }
                })?;
            }
        }
        keys.read("network_dns", &mut config.egress.dns)?;
        read_link_prefixes(object, &mut config.egress.link)?;

        if let Some(value) = object.get("warm_pool") {
            config.warm_pool = parse_warm_pool(value, config.max_concurrent_sandboxes)?;
        }
        keys.read(
            "allow_unbounded_sandboxes",
            &mut config.allow_unbounded_sandboxes,
        )?;
        config.bus = crate::bus::BusConfig::read(object)?;
        keys.read("max_paused_secs", &mut config.max_paused_secs)?;
        if config.max_paused_secs > crate::request::MAX_IDLE_TIMEOUT_SECS {
            return Err(ConfigError::WrongType {
                key: "max_paused_secs".into(),
                reason: format!(
                    "must be at most {} (a week)",
                    crate::request::MAX_IDLE_TIMEOUT_SECS
                ),
            });
        }

        keys.read("max_snapshot_disk_mb", &mut config.max_snapshot_disk_mb)?;
        keys.read("expose_address", &mut config.expose_address)?;
        keys.read("background_keeps_alive", &mut config.background_keeps_alive)?;
        check_expose_address(config.expose_address).map_err(|reason| ConfigError::WrongType {
            key: "expose_address".into(),
            reason,
        })?;

        if let Some(name) = config
            .custom_images
            .keys()
            .find(|n| PRESET_NAMES.contains(&n.as_str()))
        {
            return Err(ConfigError::CustomReusesPreset(name.clone()));
        }
        if let Some((name, _)) = config
            .custom_images
            .iter()
            .find(|(_, r)| r.trim().is_empty())
        {
            return Err(ConfigError::WrongType {
                key: format!("custom_images.{name}"),
                reason: "expected a non-empty OCI reference".into(),
            });
        }
        for (key, value) in [
            ("default_cpus", u64::from(config.default_cpus)),
            ("default_memory_mb", u64::from(config.default_memory_mb)),
            ("max_exec_timeout_ms", config.max_exec_timeout_ms),
            ("max_image_size_mb", config.max_image_size_mb),
            (
                "max_pids_per_sandbox",
                u64::from(config.max_pids_per_sandbox),
            ),
            ("default_disk_mb", u64::from(config.default_disk_mb)),
            ("max_disk_mb", u64::from(config.max_disk_mb)),
            ("max_cpus", u64::from(config.max_cpus)),
            ("max_memory_mb", u64::from(config.max_memory_mb)),
            ("max_paused_secs", config.max_paused_secs),
        ] {
            if value == 0 {
                return Err(ConfigError::WrongType {
                    key: key.into(),
                    reason: "must be at least 1".into(),
                });
            }
        }
        for (key, default, ceiling, max) in [
            (
                "default_cpus",
                config.default_cpus,
                "max_cpus",
                config.max_cpus,
            ),
            (
                "default_memory_mb",
                config.default_memory_mb,
                "max_memory_mb",
                config.max_memory_mb,
            ),
            (
                "default_disk_mb",
                config.default_disk_mb,
                "max_disk_mb",
                config.max_disk_mb,
            ),
        ] {
            if default > max {
                return Err(ConfigError::WrongType {
                    key: key.into(),
                    reason: format!("{default} is above `{ceiling}` ({max})"),
                });
            }
        }
        // SPEC.md: 0 means 1, not unlimited.
        config.max_concurrent_exec_per_sandbox = config.max_concurrent_exec_per_sandbox.max(1);
        Ok(config)
    }
}

/// `expose_address` must be loopback or an address of this host: the unspecified address
/// would put every exposed port on every interface, and a multicast one is no listener's.
/// Whether the host holds it is asked of the kernel: a listener bound to it (and closed at
/// once) succeeds only for a local address.
fn check_expose_address(address: IpAddr) -> Result<(), String> {
    if address.is_unspecified() {
        return Err(format!(
            "{address} would listen on every interface; name loopback or one host address"
        ));
    }
    if address.is_multicast() {
        return Err(format!("{address} is a multicast address"));
    }
    std::net::TcpListener::bind((address, 0))
        .map(drop)
        .map_err(|e| format!("{address} is not an address of this host ({e})"))
}

/// `network_link_v4` / `network_link_v6`: the prefixes of a bwrap sandbox's link to its gate
/// (a /24, a /64) instead of the first the host leaves free; refused when the host routes or
/// holds an address of them now (its routes are checked again at each create).
fn read_link_prefixes(
    object: &Map<String, Value>,
    link: &mut egress::network::LinkPrefixes,
) -> Result<(), ConfigError> {
    use egress::network::{LINK_KEY_V4, LINK_KEY_V6};
    if !object.contains_key(LINK_KEY_V4) && !object.contains_key(LINK_KEY_V6) {
        return Ok(());
    }
    let host = egress::network::host_routes();
    for key in [LINK_KEY_V4, LINK_KEY_V6] {
        let Some(value) = object.get(key) else {
            continue;
        };
        let wrong = |reason: String| ConfigError::WrongType {
            key: key.into(),
            reason,
        };
        let text = value.as_str().ok_or_else(|| {
            wrong(format!(
                "expected a CIDR string, got {}",
                json_type_name(value)
            ))
        })?;
        link.configure(key, text, &host).map_err(wrong)?;
    }
    Ok(())
}

/// `warm_pool`: `{image: count}`, each count a non-negative integer, all of them together at
/// most `max_concurrent_sandboxes` (pooled sandboxes hold slots). Whether each image may boot
/// is checked at start-up against the catalog (`warm_pool::check`).
fn parse_warm_pool(value: &Value, cap: usize) -> Result<BTreeMap<String, usize>, ConfigError> {
    let wrong = |key: String, reason: String| ConfigError::WrongType { key, reason };
    let Value::Object(entries) = value else {
        return Err(wrong(
            "warm_pool".into(),
            format!(
                "expected an object {{image: count}}, got {}",
                json_type_name(value)
            ),
        ));
    };
    let mut pool = BTreeMap::new();
    for (image, count) in entries {
        let key = format!("warm_pool.{image}");
        if image.trim().is_empty() {
            return Err(wrong(key, "the image name is empty".into()));
        }
        let count = count
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                wrong(
                    key,
                    format!("expected a non-negative integer count, got {count}"),
                )
            })?;
        if count > 0 {
            pool.insert(image.clone(), count);
        }
    }
    let total: usize = pool.values().sum();
    if total > cap {
        return Err(wrong(
            "warm_pool".into(),
            format!("{total} sandboxes in all, above `max_concurrent_sandboxes` ({cap})"),
        ));
    }
    Ok(pool)
}

/// Reads one key at a time so a type error names the key.
struct Keys<'a>(&'a Map<String, Value>);

impl Keys<'_> {
    fn read<T: DeserializeOwned>(&self, key: &str, slot: &mut T) -> Result<(), ConfigError> {
        if let Some(value) = self.0.get(key) {
            *slot = parse_key(key, value)?;
        }
        Ok(())
    }

    fn read_optional<T: DeserializeOwned>(
        &self,
        key: &str,
        slot: &mut Option<T>,
    ) -> Result<(), ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(()),
            Some(value) => {
                *slot = Some(parse_key(key, value)?);
                Ok(())
            }
        }
    }
}

fn parse_key<T: DeserializeOwned>(key: &str, value: &Value) -> Result<T, ConfigError> {
    T::deserialize(value).map_err(|e| ConfigError::WrongType {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

fn closest_known_key(key: &str) -> Option<String> {
    KNOWN_KEYS
        .iter()
        .map(|known| (strsim::damerau_levenshtein(key, known), *known))
        .filter(|(distance, known)| *distance <= known.len().max(key.len()) / 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known.to_string())
}

/// What kind of JSON value `value` is, as a message names it ("a string", "null").
pub(crate) fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn error_of(value: Value) -> String {
        Config::from_json(&value).unwrap_err().to_string()
    }

    #[test]
    fn empty_object_gives_the_spec_defaults() {
        let config = Config::from_json(&json!({})).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.image_allowlist, vec!["python", "node"]);
        assert_eq!(config.max_concurrent_exec_per_sandbox, 4);
    }

    #[test]
    fn every_rule_is_enforced_with_the_key_named() {
        let cases: &[(Value, &str)] = &[
            (json!([]), "must be a JSON object"),
            (
                json!({"sandbox": {"auto_install": true}}),
                "old wrapped shape",
            ),
            (
                json!({"max_concurent_sandboxes": 3}),
                "`max_concurent_sandboxes` (did you mean `max_concurrent_sandboxes`?)",
            ),
            (
                json!({"zzzzzzzzzzzzzzzzzzzzzzzz": 1}),
                "unknown configuration key `zzzzzzzzzzzzzzzzzzzzzzzz`",
            ),
            (json!({"auto_install": "yes"}), "key `auto_install`"),
            (
                json!({"max_concurrent_sandboxes": -1}),
                "key `max_concurrent_sandboxes`",
            ),
            (json!({"max_paused_secs": 0}), "key `max_paused_secs`"),
            (
                json!({"max_paused_secs": 604_801}),
                "key `max_paused_secs`: must be at most",
            ),
            (json!({"max_paused_secs": "1h"}), "key `max_paused_secs`"),
            (
                json!({"max_exec_timeout_ms": 1.5}),
                "key `max_exec_timeout_ms`",
            ),
            (
                json!({"image_allowlist": "python"}),
                "key `image_allowlist`",
            ),
            (
                json!({"per_image_caps": {"python": {"max_cpu": 2}}}),
                "key `per_image_caps`",
            ),
            (
                json!({"custom_images": {"python": "example.org/p:1"}}),
                "`custom_images.python` reuses the name of a preset",
            ),
            (
                json!({"custom_images": {"mine": ""}}),
                "`custom_images.mine`",
            ),
            (json!({"default_cpus": 0}), "key `default_cpus`"),
            (
                json!({"max_pids_per_sandbox": 0}),
                "key `max_pids_per_sandbox`",
            ),
            (
                json!({"max_pids_per_sandbox": "many"}),
                "key `max_pids_per_sandbox`",
            ),
            (json!({"max_cpus": 0}), "key `max_cpus`"),
            (json!({"default_disk_mb": 0}), "key `default_disk_mb`"),
            (json!({"default_disk_mb": "big"}), "key `default_disk_mb`"),
            (json!({"max_disk_mb": -1}), "key `max_disk_mb`"),
            (
                json!({"default_disk_mb": 64, "max_disk_mb": 32}),
                "key `default_disk_mb`: 64 is above `max_disk_mb` (32)",
            ),
            (json!({"max_memory_mb": -5}), "key `max_memory_mb`"),
            (
                json!({"default_cpus": 4, "max_cpus": 2}),
                "key `default_cpus`: 4 is above `max_cpus` (2)",
            ),
            (
                json!({"max_memory_mb": 256}),
                "key `default_memory_mb`: 512 is above `max_memory_mb` (256)",
            ),
            (
                json!({"warm_pool": ["python"]}),
                "key `warm_pool`: expected an object",
            ),
            (
                json!({"warm_pool": {"python": -1}}),
                "key `warm_pool.python`",
            ),
            (
                json!({"warm_pool": {"python": 1.5}}),
                "key `warm_pool.python`",
            ),
            (
                json!({"warm_pool": {"python": "2"}}),
                "key `warm_pool.python`",
            ),
            (json!({"warm_pool": {"": 1}}), "key `warm_pool.`"),
            (
                json!({"allow_unbounded_sandboxes": "yes"}),
                "key `allow_unbounded_sandboxes`",
            ),
            (
                json!({"allow_unbounded_sandboxes": 1}),
                "key `allow_unbounded_sandboxes`",
            ),
            (
                json!({"warm_pool": {"python": 2, "node": 2}, "max_concurrent_sandboxes": 3}),
                "key `warm_pool`: 4 sandboxes in all, above `max_concurrent_sandboxes` (3)",
            ),
        ];
        for (value, expected) in cases {
            let message = error_of(value.clone());
            assert!(
                message.contains(expected),
                "{value}: {message:?} lacks {expected:?}"
            );
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
    }

    #[test]
    fn ceilings_default_to_the_host_and_never_refuse_the_defaults() {
        let config = Config::from_json(&json!({})).unwrap();
        assert_eq!(config.max_pids_per_sandbox, 1024);
        assert!(
            !config.allow_unbounded_sandboxes,
            "limits fail closed by default"
        );
        let allowed = Config::from_json(&json!({"allow_unbounded_sandboxes": true})).unwrap();
        assert!(allowed.allow_unbounded_sandboxes);
        assert_eq!(
            (config.default_disk_mb, config.max_disk_mb),
            (1024, 16 * 1024)
        );
        // A default above the default ceiling raises it, as for cpus and memory.
        let config = Config::from_json(&json!({"default_disk_mb": 20000})).unwrap();
        assert_eq!(config.max_disk_mb, 20000);
        assert!(config.max_cpus >= 1 && config.max_cpus >= config.default_cpus);
        assert!(config.max_memory_mb >= 512);
        // A default above the host's share raises the default ceiling with it.
        let config = Config::from_json(&json!({"default_cpus": 100000})).unwrap();
        assert_eq!(config.max_cpus, 100000);
        let config = Config::from_json(
            &json!({"max_cpus": 3, "max_memory_mb": 700, "max_pids_per_sandbox": 64}),
        )
        .unwrap();
        assert_eq!(
            (
                config.max_cpus,
                config.max_memory_mb,
                config.max_pids_per_sandbox
            ),
            (3, 700, 64)
        );
    }

    #[test]
    fn warm_pool_counts_are_kept_and_zero_counts_dropped() {
        let config = Config::from_json(&json!({"warm_pool": {"python": 2, "node": 0}})).unwrap();
        assert_eq!(
            config.warm_pool,
            BTreeMap::from([("python".to_string(), 2)])
        );
        let full =
            Config::from_json(&json!({"warm_pool": {"python": 3}, "max_concurrent_sandboxes": 3}));
        assert_eq!(
            full.unwrap().warm_pool["python"],
            3,
            "the whole cap may be pooled"
        );
    }

    #[test]
    fn zero_exec_cap_means_one() {
        let config = Config::from_json(&json!({"max_concurrent_exec_per_sandbox": 0})).unwrap();
        assert_eq!(config.max_concurrent_exec_per_sandbox, 1);
    }

    #[test]
    fn configured_values_are_in_force() {
        let config = Config::from_json(&json!({
            "auto_install": false, "image_allowlist": [], "default_idle_timeout_secs": 9,
            "max_concurrent_sandboxes": 3, "max_exec_timeout_ms": 1000, "default_cpus": 2,
            "default_memory_mb": 256, "per_image_caps": {"python": {"max_cpus": 2, "max_memory_mb": 300}},
            "custom_images": {"mine": "127.0.0.1:5000/mine:1"},
            "registry_mirrors": {"docker.io": "127.0.0.1:5000"}, "insecure_registries": ["127.0.0.1:5000"],
        }))
        .unwrap();
        assert!(!config.auto_install);
        assert!(config.image_allowlist.is_empty());
        assert_eq!(config.max_concurrent_sandboxes, 3);
        assert_eq!(config.per_image_caps["python"].max_memory_mb, Some(300));
        assert_eq!(config.registry_mirrors["docker.io"], "127.0.0.1:5000");
    }

    #[test]
    fn expose_address_is_loopback_or_a_host_address() {
        assert_eq!(
            Config::default().expose_address,
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        let config = Config::from_json(&json!({"expose_address": "127.0.0.2"})).unwrap();
        assert_eq!(config.expose_address.to_string(), "127.0.0.2");
        for (value, says) in [
            (json!("0.0.0.0"), "every interface"),
            (json!("::"), "every interface"),
            (json!("224.0.0.1"), "multicast"),
            // TEST-NET-3: documentation only, never a host's.
            (json!("203.0.113.9"), "not an address of this host"),
            (json!("localhost"), "expose_address"),
            (json!(8080), "expose_address"),
        ] {
            let error = error_of(json!({ "expose_address": value }));
            assert!(error.contains("`expose_address`"), "{error}");
            assert!(error.contains(says), "{value}: {error}");
        }
    }

    #[test]
    fn the_sandboxes_link_prefixes_may_be_named_and_are_validated() {
        let config = Config::from_json(
            &json!({"network_link_v4": "10.213.47.0/24", "network_link_v6": "fd5a:1b2c:3d4e::/64"}),
        )
        .unwrap();
        assert_eq!(
            config.egress.link.v4.map(|n| n.to_string()).as_deref(),
            Some("10.213.47.0/24")
        );
        assert_eq!(
            config.egress.link.v6.map(|n| n.to_string()).as_deref(),
            Some("fd5a:1b2c:3d4e::/64")
        );
        assert_eq!(Config::default().egress.link, Default::default());
        for (value, says) in [
            (
                json!({"network_link_v4": "10.213.0.0/16"}),
                "`network_link_v4`",
            ),
            (json!({"network_link_v4": 24}), "`network_link_v4`"),
            (
                json!({"network_link_v6": "10.213.47.0/24"}),
                "`network_link_v6`",
            ),
            (json!({"network_link_v6": "fe80::/64"}), "special range"),
        ] {
            let error = error_of(value.clone());
            assert!(error.contains(says), "{value}: {error}");
        }
        // One of this host's own routes is refused.
        if let Some(used) = egress::network::host_routes()
            .into_iter()
            .find(|net| net.prefix_len() == 24 && net.addr().is_ipv4() && !net.addr().is_loopback())
        {
            let error = error_of(json!({"network_link_v4": used.to_string()}));
            assert!(error.contains("overlaps"), "{used}: {error}");
        }
    }
}
