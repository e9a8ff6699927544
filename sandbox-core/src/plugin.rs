//! The plugin every backend exports: the shared state of one adapter run, and the routing of
//! each call by id suffix to its operation. Every failure leaves here as an S-code body.

use std::path::PathBuf;
use std::sync::Arc;

use image_store::ImageStore;
use plugin_api::{ErrorBody, Host, Plugin, PluginFuture};
use serde_json::Value;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::SandboxError;
use crate::events::{Event, StopReason};
use crate::layer::StateDir;
use crate::registry::Registry;
use crate::{images, ops, reaper, warm_pool};

/// Environment variable naming the static agent binary; default `sandbox-agent` next to the
/// running executable.
pub const AGENT_PATH_ENV: &str = "SANDBOX_AGENT_PATH";

/// Shared state of one running plugin instance.
pub struct SandboxPlugin<B: Backend> {
    pub(crate) adapter: &'static str,
    pub(crate) adapter_version: &'static str,
    pub(crate) config: Config,
    pub(crate) backend: B,
    pub(crate) images: ImageStore,
    pub(crate) registry: Registry,
    pub(crate) state: StateDir,
    pub(crate) agent_path: PathBuf,
    /// Leftovers of an earlier run cleaned at start-up (`list.reconciled`).
    pub(crate) reconciled: usize,
    /// The worker VMs (`worker::*`), outside the sandbox registry.
    pub(crate) workers: ops::worker::Workers,
    /// The shell's services: engine channels for large `fs::read` / `fs::write` content.
    pub(crate) host: Host,
    /// Sandboxes booted ahead of the creates that will take them (`warm_pool`).
    pub(crate) pool: warm_pool::WarmPool,
    /// Sandboxes' endpoints of the bus guard (`sandbox_bus_access`).
    pub(crate) buses: crate::bus::Buses,
    /// Snapshots of sandboxes' files (`snapshot::*`, `fork`).
    pub(crate) snapshots: crate::snapshots::Snapshots,
    /// What a family `create` announces: the optional leaves of the family table the shell
    /// registers (see `family`).
    pub(crate) family_capabilities: Vec<&'static str>,
    /// Lifecycle events and their subscribers (`events`).
    pub(crate) events: crate::events::Events,
}

