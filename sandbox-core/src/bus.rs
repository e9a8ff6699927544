//! Sandboxes on the bus, on the operator's terms (`sandbox_bus_access`, `sandbox_bus_call`,
//! `sandbox_bus_register`). A sandbox with network, when access is on, gets an endpoint of the
//! adapter's bus guard (the `bus-guard` crate), and its backend forwards the engine's port of
//! the sandbox's loopback there, so `ws://localhost:<port>` and `ws://127.0.0.1:<port>` inside
//! reach the guard and never the engine itself. The endpoint closes when the sandbox ends
//! (stop, reaping, a dead agent, the adapter's shutdown: all go through `ops::stop::teardown`),
//! which ends its connections: the engine drops its functions.
//!
//! Off (the default), a sandbox gets no forward at all: a connection to the engine's port on
//! its loopback is refused by its own kernel at once. A create that hands a sandbox `III_URL`
//! then logs which key would let it on the bus (the attempt itself is never seen: nothing
//! listens).

use std::collections::HashMap;
use std::sync::Mutex;

use bus_guard::{BusGuard, Policy, SandboxBus};
use egress::network::BusForward;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::config::ConfigError;
use crate::error::SandboxError;

/// The configuration's keys.
pub const ACCESS_KEY: &str = "sandbox_bus_access";
pub const CALL_KEY: &str = bus_guard::CALL_KEY;
pub const REGISTER_KEY: &str = bus_guard::REGISTER_KEY;

/// The name the adapter serves and announces itself under unless told otherwise.
const PRODUCT: &str = "sandbox-libkrun";

/// What the configuration says about sandboxes on the bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusConfig {
    pub access: bool,
    /// Function-id patterns a guest may invoke.
    pub call: Vec<String>,
    /// Function-id patterns a guest may register.
    pub register: Vec<String>,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            access: false,
            call: Vec::new(),
            register: vec!["*".into()],
        }
    }
}

impl BusConfig {
    /// The three keys of `object`, each checked (a bad one names itself).
    pub fn read(object: &Map<String, Value>) -> Result<BusConfig, ConfigError> {
        let wrong = |key: &str, reason: String| ConfigError::WrongType {
            key: key.into(),
            reason,
        };
        let mut config = BusConfig::default();
        if let Some(value) = object.get(ACCESS_KEY) {
            config.access = value
                .as_bool()
                .ok_or_else(|| wrong(ACCESS_KEY, format!("expected true or false, got {value}")))?;
        }
        for (key, list) in [
            (CALL_KEY, &mut config.call),
            (REGISTER_KEY, &mut config.register),
        ] {
            let Some(value) = object.get(key) else {
                continue;
            };
            *list = serde_json::from_value(value.clone()).map_err(|_| {
                wrong(
                    key,
                    format!(
                        "expected a list of function-id patterns (e.g. [\"math::*\"]), got {value}"
                    ),
                )
            })?;
            Policy::check_list(key, list).map_err(|e| wrong(key, e.to_string()))?;
        }
        Ok(config)
    }
}

/// The adapter's way for sandboxes to the bus, and the endpoints open now.
pub(crate) struct Buses {
    /// `None`: access is off, or the adapter knows no engine to relay to.
    guard: Option<Guard>,
    access: bool,
    open: Mutex<HashMap<Uuid, SandboxBus>>,
}

struct Guard {
    guard: BusGuard,
    /// The engine's port: the one a guest's `III_URL` names at its loopback.
    port: u16,
}

