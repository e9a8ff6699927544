//! `--confine`: the agent runs in a fresh user + mount + pid namespace set made with
//! `unshare` (as the bwrap backend's namespaces would be), and every check is an exec in
//! it. The same setup without `--confine` is the control: it shows each check can fail.
//! The namespace's root is mapped to the host's root here (the tests run as root), the
//! harshest case: only the confinement stands between it and the host's sysctls.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agent_proto::AgentClient;
use common::*;
use tokio::process::Command;

const NAMESPACES: [&str; 7] = [
    "--user",
    "--map-root-user",
    "--mount",
    "--pid",
    "--fork",
    "--mount-proc",
    "--kill-child",
];

/// Docker's default capabilities but CAP_NET_RAW as a CapBnd mask.
const DOCKER_CAPS: u64 = 0xa804_05fb;
const CAP_SYS_ADMIN: u64 = 1 << 21;

/// The agent in fresh namespaces, or `None` (with a loud notice) where this host cannot
/// make them. Once the namespaces work, an agent that does not answer fails the test.
async fn start_in_namespaces(test: &str, confine: bool) -> Option<Agent> {
    let probe = Command::new("unshare")
        .args(NAMESPACES)
        .arg("true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if !matches!(&probe, Ok(s) if s.success()) {
        println!("*** {test} DID NOT RUN: unshare cannot make user+mount+pid namespaces here ({probe:?}) ***");
        return None;
    }
    let mut cmd = Command::new("unshare");
    cmd.args(NAMESPACES).arg(agent_bin());
    if confine {
        cmd.arg("--confine");
    }
    let mut child = cmd
        .arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("unshare starts");
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let client = tokio::time::timeout(Duration::from_secs(10), AgentClient::connect(stdout, stdin))
        .await
        .expect("hello within 10 s")
        .unwrap_or_else(|e| {
            panic!("the agent (confine: {confine}) does not serve in the namespaces: {e}")
        });
    Some(Agent { client, child })
}

/// The value of `Name:` in a /proc/<pid>/status text.
fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} in status:\n{status}"))
}

fn hex(field: &str) -> u64 {
    u64::from_str_radix(field, 16).unwrap_or_else(|_| panic!("not hex: {field}"))
}

/// /proc/self/status of an exec in the agent (of `cat` itself).
async fn exec_status(agent: &Agent) -> String {
    let out = run(agent, spec(&["cat", "/proc/self/status"])).await;
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    text(&out.stdout).to_string()
}

fn own_status() -> String {
    std::fs::read_to_string("/proc/self/status").expect("own status")
}

/// `(mount point, options)` of every mount at /proc/sys, /sys or below /sys, seen by an
/// exec in the agent.
async fn knob_mounts(agent: &Agent) -> Vec<(String, String)> {
    let out = run(
        agent,
        sh(r#"awk '$5 == "/proc/sys" || $5 == "/sys" || index($5, "/sys/") == 1 { print $5, $6 }' /proc/self/mountinfo"#),
    )
    .await;
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(p, o)| (p.to_string(), o.to_string()))
        .collect()
}

fn is_read_only(options: &str) -> bool {
    options.split(',').any(|o| o == "ro")
}

