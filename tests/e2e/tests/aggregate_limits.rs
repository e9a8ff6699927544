//! What the kernel counts per user or host-wide, held by every sandbox at once (bwrap plugin):
//! `max_concurrent_sandboxes` sandboxes each taking all the inotify instances, watches, open
//! files and processes they may leave the last of them its full share, leave the adapter's
//! user (or, for a root adapter, an unprivileged host user) files and inotify of its own, and
//! leave the host the part of `fs.file-max` the adapter keeps from them. And a guest's file
//! the snapshot store cannot hold (a 60 KB xattr on an ext4 store) makes `snapshot::create`
//! and `fork` S310 naming the file, never S500.

mod sandbox_support;

use e2e_tests::{adapter_user, bwrap_usable, Stack};
use sandbox_support::{create, exec_ok, expect_err, stdout, stdout_of, stop};
use serde_json::{json, Value};

const CAP: usize = 10;
/// Few processes a sandbox, so that every sandbox at its maximum is 10 x 32 x its hard limit
/// files: about 1.3 M at most, held in seconds.
const PIDS: u64 = 32;
/// Files other programs of this shared host may open while the test runs.
const HOST_NOISE: u64 = 50_000;

/// A python program (its soft open-file limit raised to the hard one) that forks a holder
/// (kept after the exec returns) taking inotify
/// instances until refused, watches with all of them until refused, then processes until
/// fork is refused, each opening `/dev/null` until refused; it writes one line,
/// `instances N ERR watches M ERR children C ERR files F stops ERR,ERR,...`, and the exec
/// prints it.
const HOLD_EVERYTHING: &str = r#"
import ctypes, errno, os, resource, time
libc = ctypes.CDLL(None, use_errno=True)
out = "/tmp/held"
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
def why():
    return errno.errorcode.get(ctypes.get_errno(), "?")
if os.fork() == 0:
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in range(3):
        os.dup2(null, fd)
    instances = []
    while len(instances) < 1000000:
        fd = libc.inotify_init1(0)
        if fd < 0:
            break
        instances.append(fd)
    why_instances = why()
    os.makedirs("/tmp/w", exist_ok=True)
    watches, why_watches, n = 0, "none", 0
    while instances and why_watches == "none":
        path = "/tmp/w/%d" % n
        n += 1
        open(path, "w").close()
        for fd in instances:
            if libc.inotify_add_watch(fd, path.encode(), 2) < 0:
                why_watches = why()
                break
            watches += 1
    r, w = os.pipe()
    children, why_fork = 0, "none"
    while True:
        try:
            pid = os.fork()
        except OSError as e:
            why_fork = errno.errorcode.get(e.errno, "?")
            break
        if pid == 0:
            os.close(r)
            opened = 0
            while libc.open(b"/dev/null", 0) >= 0:
                opened += 1
            os.write(w, b"%d %s\n" % (opened, why().encode()))
            time.sleep(600)
            os._exit(0)
        children += 1
    os.close(w)
    lines = []
    with os.fdopen(r) as reports:
        for _ in range(children):
            lines.append(reports.readline().split())
    files = sum(int(l[0]) for l in lines)
    stops = ",".join(sorted(set(l[1] for l in lines)))
    with open(out + ".part", "w") as f:
        f.write("instances %d %s watches %d %s children %d %s files %d stops %s" % (
            len(instances), why_instances, watches, why_watches, children, why_fork, files, stops))
    os.rename(out + ".part", out)
    time.sleep(600)
    os._exit(0)
while not os.path.exists(out):
    time.sleep(0.05)
print(open(out).read())
"#;

/// On the host, as `uid`: 1000 files and an inotify instance with a watch; prints `ok` or
/// what was refused.
const HOST_TAKES_ITS_OWN: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fds = []
try:
    for _ in range(1000):
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("files", errno.errorcode.get(e.errno)); raise SystemExit
fd = libc.inotify_init1(0)
if fd < 0:
    print("instance", errno.errorcode.get(ctypes.get_errno()))
elif libc.inotify_add_watch(fd, b"/tmp", 2) < 0:
    print("watch", errno.errorcode.get(ctypes.get_errno()))
else:
    print("ok")
