//! `exec`: one program in a live sandbox, with SPEC.md's exec semantics (timeout clamp,
//! bounded output, S003 past the per-sandbox cap, S200 with the partial output).

use std::sync::Arc;
use std::time::Duration;

use agent_proto::client::AgentError;
use agent_proto::{ExecOutcome, ExecSpec};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::error::SandboxError;
use crate::ops::stream::{self, StreamRefs};
use crate::plugin::SandboxPlugin;
use crate::registry::Sandbox;
use crate::request::{command, env_pairs, parse, sandbox_id, stdin_bytes};

/// Bytes kept per output stream (SPEC.md: 1 MiB).
pub const OUTPUT_CAP: usize = 1024 * 1024;
/// Timeout when the request names none.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;

#[derive(Debug, Deserialize)]
struct ExecRequest {
    sandbox_id: String,
    argv: Option<Vec<String>>,
    cmd: Option<String>,
    args: Option<Vec<String>>,
    stdin: Option<String>,
    env: Option<Value>,
    timeout_ms: Option<u64>,
    workdir: Option<String>,
    /// Write end of a caller's channel: the output streamed as NDJSON (see `ops::stream`).
    stream: Option<Value>,
    /// Read end of a caller's channel: the program's stdin as it arrives.
    stdin_stream: Option<Value>,
    /// `{rows, cols}`: run on a pseudo-terminal (with both channels; see `ops::stream`).
    tty: Option<Value>,
    /// Start it as a background process and answer at once (see `ops::process`).
    #[serde(default)]
    background: bool,
}

/// One program to run; shared by `exec` and `run`.
#[derive(Debug, Default)]
pub struct ExecInput {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub timeout_ms: Option<u64>,
    pub workdir: Option<String>,
    /// The caller's channels, when the exec is streamed.
    pub streams: StreamRefs,
}

pub async fn exec<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    payload: Value,
) -> Result<Value, SandboxError> {
    let mut request: ExecRequest = parse(payload)?;
    let id = sandbox_id(&request.sandbox_id)?;
    let has_stdin = request.stdin.is_some();
    // The base64 text is freed once decoded: a large stdin is held once while it runs.
    let stdin = stdin_bytes(request.stdin.take().as_deref())?;
    let input = ExecInput {
        argv: command(request.argv, request.cmd, request.args)?,
        env: env_pairs(request.env)?,
        stdin,
        timeout_ms: request.timeout_ms,
        workdir: request.workdir,
        streams: streams(request.stream, request.stdin_stream, has_stdin, request.tty)?,
    };
    if request.background {
        return background(plugin, id, input).await;
    }
    let (sandbox, _call) = plugin.registry.begin_exec(id)?;
    crate::ops::pause::wake(&sandbox, &plugin.events).await?;
    plugin
        .events
        .exec(sandbox.id, run_in(plugin, &sandbox, input))
        .await
}

/// `exec {background: true}`: starts the program as a background process of the sandbox and
/// answers `{process_id, pid, ...}` at once. It takes no exec slot and has no timeout; no
/// `stdin`, `stream`, `stdin_stream` or `tty` (S001): its output is kept for
/// `process::output`.
async fn background<B: Backend>(
    plugin: &Arc<SandboxPlugin<B>>,
    id: uuid::Uuid,
    input: ExecInput,
) -> Result<Value, SandboxError> {
    if !input.stdin.is_empty() || input.streams.any() {
        return Err(SandboxError::InvalidRequest(
            "a `background` exec takes no `stdin`, `stream`, `stdin_stream` or `tty`: read its \
             output with process::output"
                .into(),
        ));
    }
    let (sandbox, _call) = plugin.registry.begin_call(id)?;
    crate::ops::pause::wake(&sandbox, &plugin.events).await?;
    let (mut spec, _) = spec_for(plugin, &sandbox, input)?;
    spec.timeout_ms = 0;
    crate::ops::process::start(&sandbox, spec).await
}

/// The agent's spec for `input` in `sandbox`, and its timeout.
fn spec_for<B: Backend>(
    plugin: &SandboxPlugin<B>,
    sandbox: &Sandbox,
    input: ExecInput,
) -> Result<(ExecSpec, StreamRefs), SandboxError> {
    let timeout_ms = clamp_timeout(input.timeout_ms, plugin.config.max_exec_timeout_ms)?;
    if let Some(workdir) = &input.workdir {
        crate::request::guest_path("workdir", workdir)?;
    }
    let mut env = sandbox.env.clone();
    env.extend(input.env);
    let spec = ExecSpec {
        argv: input.argv,
        env,
        workdir: input.workdir.or_else(|| sandbox.workdir.clone()),
        stdin: input.stdin,
        timeout_ms,
        max_output_bytes: OUTPUT_CAP,
        tty: None,
    };
    Ok((spec, input.streams))
}

