//! `stop`: idempotent; `wait` returns only once the sandbox and its layer are gone. And the
//! other way a sandbox stops: its agent goes away (killed, exited, or its link broke), which
//! stops it at once, with the cause kept for later calls.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::events::{Event, StopReason};
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{parse, sandbox_id};
use agent_proto::client::AgentClient;

/// How long the agent gets to end its programs before the sandbox is killed.
const AGENT_GOODBYE: Duration = Duration::from_secs(2);

#[derive(Debug, Deserialize)]
struct StopRequest {
    sandbox_id: String,
    #[serde(default)]
    wait: bool,
}

pub async fn stop<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: StopRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    if let Some(sandbox) = plugin.registry.take(id, true)? {
        plugin
            .events
            .emit(|| Event::stopped(id, StopReason::Caller));
        if request.wait {
            teardown(plugin, sandbox).await;
        } else {
            let plugin = Arc::clone(plugin);
            tokio::spawn(async move { teardown(&plugin, sandbox).await });
        }
    }
    Ok(json!({ "sandbox_id": id.to_string(), "stopped": true }))
}

/// Ends a sandbox taken out of the registry: its programs, its process, its layer.
pub async fn teardown<B: Backend>(plugin: &SandboxPlugin<B>, sandbox: Arc<Sandbox>) {
    // Off the bus first: its functions leave the engine before its programs end. Its
    // exposed ports close with it, so their URLs refuse connections at once.
    plugin.buses.close(sandbox.id);
    sandbox.exposures.shut();
    let started = Instant::now();
    // A paused sandbox's agent cannot say goodbye: thaw it first (nothing freezes it again,
    // it is marked stopped). A thaw that fails leaves it to the kill, which thaws as well.
    if let Err(e) = sandbox.resume().await {
        tracing::warn!(sandbox_id = %sandbox.id, error = %e, "cannot thaw the paused sandbox before stopping it");
    }
    let _ = tokio::time::timeout(AGENT_GOODBYE, sandbox.agent.shutdown()).await;
    let goodbye = started.elapsed();
    sandbox.process.kill().await;
    let killed = started.elapsed();
    plugin.state.remove_layer(&plugin.backend, &sandbox.layer);
    plugin
        .snapshots
        .unpin(&plugin.backend, &sandbox.recipe.layers);
    let ms = |d: Duration| (d.as_secs_f64() * 100_000.0).round() / 100.0;
    // The phase timings feed the benchmark's breakdown (`sandbox-bench` reads this line).
    tracing::info!(
        sandbox_id = %sandbox.id,
        goodbye_ms = ms(goodbye),
        kill_ms = ms(killed - goodbye),
        layer_ms = ms(started.elapsed() - killed),
        "sandbox stopped"
    );
}

/// How long the watcher of a dead agent waits for the sandbox process's exit status.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// Watches a live sandbox's agent link: once it is gone (the agent killed or exited, or a
/// frame the host cannot decode), the sandbox leaves the live set with the cause, and its
/// process, cgroup and layer are released. Does nothing when the sandbox was stopped first
/// (a `stop` also ends the link).
pub(crate) fn watch_agent<B: Backend>(plugin: Weak<SandboxPlugin<B>>, sandbox: &Arc<Sandbox>) {
    let agent: AgentClient = sandbox.agent.clone();
    let (id, pid, layer) = (sandbox.id, sandbox.process.pid(), sandbox.layer.clone());
    tokio::spawn(async move {
        let link = agent.closed().await;
        drop(agent);
        let Some(plugin) = plugin.upgrade() else {
            return;
        };
        if !plugin.registry.is_live(id) {
            return; // stopped first: the stop ended the link
        }
        let exit = match pid {
            Some(pid) => exit_status(pid, EXIT_WAIT).await,
            None => None,
        };
        let cause = death_cause(&link, exit) + &plugin.backend.death_note(&layer);
        let Some(sandbox) = plugin.registry.take_dead(id, &cause) else {
            return;
        };
        tracing::warn!(sandbox_id = %id, cause, "the sandbox's agent is gone: stopping it");
        plugin.events.emit(|| Event::agent_lost(id, &cause));
        teardown(&plugin, sandbox).await;
    });
}

/// The wait status of our child `pid` once it has exited, read from its zombie's
/// `/proc/<pid>/stat` (field 52) without reaping it; `None` if it still runs after `wait`, or
/// where there is no `/proc`.
async fn exit_status(pid: u32, wait: Duration) -> Option<i32> {
    let deadline = Instant::now() + wait;
    loop {
        let stat = crate::proc_counters::ProcStat::of(pid)?;
        if stat.state == 'Z' {
            return stat.exit_code;
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Why a sandbox's agent is gone, for `list` and the S004 of later calls: the sandbox
/// process's exit status (bwrap and the VM runner exit with the agent's code, 128 + N when a
/// signal N killed it) and what the link saw.
fn death_cause(link: &str, exit: Option<i32>) -> String {
    let process = match exit {
        Some(raw) if raw & 0x7f == 0 => match (raw >> 8) & 0xff {
            code @ 129..=192 => killed_by(code - 128, "the agent was"),
            code => format!("the agent exited with code {code}"),
        },
        Some(raw) => killed_by(raw & 0x7f, "the sandbox process was"),
        None => "the agent link is gone while the sandbox ran".to_string(),
    };
    format!("its agent is gone: {process}; {link}")
}

fn killed_by(signal: i32, who: &str) -> String {
    let name = match signal {
        9 => " (SIGKILL: killed from outside the sandbox, or by the OOM killer)",
        15 => " (SIGTERM)",
        6 => " (SIGABRT)",
        11 => " (SIGSEGV)",
        _ => "",
    };
    format!("{who} killed by signal {signal}{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_name_the_signal_or_the_exit_code() {
        let killed = death_cause("agent closed the stream", Some(137 << 8));
        assert!(killed.contains("killed by signal 9 (SIGKILL"), "{killed}");
        assert!(killed.ends_with("agent closed the stream"), "{killed}");
        let exited = death_cause("agent closed the stream", Some(1 << 8));
        assert!(exited.contains("exited with code 1"), "{exited}");
        assert!(death_cause("x", Some(9)).contains("sandbox process was killed by signal 9"));
        let undecodable = death_cause("the agent sent a frame the host cannot decode", None);
        assert!(undecodable.contains("cannot decode"), "{undecodable}");
    }

    #[tokio::test]
    async fn a_zombie_childs_exit_status_is_read_without_reaping_it() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        let status = exit_status(child.id(), Duration::from_secs(10)).await;
        assert_eq!(status, Some(7 << 8));
        assert_eq!(child.wait().unwrap().code(), Some(7), "still ours to reap");
        let running = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(
            exit_status(running.id(), Duration::from_millis(50)).await,
            None
        );
        let mut running = running;
        let _ = running.kill();
        let _ = running.wait();
    }
}
