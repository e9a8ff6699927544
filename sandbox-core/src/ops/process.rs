//! Background processes: `exec {background: true}` starts a program and answers at once with
//! its `process_id`; `process::list`, `process::output` (paged from the agent's ring, or
//! followed live into a `stream` channel), `process::kill` and `process::wait` act on it.
//!
//! The agent keeps the processes and their output (see `agent_proto::process` for the
//! bounds: 32 running, 1 MiB of output each, 4 MiB per sandbox). The adapter keeps what it
//! was asked (argv, start time) per process, so nothing the guest says is shown but numbers
//! it reports about processes this adapter started. Background processes hold no exec slot,
//! are processes of the sandbox (its `max_pids_per_sandbox` counts them) and end with it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use agent_proto::client::AgentError;
use agent_proto::process::MAX_OUTPUT_PAGE;
use agent_proto::{ExecSpec, ProcErrorCode, ProcInfo, ProcReply, ProcRequest};
use base64::Engine as _;
use iii_sdk::channel::{ChannelWriter, StreamChannelRef};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::{FsCode, SandboxError};
use crate::ops::cancel::rfc3339;
use crate::ops::exec::agent_failure;
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{parse, sandbox_id};

/// Bytes one `process::output` answer carries at most (the agent's ring of a process).
pub const OUTPUT_REPLY_CAP: usize = agent_proto::process::RING_BYTES;

/// Processes whose argv and start time the adapter remembers per sandbox (the agent
/// forgets ended ones past its own bound; these entries go with them at the next list).
const REMEMBERED: usize = 256;

/// Arguments of a process `process::list` shows, each cut to [`ARG_SHOWN`] characters.
const ARGS_SHOWN: usize = 64;
const ARG_SHOWN: usize = 1024;

/// Live followers (`process::output` with `stream`) per sandbox.
pub const MAX_FOLLOWERS: usize = 8;

/// How often a follower asks the agent for new output.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// A follower whose reader takes nothing for this long is given up.
const FOLLOW_STALL: Duration = Duration::from_secs(30);

/// `process::wait`'s `timeout_ms` when none is given, and its ceiling.
const WAIT_DEFAULT_MS: u64 = 30_000;
const WAIT_MAX_MS: u64 = 300_000;
const WAIT_POLL: Duration = Duration::from_millis(100);

/// What the adapter knows of one sandbox's background processes.
#[derive(Default)]
pub struct Processes {
    started: Mutex<BTreeMap<u32, Started>>,
    /// How many were ever started: zero means the idle reaper never asks the agent.
    ever_started: AtomicUsize,
    followers: AtomicUsize,
}

struct Started {
    argv: Vec<String>,
    started_at: SystemTime,
}

impl Processes {
    /// Whether this sandbox ever started one (the idle reaper's cheap first check).
    pub fn any_started(&self) -> bool {
        self.ever_started.load(Ordering::Relaxed) > 0
    }
}

/// Starts `spec` in the background; the caller holds a call guard (no exec slot).
pub async fn start(sandbox: &Sandbox, spec: ExecSpec) -> Result<Value, SandboxError> {
    let argv: Vec<String> = spec
        .argv
        .iter()
        .take(ARGS_SHOWN)
        .map(|a| a.chars().take(ARG_SHOWN).collect())
        .collect();
    let exec = spec.to_request();
    let info = match ask(sandbox, ProcRequest::Start { exec }).await? {
        (ProcReply::Started { info }, _) => info,
        (other, _) => return Err(unexpected(sandbox, other)),
    };
    let processes = &sandbox.processes;
    processes.ever_started.fetch_add(1, Ordering::Relaxed);
    {
        let mut started = lock(&processes.started);
        started.insert(
            info.process_id,
            Started {
                argv,
                started_at: SystemTime::now(),
            },
        );
        while started.len() > REMEMBERED {
            started.pop_first();
        }
    }
    Ok(json!({
        "sandbox_id": sandbox.id.to_string(),
        "process_id": info.process_id,
        "pid": info.pid,
        "running": info.running,
        "exit_code": info.exit_code,
    }))
}

