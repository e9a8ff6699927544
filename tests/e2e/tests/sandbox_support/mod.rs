//! Helpers shared by the sandbox lifecycle tests (exec, limits, malformed, reaping, orphans,
//! fs): creating sandboxes, calling exec and `fs::*`, and reading the host's /proc about the
//! adapter.

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use e2e_tests::{error_body, s_code, RemoteError, Stack};
use serde_json::{json, Value};

pub mod disk_fill;
pub mod streams;
pub mod veth;

/// Creates a sandbox of `image` with the extra create fields of `extra`; panics with the
/// adapter's log when it fails (creating is not what these tests are about).
pub async fn create(stack: &Stack, image: &str, extra: Value) -> String {
    let mut payload = json!({ "image": image });
    if let (Some(base), Value::Object(extra)) = (payload.as_object_mut(), extra) {
        base.extend(extra);
    }
    let answer = stack
        .call("create", payload)
        .await
        .unwrap_or_else(|e| panic!("create {image}: {e:?}\n{}", stack.adapter.log()));
    answer["sandbox_id"]
        .as_str()
        .expect("create answers a sandbox_id")
        .to_string()
}

/// `exec` in `id` with the fields of `fields` (the command shape, env, ...).
pub async fn exec(stack: &Stack, id: &str, fields: Value) -> Result<Value, RemoteError> {
    let mut payload = json!({ "sandbox_id": id });
    if let (Some(base), Value::Object(fields)) = (payload.as_object_mut(), fields) {
        base.extend(fields);
    }
    stack.call("exec", payload).await
}

/// `exec` that must succeed (exit status aside).
pub async fn exec_ok(stack: &Stack, id: &str, fields: Value) -> Value {
    let shown = fields.to_string();
    exec(stack, id, fields)
        .await
        .unwrap_or_else(|e| panic!("exec {shown}: {e:?}\n{}", stack.adapter.log()))
}

/// `sh -c script` as an exec's fields.
pub fn sh(script: &str) -> Value {
    json!({ "argv": ["/bin/sh", "-c", script] })
}

/// The S-code of a call that must fail, with its body for further checks.
pub fn expect_err(result: Result<Value, RemoteError>, what: &str) -> (String, Value) {
    match result {
        Ok(answer) => panic!("{what}: expected an error, got {answer}"),
        Err(e) => (s_code(&e), error_body(&e)),
    }
}

pub async fn stop(stack: &Stack, id: &str, wait: bool) -> Value {
    stack
        .call("stop", json!({ "sandbox_id": id, "wait": wait }))
        .await
        .unwrap_or_else(|e| panic!("stop {id}: {e:?}"))
}

/// The ids `list` reports as live.
pub async fn live_ids(stack: &Stack) -> Vec<String> {
    let list = stack.call("list", json!({})).await.expect("list");
    list["sandboxes"]
        .as_array()
        .expect("list.sandboxes")
        .iter()
        .filter_map(|s| s["sandbox_id"].as_str().map(String::from))
        .collect()
}

/// Whether `list` shows sandbox `id` and not stopped; the list, for the failure message.
pub async fn listed_serving(stack: &Stack, id: &str) -> (bool, Value) {
    let list = stack.call("list", json!({})).await.expect("list");
    let serving = list["sandboxes"]
        .as_array()
        .expect("list.sandboxes")
        .iter()
        .any(|s| s["sandbox_id"] == id && s["stopped"] == false);
    (serving, list)
}

