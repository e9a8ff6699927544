//! `sandbox-bench`: what a sandbox costs through the engine on the bwrap plugin, against
//! baselines measured in the same run (bare `bwrap`, host spawns, GNU grep, an `iii-sdk` echo
//! function, the agent spoken to directly). Prints one table (median and p95 of each figure
//! and of its baseline, and their ratio), writes it as JSON with every sample, and draws the
//! latency distributions as a PNG. Not a test: it asserts nothing about speed.
//!
//! Usage: `sandbox-bench [--quick] [--iterations N] [--out DIR] [--merge FILE.json]...`
//! (default 20 iterations, `--quick` 5; output in DIR, default `target/bench`: `bench.json`,
//! `bench.png`, `bench.md`). `--merge` adds the rows another bench wrote in the same format
//! (`image-bench --json`). `scripts/bench.sh` runs everything in the right order. Needs the
//! adapter and `plugin-bwrap` built in the same profile as this binary, root and bubblewrap.
//! The static agent comes from `SANDBOX_AGENT_PATH`, else
//! `<target>/<arch>-unknown-linux-gnu/release/sandbox-agent`.

#[path = "../bench_report.rs"]
mod bench_report;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_proto::client::AgentClient;
use agent_proto::{ExecSpec, FsRequest, FsResponse};
use bench_report::Row;
use e2e_tests::{config_with, shared_cache_dir, strip_ansi, Client, PREFIX};
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};

const CALL_TIMEOUT: Duration = Duration::from_secs(120);
const PARALLEL: usize = 32;
const AGENT_IN_SANDBOX: &str = "/.iii-agent";
/// Sandboxes held live for the RSS-per-sandbox row.
const LIVE_FOR_RSS: usize = 8;
/// The fs::grep tree: files of lines (~36 MB), one line in 500 holding `needle<N>`.
const GREP_FILES: usize = 400;
const GREP_LINES: usize = 2000;
const GREP_MATCHES: usize = GREP_FILES * GREP_LINES / 500;
/// Runs the binary as the worker of the baseline functions instead (an internal mode).
const BASELINE_WORKER_ARG: &str = "--baseline-worker";

type BenchResult<T> = Result<T, String>;

struct Options {
    iterations: usize,
    out: PathBuf,
    merge: Vec<PathBuf>,
}

fn options() -> BenchResult<Options> {
    let mut options = Options {
        iterations: 20,
        out: PathBuf::from("target/bench"),
        merge: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--quick" => options.iterations = 5,
            "--iterations" => {
                options.iterations = value("--iterations")?
                    .parse()
                    .map_err(|_| "--iterations takes a number")?
            }
            "--out" => options.out = value("--out")?.into(),
            "--merge" => options.merge.push(value("--merge")?.into()),
            n if n.parse::<usize>().is_ok() => options.iterations = n.parse().unwrap_or(20),
            other => {
                return Err(format!(
                    "unknown argument {other} (see the header of sandbox-bench.rs)"
                ));
            }
        }
    }
    options.iterations = options.iterations.max(2);
    Ok(options)
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    // The baselines' worker runs in a process of its own, as the adapter does, so both cross
    // the same process boundaries (in the caller's process they would answer faster).
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some(BASELINE_WORKER_ARG) {
        let Some(url) = args.next() else {
            eprintln!("sandbox-bench: {BASELINE_WORKER_ARG} needs the engine's URL");
            std::process::exit(2);
        };
        runtime.block_on(serve_baselines(&url));
        return;
    }
    let result = options().and_then(|options| runtime.block_on(bench(options)));
    if let Err(e) = result {
        eprintln!("sandbox-bench: {e}");
        std::process::exit(1);
    }
}

/// Where cargo put this binary, the adapter and the plugin.
fn profile_dir() -> BenchResult<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "no profile directory".into())
}

fn existing(path: PathBuf, hint: &str) -> BenchResult<PathBuf> {
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("{} is missing: {hint}", path.display()))
    }
}

fn agent_path(profile: &Path) -> BenchResult<PathBuf> {
    if let Some(path) = std::env::var_os("SANDBOX_AGENT_PATH") {
        return existing(
            PathBuf::from(path),
            "SANDBOX_AGENT_PATH names a missing file",
        );
    }
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    existing(
        profile
            .join("..")
            .join(target)
            .join("release/sandbox-agent"),
        "build it with agent/build-static.sh or set SANDBOX_AGENT_PATH",
    )
}

/// Engine in process, adapter as a child, one client.
struct Stack {
    _engine: EngineHandle,
    client: Client,
    adapter: Child,
    /// The adapter's stderr: its per-phase timings of each create and stop.
    log: PathBuf,
    _state: tempfile::TempDir,
}

