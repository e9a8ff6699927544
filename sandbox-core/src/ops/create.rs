//! `create`: checks (caps, slots, image), then takes a sandbox from the warm pool when it can
//! serve the request, else boots one and waits for its agent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_proto::client::AgentClient;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::backend::{Backend, BootSpec, Bounds};
use crate::error::SandboxError;
use crate::images;
use crate::plugin::SandboxPlugin;
use crate::registry::{NewSandbox, Sandbox};
use crate::request::{env_pairs, parse, MAX_IDLE_TIMEOUT_SECS};
use crate::warm_pool;

/// How long a booted sandbox may take to greet us (a microVM under emulation is slow).
pub(crate) const AGENT_HELLO_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Deserialize)]
struct CreateRequest {
    image: String,
    cpus: Option<u32>,
    memory_mb: Option<u32>,
    name: Option<String>,
    #[serde(default)]
    network: Value,
    idle_timeout_secs: Option<u64>,
    env: Option<Value>,
    snapshot: Option<String>,
}

/// What a new sandbox should be; shared by `create`, `run` and `fork` (which repeats the
/// source's, kept as its recipe).
#[derive(Debug, Default, Clone)]
pub struct CreateOptions {
    pub image: String,
    pub cpus: Option<u32>,
    pub memory_mb: Option<u32>,
    pub name: Option<String>,
    pub network: bool,
    /// A create's `network` object, narrowing the configured egress policy.
    pub network_policy: Option<Value>,
    pub idle_timeout_secs: Option<u64>,
    pub env: Vec<(String, String)>,
    /// Snapshot layers to stack over the image, the top-most first, each pinned once for
    /// this sandbox (see `snapshots.rs`): the create releases the pins if it fails, the
    /// sandbox's stop once it ends.
    pub layers: Vec<String>,
    /// The manifest the layers were taken over (a create from a snapshot refuses another
    /// version of the image, S603); once booted, the sandbox's own image's.
    pub image_digest: Option<String>,
}

pub async fn create<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: CreateRequest = parse(payload)?;
    let (network, network_policy) = match request.network {
        Value::Null => (false, None),
        Value::Bool(on) => (on, None),
        policy @ Value::Object(_) => (true, Some(policy)),
        other => {
            return Err(SandboxError::InvalidRequest(format!(
                "`network` must be true, false or an object {{allow?, deny?}}, got {other}"
            )))
        }
    };
    let mut options = CreateOptions {
        network_policy,
        env: env_pairs(request.env)?,
        image: request.image,
        cpus: request.cpus,
        memory_mb: request.memory_mb,
        name: request.name,
        network,
        idle_timeout_secs: request.idle_timeout_secs,
        layers: Vec::new(),
        image_digest: None,
    };
    if let Some(name) = &request.snapshot {
        crate::snapshots::check_name(name)?;
        let snapshot = plugin.snapshots.take(name)?;
        options.layers = snapshot.layers;
        options.image_digest = Some(snapshot.image_digest);
        if snapshot.image != options.image {
            plugin.snapshots.unpin(&plugin.backend, &options.layers);
            return Err(SandboxError::SnapshotImageMismatch(format!(
                "snapshot `{name}` is of image `{}`, the create asks `{}`",
                snapshot.image, options.image
            )));
        }
    }
    let sandbox = create_sandbox(plugin, options).await?;
    Ok(json!({ "sandbox_id": sandbox.id.to_string(), "image": sandbox.image }))
}

pub async fn create_sandbox<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    options: CreateOptions,
) -> Result<Arc<Sandbox>, SandboxError> {
    let pins = LayerPins::new(plugin, &options.layers);
    let config = &plugin.config;
    let cpus = options.cpus.unwrap_or(config.default_cpus);
    let memory_mb = options.memory_mb.unwrap_or(config.default_memory_mb);
    check_request(&options, cpus, memory_mb)?;
    check_image_caps(plugin, &options.image, cpus, memory_mb)?;
    // The image verdict (S100) comes before the host's: an empty allowlist denies every
    // create, whatever the host can boot.
    plugin
        .images
        .check_allowed(&options.image)
        .map_err(images::error)?;
    check_host_can_boot(plugin)?;
    // A create the warm pool can serve boots nothing: it takes a sandbox booted earlier.
    if warm_pool::serves(config, &options) {
        if let Some(pooled) = warm_pool::take(plugin, &options.image) {
            return Ok(warm_pool::hand_out(plugin, pooled, options));
        }
    }
    let reservation = match plugin.registry.reserve() {
        Ok(reservation) => reservation,
        // Pooled sandboxes yield their slots to a create.
        Err(full) => warm_pool::evict_for_create(plugin, &options.image)
            .await
            .ok_or(full)?,
    };
    let sandbox = boot_reserved(plugin, options, reservation).await?;
    pins.keep();
    Ok(sandbox)
}