#[tokio::test]
async fn confined_kernel_knobs_are_read_only_and_stay_so() {
    let test = "confined_kernel_knobs_are_read_only_and_stay_so";
    // The agent opens ping_group_range only in a network namespace of its own: this one is
    // the host's, whose knob a root mapped to host root could otherwise write.
    let ping = "/proc/sys/net/ipv4/ping_group_range";
    let ping_before = std::fs::read(ping).expect("host ping_group_range");
    let Some(agent) = start_in_namespaces(test, true).await else {
        return;
    };
    let ping_after = std::fs::read(ping).expect("host ping_group_range");
    if ping_after != ping_before {
        let restored = std::fs::write(ping, &ping_before);
        panic!("the agent changed the host's ping_group_range (restored: {restored:?})");
    }
    let mounts = knob_mounts(&agent).await;
    assert!(
        mounts.iter().any(|(p, _)| p == "/proc/sys"),
        "/proc/sys is its own mount: {mounts:?}"
    );
    for (point, options) in &mounts {
        assert!(is_read_only(options), "{point} is writable: {options}");
    }
    for script in [
        "mount -o remount,rw /proc/sys",
        "mount -o remount,rw /sys",
        "mount -t tmpfs none /tmp",
        "umount /proc/sys",
    ] {
        let out = run(&agent, sh(&format!("{script} 2>&1"))).await;
        assert_ne!(out.exit_code, 0, "`{script}` succeeded");
    }
    // The namespace's root is the host's root here: a write that got through would change
    // the host's setting, so it is put back before the test fails.
    let core_pattern = "/proc/sys/kernel/core_pattern";
    let before = std::fs::read(core_pattern).expect("host core_pattern");
    let out = run(
        &agent,
        sh(&format!("echo confine-test-x > {core_pattern} 2>&1")),
    )
    .await;
    let after = std::fs::read(core_pattern).expect("host core_pattern");
    if after != before {
        let restored = std::fs::write(core_pattern, &before);
        panic!("the sandbox changed the host's core_pattern (restored: {restored:?})");
    }
    assert_ne!(out.exit_code, 0, "the write to core_pattern succeeded");
    // Ordinary work still goes on.
    let out = run(
        &agent,
        sh("echo ok; echo data > /tmp/confine-probe-$$ && rm /tmp/confine-probe-$$"),
    )
    .await;
    assert_eq!((out.exit_code, text(&out.stdout)), (0, "ok\n"));
}

#[tokio::test]
async fn confined_execs_hold_dockers_capabilities_no_new_privs_and_seccomp() {
    let test = "confined_execs_hold_dockers_capabilities_no_new_privs_and_seccomp";
    let Some(agent) = start_in_namespaces(test, true).await else {
        return;
    };
    let status = exec_status(&agent).await;
    let bounding = hex(status_field(&status, "CapBnd"));
    assert_eq!(bounding & CAP_SYS_ADMIN, 0, "CAP_SYS_ADMIN is in CapBnd");
    assert_eq!(bounding, DOCKER_CAPS, "CapBnd {bounding:#x}");
    // uid 0 execs get the bounding set, no more.
    assert_eq!(hex(status_field(&status, "CapEff")), DOCKER_CAPS);
    assert_eq!(hex(status_field(&status, "CapPrm")), DOCKER_CAPS);
    assert_eq!(hex(status_field(&status, "CapInh")), 0);
    assert_eq!(hex(status_field(&status, "CapAmb")), 0);
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    assert_eq!(status_field(&status, "Seccomp"), "2");
    // Seccomp_filters (Linux 5.9+): the agent's filters come on top of any the host has.
    let filters = |status: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
            .and_then(|v| v.trim().parse().ok())
    };
    if let (Some(host), Some(here)) = (filters(&own_status()), filters(&status)) {
        assert!(here > host, "{here} filters, {host} on the host");
    }
    // The agent itself, PID 1 of the namespace, is confined the same way.
    let out = run(&agent, spec(&["cat", "/proc/1/status"])).await;
    let agent_status = text(&out.stdout);
    assert_eq!(hex(status_field(agent_status, "CapBnd")), DOCKER_CAPS);
    assert_eq!(hex(status_field(agent_status, "CapEff")), DOCKER_CAPS);
    assert_eq!(status_field(agent_status, "Seccomp"), "2");
}

#[tokio::test]
async fn confined_sandbox_cannot_make_a_user_namespace() {
    let test = "confined_sandbox_cannot_make_a_user_namespace";
    let Some(agent) = start_in_namespaces(test, true).await else {
        return;
    };
    for script in [
        "unshare -U true",
        "unshare -U -r true",
        "unshare -m true",
        "unshare -n true",
    ] {
        let out = run(&agent, sh(&format!("{script} 2>&1"))).await;
        assert_ne!(out.exit_code, 0, "`{script}` succeeded");
    }
    // Forks and threads still work (libc falls back from clone3 to clone).
    let out = run(&agent, sh("(echo child) & wait; echo parent")).await;
    assert_eq!((out.exit_code, text(&out.stdout)), (0, "child\nparent\n"));
}

