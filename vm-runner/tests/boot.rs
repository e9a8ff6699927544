//! Boots real microVMs through `sandbox-libkrun-vm` with a busybox root.
//!
//! Where this host cannot boot them (no KVM, PVM-only KVM, no libkrunfw) the boot checks
//! do not run and say so on stderr, and `unfit_host_is_refused_with_its_reason` checks the
//! runner's fast refusal instead. `tests/vm-lab/run-tests.sh` runs this same binary inside
//! the VM lab, where KVM works.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{busybox_root, run, spec, static_busybox, REBOOT_PAUSE};
use tempfile::TempDir;

/// Says loudly (past the test harness's capture) that a test did not run its checks.
fn not_run(test: &str, why: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "NOT RUN here: vm-runner boot check `{test}`: {why}"
    );
}

/// A temp dir and a busybox guest root in it, or `None` when no VM can boot here.
fn guest(test: &str) -> Option<(TempDir, PathBuf)> {
    if let Err(reason) = vm_runner::host_can_boot() {
        not_run(
            test,
            &format!("{reason} (tests/vm-lab/run-tests.sh runs it in the VM lab)"),
        );
        return None;
    }
    let busybox = static_busybox().expect("KVM works but no busybox: run tests/vm-lab/install.sh");
    let dir = tempfile::tempdir().unwrap();
    let root = busybox_root(dir.path(), &busybox);
    Some((dir, root))
}

#[test]
fn bad_spec_is_refused_before_any_vm_call() {
    let dir = tempfile::tempdir().unwrap();
    let missing_root = dir.path().join("no-such-root");
    let out = run(dir.path(), &spec(&missing_root, "/bin/true", &[]));
    assert_eq!(out.code, Some(vm_runner::exit::BAD_SPEC));
    assert!(
        out.stderr.contains("is not an existing directory"),
        "{}",
        out.stderr
    );
}