/// Polls `check` every 100 ms until it holds or `limit` passes; the final verdict.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Entries left in the state directory's `sandboxes/` (one per live or leaked sandbox).
pub fn layers_on_disk(stack: &Stack) -> usize {
    std::fs::read_dir(stack.state_dir.path().join("sandboxes"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

/// A value of `/proc/<pid>/status` in KiB (e.g. `VmHWM`, `VmRSS`).
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// A process identity that survives pid reuse: pid, start time (clock ticks) and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProcess {
    pub pid: u32,
    pub ppid: u32,
    pub start_time: u64,
    pub comm: String,
}

impl HostProcess {
    pub fn read(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (head, tail) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_string();
        let fields: Vec<&str> = tail.split_whitespace().collect();
        // After the name: state(0) ppid(1) ... starttime(19).
        if fields.first() == Some(&"Z") {
            return None; // a zombie holds nothing but its pid
        }
        Some(Self {
            pid,
            ppid: fields.get(1)?.parse().ok()?,
            start_time: fields.get(19)?.parse().ok()?,
            comm,
        })
    }

    /// Still the same, living process.
    pub fn is_alive(&self) -> bool {
        Self::read(self.pid).is_some_and(|now| now.start_time == self.start_time)
    }
}

/// Every living host process descending from `root` (not `root` itself).
pub fn descendants(root: u32) -> Vec<HostProcess> {
    let all: Vec<HostProcess> = std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(HostProcess::read)
                .collect()
        })
        .unwrap_or_default();
    let mut found: Vec<HostProcess> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for process in all.iter().filter(|p| p.ppid == parent) {
            if !found.iter().any(|f| f.pid == process.pid) {
                frontier.push(process.pid);
                found.push(process.clone());
            }
        }
    }
    found
}

/// Where sandbox `id`'s layer records the name of its bwrap cgroup.
pub fn cgroup_file(stack: &Stack, id: &str) -> std::path::PathBuf {
    stack
        .state_dir
        .path()
        .join("sandboxes")
        .join(id)
        .join("cgroup")
}

/// The name of the cgroup the bwrap backend gave sandbox `id`, as its layer records it while
/// the sandbox lives (groups are made ahead of the create, so they are not named after it).
pub fn cgroup_name(stack: &Stack, id: &str) -> String {
    let file = cgroup_file(stack, id);
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{} names no cgroup: {e}", file.display()))
}

/// The bwrap backend's groups named `name` still present on the host, wherever the
/// adapter placed them (each hierarchy's `sandbox-libkrun/`, or beneath the adapter's own
/// delegated group): empty once the sandbox is fully gone.
pub fn cgroups_named(name: &str) -> Vec<PathBuf> {
    cgroup_dirs(&|group| group == name)
}

/// Group `name`'s directories holding a `pids.max` (the v2 group, or the v1 `pids`
/// hierarchy's): one where the pids limit is in force.
pub fn pids_groups(name: &str) -> Vec<PathBuf> {
    cgroups_named(name)
        .into_iter()
        .filter(|dir| dir.join("pids.max").is_file())
        .collect()
}