/// Whether any background process of `sandbox` runs (asked of its agent).
pub async fn any_running(sandbox: &Sandbox) -> bool {
    match ask(sandbox, ProcRequest::List).await {
        Ok((ProcReply::List { processes }, _)) => processes.iter().any(|p| p.running),
        _ => false,
    }
}

/// With `background_keeps_alive`: a sandbox due for its idle timeout whose background
/// processes still run is marked active instead. Only sandboxes that ever started one are
/// asked (the reaper calls this before it takes idle sandboxes).
pub async fn keep_alive<B: Backend>(plugin: &SandboxPlugin<B>) {
    if !plugin.config.background_keeps_alive {
        return;
    }
    let now = std::time::Instant::now();
    for sandbox in plugin.registry.live() {
        if !sandbox.processes.any_started() || !sandbox.is_idle(now) {
            continue;
        }
        let asked = tokio::time::timeout(Duration::from_secs(2), any_running(&sandbox)).await;
        if asked.unwrap_or(false) {
            sandbox.touch();
        }
    }
}

#[derive(Debug, Deserialize)]
struct ProcessRequest {
    sandbox_id: String,
    process_id: Option<u32>,
    signal: Option<Value>,
    since: Option<u64>,
    max_bytes: Option<u64>,
    timeout_ms: Option<u64>,
    stream: Option<Value>,
}

/// Serves `process::<verb>`.
pub async fn dispatch<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    verb: &str,
    payload: Value,
) -> Result<Value, SandboxError> {
    let request: ProcessRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    let (sandbox, _call) = plugin.registry.begin_call(id)?;
    crate::ops::pause::wake(&sandbox, &plugin.events).await?;
    let process_id = || {
        request.process_id.ok_or_else(|| {
            SandboxError::InvalidRequest("`process_id` is required (from exec's answer)".into())
        })
    };
    match verb {
        "list" => list(&sandbox).await,
        "kill" => {
            let signal = crate::ops::cancel::signal(request.signal.as_ref())?;
            let process_id = process_id()?;
            match ask(&sandbox, ProcRequest::Kill { process_id, signal }).await? {
                (ProcReply::Signalled { info }, _) => Ok(state(&info)),
                (other, _) => Err(refusal(&sandbox, other)),
            }
        }
        "wait" => {
            let timeout_ms = match request.timeout_ms {
                Some(0) => {
                    return Err(SandboxError::InvalidRequest(
                        "`timeout_ms` must be at least 1".into(),
                    ))
                }
                Some(ms) => ms.min(WAIT_MAX_MS),
                None => WAIT_DEFAULT_MS,
            };
            wait(&sandbox, process_id()?, Duration::from_millis(timeout_ms)).await
        }
        "output" => {
            let process_id = process_id()?;
            let since = request.since.unwrap_or(0);
            match request.stream.filter(|s| !s.is_null()) {
                Some(stream) => {
                    let channel = crate::ops::stream::StreamRefs::parse(Some(stream), None)?
                        .output
                        .ok_or_else(|| SandboxError::InvalidRequest("`stream`".into()))?;
                    follow(plugin, Arc::clone(&sandbox), process_id, since, channel).await
                }
                None => {
                    let max = request
                        .max_bytes
                        .map_or(OUTPUT_REPLY_CAP, |m| (m as usize).min(OUTPUT_REPLY_CAP));
                    output(&sandbox, process_id, since, max).await
                }
            }
        }
        other => Err(SandboxError::InvalidRequest(format!(
            "unknown function `process::{other}`"
        ))),
    }
}