/// python3 to run the ctypes probe, as an absolute path (the agent's execs get its
/// default PATH, not the test's).
fn python3() -> Option<String> {
    if Path::new("/usr/bin/python3").exists() {
        return Some("/usr/bin/python3".into());
    }
    let path = std::env::var("PATH").ok()?;
    path.split(':')
        .map(|dir| Path::new(dir).join("python3"))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

/// A python3 script that calls each syscall raw through ctypes and prints
/// `name ret errno` per line, then `threads ok` once a thread ran.
fn syscall_probe(calls: &[(&str, libc::c_long, &[i64])]) -> String {
    let mut script = String::from(
        "import ctypes, os, threading\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.syscall.restype = ctypes.c_long\n\
         def call(name, nr, *args):\n\
         \x20   ctypes.set_errno(0)\n\
         \x20   r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])\n\
         \x20   e = ctypes.get_errno()\n\
         \x20   if r == 0 and name == 'clone_newuser':\n\
         \x20       os._exit(0)\n\
         \x20   print(name, r, e, flush=True)\n",
    );
    for (name, nr, args) in calls {
        let args: Vec<String> = args.iter().map(i64::to_string).collect();
        script.push_str(&format!("call('{name}', {nr}, {})\n", args.join(", ")));
    }
    script.push_str(
        "t = threading.Thread(target=lambda: None)\nt.start()\nt.join()\nprint('threads ok')\n",
    );
    script
}

/// Runs the probe; `None` (with a notice) without python3.
async fn run_probe(
    test: &str,
    agent: &Agent,
    calls: &[(&str, libc::c_long, &[i64])],
) -> Option<Vec<(String, i64, i32)>> {
    let Some(python) = python3() else {
        println!("*** {test} DID NOT RUN: no python3 ***");
        return None;
    };
    let out = run(agent, spec(&[&python, "-c", &syscall_probe(calls)])).await;
    assert_eq!(
        out.exit_code,
        0,
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text(&out.stdout).lines().collect();
    assert_eq!(lines.last(), Some(&"threads ok"), "{lines:?}");
    let results = lines[..lines.len() - 1]
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 3, "{l}");
            (
                f[0].to_string(),
                f[1].parse().expect("ret"),
                f[2].parse().expect("errno"),
            )
        })
        .collect::<Vec<_>>();
    assert_eq!(results.len(), calls.len(), "{results:?}");
    Some(results)
}

const KEYCTL_GET_KEYRING_ID: i64 = 0;
const KEY_SPEC_SESSION_KEYRING: i64 = -3;
const ADDR_NO_RANDOMIZE: i64 = 0x0040000;
const QUERY_PERSONALITY: i64 = 0xffff_ffff;

#[tokio::test]
async fn confined_denied_syscalls_fail_with_eperm() {
    let test = "confined_denied_syscalls_fail_with_eperm";
    let Some(agent) = start_in_namespaces(test, true).await else {
        return;
    };
    let newuser_fork = (libc::CLONE_NEWUSER | libc::SIGCHLD) as i64;
    let calls: &[(&str, libc::c_long, &[i64])] = &[
        ("bpf", libc::SYS_bpf, &[9999, 0, 0]),
        (
            "keyctl",
            libc::SYS_keyctl,
            &[KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0],
        ),
        ("kexec_load", libc::SYS_kexec_load, &[0, 0, 0, 0]),
        ("init_module", libc::SYS_init_module, &[0, 0, 0]),
        ("mount", libc::SYS_mount, &[0, 0, 0, 0, 0]),
        ("setns", libc::SYS_setns, &[0, 0]),
        // clone first: a process already in a new user namespace (without a uid map)
        // could not make another one anyway, and the check would pass for that reason.
        (
            "clone_newuser",
            libc::SYS_clone,
            &[newuser_fork, 0, 0, 0, 0],
        ),
        (
            "unshare_newuser",
            libc::SYS_unshare,
            &[libc::CLONE_NEWUSER as i64],
        ),
        (
            "personality_bad",
            libc::SYS_personality,
            &[ADDR_NO_RANDOMIZE],
        ),
        (
            "personality_query",
            libc::SYS_personality,
            &[QUERY_PERSONALITY],
        ),
        ("clone3", libc::SYS_clone3, &[0, 0]),
    ];
    let Some(results) = run_probe(test, &agent, calls).await else {
        return;
    };
    for (name, ret, errno) in &results {
        let expected = match name.as_str() {
            "personality_query" => continue,
            "clone3" => libc::ENOSYS,
            _ => libc::EPERM,
        };
        assert_eq!((*ret, *errno), (-1, expected), "{name}: {results:?}");
    }
    let query = results
        .iter()
        .find(|(name, _, _)| name == "personality_query");
    assert!(
        matches!(query, Some((_, ret, _)) if *ret >= 0),
        "the personality query is allowed: {results:?}"
    );
}