#[test]
fn unfit_host_is_refused_with_its_reason() {
    let Err(reason) = vm_runner::host_can_boot() else {
        not_run(
            "unfit_host_is_refused_with_its_reason",
            "this host CAN boot microVMs, so there is no refusal to check",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &spec(dir.path(), "/bin/true", &[]));
    assert_eq!(out.code, Some(vm_runner::exit::HOST_UNFIT));
    assert!(out.stderr.contains(&reason.to_string()), "{}", out.stderr);
    not_run(
        "all boot checks",
        &format!("refused in {:.1?} as expected: {reason}", out.elapsed),
    );
}

#[test]
fn echo_reaches_stdout_and_exit_zero_propagates() {
    let Some((dir, root)) = guest("echo_reaches_stdout_and_exit_zero_propagates") else {
        return;
    };
    let out = run(
        dir.path(),
        &spec(&root, "/bin/echo", &["hello from the guest"]),
    );
    assert_eq!(out.code, Some(0));
    assert!(out.lines().contains(&"hello from the guest"), "{out:?}");
}

#[test]
fn exit_codes_7_and_42_propagate_and_console_log_captures() {
    let Some((dir, root)) = guest("exit_codes_7_and_42_propagate_and_console_log_captures") else {
        return;
    };
    let console_log = dir.path().join("console.log");
    for code in [7, 42] {
        let script = format!("echo console-line-{code}; exit {code}");
        let mut vm = spec(&root, "/bin/sh", &["-c", &script]);
        // The second VM also checks that console_log takes the console away from stdout.
        if code == 42 {
            vm["console_log"] = json!(console_log);
        }
        let out = run(dir.path(), &vm);
        assert_eq!(out.code, Some(code), "{out:?}");
        let on_stdout = out
            .lines()
            .contains(&format!("console-line-{code}").as_str());
        assert_eq!(on_stdout, code == 7, "{out:?}");
    }
    let logged = std::fs::read_to_string(&console_log).unwrap();
    assert!(
        logged.lines().any(|l| l.trim_end() == "console-line-42"),
        "{logged:?}"
    );
}

#[test]
fn quotes_spaces_and_environment_survive() {
    let Some((dir, root)) = guest("quotes_spaces_and_environment_survive") else {
        return;
    };
    let tricky = [
        r#"a "b c" d"#,
        "  two  spaces  ",
        "it's",
        r"back\slash",
        "tab\there",
    ];
    let mut argv = vec![
        "-c",
        r#"for a in "$@"; do echo "[$a]"; done; echo "<$GREETING>"; pwd"#,
        "sh",
    ];
    argv.extend(tricky);
    let mut vm = spec(&root, "/bin/sh", &argv);
    vm["env"] = json!({"GREETING": "hello \"world\"  'x'"});
    vm["workdir"] = json!("/tmp");
    let out = run(dir.path(), &vm);
    assert_eq!(out.code, Some(0), "{out:?}");
    let mut expected: Vec<String> = tricky.iter().map(|a| format!("[{a}]")).collect();
    expected.push("<hello \"world\"  'x'>".into());
    expected.push("/tmp".into());
    let printed: Vec<String> = out
        .stdout
        .lines()
        .map(|l| l.trim_end_matches('\r').to_owned())
        .filter(|l| l.starts_with('[') || l.starts_with('<') || l == "/tmp")
        .collect();
    assert_eq!(printed, expected);
}

#[test]
fn read_only_share_refuses_writes_and_writable_share_reaches_host() {
    let Some((dir, root)) = guest("read_only_share_refuses_writes_and_writable_share_reaches_host")
    else {
        return;
    };
    let ro = dir.path().join("ro");
    let rw = dir.path().join("rw");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::create_dir_all(&rw).unwrap();
    std::fs::write(ro.join("given.txt"), "from the host\n").unwrap();
    let script = "cat /mnt/ro/given.txt; \
        if echo x > /mnt/ro/new.txt; then echo RO-WRITE-ALLOWED; else echo ro-write-refused; fi; \
        echo 'written by the guest' > /data/out/result.txt";
    let mut vm = spec(&root, "/bin/sh", &["-c", script]);
    vm["shares"] = json!([
        {"tag": "ro", "host_path": ro, "guest_path": "/mnt/ro", "read_only": true},
        {"tag": "rw", "host_path": rw, "guest_path": "/data/out"}
    ]);
    let out = run(dir.path(), &vm);
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines = out.lines();
    assert!(lines.contains(&"from the host"), "{out:?}");
    assert!(lines.contains(&"ro-write-refused"), "{out:?}");
    assert!(!ro.join("new.txt").exists());
    let written = std::fs::read_to_string(rw.join("result.txt")).unwrap();
    assert_eq!(written, "written by the guest\n");
}

#[test]
fn root_overlay_takes_the_writes_and_leaves_lower_and_host_untouched() {
    let test = "root_overlay_takes_the_writes_and_leaves_lower_and_host_untouched";
    let Some((dir, lower)) = guest(test) else {
        return;
    };
    // Run by an ordinary user, the runner mounts the overlay from a user namespace of its own.
    let root =
        std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    let user_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .is_ok_and(|n| n.trim() != "0");
    if !root && !user_namespaces {
        not_run(test, "mounting the overlay needs root or user namespaces");
        return;
    }
    std::fs::write(lower.join("etc/lower.txt"), "from the lower layer\n").unwrap();
    let [upper, work, mount_point] = ["upper", "work", "merged"].map(|d| dir.path().join(d));
    for d in [&upper, &work, &mount_point] {
        std::fs::create_dir(d).unwrap();
    }
    let script = "cat /etc/lower.txt; echo new > /etc/guest.txt; rm /etc/lower.txt; \
        ls /etc/lower.txt 2>/dev/null || echo removed";
    let mut vm = spec(&mount_point, "/bin/sh", &["-c", script]);
    vm["root_overlay"] = json!({"lower": lower, "upper": upper, "work": work});
    let out = run(dir.path(), &vm);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.lines(), ["from the lower layer", "removed"], "{out:?}");
    assert_eq!(
        std::fs::read_to_string(lower.join("etc/lower.txt")).unwrap(),
        "from the lower layer\n",
        "the lower layer is never written"
    );
    assert!(!lower.join("etc/guest.txt").exists());
    assert_eq!(
        std::fs::read_to_string(upper.join("etc/guest.txt")).unwrap(),
        "new\n"
    );
    let whiteout = std::fs::symlink_metadata(upper.join("etc/lower.txt")).unwrap();
    assert!(
        std::os::unix::fs::FileTypeExt::is_char_device(&whiteout.file_type()),
        "the removal is an overlay whiteout in upper"
    );
    assert_eq!(
        std::fs::read_dir(&mount_point).unwrap().count(),
        0,
        "the mount lived only in the runner's namespace"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(mount_point.to_str().unwrap()), "{mounts}");
}