async fn list(sandbox: &Sandbox) -> Result<Value, SandboxError> {
    let processes = match ask(sandbox, ProcRequest::List).await? {
        (ProcReply::List { processes }, _) => processes,
        (other, _) => return Err(unexpected(sandbox, other)),
    };
    let mut started = lock(&sandbox.processes.started);
    // What the agent no longer keeps is forgotten here too.
    started.retain(|id, _| processes.iter().any(|p| p.process_id == *id));
    let listed: Vec<Value> = processes
        .iter()
        .filter_map(|p| {
            let known = started.get(&p.process_id)?;
            let mut entry = state(p);
            entry["argv"] = json!(known.argv);
            entry["started_at"] = rfc3339(known.started_at).into();
            Some(entry)
        })
        .collect();
    Ok(json!({"sandbox_id": sandbox.id.to_string(), "processes": listed}))
}

/// One page (or two: the agent's pages are half a ring) of output from `since`.
async fn output(
    sandbox: &Sandbox,
    process_id: u32,
    since: u64,
    max: usize,
) -> Result<Value, SandboxError> {
    let mut data = Vec::new();
    let mut cursor = since;
    let mut first = None;
    let info = loop {
        let want = (max - data.len()).min(MAX_OUTPUT_PAGE as usize) as u32;
        let (start, next, info, bytes) = page(sandbox, process_id, cursor, want).await?;
        first.get_or_insert(start);
        data.extend_from_slice(&bytes);
        cursor = next;
        if data.len() >= max || next >= info.total_bytes || bytes.is_empty() {
            break info;
        }
    };
    let start = first.unwrap_or(since);
    let mut reply = state(&info);
    reply["output"] = String::from_utf8_lossy(&data).into();
    reply["start"] = start.into();
    reply["next"] = cursor.into();
    reply["truncated"] = (start > since).into();
    reply["total_bytes"] = info.total_bytes.into();
    Ok(reply)
}

/// Asks the agent for output from `since`: `(start, next, info, bytes)`, checked against
/// what was asked (a guest that answers otherwise is refused, not believed).
async fn page(
    sandbox: &Sandbox,
    process_id: u32,
    since: u64,
    max_bytes: u32,
) -> Result<(u64, u64, ProcInfo, Vec<u8>), SandboxError> {
    let request = ProcRequest::Output {
        process_id,
        since,
        max_bytes,
    };
    match ask(sandbox, request).await? {
        (ProcReply::Output { info, start, next }, bytes)
            if info.process_id == process_id
                && next >= start
                && next - start == bytes.len() as u64
                && bytes.len() <= max_bytes as usize =>
        {
            Ok((start, next, info, bytes))
        }
        (other @ ProcReply::Refused { .. }, _) => Err(refusal(sandbox, other)),
        (other, _) => Err(unexpected(sandbox, other)),
    }
}

async fn wait(
    sandbox: &Sandbox,
    process_id: u32,
    timeout: Duration,
) -> Result<Value, SandboxError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let (_, _, info, _) = page(sandbox, process_id, u64::MAX, 0).await?;
        let now = tokio::time::Instant::now();
        if !info.running || now >= deadline {
            let mut reply = state(&info);
            reply["timed_out"] = info.running.into();
            return Ok(reply);
        }
        tokio::time::sleep(WAIT_POLL.min(deadline - now)).await;
    }
}