impl Stack {
    /// The engine with `extra` in the adapter's configuration, and the adapter once it
    /// serves; an adapter that exits instead (a refused key) is an error saying so.
    async fn start(profile: &Path, agent: &Path, extra: Value) -> BenchResult<Stack> {
        let state = tempfile::tempdir().map_err(|e| e.to_string())?;
        let config = config_with(state.path(), extra);
        let log = state.path().join("adapter.log");
        let log_file = std::fs::File::create(&log).map_err(|e| format!("adapter log: {e}"))?;
        let engine = Engine::with_config("sandbox-libkrun", config)
            .start("127.0.0.1:0".parse().map_err(|_| "address")?)
            .await
            .map_err(|e| format!("engine: {e}"))?;
        let adapter = Command::new(existing(
            profile.join("sandbox-libkrun"),
            "cargo build -p sandbox-libkrun",
        )?)
        .arg("--plugin")
        .arg(existing(
            profile.join("libplugin_bwrap.so"),
            "cargo build -p plugin-bwrap",
        )?)
        .arg("--prefix")
        .arg(PREFIX)
        .env("III_URL", engine.url())
        .env("III_WORKER_NAME", "sandbox-libkrun")
        .env("III_CONFIG_NAME", "sandbox-libkrun")
        .env("SANDBOX_AGENT_PATH", agent)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("start the adapter: {e}"))?;
        let mut adapter = adapter;
        let client = Client::connect(&engine.url())
            .await
            .map_err(|e| format!("client: {e:?}"))?;
        let info = format!("{PREFIX}::adapter::info");
        let deadline = Instant::now() + Duration::from_secs(60);
        while client
            .wait_for_function(&info, None, Duration::from_millis(500))
            .await
            .is_err()
        {
            if let Ok(Some(status)) = adapter.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                let last = log.lines().last().map(strip_ansi).unwrap_or_default();
                return Err(format!("the adapter exited ({status}): {last}"));
            }
            if Instant::now() > deadline {
                let _ = adapter.kill();
                let _ = adapter.wait();
                return Err("the adapter did not register in 60 s".into());
            }
        }
        Ok(Stack {
            _engine: engine,
            client,
            adapter,
            log,
            _state: state,
        })
    }

    async fn call(&self, suffix: &str, payload: Value) -> BenchResult<Value> {
        self.client
            .invoke(&format!("{PREFIX}::{suffix}"), payload, CALL_TIMEOUT)
            .await
            .map_err(|e| format!("{suffix}: {} {}", e.code, e.message))
    }

    /// Any function of the engine, by its full id.
    async fn invoke(&self, function: &str, payload: Value) -> BenchResult<Value> {
        self.client
            .invoke(function, payload, CALL_TIMEOUT)
            .await
            .map_err(|e| format!("{function}: {} {}", e.code, e.message))
    }

    /// `fs::grep` for `needle` under `path`; every match must be there.
    async fn grep(&self, id: &str, path: &str) -> BenchResult<()> {
        let payload =
            json!({"sandbox_id": id, "path": path, "pattern": "needle", "max_matches": 100_000});
        let result = self.call("fs::grep", payload).await?;
        let found = result["matches"].as_array().map_or(0, Vec::len);
        (found == GREP_MATCHES && result["truncated"] == false)
            .then_some(())
            .ok_or_else(|| format!("fs::grep found {found} matches"))
    }

    async fn create(&self) -> BenchResult<String> {
        self.create_with(json!({"image": "python"})).await
    }

    async fn create_with(&self, payload: Value) -> BenchResult<String> {
        let answer = self.call("create", payload).await?;
        answer["sandbox_id"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| format!("create answered {answer}"))
    }

    async fn exec(&self, id: &str, argv: &[&str]) -> BenchResult<Value> {
        let result = self
            .call("exec", json!({"sandbox_id": id, "argv": argv}))
            .await?;
        if result["exit_code"] != 0 {
            return Err(format!("exec {argv:?}: {result}"));
        }
        Ok(result)
    }

    async fn stop(&self, id: &str) -> BenchResult<()> {
        self.call("stop", json!({"sandbox_id": id, "wait": true}))
            .await
            .map(drop)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.adapter.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.adapter.wait();
    }
}

/// Median of each `key=<ms>` field over the adapter's log lines holding `message`, from
/// line `from` on (ANSI colours stripped).
fn logged_phases(log: &Path, message: &str, from: usize, keys: &[&str]) -> Vec<f64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<String> = text
        .lines()
        .skip(from)
        .filter(|line| line.contains(message))
        .map(strip_ansi)
        .collect();
    keys.iter()
        .map(|key| {
            let prefix = format!("{key}=");
            let mut values: Vec<f64> = lines
                .iter()
                .filter_map(|line| {
                    line.split_whitespace()
                        .find_map(|token| token.strip_prefix(&prefix)?.parse().ok())
                })
                .collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
        })
        .collect()
}