/// Free bytes of the filesystem holding `path` (`stat -f`: available blocks, block size).
fn free_bytes(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%a %S"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    fields.next().unwrap() * fields.next().unwrap()
}

#[test]
fn a_bounded_root_fills_to_enospc_in_a_tmpfs_and_the_host_pays_nothing() {
    let test = "a_bounded_root_fills_to_enospc_in_a_tmpfs_and_the_host_pays_nothing";
    let Some((dir, lower)) = guest(test) else {
        return;
    };
    std::fs::write(lower.join("etc/lower.txt"), "from the lower layer\n").unwrap();
    let [disk, mount_point] = ["disk", "merged"].map(|d| dir.path().join(d));
    for d in [&disk, &mount_point] {
        std::fs::create_dir(d).unwrap();
    }
    // The overlay works on the tmpfs (a write, a whiteout), then a 64 MiB fill of a 16 MiB
    // layer stops at ENOSPC, and once the fill is removed the guest writes again.
    let script = "echo new > /etc/guest.txt && cat /etc/guest.txt; rm /etc/lower.txt; \
        ls /etc/lower.txt 2>/dev/null || echo removed; \
        dd if=/dev/zero of=/fill bs=1M count=64 2>&1 | grep -o 'No space left on device'; \
        rm /fill && echo again > /again.txt && cat /again.txt";
    let mut vm = spec(&mount_point, "/bin/sh", &["-c", script]);
    vm["root_overlay"] = json!({
        "lower": lower, "upper": disk.join("upper"), "work": disk.join("work"), "size_mib": 16,
    });
    let free_before = free_bytes(dir.path());
    let out = run(dir.path(), &vm);
    let free_after = free_bytes(dir.path());
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(
        out.lines(),
        ["new", "removed", "No space left on device", "again"],
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_dir(&disk).unwrap().count(),
        0,
        "the layer lived in the runner's tmpfs only"
    );
    let paid = free_before.saturating_sub(free_after);
    println!("host free before {free_before}, after {free_after}: paid {paid} bytes");
    assert!(paid < 8 << 20, "the host's filesystem paid {paid} bytes");
}