/// Follows a process's output into the caller's channel: NDJSON lines
/// `{"stream":"output","data_b64":..}` as it prints (`{"dropped":n}` where the ring lost
/// bytes before they were sent), then `{"exit":{"exit_code":..}}` once it has ended and
/// everything was sent, then the channel closes. Answers at once; the following runs on.
async fn follow<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    sandbox: Arc<Sandbox>,
    process_id: u32,
    since: u64,
    channel: StreamChannelRef,
) -> Result<Value, SandboxError> {
    let engine_url = plugin.host.engine_url().ok_or_else(|| {
        SandboxError::Unsupported(
            "`stream` needs the engine connection of the shell, and this plugin runs without one"
                .into(),
        )
    })?;
    // Known before anything is followed: an unknown id is S001 here, not a silent stream.
    let (_, _, info, _) = page(&sandbox, process_id, since, 0).await?;
    let followers = &sandbox.processes.followers;
    if followers.fetch_add(1, Ordering::SeqCst) >= MAX_FOLLOWERS {
        followers.fetch_sub(1, Ordering::SeqCst);
        return Err(SandboxError::ResourceLimit(format!(
            "sandbox {} already has {MAX_FOLLOWERS} followed outputs; close one",
            sandbox.id
        )));
    }
    let writer = ChannelWriter::new(&engine_url, &channel);
    if let Err(e) = writer.write(&[]).await {
        followers.fetch_sub(1, Ordering::SeqCst);
        return Err(SandboxError::Fs {
            code: FsCode::StreamAborted,
            message: format!("cannot open the `stream` channel: {e}"),
            fix: None,
        });
    }
    let following = Arc::clone(&sandbox);
    tokio::spawn(async move {
        if let Err(why) = pump(&following, process_id, since, &writer).await {
            tracing::debug!(sandbox_id = %following.id, process_id, "follow ended: {why}");
        }
        let _ = writer.close().await;
        following.processes.followers.fetch_sub(1, Ordering::SeqCst);
    });
    let mut reply = state(&info);
    reply["following"] = true.into();
    reply["since"] = since.into();
    Ok(reply)
}

