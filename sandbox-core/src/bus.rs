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
//!
//! Worker VMs are Compose workers and always on the bus, but never straight on the engine:
//! each gets an endpoint of the same guard under the worker policy ([`Policy::worker_vm`]:
//! the ids a worker serves and calls stay open, every message is still decoded, judged and
//! written by the guard, HTTP-invoked functions only with `worker_bus_http_functions`). The
//! guard's thread starts with the first endpoint anyone needs, not with the adapter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

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
pub const WORKER_HTTP_KEY: &str = "worker_bus_http_functions";

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
    /// Whether a worker VM may register HTTP-invoked functions (never with `auth`).
    pub worker_http_functions: bool,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            access: false,
            call: Vec::new(),
            register: vec!["*".into()],
            worker_http_functions: false,
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
        for (key, flag) in [
            (ACCESS_KEY, &mut config.access),
            (WORKER_HTTP_KEY, &mut config.worker_http_functions),
        ] {
            if let Some(value) = object.get(key) {
                *flag = value
                    .as_bool()
                    .ok_or_else(|| wrong(key, format!("expected true or false, got {value}")))?;
            }
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

/// The adapter's way for sandboxes and worker VMs to the bus, and the endpoints open now.
pub(crate) struct Buses {
    /// `None`: the adapter knows no engine to relay to.
    engine: Option<Engine>,
    /// The sandboxes' policy; `None` while `sandbox_bus_access` is off.
    sandboxes: Option<Arc<Policy>>,
    /// The worker VMs' policy, before a worker's own namespace is added.
    workers: Policy,
    /// Started with the first endpoint (most adapters never open one).
    guard: OnceLock<BusGuard>,
    access: bool,
    open: Mutex<HashMap<Uuid, SandboxBus>>,
}

struct Engine {
    url: String,
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
        let engine = match engine_url {
            Some(url) => match egress::policy::bus_address(&url) {
                Some(address) => Some(Engine {
                    port: address.port(),
                    url,
                }),
                None if config.access => {
                    return Err(format!(
                        "`{ACCESS_KEY}` needs the engine's address, and III_URL {url:?} names none"
                    ))
                }
                None => None,
            },
            None => None,
        };
        let prefixes = adapter_names(adapter, "SANDBOX_LIBKRUN_PREFIX");
        let workers = adapter_names(adapter, "III_WORKER_NAME");
        let sandboxes = if config.access {
            let policy = Policy::new(&config.call, &config.register, &prefixes, &workers)
                .map_err(|e| format!("configuration key `{}`: {e}", e.key))?;
            Some(Arc::new(policy))
        } else {
            None
        };
        Ok(Buses {
            engine,
            sandboxes,
            workers: Policy::worker_vm(&prefixes, &workers, config.worker_http_functions),
            guard: OnceLock::new(),
            access: config.access,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The guard, started on first use.
    fn guard(&self, engine: &Engine) -> Result<&BusGuard, SandboxError> {
        if let Some(guard) = self.guard.get() {
            return Ok(guard);
        }
        let policy = self
            .sandboxes
            .as_deref()
            .cloned()
            .unwrap_or_else(|| self.workers.clone());
        let guard = BusGuard::new(&engine.url, policy)
            .map_err(|e| SandboxError::BootFailed(format!("cannot start the bus guard: {e}")))?;
        // Two first users at once: one guard wins, the other's is dropped unused.
        Ok(self.guard.get_or_init(|| guard))
    }

    /// For sandbox `id` booting with `network`: its line to the guard and the endpoint, when
    /// it gets one. Made before the sandbox exists, so the endpoint listens before the
    /// sandbox can connect.
    pub(crate) fn endpoint(
        &self,
        id: Uuid,
        network: bool,
    ) -> Result<Option<(BusForward, SandboxBus)>, SandboxError> {
        let (Some(engine), Some(policy), true) = (&self.engine, &self.sandboxes, network) else {
            return Ok(None);
        };
        let bus = self
            .guard(engine)?
            .open_with(&id.to_string(), Arc::clone(policy))
            .map_err(|e| {
                SandboxError::BootFailed(format!(
                    "cannot open the sandbox's bus guard endpoint: {e}"
                ))
            })?;
        let line = BusForward {
            port: engine.port,
            to: bus.addr(),
        };
        Ok(Some((line, bus)))
    }

    /// For worker VM `vm_id` (whose program names `namespace`, if any): its line to the
    /// guard, the endpoint (closed when dropped), and the `III_URL` its program is given, the
    /// engine's port on its own loopback, which is where the line starts.
    pub(crate) fn worker_endpoint(
        &self,
        vm_id: &str,
        namespace: Option<&str>,
    ) -> Result<(BusForward, SandboxBus, String), SandboxError> {
        let engine = self.engine.as_ref().ok_or_else(|| {
            SandboxError::BootFailed(
                "worker VMs need the engine's address (III_URL) for their way to the bus".into(),
            )
        })?;
        let policy = match namespace {
            Some(namespace) => self.workers.clone().with_namespace(namespace),
            None => self.workers.clone(),
        };
        let bus = self
            .guard(engine)?
            .open_with(&format!("worker-{vm_id}"), Arc::new(policy))
            .map_err(|e| {
                SandboxError::BootFailed(format!(
                    "cannot open the worker VM's bus guard endpoint: {e}"
                ))
            })?;
        let line = BusForward {
            port: engine.port,
            to: bus.addr(),
        };
        Ok((line, bus, local_url(&engine.url, engine.port)))
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
        } else if self.engine.is_none() {
            tracing::warn!(sandbox_id = %id, "this sandbox was given III_URL, but the adapter knows no engine address to relay to");
        }
    }

    fn endpoints(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, SandboxBus>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The engine's URL as a guest behind the guard uses it: the engine's port on the guest's own
/// loopback, where its line to the guard starts. An engine on the host's loopback keeps its
/// URL as the adapter has it (the same text the guest would have been given before).
fn local_url(engine_url: &str, port: u16) -> String {
    let loopback = egress::policy::bus_address(engine_url).is_some_and(|a| a.ip().is_loopback());
    if loopback && engine_url.starts_with("ws://") {
        engine_url.to_string()
    } else {
        format!("ws://127.0.0.1:{port}")
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

    #[tokio::test]
    async fn every_worker_vm_gets_an_endpoint_whatever_sandbox_access_says() {
        let url = Some("ws://127.0.0.1:49134".to_string());
        let buses = Buses::new(&BusConfig::default(), url, "sandbox-bwrap").unwrap();
        let (line, bus, guest_url) = buses.worker_endpoint("w1", Some("team")).unwrap();
        assert_eq!(line.port, 49134);
        assert_eq!(line.to, bus.addr());
        assert!(line.to.ip().is_loopback());
        assert_eq!(guest_url, "ws://127.0.0.1:49134");
        // Worker endpoints are not sandboxes': no sandbox lists them.
        assert!(buses.endpoints().is_empty());
        drop(bus);
        let no_engine = Buses::new(&BusConfig::default(), None, "sandbox-bwrap").unwrap();
        assert!(no_engine.worker_endpoint("w1", None).is_err());
    }

    #[test]
    fn a_guest_behind_the_guard_names_the_engines_port_on_its_own_loopback() {
        assert_eq!(
            local_url("ws://127.0.0.1:7000", 7000),
            "ws://127.0.0.1:7000"
        );
        assert_eq!(
            local_url("ws://192.0.2.9:7000/", 7000),
            "ws://127.0.0.1:7000"
        );
        assert_eq!(
            local_url("wss://127.0.0.1:7000", 7000),
            "ws://127.0.0.1:7000"
        );
    }

    #[test]
    fn the_worker_http_key_is_a_flag() {
        assert!(
            read(json!({"worker_bus_http_functions": true}))
                .unwrap()
                .worker_http_functions
        );
        let error = read(json!({"worker_bus_http_functions": 1})).unwrap_err();
        assert!(
            error.to_string().contains("worker_bus_http_functions"),
            "{error}"
        );
    }
}