#[test]
fn vsock_round_trip_in_both_directions() {
    let Some((dir, root)) = guest("vsock_round_trip_in_both_directions") else {
        return;
    };
    let host_sock = dir.path().join("host-listens.sock");
    let guest_sock = dir.path().join("guest-listens.sock");

    // Host listens: the guest connects to CID 2 port 2001 and gets "pong:" + its line. Every
    // connection is answered, so a boot again after a lab guest reset that came after the
    // guest's connection is answered too.
    let listener = UnixListener::bind(&host_sock).unwrap();
    let (lines_heard, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut line = String::new();
            let Ok(reading) = conn.try_clone() else {
                continue;
            };
            if BufReader::new(reading).read_line(&mut line).is_ok() {
                // Heard before answered: the guest ends only after the answer, so the test,
                // which reads what was heard once the runner ended, never misses a line.
                let reply = format!("pong:{line}");
                let _ = lines_heard.send(line);
                let _ = conn.write_all(reply.as_bytes());
            }
        }
    });
    // Guest listens on port 2000: the host connects through the socket libkrun creates,
    // retrying until the guest's listener is up (earlier connections are dropped), and once
    // more for each boot again, for as long as the runner runs.
    let guest_sock_for_thread = guest_sock.clone();
    let runner_done = Arc::new(AtomicBool::new(false));
    let stop = runner_done.clone();
    let guest_side = std::thread::spawn(move || {
        let mut replies = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(mut conn) = UnixStream::connect(&guest_sock_for_thread) {
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = conn.write_all(b"ping-from-host\n");
                let mut reply = String::new();
                if conn.read_to_string(&mut reply).is_ok() && !reply.is_empty() {
                    replies.push(reply);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        replies
    });

    let script = "vsock-helper connect 2001 ping-from-guest && vsock-helper serve 2000";
    let mut vm = spec(&root, "/bin/sh", &["-c", script]);
    vm["vsock"] = json!([
        {"port": 2001, "socket": host_sock, "direction": "host-listens"},
        {"port": 2000, "socket": guest_sock, "direction": "guest-listens"}
    ]);
    let out = run(dir.path(), &vm);
    runner_done.store(true, Ordering::Relaxed);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.lines().contains(&"pong:ping-from-guest"), "{out:?}");
    let lines: Vec<String> = heard.try_iter().collect();
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l == "ping-from-guest\n"),
        "{lines:?}"
    );
    let replies = guest_side.join().unwrap();
    assert!(
        !replies.is_empty() && replies.iter().all(|r| r == "echo:ping-from-host\n"),
        "{replies:?}"
    );
}

/// Answers each connection on 127.0.0.1 with one line, for as long as the test runs.
fn loopback_http() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten().take(8) {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"host-reached\n");
        }
    });
    port
}

#[test]
fn network_off_cannot_reach_host_loopback_and_on_can() {
    let Some((dir, root)) = guest("network_off_cannot_reach_host_loopback_and_on_can") else {
        return;
    };
    let port = loopback_http();
    let script = format!(
        // busybox's static wget crashes under TSI; nc is enough to open a TCP connection.
        "if echo hello | nc -w 5 127.0.0.1 {port}; then echo NET-REACHED; \
         else echo net-unreachable; fi"
    );
    for network in [false, true] {
        let mut vm = spec(&root, "/bin/sh", &["-c", &script]);
        vm["network"] = json!(network);
        let out = run(dir.path(), &vm);
        assert_eq!(out.code, Some(0), "{out:?}");
        let lines = out.lines();
        if network {
            // The control: with TSI on, the same request does reach the host.
            assert!(lines.contains(&"NET-REACHED"), "{out:?}");
            assert!(lines.contains(&"host-reached"), "{out:?}");
        } else {
            assert!(lines.contains(&"net-unreachable"), "{out:?}");
        }
    }
}

