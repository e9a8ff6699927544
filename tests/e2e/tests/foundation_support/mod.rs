//! Helpers shared by the foundation tests (foundation, configuration, reconnect): an engine
//! and adapter that need no image registry, starting the adapter on any plugin path, and
//! reading why an adapter refused to start.

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use e2e_tests::{
    adapter_bin, agent_bin, Adapter, AdapterOptions, Client, PluginKind, CALL_TIMEOUT,
};
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};

/// How long a refused start may take: connect, read the configuration, load the plugin.
pub const EXIT_WAIT: Duration = Duration::from_secs(60);
/// How long registrations may take to show up on the engine.
pub const READY_WAIT: Duration = Duration::from_secs(60);

/// The prefix an adapter serves under with `options` (its `--prefix`, else the plugin's name).
pub fn prefix_of(options: &AdapterOptions) -> String {
    options
        .prefix
        .clone()
        .unwrap_or_else(|| match options.plugin {
            PluginKind::Bwrap => "sandbox-bwrap".into(),
            PluginKind::Libkrun => "sandbox-libkrun".into(),
        })
}

/// A configuration that keeps every file the plugin writes inside `dir` (no registry, no
/// `$HOME`), with `extra` keys on top.
pub fn local_config(dir: &Path, extra: Value) -> Value {
    let mut config = json!({
        "state_dir": dir.join("state"),
        "image_cache_dir": dir.join("cache"),
    });
    if let (Some(base), Value::Object(extra)) = (config.as_object_mut(), extra) {
        base.extend(extra);
    }
    config
}

/// An engine, an adapter started with `options` and a client, without the image registry:
/// enough for everything that boots no sandbox.
pub struct Bare {
    pub engine: EngineHandle,
    pub client: Client,
    pub adapter: Adapter,
    pub prefix: String,
    pub dir: tempfile::TempDir,
}

impl Bare {
    /// Engine seeded with `local_config(extra)` under `options.config_name`; returns once the
    /// adapter's `adapter::info` is registered.
    pub async fn start(extra: Value, options: AdapterOptions) -> Bare {
        let dir = e2e_tests::host_dir();
        let config = local_config(dir.path(), extra);
        let engine = Engine::with_config(options.config_name.clone(), config)
            .start("127.0.0.1:0".parse().expect("address"))
            .await
            .expect("start engine");
        let adapter = Adapter::spawn(&engine.url(), &options);
        let client = Client::connect(&engine.url()).await.expect("client");
        let prefix = prefix_of(&options);
        wait_ready(&client, &adapter, &prefix).await;
        Bare {
            engine,
            client,
            adapter,
            prefix,
            dir,
        }
    }

    /// Calls `<prefix>::<suffix>`.
    pub async fn call(
        &self,
        suffix: &str,
        payload: Value,
    ) -> Result<Value, e2e_tests::RemoteError> {
        self.client
            .invoke(&format!("{}::{suffix}", self.prefix), payload, CALL_TIMEOUT)
            .await
    }
}

/// Waits until `<prefix>::adapter::info` is registered; panics with the adapter's log if not.
pub async fn wait_ready(client: &Client, adapter: &Adapter, prefix: &str) {
    let ready = client
        .wait_for_function(&format!("{prefix}::adapter::info"), None, READY_WAIT)
        .await;
    assert!(
        ready.is_ok(),
        "adapter did not register: {ready:?}\n{}",
        adapter.log()
    );
}

/// Waits for a refused adapter to exit; panics with its log if it keeps running.
pub fn exit_of(adapter: &mut Adapter) -> ExitStatus {
    match adapter.wait_exit(EXIT_WAIT) {
        Some(status) => status,
        None => panic!(
            "the adapter was expected to exit but still runs\n{}",
            adapter.log()
        ),
    }
}

/// Whether `line` is output of the tracing subscriber (a timestamp first, maybe coloured).
fn is_tracing_line(line: &str) -> bool {
    line.starts_with('\x1b') || line.bytes().next().is_some_and(|b| b.is_ascii_digit())
}

/// Everything on stderr that is not tracing output: the shell's own words.
pub fn reason_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| !l.trim().is_empty() && !is_tracing_line(l))
        .map(str::to_string)
        .collect()
}

/// Asserts a refused start: exit `code`, exactly one line of reason (`sandbox-libkrun: ...`)
/// holding every `expected` part, and no panic anywhere in the output.
pub fn assert_refused(status: ExitStatus, log: &str, code: i32, expected: &[&str], case: &str) {
    assert_eq!(
        status.code(),
        Some(code),
        "{case}: exit status {status}\n{log}"
    );
    let reasons = reason_lines(log);
    assert_eq!(
        reasons.len(),
        1,
        "{case}: one line of reason expected\n{log}"
    );
    assert!(
        reasons[0].starts_with("sandbox-libkrun: "),
        "{case}: {}",
        reasons[0]
    );
    for part in expected {
        assert!(
            reasons[0].contains(part),
            "{case}: reason lacks {part:?}: {}",
            reasons[0]
        );
    }
    assert!(!log.contains("panicked"), "{case}: panic in output\n{log}");
}

/// Runs the adapter with `--plugin plugin` (no `--prefix`) against `engine_url` until it
/// exits; returns its status and stderr. Kills it if it is still running after [`EXIT_WAIT`].
pub fn run_with_plugin(engine_url: &str, plugin: &Path) -> (Option<ExitStatus>, String) {
    let mut child = Command::new(adapter_bin())
        .arg("--plugin")
        .arg(plugin)
        .env("III_URL", engine_url)
        .env("SANDBOX_AGENT_PATH", agent_bin())
        .env("RUST_LOG", "info")
        .env_remove("SANDBOX_LIBKRUN_PLUGIN")
        .env_remove("SANDBOX_LIBKRUN_PREFIX")
        .env_remove("III_WORKER_NAME")
        .env_remove("III_CONFIG_NAME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sandbox-libkrun");
    let deadline = std::time::Instant::now() + EXIT_WAIT;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().expect("adapter output");
    (status, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The C library this very test process runs on (from `/proc/self/maps`): a real shared
/// library that is not a plugin, found without naming a path of this machine.
pub fn mapped_libc() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libc.so") || n.starts_with("libc-"))
        })
        .map(PathBuf::from)
}

/// Polls `f` every 100 ms until it yields `Some`, or gives up after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = f().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The workers `engine::workers::list` shows under `name`.
pub async fn workers_named(client: &Client, name: &str) -> Vec<Value> {
    let list = client
        .invoke("engine::workers::list", json!({}), CALL_TIMEOUT)
        .await
        .expect("engine::workers::list");
    list["workers"]
        .as_array()
        .map(|workers| {
            workers
                .iter()
                .filter(|w| w["name"] == name)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}