"#;

/// The word after `key` in `held`, as a number or the word itself.
fn after(held: &str, key: &str, skip: usize) -> String {
    held.split_whitespace()
        .skip_while(|w| *w != key)
        .nth(1 + skip)
        .unwrap_or_else(|| panic!("no {key} in {held:?}"))
        .to_string()
}

fn number(held: &str, key: &str) -> u64 {
    after(held, key, 0)
        .parse()
        .unwrap_or_else(|_| panic!("{key} in {held:?}"))
}

/// `/proc/sys/fs/file-nr`'s allocated handles, and `fs.file-max`.
fn file_nr() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/sys/fs/file-nr").expect("file-nr");
    let fields: Vec<u64> = text
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    (fields[0], fields[2])
}

/// Runs [`HOLD_EVERYTHING`] in `id`; what it holds.
async fn hold(stack: &Stack, id: &str) -> String {
    let result = exec_ok(
        stack,
        id,
        json!({"argv": ["python3", "-c", HOLD_EVERYTHING], "timeout_ms": 120_000}),
    )
    .await;
    assert_eq!(result["exit_code"], 0, "{result}");
    stdout(&result).trim().to_string()
}

/// Checks one sandbox got its whole share, refused by its own limits only.
fn got_its_share(held: &str, ceilings: &Value, which: &str) {
    let share = |key: &str| {
        ceilings[key]
            .as_u64()
            .unwrap_or_else(|| panic!("ceilings.{key}: {ceilings}"))
    };
    // Its own namespace's limit ends it: all of its share, never the host's counter first.
    assert_eq!(after(held, "instances", 1), "EMFILE", "{which}: {held}");
    assert_eq!(
        number(held, "instances"),
        share("inotify_instances"),
        "{which}: {held}"
    );
    assert_eq!(after(held, "watches", 1), "ENOSPC", "{which}: {held}");
    assert_eq!(
        number(held, "watches"),
        share("inotify_watches"),
        "{which}: {held}"
    );
    // Processes until pids.max, each file until its own RLIMIT_NOFILE (EMFILE), never the
    // host's fs.file-max (ENFILE).
    assert_eq!(after(held, "children", 1), "EAGAIN", "{which}: {held}");
    assert_eq!(after(held, "stops", 0), "EMFILE", "{which}: {held}");
    let files = number(held, "files");
    let per_sandbox = ceilings["open_files"]["per_sandbox"].as_u64().unwrap();
    assert!(files <= per_sandbox, "{which}: {files} > {per_sandbox}");
    let hard = ceilings["open_files"]["hard"].as_u64().unwrap();
    let children = number(held, "children");
    // Each child has all but the holder's own descriptors (its std streams, instances, pipe).
    assert!(
        files + children * (share("inotify_instances") + 8) >= children * hard,
        "{which}: {held} (hard {hard})"
    );
}

