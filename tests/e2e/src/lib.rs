//! The harness of the end-to-end tests: the test engine in process, the real
//! `sandbox-libkrun` binary as a child process, a real OCI registry with the fixture images.
//!
//! Binaries are found next to the test executable's profile directory (`target/<profile>/`),
//! so run `cargo build --workspace` and `agent/build-static.sh` first (`.ci/run` does). The
//! static agent comes from `SANDBOX_AGENT_PATH`, else `target/<arch>-unknown-linux-gnu/release/`.
//! The registry comes from `SANDBOX_TEST_REGISTRY` (`host:port`, fixtures already pushed),
//! else the harness starts one for the test process and pushes the fixtures itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use iii_test_engine::client::{Client, RemoteError};
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};

/// The id prefix the adapter serves under in these tests, whatever the plugin.
pub const PREFIX: &str = "sandbox-libkrun";
/// Per-call timeout of the test client; generous, since the machines are shared.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// [`CALL_TIMEOUT`], or longer where a libkrun boot may take longer: a create must outlast
/// two boots of `SANDBOX_LIBKRUN_BOOT_TIMEOUT_SECS` (the backend boots once more after a
/// guest reset) and a pull. The VM lab waits 180 s a boot; a lab run saw a create on a loaded
/// lab outlast the 120 s and fail the test with the client's timeout, not the adapter's answer.
pub fn call_timeout() -> Duration {
    let boot = std::env::var("SANDBOX_LIBKRUN_BOOT_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    CALL_TIMEOUT.max(Duration::from_secs(
        boot.saturating_mul(2).saturating_add(60),
    ))
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/<profile>/`, where cargo put the binaries this test was built with.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn require(path: PathBuf, hint: &str) -> PathBuf {
    assert!(path.exists(), "{} is missing: {hint}", path.display());
    path
}

/// Where the adapter's binaries are: `$SANDBOX_E2E_BIN_DIR` (a copy an ordinary user can
/// reach, see `scripts/test.sh`), else the profile directory.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("SANDBOX_E2E_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(profile_dir)
}

pub fn adapter_bin() -> PathBuf {
    require(
        bin_dir().join("sandbox-libkrun"),
        "run `cargo build --workspace` first",
    )
}

/// The ordinary user the adapter runs as (`$SANDBOX_E2E_ADAPTER_USER`, how Compose runs it),
/// or `None` to run it as the test's own user.
pub fn adapter_user() -> Option<AdapterUser> {
    static USER: OnceLock<Option<AdapterUser>> = OnceLock::new();
    USER.get_or_init(|| {
        let name = std::env::var("SANDBOX_E2E_ADAPTER_USER").ok()?;
        let user = nix::unistd::User::from_name(&name)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("SANDBOX_E2E_ADAPTER_USER names no user: {name}"));
        Some(AdapterUser {
            name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            home: user.dir,
        })
    })
    .clone()
}

#[derive(Debug, Clone)]
pub struct AdapterUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// A fresh host directory that the adapter may use: a temporary directory, owned by the
/// adapter's user when that is not the test's.
pub fn host_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    if let Some(user) = adapter_user() {
        std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid))
            .expect("chown a test directory to the adapter's user");
    }
    dir
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    Bwrap,
    Libkrun,
}

pub fn plugin_path(kind: PluginKind) -> PathBuf {
    let file = match kind {
        PluginKind::Bwrap => "libplugin_bwrap.so",
        PluginKind::Libkrun => "libplugin_libkrun.so",
    };
    require(bin_dir().join(file), "run `cargo build --workspace` first")
}

pub fn agent_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SANDBOX_AGENT_PATH") {
        return require(
            PathBuf::from(path),
            "SANDBOX_AGENT_PATH names a missing file",
        );
    }
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let path = profile_dir()
        .join("..")
        .join(target)
        .join("release")
        .join("sandbox-agent");
    require(path, "build the static agent with agent/build-static.sh")
}

/// The registry holding the fixture images (`host:port`, plain http).
pub fn registry() -> &'static str {
    static REGISTRY: OnceLock<String> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        if let Ok(addr) = std::env::var("SANDBOX_TEST_REGISTRY") {
            return addr;
        }
        let dir = std::env::temp_dir().join(format!(
            "sandbox-libkrun-e2e-registry-{}",
            std::process::id()
        ));
        let fixtures = repo_root().join("tests/fixtures");
        let out = Command::new("bash")
            .arg(fixtures.join("start-registry.sh"))
            .arg(&dir)
            .env("REGISTRY_PARENT_PID", std::process::id().to_string())
            .output()
            .expect("run start-registry.sh");
        assert!(
            out.status.success(),
            "start-registry.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let addr = text
            .split_whitespace()
            .nth(1)
            .expect("registry address")
            .to_string();
        let pushed = Command::new("bash")
            .arg(fixtures.join("build-fixtures.sh"))
            .args([addr.as_str(), "busybox", "python", "node"])
            .stdout(Stdio::null())
            .status()
            .expect("run build-fixtures.sh");
        assert!(pushed.success(), "build-fixtures.sh failed");
        addr
    })
}

/// Image cache shared by every test of the run (images are pulled once, with a file lock).
pub fn shared_cache_dir() -> PathBuf {
    let owner = adapter_user().map_or_else(|| "".into(), |u| format!("-{}", u.name));
    std::env::temp_dir().join(format!("sandbox-libkrun-e2e-cache{owner}"))
}

/// A configuration that reaches the fixture registry; `extra` keys override.
pub fn config_with(state_dir: &Path, extra: Value) -> Value {
    let registry = registry();
    let mut config = json!({
        "registry_mirrors": {"docker.io": registry},
        "insecure_registries": [registry],
        "image_cache_dir": shared_cache_dir(),
        "state_dir": state_dir,
    });
    if let (Some(base), Value::Object(extra)) = (config.as_object_mut(), extra) {
        base.extend(extra);
    }
    config
}

/// How to start the adapter.
#[derive(Debug, Clone)]
pub struct AdapterOptions {
    pub plugin: PluginKind,
    /// `--prefix`; `None` serves under the plugin's own adapter name.
    pub prefix: Option<String>,
    pub worker_name: String,
    pub config_name: String,
    pub env: Vec<(String, String)>,
    /// A binary to run instead of the workspace's, as installed (see `InstalledBinary`).
    pub installed: Option<InstalledBinary>,
}

/// An adapter binary run as Compose installs it: `--plugin <plugin_arg>` (e.g. a bare
/// `bwrap`), and none of the helper variables (`SANDBOX_AGENT_PATH`, `SANDBOX_BWRAP_LAUNCH`,
/// `SANDBOX_LIBKRUN_VM`, `SANDBOX_LIBKRUN_PLUGIN`) set by the harness or inherited.
#[derive(Debug, Clone)]
pub struct InstalledBinary {
    pub binary: PathBuf,
    pub plugin_arg: String,
}

/// The variables a self-contained binary sets for itself (see `InstalledBinary`).
pub const HELPER_VARS: [&str; 4] = [
    "SANDBOX_AGENT_PATH",
    "SANDBOX_BWRAP_LAUNCH",
    "SANDBOX_LIBKRUN_VM",
    "SANDBOX_LIBKRUN_PLUGIN",
];

impl AdapterOptions {
    /// `<prefix>::adapter::info` for the prefix these options serve under.
    fn info_id(&self) -> String {
        let prefix = self.prefix.clone().unwrap_or_else(|| match self.plugin {
            PluginKind::Bwrap => "sandbox-bwrap".into(),
            PluginKind::Libkrun => "sandbox-libkrun".into(),
        });
        format!("{prefix}::adapter::info")
    }
}

impl Default for AdapterOptions {
    fn default() -> Self {
        Self {
            plugin: PluginKind::Bwrap,
            prefix: Some(PREFIX.to_string()),
            worker_name: "sandbox-libkrun".into(),
            config_name: "sandbox-libkrun".into(),
            env: Vec::new(),
            installed: None,
        }
    }
}

/// The adapter as a child process; killed when dropped.
pub struct Adapter {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Adapter {
    pub fn spawn(engine_url: &str, options: &AdapterOptions) -> Adapter {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("adapter.log");
        let log_file = std::fs::File::create(&log).expect("adapter log");
        let binary = options
            .installed
            .as_ref()
            .map_or_else(adapter_bin, |installed| installed.binary.clone());
        let mut command = match adapter_user() {
            // setpriv execs the adapter: the child's pid is the adapter's. With a delegated
            // cgroup (`$SANDBOX_E2E_ADAPTER_CGROUPS`, tests/e2e/delegate-cgroup.sh), a shell
            // as root first moves itself into it, then execs setpriv, as a service manager
            // starts a service in its group.
            Some(user) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(concat!(
                        r#"for group in ${SANDBOX_E2E_ADAPTER_CGROUPS:-}; do "#,
                        r#"echo $$ > "$group/cgroup.procs" || exit 1; done; exec "$@""#
                    ))
                    .args(["sh", "setpriv"])
                    .args([
                        "--reuid",
                        &user.name,
                        "--regid",
                        &user.name,
                        "--init-groups",
                    ])
                    .arg("--")
                    .arg(&binary)
                    .env("HOME", &user.home)
                    .env("USER", &user.name);
                command
            }
            None => Command::new(&binary),
        };
        match &options.installed {
            Some(installed) => {
                command.arg("--plugin").arg(&installed.plugin_arg);
                for var in HELPER_VARS {
                    command.env_remove(var);
                }
            }
            None => {
                command
                    .arg("--plugin")
                    .arg(plugin_path(options.plugin))
                    .env("SANDBOX_AGENT_PATH", agent_bin());
            }
        }
        command
            .env("III_URL", engine_url)
            .env("III_WORKER_NAME", &options.worker_name)
            .env("III_CONFIG_NAME", &options.config_name)
            .env("RUST_LOG", "info")
            .env_remove("III_NAMESPACE")
            .env_remove("III_SANDBOX_WORKER_TOKEN")
            .env_remove("III_DISABLE_TRACE_PAYLOADS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        if let Some(prefix) = &options.prefix {
            command.arg("--prefix").arg(prefix);
        }
        for (key, value) in &options.env {
            command.env(key, value);
        }
        let child = command.spawn().expect("start sandbox-libkrun");
        Adapter {
            child,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the adapter wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `timeout` for the adapter to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `kill -9`: no chance to clean up.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait: the adapter's orderly shutdown.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(Duration::from_secs(30))
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        if self.is_running() {
            self.terminate();
        }
        if self.is_running() {
            self.kill9();
        }
    }
}

/// An engine, an adapter serving `sandbox-libkrun::*` through it, and a client.
pub struct Stack {
    pub engine: EngineHandle,
    pub client: Client,
    pub adapter: Adapter,
    pub state_dir: tempfile::TempDir,
}

impl Stack {
    /// Engine seeded with `config` (built by `config_with` over a fresh state directory when
    /// `None`), adapter started with `options`, ready once `adapter::info` is registered.
    pub async fn start(extra_config: Value, options: AdapterOptions) -> Stack {
        let state_dir = host_dir();
        let config = config_with(state_dir.path(), extra_config);
        let engine = Engine::with_config(options.config_name.clone(), config)
            .start("127.0.0.1:0".parse().unwrap())
            .await
            .expect("start engine");
        let adapter = Adapter::spawn(&engine.url(), &options);
        let client = Client::connect(&engine.url()).await.expect("client");
        let stack = Stack {
            engine,
            client,
            adapter,
            state_dir,
        };
        stack.wait_until_served(&options).await;
        stack
    }

    /// Waits for the adapter's `adapter::info`: the shell registers it last, so every
    /// function is on the bus once it is. 60 s, or `SANDBOX_E2E_START_WAIT_S` (the VM lab,
    /// where loading a debug plugin under emulation takes most of a minute on a busy host).
    async fn wait_until_served(&self, options: &AdapterOptions) {
        let wait = std::env::var("SANDBOX_E2E_START_WAIT_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(Duration::from_secs(60), Duration::from_secs);
        let ready = self
            .client
            .wait_for_function(&options.info_id(), None, wait)
            .await;
        assert!(
            ready.is_ok(),
            "adapter did not register: {ready:?}\n{}",
            self.adapter.log()
        );
    }

    /// Starts a new adapter with `options` over the same engine and state directory, once
    /// the engine has dropped the functions of the previous one (killed or terminated by the
    /// caller), and waits until it serves.
    pub async fn restart_adapter(&mut self, options: &AdapterOptions) {
        let info_id = options.info_id();
        let mut dropped = false;
        for _ in 0..300 {
            let info = self
                .client
                .invoke(
                    "engine::functions::info",
                    json!({ "function_id": info_id }),
                    Duration::from_secs(10),
                )
                .await;
            if info.is_err() {
                dropped = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(dropped, "the engine kept the previous adapter's functions");
        self.adapter = Adapter::spawn(&self.engine.url(), options);
        self.wait_until_served(options).await;
    }

    /// The usual stack: bwrap plugin standing in for `sandbox-libkrun`, default config.
    pub async fn bwrap() -> Stack {
        Self::start(json!({}), AdapterOptions::default()).await
    }

    /// Calls `sandbox-libkrun::<suffix>`.
    pub async fn call(&self, suffix: &str, payload: Value) -> Result<Value, RemoteError> {
        self.client
            .invoke(&format!("{PREFIX}::{suffix}"), payload, call_timeout())
            .await
    }

    /// Whether a new worker's `/state` lives in its layer image (a root adapter with disk
    /// images), where the host sees no file of it, rather than in `workers/<id>/data`.
    pub async fn worker_state_in_image(&self) -> bool {
        let info = self.call("adapter::info", json!({})).await.expect("info");
        info["backend"]["isolation"]["disk"]["worker_state"]
            .as_str()
            .is_some_and(|s| s.starts_with("in the worker's layer image"))
    }
}

/// The S-code of an error answer (its `code`), checking the body carries the same code.
pub fn s_code(error: &RemoteError) -> String {
    let body: Value = serde_json::from_str(&error.message).unwrap_or(Value::Null);
    if let Some(code) = body.get("code").and_then(Value::as_str) {
        assert_eq!(
            code, error.code,
            "body code and error code differ: {error:?}"
        );
    }
    error.code.clone()
}

/// The JSON body of an error answer.
pub fn error_body(error: &RemoteError) -> Value {
    serde_json::from_str(&error.message).unwrap_or(Value::Null)
}

/// Whether this host can run the bwrap backend; prints why not when it cannot.
pub fn bwrap_usable(test: &str) -> bool {
    let has_bwrap = Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .is_ok_and(|n| n.trim() != "0");
    if !(has_bwrap && userns) {
        println!(
            "\n*** {test} DID NOT RUN: needs bubblewrap installed and user namespaces (bwrap backend) ***\n"
        );
    }
    has_bwrap && userns
}

/// `text` without terminal colour sequences (`ESC [ ... m`), as the adapter's log has them.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A directory holding the official Python iii-sdk at the version the fixtures pin
/// (tests/fixtures/iii-sdk-py.txt, with hashes), installed with the host's pip once per test
/// process, for `PYTHONPATH`; or why not (no pip, PyPI not reachable).
pub fn python_sdk() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("sandbox-examples-pysdk-{}", std::process::id()));
        let out = Command::new("/usr/bin/python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--require-hashes", "--only-binary=:all:", "--target"])
            .arg(&dir)
            .arg("-r")
            .arg(repo_root().join("tests/fixtures/iii-sdk-py.txt"))
            .output()
            .map_err(|e| format!("cannot run /usr/bin/python3 -m pip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pip could not install the Python iii-sdk: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(dir)
    })
    .clone()
}