/// The control: the same namespaces without `--confine` hold everything the checks above
/// deny, so none of them passes by accident.
#[tokio::test]
async fn unconfined_in_namespaces_nothing_is_denied() {
    let test = "unconfined_in_namespaces_nothing_is_denied";
    let Some(agent) = start_in_namespaces(test, false).await else {
        return;
    };
    let status = exec_status(&agent).await;
    let host = own_status();
    // A fresh user namespace holds every capability (of that namespace).
    let bounding = hex(status_field(&status, "CapBnd"));
    assert_ne!(bounding & CAP_SYS_ADMIN, 0, "CapBnd {bounding:#x}");
    assert_ne!(bounding, DOCKER_CAPS);
    assert_eq!(status_field(&status, "NoNewPrivs"), "0");
    assert_eq!(
        status_field(&status, "Seccomp"),
        status_field(&host, "Seccomp")
    );
    let mounts = knob_mounts(&agent).await;
    assert!(
        !mounts.iter().any(|(p, _)| p == "/proc/sys"),
        "/proc/sys is no mount of its own without --confine: {mounts:?}"
    );
    let host_sys_writable = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("own mountinfo")
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.len() > 5 && f[4] == "/sys" && !is_read_only(f[5])
        });
    if host_sys_writable {
        assert!(
            mounts.iter().any(|(p, o)| p == "/sys" && !is_read_only(o)),
            "/sys is writable here without --confine: {mounts:?}"
        );
    }
    let out = run(&agent, sh("unshare -U true 2>&1")).await;
    assert_eq!(out.exit_code, 0, "{}", text(&out.stdout));
    // No write to core_pattern here: it would succeed, and reach the host.
    let calls: &[(&str, libc::c_long, &[i64])] = &[
        (
            "keyctl",
            libc::SYS_keyctl,
            &[KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0],
        ),
        (
            "personality_bad",
            libc::SYS_personality,
            &[ADDR_NO_RANDOMIZE],
        ),
        ("clone3", libc::SYS_clone3, &[0, 0]),
    ];
    let Some(results) = run_probe(test, &agent, calls).await else {
        return;
    };
    for (name, ret, errno) in &results {
        let denied = *ret == -1 && (*errno == libc::EPERM || *errno == libc::ENOSYS);
        assert!(!denied, "{name} is denied without --confine: {results:?}");
    }
}

#[tokio::test]
async fn without_confine_the_agent_is_unchanged() {
    let agent = start_agent().await;
    let status = exec_status(&agent).await;
    let host = own_status();
    for field in ["CapBnd", "CapEff", "NoNewPrivs", "Seccomp"] {
        assert_eq!(
            status_field(&status, field),
            status_field(&host, field),
            "{field}"
        );
    }
}

/// Fail closed: where the lock-down cannot be done (here: no mount namespace of its own,
/// so the binds are refused) the agent exits 1 without a word of protocol.
#[tokio::test]
async fn confine_failure_exits_without_serving() {
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "true"])
        .status()
        .await;
    if !matches!(&probe, Ok(s) if s.success()) {
        println!("*** confine_failure_exits_without_serving DID NOT RUN: no user namespaces ({probe:?}) ***");
        return;
    }
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user"])
        .arg(agent_bin())
        .args(["--confine", "--stdio"])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("unshare runs");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "it spoke: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot confine"), "{stderr}");
}

#[tokio::test]
async fn confine_is_a_leading_flag_only() {
    for args in [
        &["--confine"][..],
        &["--stdio", "--confine"],
        &["--confine", "--confine", "--stdio"],
    ] {
        let out = Command::new(agent_bin())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("agent runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty());
    }
}