/// Releases a failed create's pins of its snapshot layers (see [`CreateOptions::layers`]).
pub(crate) struct LayerPins<'a, B: Backend> {
    plugin: &'a SandboxPlugin<B>,
    layers: Vec<String>,
}

impl<'a, B: Backend> LayerPins<'a, B> {
    pub(crate) fn new(plugin: &'a SandboxPlugin<B>, layers: &[String]) -> Self {
        Self {
            plugin,
            layers: layers.to_vec(),
        }
    }

    /// The sandbox holds the pins now.
    pub(crate) fn keep(mut self) {
        self.layers.clear();
    }
}

impl<B: Backend> Drop for LayerPins<'_, B> {
    fn drop(&mut self) {
        self.plugin
            .snapshots
            .unpin(&self.plugin.backend, &self.layers);
    }
}

/// Boots a sandbox of `options` into the slot `reservation` holds (checked already).
pub(crate) async fn boot_reserved<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    options: CreateOptions,
    reservation: crate::registry::Reservation<'_>,
) -> Result<Arc<Sandbox>, SandboxError> {
    let config = &plugin.config;
    let cpus = options.cpus.unwrap_or(config.default_cpus);
    let memory_mb = options.memory_mb.unwrap_or(config.default_memory_mb);
    let egress = match &options.network_policy {
        Some(policy) => config
            .egress
            .narrowed(policy)
            .map_err(SandboxError::InvalidRequest)?,
        None => config.egress.clone(),
    };
    let boot = Boot {
        image: &options.image,
        cpus,
        memory_mb,
        network: options.network,
        egress,
        layers: &options.layers,
        image_digest: options.image_digest.as_deref(),
    };
    let fresh = boot_sandbox(plugin, boot).await?;
    plugin.pool.count_boot_on_create();
    let Phases {
        image_ms,
        layer_ms,
        boot_ms,
        hello_ms,
        ..
    } = fresh.phases;
    plugin
        .buses
        .note_create(fresh.id, options.network, &options.env);
    let sandbox = reservation.insert(new_sandbox(plugin, fresh, options));
    // A sandbox whose agent goes away is stopped at once.
    crate::ops::stop::watch_agent(Arc::downgrade(plugin), &sandbox);
    plugin
        .events
        .emit(|| crate::events::Event::created(sandbox.id, &sandbox.image, cpus, memory_mb, false));
    plugin
        .events
        .emit(|| crate::events::Event::ready(sandbox.id));
    // The phase timings feed the benchmark's breakdown (`sandbox-bench` reads this line).
    tracing::info!(
        sandbox_id = %sandbox.id, image = %sandbox.image, cpus, memory_mb,
        image_ms, layer_ms, boot_ms, hello_ms, bounded = bounded(plugin), "sandbox created"
    );
    Ok(sandbox)
}

/// What decides how a sandbox boots (everything else of a create is host-side state).
pub(crate) struct Boot<'a> {
    pub image: &'a str,
    pub cpus: u32,
    pub memory_mb: u32,
    pub network: bool,
    pub egress: crate::network::Egress,
    /// Snapshot layers to stack (ids, the top-most first) and the image manifest they were
    /// taken over.
    pub layers: &'a [String],
    pub image_digest: Option<&'a str>,
}

/// A sandbox booted and greeted by its agent, not yet in the registry.
pub(crate) struct Fresh {
    pub id: Uuid,
    pub image: image_store::PreparedImage,
    pub agent: AgentClient,
    pub process: Box<dyn crate::backend::SandboxProcess>,
    pub layer: std::path::PathBuf,
    pub phases: Phases,
}