async fn pump(
    sandbox: &Sandbox,
    process_id: u32,
    since: u64,
    writer: &ChannelWriter,
) -> Result<(), String> {
    let mut cursor = since;
    loop {
        let (start, next, info, bytes) = page(sandbox, process_id, cursor, MAX_OUTPUT_PAGE)
            .await
            .map_err(|e| e.to_string())?;
        if start > cursor {
            line(writer, &json!({"dropped": start - cursor})).await?;
        }
        if !bytes.is_empty() {
            let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
            line(writer, &json!({"stream": "output", "data_b64": data})).await?;
        }
        cursor = next;
        if cursor >= info.total_bytes {
            if !info.running {
                let exit = json!({"exit": {"exit_code": info.exit_code, "next": cursor}});
                return line(writer, &exit).await;
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }
}

async fn line(writer: &ChannelWriter, value: &Value) -> Result<(), String> {
    let mut bytes = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    match tokio::time::timeout(FOLLOW_STALL, writer.write(&bytes)).await {
        Ok(written) => written.map_err(|e| e.to_string()),
        Err(_) => Err(format!("the reader took nothing for {FOLLOW_STALL:?}")),
    }
}

/// `{process_id, pid, running, exit_code}`.
fn state(info: &ProcInfo) -> Value {
    json!({
        "process_id": info.process_id,
        "pid": info.pid,
        "running": info.running,
        "exit_code": info.exit_code,
    })
}

async fn ask(
    sandbox: &Sandbox,
    request: ProcRequest,
) -> Result<(ProcReply, Vec<u8>), SandboxError> {
    match sandbox.agent.process(request).await {
        Ok(reply) => Ok(reply),
        Err(AgentError::Unsupported(why)) => Err(SandboxError::Unsupported(format!(
            "background processes in sandbox {}: {why}; a sandbox created by this adapter has them",
            sandbox.id
        ))),
        Err(e) => Err(agent_failure(sandbox, e).await),
    }
}

/// The agent's refusal as the caller's error: an unknown id or a bad signal is S001, too
/// many processes S400.
fn refusal(sandbox: &Sandbox, reply: ProcReply) -> SandboxError {
    match reply {
        ProcReply::Refused { code, message } => {
            let message: String = message.chars().take(512).collect();
            match code {
                ProcErrorCode::TooMany => SandboxError::ResourceLimit(format!(
                    "sandbox {}: {message} (kill or wait for one)",
                    sandbox.id
                )),
                ProcErrorCode::NotFound => {
                    SandboxError::InvalidRequest(format!("sandbox {}: {message}", sandbox.id))
                }
                ProcErrorCode::BadSignal | ProcErrorCode::Spawn => {
                    SandboxError::InvalidRequest(format!("the agent refused: {message}"))
                }
            }
        }
        other => unexpected(sandbox, other),
    }
}

fn unexpected(sandbox: &Sandbox, reply: ProcReply) -> SandboxError {
    if matches!(reply, ProcReply::Refused { .. }) {
        return refusal(sandbox, reply);
    }
    SandboxError::Internal(format!(
        "sandbox {}: the agent answered out of turn",
        sandbox.id
    ))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub mod schema {
    //! Request and response schemas of `process::*`.
    use serde_json::{json, Value};

    use crate::functions::{object, uuid_schema};

    fn process_id() -> Value {
        json!({"type": "integer", "minimum": 1})
    }

    fn state() -> Value {
        object(
            &["process_id", "pid", "running", "exit_code"],
            json!({
                "process_id": process_id(),
                "pid": {"type": "integer", "description": "in the sandbox's pid namespace"},
                "running": {"type": "boolean"},
                "exit_code": {"type": ["integer", "null"], "description": "once ended; 128 + signal when a signal ended it"},
            }),
        )
    }

    /// `(suffix, description, request, response)` of each function.
    pub fn specs() -> Vec<(&'static str, &'static str, Value, Value)> {
        let by_id = |extra: Value| {
            let mut properties = json!({"sandbox_id": uuid_schema(), "process_id": process_id()});
            if let (Some(p), Some(e)) = (properties.as_object_mut(), extra.as_object()) {
                p.extend(e.clone());
            }
            object(&["sandbox_id", "process_id"], properties)
        };
        let mut output = state();
        output["properties"]["output"] = json!({"type": "string", "description": "stdout and stderr interleaved as read, decoded as UTF-8 (lossy)"});
        output["properties"]["start"] =
            json!({"type": "integer", "description": "offset of the first byte of `output`"});
        output["properties"]["next"] =
            json!({"type": "integer", "description": "offset to pass as `since` next time"});
        output["properties"]["truncated"] = json!({"type": "boolean", "description": "bytes after `since` were dropped from the ring before they were read"});
        let mut listed = state();
        listed["properties"]["argv"] = json!({"type": "array", "items": {"type": "string"}});
        listed["properties"]["started_at"] = json!({"type": "string", "format": "date-time"});
        let mut waited = state();
        waited["properties"]["timed_out"] =
            json!({"type": "boolean", "description": "still running at `timeout_ms`"});
        vec![
            (
                "process::list",
                "A sandbox's background processes (exec with background: true), running and recently ended",
                object(&["sandbox_id"], json!({"sandbox_id": uuid_schema()})),
                object(
                    &["sandbox_id", "processes"],
                    json!({"sandbox_id": uuid_schema(), "processes": {"type": "array", "items": listed}}),
                ),
            ),
            (
                "process::output",
                "What a background process printed from offset `since` (its last 1 MiB is kept), or with `stream` its output followed live into a channel",
                by_id(json!({
                    "since": {"type": "integer", "minimum": 0, "default": 0},
                    "max_bytes": {"type": "integer", "minimum": 0, "maximum": super::OUTPUT_REPLY_CAP},
                    "stream": crate::ops::stream::schema("write"),
                })),
                output,
            ),
            (
                "process::kill",
                "Signal a background process's group (default SIGTERM; SIGKILL 2 s later unless it ends)",
                by_id(json!({"signal": crate::ops::cancel::signal_schema()})),
                state(),
            ),
            (
                "process::wait",
                "Wait until a background process ends (or timeout_ms passes) and answer its exit code",
                by_id(json!({"timeout_ms": {"type": "integer", "minimum": 1, "maximum": super::WAIT_MAX_MS, "default": super::WAIT_DEFAULT_MS}})),
                waited,
            ),
        ]
    }
}