/// Closes the state directory's `sandboxes/`, `workers/` and `snapshots/` to every other host
/// user: 0700,
/// or 0710 with `group` (the backend's, see [`Backend::state_group`]) allowed through. What a
/// guest leaves in its layer or `/state` (a setuid copy of a shell, a device node) then lies
/// beyond their reach, whatever the guest did to the modes inside. Run at each start, so a
/// state directory made by an older version is closed too.
fn close_to_others(state_dir: &std::path::Path, group: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for dir in ["sandboxes", "workers", "snapshots"] {
        let dir = state_dir.join(dir);
        if let Some(gid) = group {
            std::os::unix::fs::chown(&dir, None, Some(gid))?;
        }
        let mode = if group.is_some() { 0o710 } else { 0o700 };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

impl<B: Backend> SandboxPlugin<B> {
    /// Validates `config`, cleans what an earlier run left, and starts the idle reaper. Must
    /// run inside the plugin's tokio runtime. The error is the one-line reason the shell prints
    /// before exiting 2.
    pub fn start(
        adapter: &'static str,
        adapter_version: &'static str,
        config: &Value,
        backend: B,
        host: Host,
    ) -> Result<Arc<Self>, String> {
        let config = Config::from_json(config).map_err(|e| e.to_string())?;
        let images =
            ImageStore::new(images::settings(&config)).map_err(|e| format!("image store: {e}"))?;
        warm_pool::check(&config, &images)?;
        let state_dir = config
            .state_dir
            .clone()
            .unwrap_or_else(images::default_state_dir);
        let state = StateDir::open(&state_dir)
            .map_err(|e| format!("cannot use state directory {}: {e}", state_dir.display()))?;
        let reconciled = state.reconcile(&backend);
        let workers = ops::worker::Workers::open(&state_dir).map_err(|e| {
            format!(
                "cannot use the worker VMs' directory under {}: {e}",
                state_dir.display()
            )
        })?;
        let snapshots =
            crate::snapshots::Snapshots::open(&state_dir, config.max_snapshot_disk_mb, &backend)
                .map_err(|e| {
                    format!(
                        "cannot use the snapshots' directory under {}: {e}",
                        state_dir.display()
                    )
                })?;
        close_to_others(&state_dir, backend.state_group())
            .map_err(|e| format!("cannot close {} to other users: {e}", state_dir.display()))?;
        let buses = crate::bus::Buses::new(&config.bus, host.engine_url(), adapter)?;
        let events = crate::events::Events::new(Arc::new(host.clone()));
        let plugin = Arc::new(Self {
            adapter,
            adapter_version,
            registry: Registry::new(config.max_concurrent_sandboxes),
            pool: warm_pool::WarmPool::new(&config),
            config,
            backend,
            images,
            state,
            agent_path: agent_path(),
            reconciled,
            workers,
            host,
            buses,
            snapshots,
            events,
            family_capabilities: crate::family::capabilities(
                &crate::functions::manifest(adapter, adapter_version).family,
            ),
        });
        reaper::spawn(Arc::downgrade(&plugin));
        warm_pool::spawn(&plugin);
        ops::worker::restart_all(&plugin);
        Ok(plugin)
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    async fn dispatch(
        self: Arc<Self>,
        function: String,
        payload: Value,
    ) -> Result<Value, SandboxError> {
        match function.strip_prefix("family::") {
            Some(leaf) => crate::family::call(&self, leaf, payload).await,
            None => self.ours(function, payload).await,
        }
    }

    /// Our own function `function` (an id suffix of the function table).
    pub(crate) async fn ours(
        self: Arc<Self>,
        function: String,
        payload: Value,
    ) -> Result<Value, SandboxError> {
        match function.as_str() {
            "adapter::info" => Ok(ops::info::info(&self)),
            "catalog::list" => Ok(ops::catalog::list(&self)),
            "create" => ops::create::create(&self, payload).await,
            "exec" => ops::exec::exec(&self, payload).await,
            "exec::cancel" => ops::cancel::cancel(&self, payload).await,
            "stop" => ops::stop::stop(&self, payload).await,
            "list" => Ok(ops::list::list(&self)),
            "metrics" => ops::metrics::metrics(&self, payload),
            "pause" => ops::pause::pause(&self, payload).await,
            "resume" => ops::pause::resume(&self, payload).await,
            "run" => ops::run::run(&self, payload).await,
            "snapshot::create" => ops::snapshot::create(&self, payload).await,
            "snapshot::list" => Ok(ops::snapshot::list(&self)),
            "snapshot::delete" => ops::snapshot::delete(&self, payload),
            "fork" => ops::snapshot::fork(&self, payload).await,
            // From the shell's event trigger types only: no bus function leads here.
            "events::subscribe" => self.events.subscribe(payload),
            "events::unsubscribe" => self.events.unsubscribe(payload),
            f if f.starts_with("process::") => {
                ops::process::dispatch(&self, &f[9..], payload).await
            }
            f if f.starts_with("port::") => ops::expose::dispatch(&self, &f[6..], payload).await,
            f if f.starts_with("fs::") => ops::fs::dispatch(&self, &f[4..], payload).await,
            f if f.starts_with("worker::") => ops::worker::dispatch(&self, &f[8..], payload).await,
            other => Err(SandboxError::InvalidRequest(format!(
                "unknown function `{other}`"
            ))),
        }
    }

    /// Stops every sandbox and worker VM; the adapter is going away.
    fn stop_all(self: &Arc<Self>) {
        let sandboxes = self.registry.live();
        let plugin = Arc::clone(self);
        let handle = tokio::runtime::Handle::current();
        // Called from the shell's thread inside our runtime's context: block here until every
        // sandbox is torn down, so nothing outlives the adapter.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                handle.block_on(async move {
                    let stops = sandboxes
                        .into_iter()
                        .filter_map(|s| plugin.registry.take(s.id, true).ok().flatten())
                        .inspect(|s| {
                            plugin
                                .events
                                .emit(|| Event::stopped(s.id, StopReason::AdapterShutdown))
                        });
                    let sandboxes = stops.map(|s| ops::stop::teardown(&plugin, s));
                    let workers = ops::worker::shutdown(&plugin);
                    let pool = warm_pool::shutdown(&plugin);
                    futures::future::join3(futures::future::join_all(sandboxes), workers, pool)
                        .await;
                })
            });
        });
    }
}

impl<B: Backend> Plugin for SandboxPlugin<B> {
    fn invoke(self: Arc<Self>, function: String, payload: Value) -> PluginFuture {
        Box::pin(async move {
            self.dispatch(function, payload)
                .await
                .map_err(ErrorBody::from)
        })
    }

    fn shutdown(self: Arc<Self>) {
        self.stop_all();
    }
}

fn agent_path() -> PathBuf {
    crate::backend::helper_program(AGENT_PATH_ENV, "sandbox-agent")
}