/// Pulls the image if needed, makes the layer, boots and waits for the agent's hello; on any
/// failure nothing is left behind (process killed, layer removed). Holds no slot itself: the
/// caller does.
pub(crate) async fn boot_sandbox<B: Backend>(
    plugin: &SandboxPlugin<B>,
    boot: Boot<'_>,
) -> Result<Fresh, SandboxError> {
    let mut phases = Phases::start();
    let image = plugin
        .images
        .ensure(boot.image)
        .await
        .map_err(images::error)?;
    phases.image_ms = phases.lap();
    if let Some(expected) = boot.image_digest.filter(|d| !d.is_empty()) {
        if image.manifest_digest != expected {
            return Err(SandboxError::SnapshotImageMismatch(format!(
                "image `{}` is now {}, not {expected} that the snapshot was taken over; \
                 take the snapshot again",
                boot.image, image.manifest_digest
            )));
        }
    }
    let id = Uuid::new_v4();
    // A sandbox with network reaches the bus only through its guard endpoint, if at all.
    let (bus_line, bus) = plugin.buses.endpoint(id, boot.network)?.unzip();
    let layer = plugin
        .state
        .create_layer(&id.to_string())
        .map_err(|e| SandboxError::BootFailed(format!("cannot create the sandbox's layer: {e}")))?;
    let spec = BootSpec {
        sandbox_id: id.to_string(),
        image_root: image.rootfs.clone(),
        layer_dir: layer.clone(),
        cpus: boot.cpus,
        memory_mb: boot.memory_mb,
        pids: plugin.config.max_pids_per_sandbox,
        disk_mb: plugin.config.default_disk_mb,
        network: boot.network,
        egress: crate::network::Egress {
            bus_guard: bus_line,
            ..boot.egress
        },
        agent_path: plugin.agent_path.clone(),
        mounts: Vec::new(),
        persistent_layer: false,
        snapshot_layers: boot
            .layers
            .iter()
            .map(|layer| plugin.snapshots.layer_path(layer))
            .collect(),
    };
    phases.layer_ms = phases.lap();
    let booted = match async {
        spec.check()?;
        plugin.backend.boot(&spec).await
    }
    .await
    {
        Ok(booted) => booted,
        Err(e) => {
            plugin.state.remove_layer(&plugin.backend, &layer);
            return Err(e);
        }
    };
    if let Some(pid) = booted.process.pid() {
        plugin.state.record_process(&layer, pid);
    }
    phases.boot_ms = phases.lap();
    let hello = tokio::time::timeout(
        AGENT_HELLO_TIMEOUT,
        AgentClient::connect(booted.reader, booted.writer),
    )
    .await;
    phases.hello_ms = phases.lap();
    let agent = match hello {
        Ok(Ok(agent)) => agent,
        failure => {
            booted.process.kill().await;
            // Read the logs before the layer (which holds them) goes.
            let logs = plugin.backend.boot_logs(&layer);
            plugin.state.remove_layer(&plugin.backend, &layer);
            let cause = match failure {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {} s", AGENT_HELLO_TIMEOUT.as_secs()),
            };
            return Err(SandboxError::BootFailed(format!(
                "the sandbox agent did not start: {cause}{logs}"
            )));
        }
    };
    if let Some(bus) = bus {
        plugin.buses.keep(id, bus);
    }
    Ok(Fresh {
        id,
        image,
        agent,
        process: booted.process,
        layer,
        phases,
    })
}

/// The registry entry of a booted sandbox for the create that asked `options`: the image's
/// environment then the create's, the image's working directory, the create's idle timeout.
pub(crate) fn new_sandbox<B: Backend>(
    plugin: &SandboxPlugin<B>,
    fresh: Fresh,
    options: CreateOptions,
) -> NewSandbox {
    let config = &plugin.config;
    let mut env: Vec<(String, String)> = fresh
        .image
        .config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let recipe = CreateOptions {
        image_digest: Some(fresh.image.manifest_digest.clone()),
        ..options.clone()
    };
    env.extend(options.env);
    NewSandbox {
        recipe,
        id: fresh.id,
        name: options.name,
        image: options.image,
        env,
        workdir: fresh
            .image
            .config
            .working_dir
            .clone()
            .filter(|w| !w.is_empty()),
        idle_timeout: Duration::from_secs(
            options
                .idle_timeout_secs
                .unwrap_or(config.default_idle_timeout_secs),
        ),
        exec_cap: config.max_concurrent_exec_per_sandbox,
        agent: fresh.agent,
        process: fresh.process,
        layer: fresh.layer,
    }
}

fn check_request(options: &CreateOptions, cpus: u32, memory_mb: u32) -> Result<(), SandboxError> {
    let invalid = |m: &str| Err(SandboxError::InvalidRequest(m.to_string()));
    if options.image.trim().is_empty() {
        return invalid("`image` is empty");
    }
    if cpus == 0 {
        return invalid("`cpus` must be at least 1");
    }
    if memory_mb < 16 {
        return invalid("`memory_mb` must be at least 16");
    }
    if let Some(secs) = options.idle_timeout_secs {
        if !(1..=MAX_IDLE_TIMEOUT_SECS).contains(&secs) {
            return Err(SandboxError::InvalidRequest(format!(
                "`idle_timeout_secs` must be 1 to {MAX_IDLE_TIMEOUT_SECS} (a week)"
            )));
        }
    }
    if options
        .name
        .as_deref()
        .is_some_and(|n| n.is_empty() || n.len() > 128)
    {
        return invalid("`name` must be 1 to 128 characters");
    }
    Ok(())
}