fn log_lines(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |t| t.lines().count())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn spawn_and_wait(program: &str, args: &[&str]) -> BenchResult<()> {
    let status = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("{program}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("{program} {args:?}: {status}"))
}

/// The cached root of the python image (the one holding `python3`).
fn python_root() -> BenchResult<PathBuf> {
    let roots = shared_cache_dir().join("images/roots");
    let entries = std::fs::read_dir(&roots).map_err(|e| format!("{}: {e}", roots.display()))?;
    entries
        .flatten()
        .map(|e| e.path().join("rootfs"))
        .find(|root| {
            ["usr/bin/python3", "usr/local/bin/python3", "bin/python3"]
                .iter()
                .any(|p| root.join(p).exists())
        })
        .ok_or_else(|| format!("no python root under {}", roots.display()))
}

/// bwrap over the image root without the adapter: a tmpfs `/` holding read-only binds of the
/// root's top-level entries (the cached root itself is read-only and has no `/dev`, `/proc`).
fn bare_bwrap_args(root: &Path, extra: &[&str]) -> BenchResult<Vec<String>> {
    let mut args: Vec<String> = ["--unshare-all", "--die-with-parent", "--tmpfs", "/"]
        .map(String::from)
        .to_vec();
    let entries = std::fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
    for entry in entries.flatten() {
        let inside = format!("/{}", entry.file_name().to_string_lossy());
        let path = entry.path();
        match std::fs::read_link(&path) {
            Ok(target) => args.extend(["--symlink".into(), target.display().to_string(), inside]),
            Err(_) => args.extend(["--ro-bind".into(), path.display().to_string(), inside]),
        }
    }
    args.extend(["--dev", "/dev", "--proc", "/proc"].map(String::from));
    args.extend(extra.iter().map(|a| a.to_string()));
    Ok(args)
}

/// bwrap with the agent as PID 1 over the root, spoken to directly (no engine, no adapter).
struct DirectAgent {
    child: tokio::process::Child,
    client: AgentClient,
}

async fn direct_agent(root: &Path, agent: &str) -> BenchResult<DirectAgent> {
    let args = bare_bwrap_args(
        root,
        &[
            // A writable /tmp, as a sandbox has (the grep tree is written there).
            "--tmpfs",
            "/tmp",
            "--ro-bind",
            agent,
            AGENT_IN_SANDBOX,
            "--as-pid-1",
            "--",
            AGENT_IN_SANDBOX,
            "--stdio",
        ],
    )?;
    let mut child = tokio::process::Command::new("bwrap")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("bwrap: {e}"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("bwrap without pipes".into());
    };
    let client = AgentClient::connect(stdout, stdin)
        .await
        .map_err(|e| format!("agent hello: {e}"))?;
    Ok(DirectAgent { child, client })
}

impl DirectAgent {
    async fn exec_true(&self) -> BenchResult<()> {
        let outcome = self
            .client
            .exec(ExecSpec {
                argv: vec!["/bin/true".into()],
                timeout_ms: 60_000,
                max_output_bytes: 1024,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("direct exec: {e}"))?;
        (outcome.exit_code == 0)
            .then_some(())
            .ok_or_else(|| format!("direct exec: {outcome:?}"))
    }

    async fn exec(&self, argv: &[&str]) -> BenchResult<()> {
        let outcome = self
            .client
            .exec(ExecSpec {
                argv: argv.iter().map(|a| a.to_string()).collect(),
                timeout_ms: 120_000,
                max_output_bytes: 64 * 1024,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("direct exec: {e}"))?;
        (outcome.exit_code == 0).then_some(()).ok_or_else(|| {
            let stderr = String::from_utf8_lossy(&outcome.stderr);
            format!("direct exec {argv:?}: exit {} {stderr}", outcome.exit_code)
        })
    }

    async fn grep(&self, path: &str) -> BenchResult<()> {
        match self.client.fs(grep_request(path)).await {
            Ok(FsResponse::Matches { matches, .. }) if matches.len() == GREP_MATCHES => Ok(()),
            other => Err(format!("direct fs grep: {other:?}")),
        }
    }

    async fn end(mut self) {
        let _ = self.client.shutdown().await;
        let _ = self.child.kill().await;
    }
}

/// Milliseconds of each sample.
fn ms_all(samples: &[Duration]) -> Vec<f64> {
    samples.iter().map(|d| ms(*d)).collect()
}

/// Samples of each measure, by name.
#[derive(Default)]
struct Samples(std::collections::BTreeMap<&'static str, Vec<Duration>>);

impl Samples {
    fn add(&mut self, key: &'static str, sample: Duration) {
        self.0.entry(key).or_default().push(sample);
    }

    fn get(&self, key: &str) -> Vec<f64> {
        self.0.get(key).map_or_else(Vec::new, |v| ms_all(v))
    }

    fn median(&self, key: &str) -> f64 {
        bench_report::median(&self.get(key)).unwrap_or(f64::NAN)
    }
}

/// Times `run`, adding the sample under `key`.
async fn timed<T>(
    samples: &mut Samples,
    key: &'static str,
    run: impl std::future::Future<Output = BenchResult<T>>,
) -> BenchResult<T> {
    let start = Instant::now();
    let value = run.await?;
    samples.add(key, start.elapsed());
    Ok(value)
}

/// Resident memory of `pid` in MiB (VmRSS).
fn rss_mib(pid: u32) -> BenchResult<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .ok_or_else(|| format!("no VmRSS for {pid}"))
}

/// Every process below `pid` (not `pid` itself).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The fields after the command's closing parenthesis: state, then the parent.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
        if let Some(ppid) = ppid {
            parents.push((child, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    found.remove(0);
    found
}

/// The python generator of the grep tree, so the sandbox and the host hold the same bytes.
fn grep_tree_script(root: &str) -> String {
    format!(
        "import os\nfor f in range({GREP_FILES}):\n d='{root}/d%02d'%(f%20)\n os.makedirs(d,exist_ok=True)\n \
         t=[('    let needle%d = alpha(%d);\\n'%(l,f)) if (f*{GREP_LINES}+l)%500==0 else \
         ('    filler line %d of file %d: alpha beta gamma\\n'%(l,f)) for l in range({GREP_LINES})]\n \
         open('%s/f%04d.txt'%(d,f),'w').write(''.join(t))\n"
    )
}

fn grep_request(path: &str) -> FsRequest {
    FsRequest::Grep {
        path: path.into(),
        pattern: "needle".into(),
        recursive: true,
        ignore_case: false,
        include_glob: Vec::new(),
        exclude_glob: Vec::new(),
        max_matches: 100_000,
        max_line_bytes: 4096,
    }
}

/// `grep -rn needle` on the host's copy of the tree, its output read (as a caller would).
fn host_grep(root: &Path) -> BenchResult<()> {
    let out = Command::new("grep")
        .args(["-rn", "needle"])
        .arg(root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("grep: {e}"))?;
    let lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
    (lines == GREP_MATCHES)
        .then_some(())
        .ok_or_else(|| format!("grep -rn found {lines} lines"))
}

/// Runs this binary again as the baselines' worker (see `serve_baselines`); killed on drop.
struct BaselineWorker(Child);

impl BaselineWorker {
    fn start(url: &str) -> BenchResult<BaselineWorker> {
        let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
        Command::new(exe)
            .args([BASELINE_WORKER_ARG, url])
            .stdin(Stdio::piped())
            .spawn()
            .map(BaselineWorker)
            .map_err(|e| format!("cannot start the baselines' worker: {e}"))
    }
}

impl Drop for BaselineWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves the baseline functions until its stdin closes (the bench ended or died).
async fn serve_baselines(url: &str) {
    let worker = baseline_worker(url);
    let _ =
        tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
            .await;
    worker.shutdown_async().await;
}

/// The registered `bench::echo`, a bare iii-sdk function answering its input, and
/// `bench::spawn_true`, one that spawns `/bin/true` on the host and answers when it ended:
/// the baseline of an exec through the same engine.
fn baseline_worker(url: &str) -> iii_sdk::IIIClient {
    let metadata = iii_sdk::runtime::WorkerMetadata {
        name: "bench-echo".into(),
        ..Default::default()
    };
    let worker = iii_sdk::register_worker(
        url,
        iii_sdk::InitOptions {
            metadata: Some(metadata),
            identity: iii_sdk::WorkerIdentityMode::Explicit,
            ..Default::default()
        },
    );
    worker.register_function(
        "bench::echo",
        iii_sdk::RegisterFunction::new_async(|input: Value| async move { Ok(input) }),
    );
    worker.register_function(
        "bench::spawn_true",
        iii_sdk::RegisterFunction::new_async(|_: Value| async move {
            let status = tokio::process::Command::new("/bin/true").status().await;
            Ok(json!({"success": status.map(|s| s.success()).unwrap_or(false)}))
        }),
    );
    worker
}

async fn bench(options: Options) -> BenchResult<()> {
    let n = options.iterations;
    let started = Instant::now();
    let profile = profile_dir()?;
    let agent = agent_path(&profile)?;
    let agent_text = agent.display().to_string();
    let stack = Stack::start(&profile, &agent, json!({})).await?;
    let adapter_pid = stack.adapter.id();
    let baselines = BaselineWorker::start(&stack._engine.url())?;
    for function in ["bench::echo", "bench::spawn_true"] {
        stack
            .client
            .wait_for_function(function, None, Duration::from_secs(30))
            .await
            .map_err(|e| format!("{function} did not register: {e:?}"))?;
    }

    // Warm-up: pulls the image once (cached from then on) and loads the python binaries.
    let warm = stack.create().await?;
    stack.exec(&warm, &["python3", "-c", "print(6*7)"]).await?;
    stack.stop(&warm).await?;
    let root = python_root()?;
    let mut idle_rss = Vec::new();
    for _ in 0..5 {
        idle_rss.push(rss_mib(adapter_pid)?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every measure is sampled once per iteration, interleaved, so that the load of a shared
    // machine weighs on each subject and its baseline alike.
    let true_args = bare_bwrap_args(&root, &["/bin/true"])?;
    let true_args: Vec<&str> = true_args.iter().map(String::as_str).collect();
    let py = ["python3", "-c", "print(6*7)"];
    let run_payload = json!({"image": "python", "code": "print(6*7)", "lang": "python"});
    let live = stack.create().await?;
    let direct_live = direct_agent(&root, &agent_text).await?;
    // The same grep tree in the live sandbox, in the direct agent's root and on the host.
    let host_tree = tempfile::tempdir().map_err(|e| e.to_string())?;
    let host_tree_path = host_tree.path().join("tree");
    spawn_and_wait(
        "python3",
        &[
            "-c",
            &grep_tree_script(&host_tree_path.display().to_string()),
        ],
    )?;
    let tree_script = grep_tree_script("/tmp/grep-tree");
    stack.exec(&live, &["python3", "-c", &tree_script]).await?;
    direct_live.exec(&["python3", "-c", &tree_script]).await?;
    let measured_from = log_lines(&stack.log);
    let mut samples = Samples::default();
    let s = &mut samples;
    for _ in 0..n {
        timed(s, "host_true", async { spawn_and_wait("/bin/true", &[]) }).await?;
        timed(s, "bare_bwrap", async {
            spawn_and_wait("bwrap", &true_args)
        })
        .await?;

        let direct = timed(s, "hello", direct_agent(&root, &agent_text)).await?;
        timed(s, "direct_first", direct.exec_true()).await?;
        direct.end().await;
        timed(s, "direct_exec", direct_live.exec_true()).await?;

        timed(s, "rtt", stack.call("adapter::info", json!({}))).await?;
        timed(s, "echo", stack.invoke("bench::echo", json!({"i": 1}))).await?;
        let spawned = timed(
            s,
            "host_true_engine",
            stack.invoke("bench::spawn_true", json!({})),
        );
        if spawned.await?["success"] != true {
            return Err("bench::spawn_true: /bin/true did not succeed".into());
        }
        timed(s, "exec_true", stack.exec(&live, &["/bin/true"])).await?;
        timed(s, "exec_py", stack.exec(&live, &py)).await?;

        timed(s, "grep_host", async { host_grep(&host_tree_path) }).await?;
        timed(s, "grep_engine", stack.grep(&live, "/tmp/grep-tree")).await?;
        timed(s, "grep_direct", direct_live.grep("/tmp/grep-tree")).await?;

        let start = Instant::now();
        let id = stack.create().await?;
        let created = start.elapsed();
        stack.exec(&id, &["/bin/true"]).await?;
        s.add("total", start.elapsed());
        s.add("first", start.elapsed() - created);
        s.add("create", created);
        stack.stop(&id).await?;

        // The same python in a sandbox that never ran it (fresh overlay), as `run` does.
        let id = stack.create().await?;
        timed(s, "fresh_py", stack.exec(&id, &py)).await?;
        stack.stop(&id).await?;

        // Egress: a network namespace with pasta and the policy, against `create` above.
        let net = json!({"image": "python", "network": true});
        let id = timed(s, "create_net", stack.create_with(net)).await?;
        stack.stop(&id).await?;

        let result = timed(s, "run", stack.call("run", run_payload.clone())).await?;
        if result["stdout"] != "42\n" {
            return Err(format!("run answered {result}"));
        }
    }

    // Memory: the adapter's own RSS with sandboxes live, against its idle RSS.
    let mut held = Vec::new();
    for _ in 0..LIVE_FOR_RSS - 1 {
        held.push(stack.create().await?);
    }
    let live_rss = rss_mib(adapter_pid)?;
    let children_rss: f64 = descendants(adapter_pid)
        .into_iter()
        .filter_map(|pid| rss_mib(pid).ok())
        .sum();
    for id in &held {
        stack.stop(id).await?;
    }
    stack.stop(&live).await?;
    direct_live.end().await;

    let create_phases = ["image_ms", "layer_ms", "boot_ms", "hello_ms"];
    let [image_ms, layer_ms, boot_ms, hello_ms] =
        logged_phases(&stack.log, "sandbox created", measured_from, &create_phases)[..]
    else {
        return Err("create phases".into());
    };
    let stop_phases = ["goodbye_ms", "kill_ms", "layer_ms"];
    let [goodbye_ms, kill_ms, unlayer_ms] =
        logged_phases(&stack.log, "sandbox stopped", measured_from, &stop_phases)[..]
    else {
        return Err("stop phases".into());
    };

    let rounds = (n / 5).max(3);
    let mut parallel = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let ids = futures::future::join_all((0..PARALLEL).map(|_| stack.create())).await;
        parallel.push(start.elapsed());
        let ids: Vec<String> = ids.into_iter().collect::<BenchResult<_>>()?;
        // Stopping is not measured, but must finish before the next round.
        for stopped in futures::future::join_all(ids.iter().map(|id| stack.stop(id))).await {
            stopped?;
        }
    }
    let download = download_rows(&stack, rounds).await?;
    let preview = preview_row(&stack, n).await?;
    let snapshots = snapshot_rows(&stack, n, rounds).await;
    drop(baselines);
    drop(stack);
    let warm_pool = warm_pool_row(&profile, &agent, n, &root).await;
    let bus = bus_guard_rows(&profile, &agent, n).await;

    let m = |key: &str| samples.median(key);
    let idle = bench_report::median(&idle_rss).unwrap_or(f64::NAN);
    let per_sandbox = (live_rss - idle) / LIVE_FOR_RSS as f64;
    let create = m("create");
    let mut rows = vec![
        Row::timed(
            "create -> first exec, cold",
            samples.get("total"),
            "bare bwrap --unshare-all /bin/true",
            samples.get("bare_bwrap"),
        )
        .goal("<= 2x")
        .note(format!(
            "create {create:.2} [engine rtt {:.2}, image {image_ms:.2}, layer dir {layer_ms:.2}, \
             spawn {boot_ms:.2}, agent ready {hello_ms:.2}; bare bwrap+agent hello {:.2}] \
             + first exec {:.2} [direct to the agent {:.2}]",
            m("rtt"),
            m("hello"),
            m("first"),
            m("direct_first")
        )),
        warm_pool,
        Row::timed(
            "exec /bin/true in a live sandbox",
            samples.get("exec_true"),
            "host spawn /bin/true in an iii-sdk function, same engine",
            samples.get("host_true_engine"),
        )
        .difference()
        .goal("< +0.3 ms")
        .note(format!(
            "same client, each served by a process of its own; an iii-sdk echo {:.2} + agent \
             exec direct {:.2} + the adapter's own {:.2}",
            m("echo"),
            m("direct_exec"),
            m("exec_true") - m("echo") - m("direct_exec")
        )),
        Row::timed(
            "exec /bin/true, agent spoken to directly",
            samples.get("direct_exec"),
            "host spawn /bin/true",
            samples.get("host_true"),
        )
        .difference()
        .goal("< +0.3 ms")
        .note("the agent in a bare bwrap over the same root, over its pipe; no engine"),
        Row::timed(
            "fs::grep through the engine",
            samples.get("grep_engine"),
            "grep -rn (host, same tree)",
            samples.get("grep_host"),
        )
        .goal("<= 1.0x")
        .note(format!(
            "{GREP_FILES} files, ~36 MB, {GREP_MATCHES} matching lines; \
             agent spoken to directly {:.2} ms",
            m("grep_direct")
        )),
        Row::timed(
            "fs::grep, agent spoken to directly",
            samples.get("grep_direct"),
            "grep -rn (host, same tree)",
            samples.get("grep_host"),
        )
        .goal("<= 1.0x")
        .note("the agent in a bare bwrap over the same root, over its pipe"),
        Row::timed(
            "adapter::info through the engine",
            samples.get("rtt"),
            "iii-sdk echo function, same engine",
            samples.get("echo"),
        )
        .note("both called from the same client, each served by a process of its own"),
        Row::timed(
            "run print(6*7) end to end",
            samples.get("run"),
            "create -> first exec, cold",
            samples.get("total"),
        )
        .note(format!(
            "create {create:.2} + python3 exec in a fresh sandbox {:.2} (in a warm one {:.2}) \
             + code file and teardown {:.2} [teardown: agent goodbye {goodbye_ms:.2}, \
             kill {kill_ms:.2}, layer {unlayer_ms:.2}]",
            m("fresh_py"),
            m("exec_py"),
            m("run") - create - m("fresh_py")
        )),
        Row::timed(
            &format!("{PARALLEL} creates in parallel"),
            ms_all(&parallel),
            &format!("{PARALLEL} x the median create"),
            samples
                .get("create")
                .iter()
                .map(|c| c * PARALLEL as f64)
                .collect(),
        )
        .note(format!(
            "{rounds} rounds; {:.2} ms per sandbox",
            bench_report::median(&ms_all(&parallel)).unwrap_or(f64::NAN) / PARALLEL as f64
        )),
        Row::timed(
            "create with network: true",
            samples.get("create_net"),
            "create, network off",
            samples.get("create"),
        )
        .note("the gate (a namespace and a veth pair behind the sandbox), its nftables policy, pasta and its readiness wait"),
    ];
    rows.extend(download);
    rows.push(preview);
    rows.extend(snapshots);
    rows.extend(bus);
    rows.push(
        Row::single("adapter RSS, idle", "MiB", idle_rss)
            .goal("< 30 MiB")
            .note("VmRSS after a warm-up create, no sandbox live"),
    );
    rows.push(
        Row::single("adapter RSS per live sandbox", "MiB", vec![per_sandbox]).note(format!(
            "{LIVE_FOR_RSS} live: adapter {live_rss:.1} MiB; their processes (launcher, \
             bwrap, agent) {:.1} MiB RSS each, shared pages counted in each",
            children_rss / LIVE_FOR_RSS as f64
        )),
    );
    for file in &options.merge {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        rows.extend(bench_report::rows_from_json(&value));
    }

    let title = format!(
        "sandbox-bench: {n} iterations, bwrap plugin through the engine ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    let table = bench_report::table(&title, &rows);
    println!("\n{table}");
    std::fs::create_dir_all(&options.out).map_err(|e| format!("{}: {e}", options.out.display()))?;
    let write = |name: &str, bytes: &[u8]| {
        let path = options.out.join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("bench.md", table.as_bytes())?;
    let json = serde_json::to_vec_pretty(&bench_report::to_json(&title, &rows))
        .map_err(|e| e.to_string())?;
    write("bench.json", &json)?;
    let png = options.out.join("bench.png");
    bench_report::draw_png(&png, &title, &rows)?;
    println!(
        "written: {} (table), {} (every sample), {} (chart)",
        options.out.join("bench.md").display(),
        options.out.join("bench.json").display(),
        png.display()
    );
    Ok(())
}

/// Sandboxes from a snapshot of one that installed files (about 8 MiB in 200 files under
/// `/opt/deps`) against cold creates, interleaved: create -> first exec (python) for each of
/// `n` iterations, and `fork` of 8 against 8 creates in parallel for `rounds` rounds.
async fn snapshot_rows(stack: &Stack, n: usize, rounds: usize) -> Vec<Row> {
    const FROM_SNAPSHOT: &str = "create from snapshot -> first exec";
    const FORK: &str = "fork 8";
    match snapshot_samples(stack, n, rounds).await {
        Ok(samples) => vec![
            Row::timed(
                FROM_SNAPSHOT,
                samples.from_snapshot,
                "create -> first exec, cold",
                samples.cold,
            )
            .note("python3 -c print(6*7) in a sandbox from a snapshot of ~8 MiB in 200 files"),
            Row::timed(FORK, samples.fork, "8 cold creates in parallel", samples.creates)
                .note(format!(
                    "{rounds} rounds; the copy of the source's layer (~8 MiB) once, then 8 boots; snapshot::create of it {:.2} ms",
                    bench_report::median(&samples.capture).unwrap_or(f64::NAN)
                )),
        ],
        Err(e) => vec![
            Row::missing(FROM_SNAPSHOT, &format!("not available: {e}")),
            Row::missing(FORK, &format!("not available: {e}")),
        ],
    }
}

#[derive(Default)]
struct SnapshotSamples {
    from_snapshot: Vec<f64>,
    cold: Vec<f64>,
    fork: Vec<f64>,
    creates: Vec<f64>,
    capture: Vec<f64>,
}

async fn snapshot_samples(stack: &Stack, n: usize, rounds: usize) -> BenchResult<SnapshotSamples> {
    const FORKED: usize = 8;
    let py = ["python3", "-c", "print(6*7)"];
    let source = stack.create().await?;
    let install = "import os\nos.makedirs('/opt/deps', exist_ok=True)\n\
        for i in range(200):\n    open(f'/opt/deps/m{i}.py', 'wb').write(os.urandom(40960))\n";
    stack.exec(&source, &["python3", "-c", install]).await?;
    let mut samples = SnapshotSamples::default();
    let started = Instant::now();
    stack
        .call(
            "snapshot::create",
            json!({"sandbox_id": source, "name": "bench"}),
        )
        .await?;
    samples.capture.push(ms(started.elapsed()));
    for _ in 0..n {
        for from_snapshot in [true, false] {
            let payload = if from_snapshot {
                json!({"image": "python", "snapshot": "bench"})
            } else {
                json!({"image": "python"})
            };
            let started = Instant::now();
            let id = stack.create_with(payload).await?;
            stack.exec(&id, &py).await?;
            let took = ms(started.elapsed());
            stack.stop(&id).await?;
            if from_snapshot {
                samples.from_snapshot.push(took);
            } else {
                samples.cold.push(took);
            }
        }
    }
    for _ in 0..rounds {
        let started = Instant::now();
        let forked = stack
            .call("fork", json!({"sandbox_id": source, "count": FORKED}))
            .await?;
        samples.fork.push(ms(started.elapsed()));
        let ids: Vec<String> = forked["sandbox_ids"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        for stopped in futures::future::join_all(ids.iter().map(|id| stack.stop(id))).await {
            stopped?;
        }
        let started = Instant::now();
        let created = futures::future::join_all((0..FORKED).map(|_| stack.create())).await;
        samples.creates.push(ms(started.elapsed()));
        let ids: Vec<String> = created.into_iter().collect::<BenchResult<_>>()?;
        for stopped in futures::future::join_all(ids.iter().map(|id| stack.stop(id))).await {
            stopped?;
        }
    }
    stack.stop(&source).await?;
    stack
        .call("snapshot::delete", json!({"name": "bench"}))
        .await?;
    Ok(samples)
}

/// Create -> first exec with `warm_pool: {python: 2}`, against bare bwrap in the same run:
/// before each create the pool is full again; each create must boot nothing
/// (`adapter::info.boots.on_create`). "not available" when the adapter refuses the key.
async fn warm_pool_row(profile: &Path, agent: &Path, n: usize, root: &Path) -> Row {
    const WHAT: &str = "create -> first exec, warm pool";
    match warm_pool_samples(profile, agent, n, root).await {
        Ok(WarmSamples {
            total,
            create,
            bare,
            booted,
        }) => {
            let create = bench_report::median(&create).unwrap_or(f64::NAN);
            let first = bench_report::median(&total).unwrap_or(f64::NAN) - create;
            Row::timed(WHAT, total, "bare bwrap --unshare-all /bin/true", bare)
                .goal("< 0.5x")
                .note(format!(
                    "warm_pool {{python: 2}}, refilled before each create; create {create:.2} + \
                     first exec {first:.2}; boots on create: {booted} of {n}"
                ))
        }
        Err(e) => Row::missing(WHAT, &format!("not available: {e}")),
    }
}

/// Milliseconds of each warm create -> first exec, of its create alone, of the bare bwrap
/// beside it, and how many of the creates booted.
struct WarmSamples {
    total: Vec<f64>,
    create: Vec<f64>,
    bare: Vec<f64>,
    booted: u64,
}

async fn warm_pool_samples(
    profile: &Path,
    agent: &Path,
    n: usize,
    root: &Path,
) -> BenchResult<WarmSamples> {
    let stack = Stack::start(profile, agent, json!({"warm_pool": {"python": 2}})).await?;
    let true_args = bare_bwrap_args(root, &["/bin/true"])?;
    let true_args: Vec<&str> = true_args.iter().map(String::as_str).collect();
    let boots = |info: &Value| info["boots"]["on_create"].as_u64();
    let (mut total, mut create, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    let mut booted = 0;
    for _ in 0..n {
        let deadline = Instant::now() + Duration::from_secs(60);
        let before = loop {
            let info = stack.call("adapter::info", json!({})).await?;
            let pool = &info["warm_pool"]["images"]["python"];
            if pool["ready"].as_u64() >= pool["target"].as_u64()
                && pool["target"].as_u64() > Some(0)
            {
                break boots(&info).ok_or("adapter::info has no boots.on_create")?;
            }
            if Instant::now() > deadline {
                return Err(format!("the pool did not fill in 60 s: {pool}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let start = Instant::now();
        spawn_and_wait("bwrap", &true_args)?;
        bare.push(ms(start.elapsed()));
        let start = Instant::now();
        let id = stack.create().await?;
        create.push(ms(start.elapsed()));
        stack.exec(&id, &["/bin/true"]).await?;
        total.push(ms(start.elapsed()));
        let info = stack.call("adapter::info", json!({})).await?;
        booted += boots(&info).unwrap_or(before) - before;
        stack.stop(&id).await?;
    }
    Ok(WarmSamples {
        total,
        create,
        bare,
        booted,
    })
}

/// The plain-python worker of the network tests (stdlib only), serving one function.
const PY_WORKER: &str = include_str!("../../tests/iii_worker.py");

/// A call from the host to a function a sandbox's program registered through the bus guard,
/// against the same program serving the same function from the host straight to the engine,
/// interleaved; and the guard's share per message (the call goes to the guest and its
/// answer comes back: two messages through the forward and the guard).
async fn bus_guard_rows(profile: &Path, agent: &Path, n: usize) -> Vec<Row> {
    const WHAT: &str = "call a guest-registered function (bus guard)";
    match bus_guard_samples(profile, agent, n.max(20) * 5).await {
        Ok((guest, host)) => {
            let half = |v: &[f64]| v.iter().map(|ms| ms / 2.0).collect::<Vec<_>>();
            vec![
                Row::timed(
                    WHAT,
                    guest.clone(),
                    "the same python worker on the host, straight to the engine",
                    host.clone(),
                )
                .note("python3 stdlib worker (tests/e2e/tests/iii_worker.py) in a network: true sandbox with sandbox_bus_access, its III_URL at the sandbox's localhost"),
                Row::timed(
                    "bus guard + forward, per message",
                    half(&guest),
                    "straight to the engine, per message",
                    half(&host),
                )
                .difference()
                .note("half of each call: the invocation in, the result out"),
            ]
        }
        Err(e) => vec![Row::missing(WHAT, &format!("not available: {e}"))],
    }
}

async fn bus_guard_samples(
    profile: &Path,
    agent: &Path,
    n: usize,
) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let stack = Stack::start(profile, agent, json!({"sandbox_bus_access": true})).await?;
    let url = stack._engine.url();
    let port = url
        .rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse::<u16>().ok())
        .ok_or("the engine's port")?;
    let mut host = Command::new("python3")
        .args(["-c", PY_WORKER, "serve", "bench::host_py", "host"])
        .env("III_URL", &url)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("python3 on the host: {e}"))?;
    let id = stack
        .create_with(json!({"image": "python", "network": true}))
        .await?;
    let served = stack
        .call(
            "exec",
            json!({"sandbox_id": id, "argv": ["/bin/sh", "-c",
                "setsid python3 -c \"$W\" serve bench::guest_py guest </dev/null >/dev/null 2>&1 &"],
                "env": {"W": PY_WORKER, "III_URL": format!("ws://localhost:{port}")}}),
        )
        .await;
    let measured = async {
        served?;
        for function in ["bench::host_py", "bench::guest_py"] {
            stack
                .client
                .wait_for_function(function, None, Duration::from_secs(30))
                .await
                .map_err(|e| format!("{function} did not register: {e:?}"))?;
        }
        let (mut guest, mut host) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n + 5 {
            let start = Instant::now();
            stack.invoke("bench::guest_py", json!({"i": i})).await?;
            let g = ms(start.elapsed());
            let start = Instant::now();
            stack.invoke("bench::host_py", json!({"i": i})).await?;
            // The first calls warm both paths up.
            if i >= 5 {
                guest.push(g);
                host.push(ms(start.elapsed()));
            }
        }
        Ok((guest, host))
    }
    .await;
    let _ = host.kill();
    let _ = host.wait();
    let _ = stack.stop(&id).await;
    measured
}

/// Where the download row's server stands: a network namespace of the bench's own, at a
/// "public" address, serving [`DOWNLOAD_MIB`] MiB to each connection.
const DOWNLOAD_NS: &str = "iiibenchpub";
const DOWNLOAD_ADDR: &str = "198.51.100.10";
const DOWNLOAD_MIB: usize = 100;

/// 100 MiB from the "public" test server: into a `network: true` sandbox (through pasta)
/// against the same download by the host, interleaved. Empty when `ip netns` is unavailable.
async fn download_rows(stack: &Stack, rounds: usize) -> BenchResult<Vec<Row>> {
    let Some(_server) = DownloadServer::start() else {
        return Ok(vec![Row::missing(
            &format!("{DOWNLOAD_MIB} MiB from the \"public\" server"),
            "DID NOT RUN: needs `ip netns` (iproute2) and root",
        )]);
    };
    let client = format!(
        "import socket,time\ns=time.monotonic();c=socket.create_connection(('{DOWNLOAD_ADDR}',9000));n=0\n\
         while True:\n d=c.recv(1<<20)\n if not d: break\n n+=len(d)\n\
         assert n=={DOWNLOAD_MIB}<<20, n\nprint(time.monotonic()-s)"
    );
    let id = stack
        .create_with(json!({"image": "python", "network": true}))
        .await?;
    let (mut host, mut sandbox) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let out = Command::new("python3")
            .args(["-c", &client])
            .output()
            .map_err(|e| format!("download on the host: {e}"))?;
        let seconds: f64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("download on the host: {out:?}"))?;
        host.push(Duration::from_secs_f64(seconds));
        let result = stack.exec(&id, &["python3", "-c", &client]).await?;
        let seconds: f64 = result["stdout"]
            .as_str()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| format!("download in the sandbox: {result}"))?;
        sandbox.push(Duration::from_secs_f64(seconds));
    }
    stack.stop(&id).await?;
    Ok(vec![Row::timed(
        &format!("{DOWNLOAD_MIB} MiB from the \"public\" server"),
        ms_all(&sandbox),
        "the host's own download",
        ms_all(&host),
    )
    .note(format!(
        "through pasta, {rounds} rounds, each timed inside python3"
    ))])
}

/// A GET through a preview URL (`port::expose`: the host's listener relays the connection
/// over the agent link to the server in the sandbox) against the same server on the host.
async fn preview_row(stack: &Stack, n: usize) -> BenchResult<Row> {
    const WHAT: &str = "a GET through a preview URL (port::expose)";
    let server = |port: u16| -> Vec<String> {
        [
            "python3",
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ]
        .map(String::from)
        .to_vec()
    };
    let id = stack.create().await?;
    stack
        .call(
            "exec",
            json!({"sandbox_id": id, "argv": server(8000), "background": true}),
        )
        .await?;
    let host_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let argv = server(host_port);
    let mut host_server = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("the host's server: {e}"))?;
    let exposed = stack
        .call("port::expose", json!({"sandbox_id": id, "port": 8000}))
        .await?;
    let url = exposed["url"]
        .as_str()
        .ok_or_else(|| format!("port::expose answered {exposed}"))?
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let host = format!("127.0.0.1:{host_port}");
    // Both servers answer before anything is timed (they start in the background).
    let get = |addr: &str| -> Result<(), String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        stream
            .write_all(b"GET / HTTP/1.0\r\nHost: bench\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).map_err(|e| e.to_string())?;
        if answer.starts_with(b"HTTP/1.0 200") {
            Ok(())
        } else {
            Err(format!(
                "{addr} answered {:?}",
                String::from_utf8_lossy(&answer)
            ))
        }
    };
    let ready = Instant::now();
    while get(&url).is_err() || get(&host).is_err() {
        if ready.elapsed() > Duration::from_secs(30) {
            let _ = host_server.kill();
            return Err(format!("a server did not answer: {url} {host}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut ours, mut theirs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let start = Instant::now();
        get(&url)?;
        ours.push(start.elapsed());
        let start = Instant::now();
        get(&host)?;
        theirs.push(start.elapsed());
    }
    let _ = host_server.kill();
    let _ = host_server.wait();
    stack.stop(&id).await?;
    Ok(Row::timed(
        WHAT,
        ms_all(&ours),
        "the same server (python3 -m http.server) on the host",
        ms_all(&theirs),
    )
    .note("a new connection per GET, interleaved; the URL's listener is the adapter's"))
}

/// The namespace, its veth and the server; removed when dropped.
struct DownloadServer(Child);

impl DownloadServer {
    fn start() -> Option<DownloadServer> {
        let ip = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let _ = ip(&["netns", "del", DOWNLOAD_NS]);
        let ok = ip(&["netns", "add", DOWNLOAD_NS])
            && ip(&[
                "link", "add", "iiibph", "type", "veth", "peer", "name", "iiibpn",
            ])
            && ip(&["link", "set", "iiibpn", "netns", DOWNLOAD_NS])
            && ip(&["addr", "add", "198.51.100.1/24", "dev", "iiibph"])
            && ip(&[
                "-n",
                DOWNLOAD_NS,
                "addr",
                "add",
                "198.51.100.10/24",
                "dev",
                "iiibpn",
            ])
            && ip(&["link", "set", "iiibph", "up"])
            && ip(&["-n", DOWNLOAD_NS, "link", "set", "iiibpn", "up"])
            // More specific than a prefix a leftover namespace on the host may still route.
            && ip(&["route", "replace", "198.51.100.10/32", "dev", "iiibph"]);
        if !ok {
            let _ = ip(&["netns", "del", DOWNLOAD_NS]);
            return None;
        }
        let server = format!(
            "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('0.0.0.0',9000));s.listen(8);b=b'x'*(1<<20)\n\
             while True:\n c,_=s.accept()\n for i in range({DOWNLOAD_MIB}): c.sendall(b)\n c.close()"
        );
        let child = Command::new("ip")
            .args(["netns", "exec", DOWNLOAD_NS, "python3", "-c", &server])
            .spawn()
            .ok()?;
        std::thread::sleep(Duration::from_millis(500));
        Some(DownloadServer(child))
    }
}

impl Drop for DownloadServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = Command::new("ip")
            .args(["netns", "del", DOWNLOAD_NS])
            .status();
    }
}