/// Runs `input` in `sandbox`; the caller holds the sandbox's exec slot. The exec is known by
/// its `exec_id` while it runs (`list`, `exec::cancel`); its answer says whether a cancel
/// ended it (`cancelled`).
pub async fn run_in<B: Backend>(
    plugin: &SandboxPlugin<B>,
    sandbox: &Sandbox,
    input: ExecInput,
) -> Result<Value, SandboxError> {
    let (spec, streams) = spec_for(plugin, sandbox, input)?;
    let timeout_ms = spec.timeout_ms;
    let argv0 = spec.argv.first().map_or("", String::as_str);
    let (ticket, signals) = sandbox.execs.register(argv0);
    let marked = |mut result: Value| {
        result["exec_id"] = ticket.id.to_string().into();
        result["cancelled"] = ticket.cancelled().into();
        result
    };
    if streams.any() {
        let engine_url = plugin.host.engine_url().ok_or_else(|| {
            SandboxError::Unsupported(
                "`stream` and `stdin_stream` need the engine connection of the shell, and \
                 this plugin runs without one"
                    .into(),
            )
        })?;
        return match stream::run(&engine_url, sandbox, spec, streams, &ticket, signals).await {
            Ok(result) => Ok(marked(result)),
            Err(SandboxError::ExecTimedOut {
                timeout_ms,
                partial,
            }) => Err(SandboxError::ExecTimedOut {
                timeout_ms,
                partial: marked(partial),
            }),
            Err(e) => Err(e),
        };
    }
    let outcome = match sandbox.agent.exec_signalled(spec, Some(signals)).await {
        Ok(outcome) => outcome,
        Err(e) => return Err(agent_failure(sandbox, e).await),
    };
    if let Some(stopped) = ended_by_stop(sandbox, outcome.exit_code).await {
        return Err(stopped);
    }
    let result = marked(result_json(&outcome));
    if outcome.timed_out {
        return Err(SandboxError::ExecTimedOut {
            timeout_ms,
            partial: result,
        });
    }
    Ok(result)
}

/// The `stream`/`stdin_stream`/`tty` fields of `exec` and `run` (S001 when malformed, when
/// `stdin` and `stdin_stream` are both given, or `tty` without both channels).
pub fn streams(
    stream: Option<Value>,
    stdin_stream: Option<Value>,
    has_stdin: bool,
    tty: Option<Value>,
) -> Result<StreamRefs, SandboxError> {
    if has_stdin && stdin_stream.is_some() {
        return Err(SandboxError::InvalidRequest(
            "give `stdin` or `stdin_stream`, not both".into(),
        ));
    }
    let mut refs = StreamRefs::parse(stream, stdin_stream)?;
    refs.tty = stream::tty(tty, &refs)?;
    Ok(refs)
}

fn clamp_timeout(requested: Option<u64>, ceiling: u64) -> Result<u64, SandboxError> {
    match requested {
        Some(0) => Err(SandboxError::InvalidRequest(
            "`timeout_ms` must be at least 1".into(),
        )),
        Some(ms) => Ok(ms.min(ceiling)),
        None => Ok(DEFAULT_TIMEOUT_MS.min(ceiling)),
    }
}

pub(crate) fn result_json(outcome: &ExecOutcome) -> Value {
    json!({
        "stdout": String::from_utf8_lossy(&outcome.stdout),
        "stderr": String::from_utf8_lossy(&outcome.stderr),
        "exit_code": outcome.exit_code,
        "timed_out": outcome.timed_out,
        "duration_ms": outcome.duration_ms,
        "success": outcome.exit_code == 0 && !outcome.timed_out,
        "stdout_truncated": outcome.stdout_truncated,
        "stderr_truncated": outcome.stderr_truncated,
    })
}

/// S004 for a program that a stop of its sandbox ended. A stop marks the sandbox stopped
/// before its agent ends the programs: one that died by a signal after that mark was ended
/// by the stop, and its caller gets S004, not the kill's status (the agent's result for it
/// can reach the host before the link's end does). Both exec paths ask this.
pub(crate) async fn ended_by_stop(sandbox: &Sandbox, exit_code: i32) -> Option<SandboxError> {
    if exit_code < 128 || !sandbox.is_stopped() {
        return None;
    }
    let cause = sandbox
        .end_cause(Duration::ZERO)
        .await
        .unwrap_or_else(|| "stopped".into());
    Some(SandboxError::Stopped(format!(
        "{} ({cause}) during the exec",
        sandbox.id
    )))
}

/// How long a call whose agent link broke waits for the sandbox's verdict (why it ended).
const END_CAUSE_WAIT: Duration = Duration::from_secs(3);