/// S400 above the adapter's ceilings (`max_cpus`, `max_memory_mb`, in force for every image)
/// or above the image's own `per_image_caps`. Worker VMs are checked here too.
pub(crate) fn check_image_caps<B: Backend>(
    plugin: &SandboxPlugin<B>,
    image: &str,
    cpus: u32,
    memory_mb: u32,
) -> Result<(), SandboxError> {
    let config = &plugin.config;
    if cpus > config.max_cpus {
        return Err(SandboxError::ResourceLimit(format!(
            "at most {} cpus per sandbox (`max_cpus`), asked {cpus}",
            config.max_cpus
        )));
    }
    if memory_mb > config.max_memory_mb {
        return Err(SandboxError::ResourceLimit(format!(
            "at most {} MiB of memory per sandbox (`max_memory_mb`), asked {memory_mb}",
            config.max_memory_mb
        )));
    }
    let Some(caps) = config.per_image_caps.get(image) else {
        return Ok(());
    };
    if let Some(max) = caps.max_cpus.filter(|max| cpus > *max) {
        return Err(SandboxError::ResourceLimit(format!(
            "image `{image}` allows at most {max} cpus, asked {cpus}"
        )));
    }
    if let Some(max) = caps.max_memory_mb.filter(|max| memory_mb > *max) {
        return Err(SandboxError::ResourceLimit(format!(
            "image `{image}` allows at most {max} MiB of memory, asked {memory_mb}"
        )));
    }
    Ok(())
}

/// Milliseconds spent in each phase of a boot, for the log line that closes a create.
pub(crate) struct Phases {
    lap_start: Instant,
    pub image_ms: f64,
    pub layer_ms: f64,
    pub boot_ms: f64,
    pub hello_ms: f64,
}

impl Phases {
    pub(crate) fn start() -> Self {
        Self {
            lap_start: Instant::now(),
            image_ms: 0.0,
            layer_ms: 0.0,
            boot_ms: 0.0,
            hello_ms: 0.0,
        }
    }

    /// Milliseconds since the previous lap (two decimals), and starts the next.
    fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let ms = now.duration_since(self.lap_start).as_secs_f64() * 1000.0;
        self.lap_start = now;
        (ms * 100.0).round() / 100.0
    }
}

/// S300 before any work when this host cannot boot a sandbox: the backend's own verdict, and
/// the agent binary every sandbox runs.
pub(crate) fn check_host_can_boot<B: Backend>(
    plugin: &SandboxPlugin<B>,
) -> Result<(), SandboxError> {
    plugin
        .backend
        .probe()
        .map_err(|unfit| SandboxError::BootFailed(unfit.to_string()))?;
    if !plugin.agent_path.is_file() {
        return Err(SandboxError::BootFailed(format!(
            "the sandbox agent binary is missing at {} (set SANDBOX_AGENT_PATH)",
            plugin.agent_path.display()
        )));
    }
    // Limits fail closed: a sandbox this host cannot bound boots only when the operator said
    // it may.
    if let Bounds::Missing(missing) = plugin.backend.bounds() {
        if !plugin.config.allow_unbounded_sandboxes {
            return Err(SandboxError::BootFailed(format!(
                "this host cannot bound a sandbox's cpus, memory and pids: {missing}; or set \
                 `allow_unbounded_sandboxes: true` to run sandboxes without those limits"
            )));
        }
    }
    Ok(())
}

/// Whether the sandboxes this plugin boots hold their cpus, memory and pids limits (false
/// only where `allow_unbounded_sandboxes` let them boot without): for each create's log line.
pub(crate) fn bounded<B: Backend>(plugin: &SandboxPlugin<B>) -> bool {
    matches!(plugin.backend.bounds(), Bounds::Held(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_timeouts_are_one_second_to_a_week() {
        let with = |secs: u64| CreateOptions {
            image: "python".into(),
            idle_timeout_secs: Some(secs),
            ..CreateOptions::default()
        };
        for good in [1, 300, MAX_IDLE_TIMEOUT_SECS] {
            assert!(check_request(&with(good), 1, 512).is_ok(), "{good}");
        }
        for bad in [0, MAX_IDLE_TIMEOUT_SECS + 1, 1 << 63, u64::MAX] {
            let error = check_request(&with(bad), 1, 512).unwrap_err();
            assert_eq!(error.code(), "S001", "{bad}");
        }
    }
}
