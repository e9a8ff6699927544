//! Idle reaping: a sandbox with no call in flight for its idle timeout is stopped and its
//! state removed. Never while an exec or fs call is in flight (see `Registry::take_idle`).
//! A sandbox paused for `max_paused_secs` is stopped too.

use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::events::{Event, StopReason};
use crate::ops::stop::teardown;
use crate::plugin::SandboxPlugin;

const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// Runs until the plugin is dropped.
pub fn spawn<B: Backend>(plugin: Weak<SandboxPlugin<B>>) {
    tokio::spawn(async move {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        loop {
            sweep.tick().await;
            let Some(plugin) = plugin.upgrade() else {
                return;
            };
            crate::ops::process::keep_alive(&plugin).await;
            for sandbox in plugin.registry.take_idle(Instant::now()) {
                tracing::info!(sandbox_id = %sandbox.id, "idle timeout: stopping");
                plugin
                    .events
                    .emit(|| Event::stopped(sandbox.id, StopReason::Idle));
                let plugin = std::sync::Arc::clone(&plugin);
                tokio::spawn(async move { teardown(&plugin, sandbox).await });
            }
            let max_paused = Duration::from_secs(plugin.config.max_paused_secs);
            for sandbox in plugin.registry.take_paused_past(Instant::now(), max_paused) {
                tracing::info!(sandbox_id = %sandbox.id, "paused past max_paused_secs: stopping");
                plugin
                    .events
                    .emit(|| Event::stopped(sandbox.id, StopReason::MaxPaused));
                let plugin = std::sync::Arc::clone(&plugin);
                tokio::spawn(async move { teardown(&plugin, sandbox).await });
            }
        }
    });
}