/// Every cgroup directory under `/sys/fs/cgroup` (all hierarchies, v1 and v2) whose name
/// passes `wanted`; links (`cpu -> cpu,cpuacct`) are not followed, so none is seen twice,
/// and a wanted group is not searched further.
pub fn cgroup_dirs(wanted: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    fn walk(dir: &Path, depth: usize, wanted: &dyn Fn(&str) -> bool, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if wanted(&entry.file_name().to_string_lossy()) {
                found.push(entry.path());
            } else if depth > 0 {
                walk(&entry.path(), depth - 1, wanted, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), 8, wanted, &mut found);
    found
}

/// `fs::<verb>` on sandbox `id` with `fields`.
pub async fn fs(stack: &Stack, verb: &str, id: &str, fields: Value) -> Result<Value, RemoteError> {
    let mut payload = json!({ "sandbox_id": id });
    if let (Some(base), Value::Object(fields)) = (payload.as_object_mut(), fields) {
        base.extend(fields);
    }
    stack.call(&format!("fs::{verb}"), payload).await
}

/// `fs::<verb>` that must succeed.
pub async fn fs_ok(stack: &Stack, verb: &str, id: &str, fields: Value) -> Value {
    let shown = fields.to_string();
    fs(stack, verb, id, fields)
        .await
        .unwrap_or_else(|e| panic!("fs::{verb} {shown}: {e:?}\n{}", stack.adapter.log()))
}

/// `fs::<verb>` that must fail with `code`; its error body.
pub async fn fs_err(stack: &Stack, verb: &str, id: &str, fields: Value, code: &str) -> Value {
    let what = format!("fs::{verb} {fields}");
    let (got, body) = expect_err(fs(stack, verb, id, fields).await, &what);
    assert_eq!(got, code, "{what}: {body}");
    body
}

/// The stdout of a shell script that must exit 0 in sandbox `id`.
pub async fn stdout_of(stack: &Stack, id: &str, script: &str) -> String {
    let result = exec_ok(stack, id, sh(script)).await;
    assert_eq!(result["exit_code"], 0, "{script}: {result}");
    result["stdout"].as_str().unwrap_or_default().to_string()
}

/// An exec result's stdout.
pub fn stdout(result: &Value) -> &str {
    result["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("no stdout in {result}"))
}

/// A shell whose grandchild (own shell, same process group) writes its pid, run with
/// `timeout_ms`: the call is S200 with the partial output, and the grandchild is gone inside
/// the sandbox within `within`. Returns the grandchild's pid.
pub async fn timeout_kills_the_grandchild(
    stack: &Stack,
    id: &str,
    timeout_ms: u64,
    within: Duration,
) -> u32 {
    let mut tree =
        // "started" only once the grandchild has written its pid (a slow guest may take a
        // while to start it).
        sh("sh -c 'echo $$ > /tmp/grandchild.pid; exec sleep 1000' & \
            while [ ! -s /tmp/grandchild.pid ]; do sleep 0.05; done; echo started; wait");
    tree["timeout_ms"] = json!(timeout_ms);
    let (code, body) = expect_err(exec(stack, id, tree).await, "timed-out process tree");
    assert_eq!(code, "S200", "{body}");
    assert_eq!(body["output"]["stdout"], "started\n", "{body}");
    assert_eq!(body["output"]["timed_out"], true, "{body}");
    // Where the iii console reads it: the exec response's shape in `fix`.
    assert_eq!(body["fix"], body["output"], "{body}");
    for key in [
        "stderr",
        "exit_code",
        "duration_ms",
        "success",
        "stdout_truncated",
    ] {
        assert!(body["fix"].get(key).is_some(), "fix.{key}: {body}");
    }
    let pid_file = exec_ok(stack, id, json!({"argv": ["cat", "/tmp/grandchild.pid"]})).await;
    let pid: u32 = stdout(&pid_file)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("grandchild pid: {pid_file}"));
    let gone = eventually(within, || async {
        let probe = exec_ok(
            stack,
            id,
            json!({"argv": ["cat", format!("/proc/{pid}/stat")]}),
        )
        .await;
        probe["exit_code"] != 0
    })
    .await;
    assert!(gone, "grandchild {pid} still alive inside the sandbox");
    pid
}

/// The escape suite (`escape_attacks.py`, run by escape.rs and libkrun.rs): every attack line of the script's output: none escaped, and as many ran as expected.
pub fn assert_all_blocked(output: &str, context: &str) {
    println!("{output}");
    let escaped: Vec<&str> = output.lines().filter(|l| l.contains(" ESCAPED ")).collect();
    assert!(escaped.is_empty(), "escapes: {escaped:#?}\n{context}");
    let blocked = output.lines().filter(|l| l.contains(" blocked ")).count();
    let done = output
        .lines()
        .find_map(|l| l.strip_prefix("done "))
        .unwrap_or_else(|| panic!("the attacks did not finish: {output}\n{context}"));
    let ran: usize = done.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(blocked, ran, "every attack reports: {output}");
    // The fixed attacks (uid map, core_pattern, 8 knobs, 3 mounts, the status checks...),
    // whatever the number of read-only mounts.
    assert!(ran >= 20, "too few attacks ran ({ran}): {output}");
}

/// No process of the adapter `adapter_pid`'s sandboxes (its descendants in a user namespace
/// other than the host's) holds host uid or gid 0 in any of its ids: checked from the host,
/// since a nested namespace's map shows only its parent's ids.
pub fn assert_no_host_root_in_sandboxes(adapter_pid: u32) {
    let host_userns = std::fs::read_link("/proc/self/ns/user").unwrap();
    let mut seen = 0;
    for pid in descendants(adapter_pid).into_iter().map(|p| p.pid) {
        let Ok(userns) = std::fs::read_link(format!("/proc/{pid}/ns/user")) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        if userns == host_userns {
            continue;
        }
        seen += 1;
        for key in ["Uid:", "Gid:"] {
            let line = status
                .lines()
                .find(|l| l.starts_with(key))
                .unwrap_or_default();
            assert!(
                !line.split_whitespace().skip(1).any(|id| id == "0"),
                "sandbox process {pid} holds host {key} 0: {line}"
            );
        }
    }
    assert!(
        seen > 0,
        "no sandbox process of adapter {adapter_pid} found"
    );
}

/// A host file an attack would change, with what it held.
pub struct Canary {
    pub path: PathBuf,
    pub content: Vec<u8>,
    modified: SystemTime,
}

impl Canary {
    pub fn plant(dir: &Path, name: &str) -> Canary {
        let path = dir.join(name);
        std::fs::write(&path, format!("canary {name}: untouched\n")).unwrap();
        Canary::of(&path)
    }

    pub fn of(path: &Path) -> Canary {
        Canary {
            path: path.to_path_buf(),
            content: std::fs::read(path).unwrap(),
            modified: std::fs::metadata(path).unwrap().modified().unwrap(),
        }
    }

    pub fn assert_untouched(&self) {
        self.assert_untouched_when("after the attacks");
    }

    /// The canary kept its content and mtime; `when` says at which step of a test.
    pub fn assert_untouched_when(&self, when: &str) {
        let now = Canary::of(&self.path);
        assert_eq!(
            String::from_utf8_lossy(&now.content),
            String::from_utf8_lossy(&self.content),
            "{when}: {} changed",
            self.path.display()
        );
        assert_eq!(
            now.modified,
            self.modified,
            "{when}: {} was written",
            self.path.display()
        );
    }

    /// `text` (a reply, a log) does not hold the canary's content: it was not read out.
    pub fn assert_not_in(&self, text: &str, when: &str) {
        let content = String::from_utf8_lossy(&self.content);
        assert!(
            !text.contains(content.trim()),
            "{when}: {} leaked: {text}",
            self.path.display()
        );
    }
}

/// `dir` holds exactly `names` (an attack left nothing new in a host directory).
pub fn assert_only_entries(dir: &Path, names: &[&str]) {
    let mut entries: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, names, "nothing new in {}", dir.display());
}