/// True while `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn runner_dies_with_its_parent() {
    let Some((dir, root)) = guest("runner_dies_with_its_parent") else {
        return;
    };
    let spec_path = dir.path().join("sleep.json");
    std::fs::write(&spec_path, spec(&root, "/bin/sleep", &["120"]).to_string()).unwrap();
    // A runner that ended before its parent was killed because the lab's emulated CPU reset
    // its guest (as `support::run` tells apart) is started once more after the same pause,
    // saying so; a second early end fails the test, and so does any other.
    let (mut parent, runner) = match start_under_a_parent(dir.path(), &spec_path) {
        Ok(started) => started,
        Err(first) if first.guest_reset() => {
            eprintln!(
                "*** the guest reset before the parent was killed (KVM_EXIT_SHUTDOWN): booting it once more in {REBOOT_PAUSE:?} ***\nits runner's stderr: {}",
                first.stderr.trim_end()
            );
            std::thread::sleep(REBOOT_PAUSE);
            start_under_a_parent(dir.path(), &spec_path).unwrap_or_else(|again| {
                panic!("the runner exited before its parent was killed, twice: {again:?}")
            })
        }
        Err(first) => panic!("the runner exited before its parent was killed: {first:?}"),
    };
    parent.kill().unwrap();
    parent.wait().unwrap();
    // PR_SET_PDEATHSIG makes this immediate; the deadline only stops a broken runner
    // from hanging the test until its guest's sleep ends.
    let deadline = Instant::now() + Duration::from_secs(60);
    while alive(runner) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(runner), "the runner outlived its parent");
}

/// Starts the runner under a shell parent that reports its pid and waits for it, and lets
/// the VM come up (the workload sleeps for two minutes). The parent and the runner's pid,
/// or, when the runner has already ended, what it wrote to stderr.
fn start_under_a_parent(
    dir: &std::path::Path,
    spec_path: &std::path::Path,
) -> Result<(std::process::Child, u32), support::Outcome> {
    let stderr_path = dir.join(format!("runner-stderr-{}", std::process::id()));
    let started = Instant::now();
    let mut parent = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("\"$0\" --spec \"$1\" >/dev/null 2>\"$2\" & echo $!; wait")
        .arg(support::runner())
        .arg(spec_path)
        .arg(&stderr_path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let runner: u32 = line.trim().parse().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    if alive(runner) {
        return Ok((parent, runner));
    }
    parent.wait().unwrap();
    Err(support::Outcome {
        code: None,
        stdout: String::new(),
        stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
        elapsed: started.elapsed(),
    })
}

/// What libkrun logged in the lab for a guest that triple-faulted before its workload ran,
/// against a workload that exited 0 itself: only the first is booted once more.
#[test]
fn a_guest_reset_is_told_apart_from_a_workload_exit() {
    let outcome = |stderr: &str| support::Outcome {
        code: Some(0),
        stdout: String::new(),
        stderr: stderr.into(),
        elapsed: Duration::from_secs(8),
    };
    let reset = outcome(
        "[..Z INFO  krun_vmm::linux::vstate] Received KVM_EXIT_SHUTDOWN signal\n\
         [..Z DEBUG krun_vmm] using vcpu exit code: 0\n\
         [..Z INFO  krun_vmm] Vmm is stopping.\n",
    );
    assert!(reset.guest_reset());
    let exited = outcome(
        "[..Z DEBUG krun_vmm] using vmm exit code: 0\n[..Z INFO  krun_vmm] Vmm is stopping.\n",
    );
    assert!(!exited.guest_reset());
}

/// A runner killed at the deadline counts as the lab losing the guest only when it had
/// entered the VM and the guest printed nothing; one stuck in its own set-up, or a guest that
/// printed and then hung, fails at once.
#[test]
fn a_silent_guest_hang_is_told_apart_from_a_hang_of_ours() {
    let killed = |stdout: &str, stderr: &str| support::Outcome {
        code: None,
        stdout: stdout.into(),
        stderr: stderr.into(),
        elapsed: Duration::from_secs(181),
    };
    let entered = "sandbox-libkrun-vm: entering the VM (1 vCPUs, 256 MiB)\n";
    assert!(killed("", entered).silent_hang());
    assert!(killed("\r\n\n", entered).silent_hang());
    assert!(!killed("", "").silent_hang(), "stuck before the VM");
    assert!(
        !killed("started\n", entered).silent_hang(),
        "hung in the workload"
    );
    let mut ended = killed("", entered);
    ended.code = Some(0);
    assert!(!ended.silent_hang(), "it ended by itself");
}