/// Maps an agent failure on `sandbox` to the caller's error. A lost link means the sandbox
/// is ending (stopped, or its agent is gone and it is being stopped): S004 with the cause.
pub async fn agent_failure(sandbox: &Sandbox, error: AgentError) -> SandboxError {
    match error {
        AgentError::ConnectionLost(link) => {
            let cause = sandbox.end_cause(END_CAUSE_WAIT).await.unwrap_or(link);
            SandboxError::Stopped(format!("{} ({cause})", sandbox.id))
        }
        AgentError::TooLarge { bytes, limit } => SandboxError::InvalidRequest(format!(
            "the request is {bytes} bytes as an agent frame, over the limit of {limit} bytes \
             (1 MiB): shorten argv, env, workdir or paths (pass large data as stdin or with \
             fs::write)"
        )),
        AgentError::Fs(fs) => crate::ops::fs_error(fs),
        AgentError::Request(refusal) => {
            SandboxError::InvalidRequest(format!("the agent refused: {refusal}"))
        }
        // What the sandbox's host side wrote last says why, if anything does (a guest that
        // panicked, a runner that lost its VM).
        unresponsive @ AgentError::Unresponsive { .. } => {
            SandboxError::Internal(format!("{unresponsive}{}", sandbox.process.last_words()))
        }
        other => SandboxError::Internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SandboxProcess;
    use crate::registry::{NewSandbox, Registry};
    use agent_proto::{AgentClient, Hello, Message};
    use tokio::io::AsyncWriteExt;

    struct NoProcess;

    #[async_trait::async_trait]
    impl SandboxProcess for NoProcess {
        fn pid(&self) -> Option<u32> {
            None
        }
        fn is_alive(&self) -> bool {
            true
        }
        async fn kill(&self) {}
        fn last_words(&self) -> String {
            "; console log tail: Kernel panic - not syncing".into()
        }
    }

    /// A registered sandbox whose agent said hello over an in-memory pipe (and nothing more).
    async fn sandbox(registry: &Registry) -> Arc<Sandbox> {
        let (host, agent) = tokio::io::duplex(64 * 1024);
        let (_agent_reader, mut agent_writer) = tokio::io::split(agent);
        let hello = Message::Hello(Hello::new("fake")).into_frame(0).unwrap();
        agent_writer
            .write_all(&hello.to_bytes().unwrap())
            .await
            .unwrap();
        let (reader, writer) = tokio::io::split(host);
        let agent = AgentClient::connect(reader, writer).await.unwrap();
        registry.reserve().unwrap().insert(NewSandbox {
            recipe: Default::default(),
            id: uuid::Uuid::new_v4(),
            name: None,
            image: "busybox".into(),
            env: Vec::new(),
            workdir: None,
            idle_timeout: Duration::from_secs(60),
            exec_cap: 1,
            agent,
            process: Box::new(NoProcess),
            layer: std::path::PathBuf::new(),
        })
    }

    /// The order a stop makes (the sandbox marked stopped, then its programs killed) decides:
    /// a signal death seen after the mark is the stop's (S004 with its cause), one before it
    /// or an exit of the program's own is the program's result.
    #[tokio::test]
    async fn a_signal_death_after_a_stop_is_s004_with_the_stops_cause() {
        let registry = Registry::new(2);
        let sandbox = sandbox(&registry).await;
        assert!(
            ended_by_stop(&sandbox, 137).await.is_none(),
            "not stopped yet"
        );
        registry.take_dead(sandbox.id, "stopped by sandbox::stop");
        let stopped = ended_by_stop(&sandbox, 137).await.expect("S004");
        assert_eq!(stopped.code(), "S004");
        let text = stopped.to_string();
        assert!(text.contains("stopped by sandbox::stop"), "{text}");
        assert!(text.contains(&sandbox.id.to_string()), "{text}");
        for own_exit in [0, 1, 127] {
            assert!(
                ended_by_stop(&sandbox, own_exit).await.is_none(),
                "{own_exit}"
            );
        }
    }

    /// An agent that stopped answering is S500 with what the sandbox's host side wrote last,
    /// so the failure says why; other failures carry none of it.
    #[tokio::test]
    async fn an_unresponsive_agent_is_s500_with_the_sandboxs_last_words() {
        let registry = Registry::new(2);
        let sandbox = sandbox(&registry).await;
        let error = agent_failure(&sandbox, AgentError::Unresponsive { id: 3 }).await;
        assert_eq!(error.code(), "S500");
        let text = error.to_string();
        assert!(text.contains("did not answer request 3"), "{text}");
        assert!(text.contains("console log tail: Kernel panic"), "{text}");
        let other = agent_failure(&sandbox, AgentError::Unexpected("x".into())).await;
        assert!(!other.to_string().contains("Kernel panic"), "{other}");
    }

    #[test]
    fn timeout_defaults_and_clamps() {
        assert_eq!(clamp_timeout(None, 300_000).unwrap(), 300_000);
        assert_eq!(clamp_timeout(None, 1000).unwrap(), 1000);
        assert_eq!(clamp_timeout(Some(5000), 1000).unwrap(), 1000);
        assert_eq!(clamp_timeout(Some(10), 1000).unwrap(), 10);
        assert!(clamp_timeout(Some(0), 1000).is_err());
    }
}