/// Every file under `dir` named `name` (a sandbox's write must not land in the image cache;
/// the escape suite's plants, see [`assert_plants_out_of_reach`]).
pub fn find_named(dir: &Path, name: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name() == name {
                found.push(path.display().to_string());
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            }
        }
    }
    found
}

/// What `escape_attacks.py` names the setuid files it plants for a host user.
pub const PLANT: &str = ".escape-plant-suid";

/// The second half of the plant attack, run on the host while the guest's layer and `/state`
/// still exist: `nobody` tries to reach each setuid file the guest planted under the state
/// directory. Each must be out of its reach, or (a root bwrap adapter, whose sandboxes are
/// subordinate host ids) owned by neither host root nor the adapter's user, so running it
/// gains nothing. Returns how many plants were found.
pub fn assert_plants_out_of_reach(state_dir: &Path, adapter_pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{adapter_pid}/status")).unwrap();
    let adapter_uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
        .expect("the adapter's uid");
    // The state directory as an operator may well leave it (0755, like /var/lib): only what
    // the adapter makes beneath it decides. (The tests' own is a private temporary one.)
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state_dir).unwrap().permissions().mode();
    std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plants = find_named(state_dir, PLANT);
    for plant in &plants {
        let seen = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["stat", "-c", "%u %a"])
            .arg(plant)
            .output()
            .expect("setpriv runs");
        let shown = String::from_utf8_lossy(&seen.stdout).trim().to_string();
        let why = String::from_utf8_lossy(&seen.stderr).trim().to_string();
        println!("plant {plant}: as nobody {shown:?} {why}");
        if seen.status.success() {
            let owner: u32 = shown.split_whitespace().next().unwrap().parse().unwrap();
            assert!(
                owner != 0 && owner != adapter_uid,
                "another host user reaches a setuid file of uid {owner} a guest planted: \
                 {plant} ({shown})"
            );
        } else {
            assert!(why.contains("Permission denied"), "{plant}: {why}");
        }
    }
    std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(mode)).unwrap();
    plants.len()
}