impl Buses {
    /// `engine_url` is the adapter's own (`III_URL`); `adapter` the plugin's name.
    pub(crate) fn new(
        config: &BusConfig,
        engine_url: Option<String>,
        adapter: &str,
    ) -> Result<Buses, String> {
        let guard = match engine_url {
            Some(url) if config.access => {
                let port = egress::policy::bus_address(&url)
                    .map(|a| a.port())
                    .ok_or_else(|| {
                        format!("`{ACCESS_KEY}` needs the engine's address, and III_URL {url:?} names none")
                    })?;
                let policy = Policy::new(
                    &config.call,
                    &config.register,
                    &adapter_names(adapter, "SANDBOX_LIBKRUN_PREFIX"),
                    &adapter_names(adapter, "III_WORKER_NAME"),
                )
                .map_err(|e| format!("configuration key `{}`: {e}", e.key))?;
                let guard = BusGuard::new(&url, policy)
                    .map_err(|e| format!("cannot start the bus guard: {e}"))?;
                Some(Guard { guard, port })
            }
            _ => None,
        };
        Ok(Buses {
            guard,
            access: config.access,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// For sandbox `id` booting with `network`: its line to the guard and the endpoint, when
    /// it gets one. Made before the sandbox exists, so the endpoint listens before the
    /// sandbox can connect.
    pub(crate) fn endpoint(
        &self,
        id: Uuid,
        network: bool,
    ) -> Result<Option<(BusForward, SandboxBus)>, SandboxError> {
        let Some(guard) = self.guard.as_ref().filter(|_| network) else {
            return Ok(None);
        };
        let bus = guard.guard.open(&id.to_string()).map_err(|e| {
            SandboxError::BootFailed(format!("cannot open the sandbox's bus guard endpoint: {e}"))
        })?;
        let line = BusForward {
            port: guard.port,
            to: bus.addr(),
        };
        Ok(Some((line, bus)))
    }

    /// Keeps a booted sandbox's endpoint until [`Buses::close`].
    pub(crate) fn keep(&self, id: Uuid, bus: SandboxBus) {
        self.endpoints().insert(id, bus);
    }

    /// Ends sandbox `id`'s endpoint and every connection through it (none: nothing to do).
    pub(crate) fn close(&self, id: Uuid) {
        let bus = self.endpoints().remove(&id);
        drop(bus);
    }

    /// Functions sandbox `id` serves on the bus; `None` when it has no endpoint.
    pub(crate) fn functions(&self, id: Uuid) -> Option<usize> {
        self.endpoints().get(&id).map(SandboxBus::functions)
    }

    /// A create that gives sandbox `id` an `III_URL` it cannot use: said once, with the key
    /// that would change it.
    pub(crate) fn note_create(&self, id: Uuid, network: bool, env: &[(String, String)]) {
        if !env.iter().any(|(k, _)| k == "III_URL") {
            return;
        }
        if !self.access {
            tracing::warn!(sandbox_id = %id, "this sandbox was given III_URL, but `{ACCESS_KEY}` is false: its connections to the engine are refused (set `{ACCESS_KEY}: true`, and `{CALL_KEY}` for the functions it calls, to let it on the bus through the guard)");
        } else if !network {
            tracing::warn!(sandbox_id = %id, "this sandbox was given III_URL but no network: it cannot reach the bus (create it with `network: true`)");
        } else if self.guard.is_none() {
            tracing::warn!(sandbox_id = %id, "this sandbox was given III_URL, but the adapter knows no engine address to relay to");
        }
    }

    fn endpoints(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, SandboxBus>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The names the adapter's functions or worker may go by: the plugin's, the product's, and
/// the one the environment variable `var` gives (the shell's `--prefix` and `--worker-name`
/// read theirs from it). A name given on the command line only is not seen here.
fn adapter_names(adapter: &str, var: &str) -> Vec<String> {
    let mut names = vec![adapter.to_string(), PRODUCT.to_string()];
    names.extend(std::env::var(var).ok().filter(|n| !n.trim().is_empty()));
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(value: Value) -> Result<BusConfig, ConfigError> {
        BusConfig::read(value.as_object().unwrap())
    }

    #[test]
    fn off_by_default_registering_anything_calling_nothing() {
        let config = read(json!({})).unwrap();
        assert_eq!(config, BusConfig::default());
        assert!(!config.access);
        assert!(config.call.is_empty());
        assert_eq!(config.register, ["*"]);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (value, key) in [
            (json!({"sandbox_bus_access": "yes"}), "sandbox_bus_access"),
            (json!({"sandbox_bus_call": "math::*"}), "sandbox_bus_call"),
            (json!({"sandbox_bus_call": ["ok", ""]}), "sandbox_bus_call"),
            (json!({"sandbox_bus_register": [1]}), "sandbox_bus_register"),
            (
                json!({"sandbox_bus_register": ["a b"]}),
                "sandbox_bus_register",
            ),
        ] {
            let error = read(value.clone()).unwrap_err().to_string();
            assert!(error.contains(&format!("`{key}`")), "{value}: {error}");
        }
        let config =
            read(json!({"sandbox_bus_access": true, "sandbox_bus_call": ["math::*"]})).unwrap();
        assert!(config.access);
        assert_eq!(config.call, ["math::*"]);
    }

    #[tokio::test]
    async fn a_sandbox_gets_an_endpoint_only_with_network_and_access() {
        let on = BusConfig {
            access: true,
            ..BusConfig::default()
        };
        let url = Some("ws://127.0.0.1:49134".to_string());
        let buses = Buses::new(&on, url.clone(), "sandbox-bwrap").unwrap();
        let id = Uuid::new_v4();
        assert!(buses.endpoint(id, false).unwrap().is_none());
        let (line, bus) = buses.endpoint(id, true).unwrap().unwrap();
        assert_eq!(line.port, 49134);
        assert_eq!(line.to, bus.addr());
        assert!(line.to.ip().is_loopback());
        buses.keep(id, bus);
        assert_eq!(buses.functions(id), Some(0));
        buses.close(id);
        assert_eq!(buses.functions(id), None);
        // The endpoint stopped listening.
        let mut closed = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(line.to).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(closed);
        let off = Buses::new(&BusConfig::default(), url, "sandbox-bwrap").unwrap();
        assert!(off.endpoint(id, true).unwrap().is_none());
        let no_engine = Buses::new(&on, None, "sandbox-bwrap").unwrap();
        assert!(no_engine.endpoint(id, true).unwrap().is_none());
    }
}
