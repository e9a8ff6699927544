//! Per-sandbox ceilings on the bwrap plugin that keep one sandbox from growing the host or
//! starving its neighbours: `/dev` and `/dev/shm` are bounded, the writable layer answers
//! ENOSPC at the defaults (its memory never gets there first), inotify and fanotify are
//! counted per sandbox so another sandbox and the adapter's user keep theirs, and every guest
//! process has an open-file limit it cannot raise.

mod sandbox_support;

use e2e_tests::{adapter_user, bwrap_usable, Stack};
use sandbox_support::disk_fill::{filler, number};
use sandbox_support::{create, exec_ok, sh, stdout};
use serde_json::{json, Value};

const DISK_MB: u64 = 64;

/// `adapter::info`'s `backend.isolation.ceilings`.
async fn ceilings(stack: &Stack) -> Value {
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    let ceilings = info["backend"]["isolation"]["ceilings"].clone();
    println!("ceilings: {ceilings}");
    println!("disk: {}", info["backend"]["isolation"]["disk"]);
    ceilings
}

/// Runs `script` with python3 in sandbox `id`; its stdout, after checking it exited 0 (a
/// program killed for its memory exits 137).
async fn python(stack: &Stack, id: &str, script: &str) -> String {
    let result = exec_ok(
        stack,
        id,
        json!({"argv": ["python3", "-c", script], "timeout_ms": 120_000}),
    )
    .await;
    assert_eq!(result["exit_code"], 0, "{result}\n{}", stack.adapter.log());
    stdout(&result).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_is_read_only_and_dev_shm_shares_the_layers_bound() {
    let test = "dev_is_read_only_and_dev_shm_shares_the_layers_bound";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::start(json!({"default_disk_mb": DISK_MB}), Default::default()).await;
    let id = create(&stack, "python", json!({})).await;

    let out = python(&stack, &id, &filler("/dev/shm/fill")).await;
    println!("/dev/shm: {}", out.replace('\n', " "));
    assert!(out.contains("errno 28 ENOSPC"), "/dev/shm: {out}");
    assert!(number(&out, "written_mb ") <= DISK_MB, "/dev/shm: {out}");

    // The same bound as the layer and /tmp: with /dev/shm full, the others are full too.
    let out = python(&stack, &id, &filler("/tmp/more")).await;
    println!("/tmp with /dev/shm full: {}", out.replace('\n', " "));
    assert!(out.contains("errno 28 ENOSPC"), "/tmp: {out}");
    assert!(number(&out, "written_mb ") <= 2, "/tmp: {out}");

    // Nothing but /dev/shm and /dev/pts takes writes under /dev; devices still work.
    let dev = exec_ok(
        &stack,
        &id,
        sh(
            "echo x > /dev/fill; echo \"file $?\"; mkdir /dev/d; echo \"dir $?\"; \
            echo ok > /dev/null && head -c 4 /dev/zero | wc -c; \
            rm /dev/shm/fill && echo 1 > /dev/shm/small && cat /dev/shm/small",
        ),
    )
    .await;
    let out = stdout(&dev);
    println!("/dev: {out:?} {}", dev["stderr"]);
    assert!(out.contains("file 1") || out.contains("file 2"), "{dev}");
    assert!(out.contains("dir 1"), "{dev}");
    assert!(out.ends_with("4\n1\n"), "{dev}");

    // A pseudo-terminal still opens (/dev/pts is its own mount).
    let out = python(
        &stack,
        &id,
        "import os, pty\nm, s = pty.openpty()\nprint(os.ttyname(s))",
    )
    .await;
    assert!(out.starts_with("/dev/pts/"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn writing_4_gib_at_the_defaults_is_enospc_and_the_program_lives() {
    let test = "writing_4_gib_at_the_defaults_is_enospc_and_the_program_lives";
    if !bwrap_usable(test) {
        return;
    }
    // The defaults: default_memory_mb 512, default_disk_mb 1024.
    let stack = Stack::bwrap().await;
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    println!("disk: {}", info["backend"]["isolation"]["disk"]);
    let id = create(&stack, "python", json!({})).await;
    for target in ["/fill", "/tmp/fill"] {
        // `filler` writes up to 4096 blocks of 1 MiB: 4 GiB.
        let out = python(&stack, &id, &filler(target)).await;
        println!("{target}: {}", out.replace('\n', " "));
        assert!(out.contains("errno 28 ENOSPC"), "{target}: {out}");
        assert!(number(&out, "written_mb ") <= 1024, "{target}: {out}");
        let again = exec_ok(&stack, &id, sh(&format!("rm {target} && echo gone"))).await;
        assert_eq!(stdout(&again), "gone\n", "{again}");
    }
}

/// A python program that takes inotify instances until the kernel refuses (or `most`), then
/// watches files with them until that is refused too, and keeps them all (forked off, so the
/// exec returns); prints `instances N ERR watches M ERR`.
fn inotify_holder(most: u32) -> String {
    format!(
        r#"
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
out = "/tmp/held"
if os.fork() == 0:
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in range(3):
        os.dup2(null, fd)
    instances = []
    while len(instances) < {most}:
        fd = libc.inotify_init1(0)
        if fd < 0:
            break
        instances.append(fd)
    why = errno.errorcode.get(ctypes.get_errno(), "none") if len(instances) < {most} else "most"
    os.makedirs("/tmp/w", exist_ok=True)
    watches, refused, n = 0, "none", 0
    while instances and refused == "none" and watches < 400000:
        path = "/tmp/w/%d" % n
        n += 1
        open(path, "w").close()
        for fd in instances:
            if libc.inotify_add_watch(fd, path.encode(), 2) < 0:
                refused = errno.errorcode.get(ctypes.get_errno(), "?")
                break
            watches += 1
    with open(out + ".part", "w") as f:
        f.write("instances %d %s watches %d %s" % (len(instances), why, watches, refused))
    os.rename(out + ".part", out)
    time.sleep(600)
    os._exit(0)
while not os.path.exists(out):
    time.sleep(0.05)
print(open(out).read())
"#
    )
}

/// One inotify instance with one watch, in python; prints `ok` or the errno's name.
const ONE_WATCH: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
if fd < 0:
    print("instance", errno.errorcode.get(ctypes.get_errno()))
elif libc.inotify_add_watch(fd, b"/tmp", 2) < 0:
    print("watch", errno.errorcode.get(ctypes.get_errno()))
else:
    print("ok")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn one_sandbox_at_its_inotify_maximum_leaves_room_for_another_and_the_adapters_user() {
    let test = "one_sandbox_at_its_inotify_maximum_leaves_room_for_another_and_the_adapters_user";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::bwrap().await;
    let (a, b) = (
        create(&stack, "python", json!({})).await,
        create(&stack, "python", json!({})).await,
    );
    // Taken until refused: the host's own limit (128 by default) ends it at the latest.
    let held = python(&stack, &a, &inotify_holder(100_000)).await;
    println!("sandbox A: {held}");
    assert_eq!(word_after(&held, "instances + 1"), "EMFILE", "{held}");
    assert_eq!(word_after(&held, "watches + 1"), "ENOSPC", "{held}");

    // While A holds all it may: B gets one, and so does the adapter's user on the host.
    let out = python(&stack, &b, ONE_WATCH).await;
    assert_eq!(out.trim(), "ok", "sandbox B, while A holds {held}");
    if let Some(host) = host_one_watch() {
        assert_eq!(host.trim(), "ok", "the adapter's user on the host: {host}");
    }

    // A's maximum is the one `adapter::info` names.
    let ceilings = ceilings(&stack).await;
    for (what, key) in [
        ("instances", "inotify_instances"),
        ("watches", "inotify_watches"),
    ] {
        let most = ceilings[key]
            .as_u64()
            .unwrap_or_else(|| panic!("ceilings.{key}"));
        let took: u64 = word_after(&held, what).parse().expect("a count");
        assert!(
            took >= 1 && took <= most,
            "A took {took} {what} of {most}: {held}"
        );
    }
}

/// The word after `key` in `text` (`key + 1`: the one after that).
fn word_after(text: &str, key: &str) -> String {
    let (key, skip) = match key.strip_suffix(" + 1") {
        Some(key) => (key, 1),
        None => (key, 0),
    };
    text.split_whitespace()
        .skip_while(|w| *w != key)
        .nth(1 + skip)
        .unwrap_or_else(|| panic!("no {key} in {text:?}"))
        .to_string()
}

/// [`ONE_WATCH`] on the host as the adapter's user; none (said) where the host has no
/// python3 to run it.
fn host_one_watch() -> Option<String> {
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        println!("*** the host check DID NOT RUN: no {python} on the host ***");
        return None;
    }
    let mut command = match adapter_user() {
        Some(user) => {
            let mut c = std::process::Command::new("setpriv");
            c.args([
                format!("--reuid={}", user.uid),
                format!("--regid={}", user.gid),
                "--clear-groups".into(),
                python.into(),
            ]);
            c
        }
        None => std::process::Command::new(python),
    };
    let output = command
        .args(["-c", ONE_WATCH])
        .output()
        .expect("host python3");
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_process_opens_files_up_to_its_limit_and_cannot_raise_it() {
    let test = "a_guest_process_opens_files_up_to_its_limit_and_cannot_raise_it";
    if !bwrap_usable(test) {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let script = r#"
import errno, os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))
    raised = "yes"
except (OSError, ValueError):
    raised = "no"
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds, why = [], "none"
try:
    while len(fds) < 2000000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    why = errno.errorcode.get(e.errno)
print("soft", soft)
print("hard", hard)
print("raised", raised)
print("highest", max(fds))
print("stopped", why)
"#;
    let out = python(&stack, &id, script).await;
    println!("{}", out.replace('\n', " "));
    assert!(out.contains("raised no"), "{out}");
    assert!(out.contains("stopped EMFILE"), "{out}");
    let ceilings = ceilings(&stack).await;
    let soft = ceilings["open_files"]["soft"]
        .as_u64()
        .expect("open_files.soft");
    let hard = ceilings["open_files"]["hard"]
        .as_u64()
        .expect("open_files.hard");
    assert_eq!(number(&out, "soft "), soft, "{out}");
    assert_eq!(number(&out, "hard "), hard, "{out}");
    assert_eq!(number(&out, "highest "), hard - 1, "{out}");
    // A shell's child inherits the same limits.
    let shell = exec_ok(&stack, &id, sh("ulimit -Sn; ulimit -Hn")).await;
    assert_eq!(stdout(&shell), format!("{soft}\n{hard}\n"), "{shell}");
}