/// The host process the adapter recorded for sandbox `id`: bwrap, or the VM runner.
pub fn recorded_process(stack: &Stack, id: &str) -> u32 {
    let recorded = stack
        .state_dir
        .path()
        .join("sandboxes")
        .join(id)
        .join("process");
    std::fs::read_to_string(&recorded)
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no process recorded in {}", recorded.display()))
}

/// The agent of bwrap sandbox `id`: the process named after the agent's path under the
/// sandbox process its layer records.
pub fn agent_pid(stack: &Stack, id: &str) -> u32 {
    let bwrap = recorded_process(stack, id);
    descendants(bwrap)
        .into_iter()
        .find(|p| p.comm == ".iii-agent")
        .unwrap_or_else(|| panic!("no agent under bwrap {bwrap}"))
        .pid
}

/// A program that counts as fast as it can, publishing its count in `/tmp/count` every
/// 20000 steps; prints its pid.
pub const BUSY_COUNTER: &str = "python3 -c 'import os
i = 0
while True:
    i += 1
    if i % 20000 == 0:
        with open(\"/tmp/count.tmp\", \"w\") as f:
            f.write(str(i))
        os.replace(\"/tmp/count.tmp\", \"/tmp/count\")
' </dev/null >/dev/null 2>&1 &
echo $!";

/// User and system CPU ticks of `pid` (all its threads) as the host's /proc counts them;
/// `None` once it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, tail) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = tail.split_whitespace().collect();
    // After the name: state(0) ... utime(11) stime(12).
    let field = |n: usize| {
        fields
            .get(n)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(field(11) + field(12))
}

/// The host paths of the adapter's that no guest's `/proc/self/mountinfo` may name: its state
/// and shared cache, its user's home, its binaries and the agent's directory.
pub fn adapter_host_paths(stack: &Stack) -> Vec<PathBuf> {
    let home = match e2e_tests::adapter_user() {
        Some(user) => user.home,
        None => std::env::var_os("HOME").map_or_else(|| "/root".into(), Into::into),
    };
    let agent = e2e_tests::agent_bin();
    let agent_dir = agent
        .parent()
        .expect("the agent is in a directory")
        .to_path_buf();
    vec![
        stack.state_dir.path().to_path_buf(),
        e2e_tests::shared_cache_dir(),
        home,
        e2e_tests::bin_dir(),
        agent,
        agent_dir,
    ]
}

/// The lines of `mountinfo` that name one of [`adapter_host_paths`], each with the path.
pub fn lines_naming_host_paths<'a>(stack: &Stack, mountinfo: &'a str) -> Vec<(String, &'a str)> {
    let mut named = Vec::new();
    for path in adapter_host_paths(stack) {
        let path = path.display().to_string();
        assert!(path.len() > 1, "{path} is too short to look for");
        named.extend(
            mountinfo
                .lines()
                .filter(|line| names_path(line, &path))
                .map(|line| (path.clone(), line)),
        );
    }
    named
}

/// Whether a mountinfo line names `path` or a path below it, in any field or mount option
/// (`lowerdir=/a:/b`): as a whole path, so `/dev/root` (a virtio-fs tag) is not `/root`.
pub fn names_path(line: &str, path: &str) -> bool {
    let below = format!("{path}/");
    line.split(|c: char| c.is_whitespace() || matches!(c, ',' | '=' | ':'))
        .any(|word| word == path || word.starts_with(&below))
}
