//! `sandbox-bench`: what a sandbox costs through the engine on the bwrap plugin, against
//! baselines measured in the same run (bare `bwrap`, host spawns, the agent spoken to
//! directly). Prints one table of medians with ratios and breakdowns. Not a test: it asserts
//! nothing about speed.
//!
//! Usage: `sandbox-bench [ITERATIONS]` (default 20), after `cargo build` of the adapter and
//! `plugin-bwrap` in the same profile; needs root and bubblewrap. The static agent comes from
//! `SANDBOX_AGENT_PATH`, else `<target>/<arch>-unknown-linux-gnu/release/sandbox-agent`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_proto::client::AgentClient;
use agent_proto::ExecSpec;
use e2e_tests::{config_with, shared_cache_dir, strip_ansi, Client, PREFIX};
use iii_test_engine::{Engine, EngineHandle};
use serde_json::{json, Value};

const CALL_TIMEOUT: Duration = Duration::from_secs(120);
const PARALLEL: usize = 32;
const AGENT_IN_SANDBOX: &str = "/.iii-agent";

type BenchResult<T> = Result<T, String>;

fn main() {
    let iterations = std::env::args()
        .nth(1)
        .map(|n| n.parse::<usize>())
        .transpose()
        .ok()
        .flatten()
        .unwrap_or(20)
        .max(1);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    if let Err(e) = runtime.block_on(bench(iterations)) {
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
    async fn start(profile: &Path, agent: &Path) -> BenchResult<Stack> {
        let state = tempfile::tempdir().map_err(|e| e.to_string())?;
        let config = config_with(state.path(), json!({}));
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
        let client = Client::connect(&engine.url())
            .await
            .map_err(|e| format!("client: {e:?}"))?;
        client
            .wait_for_function(
                &format!("{PREFIX}::adapter::info"),
                None,
                Duration::from_secs(60),
            )
            .await
            .map_err(|e| format!("adapter did not register: {e:?}"))?;
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

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// Samples of each measure, by name.
#[derive(Default)]
struct Samples(std::collections::BTreeMap<&'static str, Vec<Duration>>);

impl Samples {
    fn add(&mut self, key: &'static str, sample: Duration) {
        self.0.entry(key).or_default().push(sample);
    }

    fn median(&self, key: &str) -> Duration {
        median(self.0.get(key).cloned().unwrap_or_default())
    }
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

    async fn end(mut self) {
        let _ = self.client.shutdown().await;
        let _ = self.child.kill().await;
    }
}

struct Row {
    what: String,
    median_ms: f64,
    baseline: String,
    ratio: String,
    breakdown: String,
}

fn print_table(iterations: usize, rows: &[Row]) {
    println!(
        "\nsandbox-bench: medians of {iterations} iterations (bwrap plugin, through the engine)\n"
    );
    println!(
        "| {:<38} | {:>9} | {:<34} | {:>13} | breakdown (median ms)",
        "measurement", "median ms", "baseline (same run)", "ratio"
    );
    println!(
        "|{}|{}|{}|{}|{}",
        "-".repeat(40),
        "-".repeat(11),
        "-".repeat(36),
        "-".repeat(15),
        "-".repeat(40)
    );
    for row in rows {
        println!(
            "| {:<38} | {:>9.2} | {:<34} | {:>13} | {}",
            row.what, row.median_ms, row.baseline, row.ratio, row.breakdown
        );
    }
    println!();
}

async fn bench(n: usize) -> BenchResult<()> {
    let profile = profile_dir()?;
    let agent = agent_path(&profile)?;
    let agent_text = agent.display().to_string();
    let stack = Stack::start(&profile, &agent).await?;

    // Warm-up: pulls the image once (cached from then on) and loads the python binaries.
    let warm = stack.create().await?;
    stack.exec(&warm, &["python3", "-c", "print(6*7)"]).await?;
    stack.stop(&warm).await?;
    let root = python_root()?;

    // Every measure is sampled once per iteration, interleaved, so that the load of a shared
    // machine weighs on each subject and its baseline alike.
    let true_args = bare_bwrap_args(&root, &["/bin/true"])?;
    let true_args: Vec<&str> = true_args.iter().map(String::as_str).collect();
    let py = ["python3", "-c", "print(6*7)"];
    let run_payload = json!({"image": "python", "code": "print(6*7)", "lang": "python"});
    let live = stack.create().await?;
    let direct_live = direct_agent(&root, &agent_text).await?;
    let measured_from = log_lines(&stack.log);
    let mut samples = Samples::default();
    for _ in 0..n {
        let start = Instant::now();
        spawn_and_wait("/bin/true", &[])?;
        samples.add("host_true", start.elapsed());
        let start = Instant::now();
        spawn_and_wait("bwrap", &true_args)?;
        samples.add("bare_bwrap", start.elapsed());

        let start = Instant::now();
        let direct = direct_agent(&root, &agent_text).await?;
        samples.add("hello", start.elapsed());
        let start = Instant::now();
        direct.exec_true().await?;
        samples.add("direct_first", start.elapsed());
        direct.end().await;
        let start = Instant::now();
        direct_live.exec_true().await?;
        samples.add("direct_exec", start.elapsed());

        let start = Instant::now();
        stack.call("adapter::info", json!({})).await?;
        samples.add("rtt", start.elapsed());
        let start = Instant::now();
        stack.exec(&live, &["/bin/true"]).await?;
        samples.add("exec_true", start.elapsed());
        let start = Instant::now();
        stack.exec(&live, &py).await?;
        samples.add("exec_py", start.elapsed());

        let start = Instant::now();
        let id = stack.create().await?;
        let created = start.elapsed();
        stack.exec(&id, &["/bin/true"]).await?;
        samples.add("total", start.elapsed());
        samples.add("first", start.elapsed() - created);
        samples.add("create", created);
        stack.stop(&id).await?;

        // The same python in a sandbox that never ran it (fresh overlay), as `run` does.
        let id = stack.create().await?;
        let start = Instant::now();
        stack.exec(&id, &py).await?;
        samples.add("fresh_py", start.elapsed());
        stack.stop(&id).await?;

        // Egress: a network namespace with pasta and the policy, against `create` above.
        let start = Instant::now();
        let id = stack
            .create_with(json!({"image": "python", "network": true}))
            .await?;
        samples.add("create_net", start.elapsed());
        stack.stop(&id).await?;

        let start = Instant::now();
        let result = stack.call("run", run_payload.clone()).await?;
        if result["stdout"] != "42\n" {
            return Err(format!("run answered {result}"));
        }
        samples.add("run", start.elapsed());
    }
    stack.stop(&live).await?;
    direct_live.end().await;
    let m = |key: &str| samples.median(key);
    let (host_true, bare_bwrap, hello, direct_first) = (
        m("host_true"),
        m("bare_bwrap"),
        m("hello"),
        m("direct_first"),
    );
    let (direct_exec, rtt, exec_true, exec_py) =
        (m("direct_exec"), m("rtt"), m("exec_true"), m("exec_py"));
    let (create, first, total) = (m("create"), m("first"), m("total"));
    let (fresh_py, run) = (m("fresh_py"), m("run"));
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
    let parallel = median(parallel);
    let create_net = m("create_net");
    let download = download_rows(&stack, (n / 5).max(3)).await?;

    let ratio = |a: Duration, b: Duration| format!("{:.2}x", ms(a) / ms(b).max(1e-6));
    let rows = vec![
        Row {
            what: "create -> first exec (cached image)".into(),
            median_ms: ms(total),
            baseline: format!("bare bwrap /bin/true {:.2} ms", ms(bare_bwrap)),
            ratio: format!("{} (goal <=2x)", ratio(total, bare_bwrap)),
            breakdown: format!(
                "create {:.2} [engine rtt {:.2}, image {image_ms:.2}, layer dir {layer_ms:.2}, \
                 spawn {boot_ms:.2}, agent ready {hello_ms:.2}; bare bwrap+agent hello {:.2}] \
                 + first exec {:.2} [direct to the agent {:.2}]",
                ms(create),
                ms(rtt),
                ms(hello),
                ms(first),
                ms(direct_first)
            ),
        },
        Row {
            what: "exec /bin/true in a live sandbox".into(),
            median_ms: ms(exec_true),
            baseline: format!("host spawn /bin/true {:.2} ms", ms(host_true)),
            ratio: format!("+{:.2} ms", ms(exec_true) - ms(host_true)),
            breakdown: format!(
                "engine rtt {:.2} + agent exec direct {:.2} (host spawn {:.2}) + adapter {:.2}",
                ms(rtt),
                ms(direct_exec),
                ms(host_true),
                ms(exec_true) - ms(rtt) - ms(direct_exec)
            ),
        },
        Row {
            what: "run print(6*7) end to end".into(),
            median_ms: ms(run),
            baseline: format!("create->first exec {:.2} ms", ms(total)),
            ratio: ratio(run, total),
            breakdown: format!(
                "create {:.2} + python3 exec in a fresh sandbox {:.2} (in a warm one {:.2}) \
                 + code file and teardown {:.2} [teardown: agent goodbye {goodbye_ms:.2}, \
                 kill {kill_ms:.2}, layer {unlayer_ms:.2}]",
                ms(create),
                ms(fresh_py),
                ms(exec_py),
                ms(run) - ms(create) - ms(fresh_py)
            ),
        },
        Row {
            what: format!("{PARALLEL} creates in parallel ({rounds} rounds)"),
            median_ms: ms(parallel),
            baseline: format!(
                "{PARALLEL} x one create {:.2} ms",
                ms(create) * PARALLEL as f64
            ),
            ratio: ratio(parallel, create * PARALLEL as u32),
            breakdown: format!("{:.2} per sandbox", ms(parallel) / PARALLEL as f64),
        },
        Row {
            what: "create with network: true".into(),
            median_ms: ms(create_net),
            baseline: format!("create, network off {:.2} ms", ms(create)),
            ratio: ratio(create_net, create),
            breakdown: "pasta start + nftables policy + its readiness wait".into(),
        },
    ];
    let mut rows = rows;
    rows.extend(download);
    print_table(n, &rows);
    Ok(())
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
        println!("download row DID NOT RUN: needs `ip netns` (iproute2) and root");
        return Ok(Vec::new());
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
    let (host, sandbox) = (median(host), median(sandbox));
    Ok(vec![Row {
        what: format!("{DOWNLOAD_MIB} MiB from the \"public\" server"),
        median_ms: ms(sandbox),
        baseline: format!("the host's download {:.2} ms", ms(host)),
        ratio: format!("{:.2}x", ms(sandbox) / ms(host).max(1e-6)),
        breakdown: format!("through pasta, {rounds} rounds, each timed inside python3"),
    }])
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
            && ip(&["-n", DOWNLOAD_NS, "link", "set", "iiibpn", "up"]);
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
