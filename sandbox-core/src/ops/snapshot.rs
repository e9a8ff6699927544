//! `snapshot::create`, `snapshot::list`, `snapshot::delete` and `fork`: a running sandbox's
//! files kept as a template (see `snapshots.rs` for the store) and sandboxes started from
//! them. Files only: no process or memory is captured (libkrun has no snapshot on Linux).
//!
//! A consistent point: the sandbox is frozen (`pause`) while its writable layer is copied and
//! thawed after, unless it was paused already. Where the backend cannot freeze it (an ordinary
//! user's bwrap on cgroup v1), the copy is taken while it runs, and the log says so: a file
//! written during the copy may then be caught half-written.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::ops::create::{boot_reserved, check_host_can_boot, CreateOptions};
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{parse, sandbox_id};
use crate::snapshots::{check_name, Snapshot, MAX_DEPTH};

#[derive(Debug, Deserialize)]
struct CreateRequest {
    sandbox_id: String,
    name: String,
}

#[derive(Debug, Deserialize)]
struct NameRequest {
    name: String,
}

#[derive(Debug, Deserialize)]
struct ForkRequest {
    sandbox_id: String,
    count: u64,
}

pub async fn create<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: CreateRequest = parse(payload)?;
    check_name(&request.name)?;
    let id = sandbox_id(&request.sandbox_id)?;
    // Before any copying: the name is checked again when it is recorded.
    if plugin.snapshots.exists(&request.name) {
        return Err(SandboxError::SnapshotExists(request.name));
    }
    let sandbox = plugin.registry.live_sandbox(id)?;
    let layer = capture(plugin, &sandbox, 0).await?;
    let layers: Vec<String> = std::iter::once(layer.clone())
        .chain(sandbox.recipe.layers.iter().cloned())
        .collect();
    let snapshot = Snapshot {
        name: request.name,
        image: sandbox.image.clone(),
        image_digest: sandbox.recipe.image_digest.clone().unwrap_or_default(),
        size_bytes: plugin.snapshots.size_of(&layers),
        layers,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    if let Err(e) = plugin.snapshots.add(snapshot.clone()) {
        // Named by nothing: the new layer goes.
        plugin.snapshots.unpin(&plugin.backend, &[layer]);
        return Err(e);
    }
    tracing::info!(sandbox_id = %sandbox.id, snapshot = %snapshot.name, size_bytes = snapshot.size_bytes, "snapshot taken");
    plugin.events.emit(|| {
        crate::events::Event::snapshot_created(sandbox.id, &snapshot.name, snapshot.size_bytes)
    });
    Ok(shown(&snapshot))
}

pub fn list<B: Backend>(plugin: &SandboxPlugin<B>) -> Value {
    let snapshots: Vec<Value> = plugin.snapshots.list().iter().map(shown).collect();
    json!({
        "snapshots": snapshots,
        "used_bytes": plugin.snapshots.used_bytes(),
        "budget_bytes": plugin.snapshots.budget_bytes(),
    })
}

pub fn delete<B: Backend>(
    plugin: &SandboxPlugin<B>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: NameRequest = parse(payload)?;
    check_name(&request.name)?;
    let snapshot = plugin.snapshots.delete(&plugin.backend, &request.name)?;
    tracing::info!(snapshot = %snapshot.name, "snapshot deleted");
    Ok(json!({"deleted": true, "name": snapshot.name}))
}