/// On the host as the adapter's user (a root adapter: `nobody`, which fs.file-max binds as
/// it binds every process without CAP_SYS_ADMIN).
fn host_takes_its_own() -> Option<String> {
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        println!("*** the host check DID NOT RUN: no {python} on the host ***");
        return None;
    }
    let (uid, gid) = adapter_user().map_or((65534, 65534), |u| (u.uid, u.gid));
    let output = std::process::Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
            python.into(),
            "-c".into(),
            HOST_TAKES_ITS_OWN.into(),
        ])
        .current_dir("/")
        .output()
        .expect("setpriv python3");
    Some(format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_sandbox_at_its_maximum_leaves_the_last_one_the_user_and_the_host_theirs() {
    let test = "every_sandbox_at_its_maximum_leaves_the_last_one_the_user_and_the_host_theirs";
    if !bwrap_usable(test) {
        return;
    }
    let started = std::time::Instant::now();
    let stack = Stack::start(
        json!({"max_concurrent_sandboxes": CAP, "max_pids_per_sandbox": PIDS}),
        Default::default(),
    )
    .await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let isolation = &info["backend"]["isolation"];
    let ceilings = isolation["ceilings"].clone();
    println!("ceilings: {ceilings}");
    assert!(ceilings["refused"].is_null(), "{ceilings}");
    let pids_bounded = isolation["limits_in_force"]
        .as_array()
        .is_some_and(|l| l.iter().any(|l| l == "pids"));
    if !pids_bounded {
        println!("*** {test} DID NOT RUN: no pids cgroup here, so no open-file total holds ***");
        return;
    }
    let open_files = &ceilings["open_files"];
    let per_sandbox = open_files["per_sandbox"].as_u64().unwrap();
    let together = open_files["sandboxes_together"].as_u64().unwrap();
    let kept = open_files["file_max"]["kept_from_sandboxes"]
        .as_u64()
        .unwrap();
    assert_eq!(together, per_sandbox * CAP as u64, "{ceilings}");
    assert!(open_files["pids"].as_u64().unwrap() <= PIDS, "{ceilings}");

    let (before, file_max) = file_nr();
    assert!(
        together <= file_max - kept,
        "the sandboxes' files fit above what the host keeps: {ceilings}"
    );
    let ids: Vec<String> =
        futures::future::join_all((0..CAP).map(|_| create(&stack, "python", json!({})))).await;
    // Nine take everything at once, then the last one on its own.
    let held: Vec<String> =
        futures::future::join_all(ids[..CAP - 1].iter().map(|id| hold(&stack, id))).await;
    for (n, held) in held.iter().enumerate() {
        println!("sandbox {n}: {held}");
        got_its_share(held, &ceilings, &format!("sandbox {n}"));
    }
    let last = hold(&stack, &ids[CAP - 1]).await;
    println!("sandbox {}: {last}", CAP - 1);
    got_its_share(&last, &ceilings, "the last sandbox");

    let (after_all, file_max_now) = file_nr();
    let held_files: u64 = held
        .iter()
        .chain(std::iter::once(&last))
        .map(|h| number(h, "files"))
        .sum();
    println!(
        "host: file-nr {before} -> {after_all} of file-max {file_max_now} ({:.1}% -> {:.1}%); \
         the sandboxes hold {held_files} files (at most {together}), {kept} kept for the host",
        before as f64 * 100.0 / file_max_now as f64,
        after_all as f64 * 100.0 / file_max_now as f64,
    );
    assert!(held_files <= together, "{held_files} > {together}");
    assert!(
        after_all.saturating_sub(before) <= together + HOST_NOISE,
        "file-nr grew {} with the sandboxes holding at most {together}",
        after_all - before
    );
    // The host keeps its share of fs.file-max: what was allocated since is the sandboxes'
    // (within their budget) and other programs' noise.
    assert!(
        after_all.saturating_sub(before) <= file_max_now - kept + HOST_NOISE,
        "file-nr grew {} past fs.file-max {file_max_now} less {kept} kept",
        after_all - before
    );
    assert!(
        after_all + kept / 2 <= file_max_now,
        "file-nr {after_all} of {file_max_now}"
    );
    if let Some(host) = host_takes_its_own() {
        assert_eq!(
            host.trim(),
            "ok",
            "the host's user while every sandbox holds all"
        );
    }
    futures::future::join_all(ids.iter().map(|id| stop(&stack, id, true))).await;
    println!("{test}: {:.1} s", started.elapsed().as_secs_f64());
}

/// 60 KB: tmpfs (the sandbox's layer) takes it, ext4 (a store on the host's disk) keeps all of
/// one file's xattrs in one 4 KiB block.
const BIG_XATTR: usize = 60_000;

/// Whether the filesystem of `dir` takes a [`BIG_XATTR`]-byte `user.*` xattr (asked of the
/// host's python3).
fn takes_big_xattr(dir: &std::path::Path) -> bool {
    let probe = format!(
        "import os, sys\np = sys.argv[1] + '/.xattr-probe'\nopen(p, 'w').close()\n\
         try:\n    os.setxattr(p, 'user.x', b'a' * {BIG_XATTR}); print('yes')\n\
         except OSError as e:\n    print('no', e)\nos.remove(p)"
    );
    let output = std::process::Command::new("python3")
        .args(["-c", &probe])
        .arg(dir)
        .output()
        .expect("the host's python3");
    let answer = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("the store's filesystem and a {BIG_XATTR}-byte xattr: {answer}");
    answer.starts_with("yes")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guests_xattr_the_store_cannot_hold_is_s310_naming_the_file() {
    let test = "a_guests_xattr_the_store_cannot_hold_is_s310_naming_the_file";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::start(json!({"max_concurrent_sandboxes": 4}), Default::default()).await;
    let id = create(&stack, "python", json!({})).await;
    let script = format!(
        "import os\nos.makedirs('/work', exist_ok=True)\np = '/work/a\\nb'\n\
         open(p, 'w').write('x')\nos.setxattr(p, 'user.x', b'a' * {BIG_XATTR})\n\
         print(len(os.getxattr(p, 'user.x')))"
    );
    let set = exec_ok(&stack, &id, json!({"argv": ["python3", "-c", script]})).await;
    assert_eq!(stdout(&set).trim(), BIG_XATTR.to_string(), "{set}");
    let store_takes_it = takes_big_xattr(stack.state_dir.path());
    let snapshot = stack
        .call("snapshot::create", json!({"sandbox_id": id, "name": "big"}))
        .await;
    if store_takes_it {
        println!("the store's filesystem takes a {BIG_XATTR}-byte xattr: the snapshot keeps it");
        snapshot.expect("snapshot");
        stop(&stack, &id, true).await;
        return;
    }
    let (code, body) = expect_err(snapshot, "snapshot of a file with a 60 KB xattr");
    println!("snapshot::create: {body}");
    assert_eq!(code, "S310", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    for part in [
        "/work/a\\x0ab",
        &format!("the xattr user.x ({BIG_XATTR} bytes)"),
        "ENOSPC",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert!(!message.contains("/work/a\nb"), "unescaped: {message:?}");
    let (code, body) = expect_err(
        stack
            .call("fork", json!({"sandbox_id": id, "count": 1}))
            .await,
        "fork of a file with a 60 KB xattr",
    );
    assert_eq!(code, "S310", "{body}");
    // Nothing of the refused copies is kept, and without the xattr the snapshot is taken.
    let list = stack.call("snapshot::list", json!({})).await.expect("list");
    assert_eq!(list["used_bytes"], 0, "{list}");
    let out = stdout_of(
        &stack,
        &id,
        "python3 -c \"import os; os.removexattr('/work/a\\nb', 'user.x')\" && echo ok",
    )
    .await;
    assert_eq!(out, "ok\n");
    stack
        .call("snapshot::create", json!({"sandbox_id": id, "name": "big"}))
        .await
        .unwrap_or_else(|e| panic!("snapshot without the xattr: {e:?}"));
    stop(&stack, &id, true).await;
}

/// An ordinary user's adapter whose `max_concurrent_sandboxes` is more than its user's
/// inotify instances can be shared among (a quarter kept for the user's own programs) starts
/// no sandbox: S300 naming the limit, at every create (a root adapter raises the host's limit
/// instead, so this runs as the ordinary user only).
#[tokio::test(flavor = "multi_thread")]
async fn a_cap_the_users_limits_cannot_share_refuses_every_create() {
    let test = "a_cap_the_users_limits_cannot_share_refuses_every_create";
    if !bwrap_usable(test) {
        return;
    }
    if adapter_user().is_none() {
        println!("*** {test} DID NOT RUN: a root adapter raises the host's limits instead ***");
        return;
    }
    let instances: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .expect("max_user_instances")
        .trim()
        .parse()
        .unwrap();
    let stack = Stack::start(
        json!({"max_concurrent_sandboxes": instances}),
        Default::default(),
    )
    .await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let ceilings = &info["backend"]["isolation"]["ceilings"];
    assert_eq!(ceilings["inotify_instances"], 0, "{ceilings}");
    let refused = ceilings["refused"].as_str().unwrap_or_default().to_string();
    assert!(
        refused.contains(&format!("max_inotify_instances ({instances})")),
        "{ceilings}"
    );
    for _ in 0..2 {
        let (code, body) = expect_err(
            stack.call("create", json!({"image": "python"})).await,
            "a create past the user's inotify instances",
        );
        assert_eq!(code, "S300", "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("max_inotify_instances"),
            "{body}"
        );
    }
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(list["in_flight"], 0, "{list}");
}