/// `fork {sandbox_id, count}`: `count` new sandboxes with the source's files at this moment
/// and its create options otherwise, each its own. All or nothing: the slots are taken before
/// anything is copied (S400 past `max_concurrent_sandboxes`), and if one fails to boot, those
/// that did are stopped.
pub async fn fork<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: ForkRequest = parse(payload)?;
    let cap = plugin.config.max_concurrent_sandboxes;
    if request.count == 0 {
        return Err(SandboxError::InvalidRequest(
            "`count` must be at least 1".into(),
        ));
    }
    let count = usize::try_from(request.count).unwrap_or(usize::MAX);
    let source = plugin
        .registry
        .live_sandbox(sandbox_id(&request.sandbox_id)?)?;
    check_host_can_boot(plugin)?;
    let mut reservations = Vec::with_capacity(count.min(cap));
    for _ in 0..count {
        reservations.push(plugin.registry.reserve().map_err(|_| {
            SandboxError::ResourceLimit(format!(
                "a fork of {count} needs {count} free slots of `max_concurrent_sandboxes` ({cap}); \
                 none was started"
            ))
        })?);
    }
    let layer = capture(plugin, &source, count).await?;
    plugin.snapshots.pin_times(&source.recipe.layers, count);
    let options = CreateOptions {
        layers: std::iter::once(layer)
            .chain(source.recipe.layers.iter().cloned())
            .collect(),
        name: None,
        ..source.recipe.clone()
    };
    let boots = reservations.into_iter().map(|reservation| {
        let options = options.clone();
        async move {
            let pins = crate::ops::create::LayerPins::new(plugin, &options.layers);
            let booted = boot_reserved(plugin, options, reservation).await;
            if booted.is_ok() {
                pins.keep();
            }
            booted
        }
    });
    let booted = futures::future::join_all(boots).await;
    let failure = booted
        .iter()
        .find_map(|b| b.as_ref().err())
        .map(|e| e.to_string());
    let sandboxes: Vec<Arc<Sandbox>> = booted.into_iter().filter_map(Result::ok).collect();
    if let Some(failure) = failure {
        for sandbox in sandboxes {
            if let Ok(Some(sandbox)) = plugin.registry.take(sandbox.id, true) {
                plugin.events.emit(|| {
                    crate::events::Event::stopped(sandbox.id, crate::events::StopReason::Caller)
                });
                crate::ops::stop::teardown(plugin, sandbox).await;
            }
        }
        return Err(SandboxError::BootFailed(format!(
            "a fork of {count}: one did not start ({failure}); none was kept"
        )));
    }
    let ids: Vec<String> = sandboxes.iter().map(|s| s.id.to_string()).collect();
    tracing::info!(sandbox_id = %source.id, count, "forked");
    plugin
        .events
        .emit(|| crate::events::Event::forked(source.id, &ids));
    Ok(json!({"sandbox_ids": ids}))
}

/// Copies `sandbox`'s writable layer into a new complete layer, pinned `pins` times, frozen
/// while it is copied where the backend can (see the module).
async fn capture<B: Backend>(
    plugin: &SandboxPlugin<B>,
    sandbox: &Sandbox,
    pins: usize,
) -> Result<String, SandboxError> {
    if sandbox.recipe.layers.len() >= MAX_DEPTH {
        return Err(SandboxError::ResourceLimit(format!(
            "this sandbox stacks {MAX_DEPTH} snapshot layers already, the most a snapshot may \
             have; start one from the image to snapshot again"
        )));
    }
    let pending = plugin.snapshots.begin(&plugin.backend).await?;
    let froze = if sandbox.is_paused() {
        false
    } else {
        match sandbox.pause().await {
            Ok(()) => true,
            Err(SandboxError::BackendUnsupported(why)) => {
                tracing::warn!(sandbox_id = %sandbox.id, why, "cannot freeze the sandbox: its files are copied while it runs");
                false
            }
            Err(e) => return Err(e),
        }
    };
    let copied = plugin
        .backend
        .capture_layer(
            sandbox.process.as_ref(),
            &sandbox.layer,
            &pending.path,
            pending.room,
        )
        .await;
    if froze {
        if let Err(e) = sandbox.resume().await {
            tracing::warn!(sandbox_id = %sandbox.id, error = %e, "cannot thaw the sandbox after copying its files");
        }
    }
    let bytes = copied.map_err(|e| match e {
        SandboxError::BackendUnsupported(why) => {
            SandboxError::BackendUnsupported(format!("snapshots: {why}"))
        }
        other => other,
    })?;
    plugin.snapshots.complete(pending, bytes, pins)
}

fn shown(snapshot: &Snapshot) -> Value {
    json!({
        "name": snapshot.name,
        "image": snapshot.image,
        "size_bytes": snapshot.size_bytes,
        "created_at": snapshot.created_at,
    })
}
