//! Exec semantics through the real agent binary and the real client.

mod common;

use std::time::{Duration, Instant};

use agent_proto::{AgentError, ErrorCode};
use common::*;
use tokio::process::Command;

#[tokio::test]
async fn echo_and_exit_codes() {
    let agent = start_agent().await;
    let out = run(&agent, spec(&["echo", "hello", "world"])).await;
    assert_eq!(text(&out.stdout), "hello world\n");
    assert_eq!(out.exit_code, 0);
    assert!(!out.timed_out && !out.stdout_truncated && !out.stderr_truncated);

    let out = run(&agent, sh("echo oops >&2; exit 3")).await;
    assert_eq!(out.exit_code, 3);
    assert_eq!(text(&out.stderr), "oops\n");

    let out = run(&agent, sh("kill -9 $$")).await;
    assert_eq!(
        out.exit_code,
        128 + 9,
        "killed by a signal reads like a shell"
    );
}

#[tokio::test]
async fn stdin_is_fed_then_closed() {
    let agent = start_agent().await;
    let mut s = spec(&["cat"]);
    s.stdin = b"abc\n".to_vec();
    let out = run(&agent, s).await;
    assert_eq!(text(&out.stdout), "abc\n");

    // Several chunks' worth, checked byte for byte.
    let big: Vec<u8> = (0..3 * MIB + 17).map(|i| (i * 7 % 251) as u8).collect();
    let mut s = spec(&["cat"]);
    s.stdin = big.clone();
    s.max_output_bytes = 4 * MIB;
    let out = run(&agent, s).await;
    assert_eq!(out.stdout.len(), big.len());
    assert!(out.stdout == big, "stdin comes back unchanged");

    // No stdin at all: the program sees EOF at once instead of hanging.
    let out = run(&agent, spec(&["wc", "-c"])).await;
    assert_eq!(text(&out.stdout).trim(), "0");
}

#[tokio::test]
async fn env_is_clean_with_default_path() {
    let agent = start_agent().await;
    let mut s = spec(&["env"]);
    s.env = vec![("FOO".into(), "bar baz".into())];
    let out = run(&agent, s).await;
    let mut lines: Vec<&str> = text(&out.stdout).lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            "FOO=bar baz",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        ]
    );

    let mut s = spec(&["/usr/bin/env"]);
    s.env = vec![("PATH".into(), "/nowhere".into())];
    let out = run(&agent, s).await;
    assert_eq!(text(&out.stdout), "PATH=/nowhere\n");

    let mut s = spec(&["env"]);
    s.env = vec![("BAD=NAME".into(), "x".into())];
    match agent.client.exec(s).await {
        Err(AgentError::Request(e)) => assert_eq!(e.code, ErrorCode::BadRequest),
        other => panic!("bad env name must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn workdir_is_used_and_checked() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let real = std::fs::canonicalize(dir.path()).expect("canonical");
    let mut s = spec(&["pwd"]);
    s.workdir = Some(real.to_string_lossy().into_owned());
    let out = run(&agent, s).await;
    assert_eq!(text(&out.stdout).trim_end(), real.to_string_lossy());

    let mut s = spec(&["pwd"]);
    s.workdir = Some(real.join("missing").to_string_lossy().into_owned());
    match agent.client.exec(s).await {
        Err(AgentError::Request(e)) => assert_eq!(e.code, ErrorCode::BadWorkdir),
        other => panic!("missing workdir must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn missing_program_is_127_and_non_executable_is_126() {
    let agent = start_agent().await;
    let out = run(&agent, spec(&["no-such-program-here"])).await;
    assert_eq!(out.exit_code, 127);
    assert!(text(&out.stderr).contains("not found"));

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("script");
    std::fs::write(&file, "#!/bin/sh\necho hi\n").expect("write");
    let out = run(&agent, spec(&[file.to_str().expect("utf-8 path")])).await;
    assert_eq!(out.exit_code, 126);
}

#[tokio::test]
async fn a_name_is_looked_up_in_the_programs_own_path_like_execvp() {
    let agent = start_agent().await;
    let first = tempfile::tempdir().expect("tempdir");
    let second = tempfile::tempdir().expect("tempdir");
    // Not executable in the first directory, executable in the second: the search goes on.
    std::fs::write(first.path().join("tool"), "#!/bin/sh\necho first\n").expect("write");
    let runnable = second.path().join("tool");
    std::fs::write(&runnable, "#!/bin/sh\necho second\n").expect("write");
    std::fs::set_permissions(
        &runnable,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        first.path().display(),
        second.path().display()
    );
    let mut s = spec(&["tool"]);
    s.env = vec![("PATH".into(), path)];
    let out = run(&agent, s).await;
    assert_eq!(out.exit_code, 0, "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "second\n");

    // Only a refused one: that is 126 (EACCES wins over "not found").
    let mut s = spec(&["tool"]);
    s.env = vec![("PATH".into(), first.path().display().to_string())];
    let out = run(&agent, s).await;
    assert_eq!(out.exit_code, 126, "{}", text(&out.stderr));
}

#[tokio::test]
async fn a_later_env_entry_overrides_an_earlier_one_of_the_same_name() {
    // The adapter sends the sandbox's env followed by the exec's: the exec's value wins, and
    // the program sees each name once (`env` prints its environment as the kernel gave it;
    // a shell would hide a duplicate by importing each entry in turn).
    let agent = start_agent().await;
    let mut s = spec(&["env"]);
    s.env = vec![
        ("A".into(), "from-create".into()),
        ("B".into(), "kept".into()),
        ("A".into(), "from-exec".into()),
    ];
    let out = run(&agent, s).await;
    let printed = text(&out.stdout);
    let a: Vec<&str> = printed.lines().filter(|l| l.starts_with("A=")).collect();
    assert_eq!(a, ["A=from-exec"], "{printed}");
    assert!(printed.lines().any(|l| l == "B=kept"), "{printed}");
}

#[tokio::test]
async fn a_nul_byte_in_argv_or_env_is_a_bad_request() {
    let agent = start_agent().await;
    let refused = agent.client.exec(spec(&["echo", "a\0b"])).await;
    assert!(
        matches!(&refused, Err(AgentError::Request(e)) if e.code == ErrorCode::BadRequest),
        "{refused:?}"
    );
    let mut s = spec(&["true"]);
    s.env = vec![("X".into(), "a\0b".into())];
    let refused = agent.client.exec(s).await;
    assert!(
        matches!(&refused, Err(AgentError::Request(e)) if e.code == ErrorCode::BadRequest),
        "{refused:?}"
    );
    // The agent keeps serving.
    assert_eq!(run(&agent, spec(&["true"])).await.exit_code, 0);
}

#[tokio::test]
async fn timeout_kills_the_whole_group_and_keeps_partial_output() {
    let agent = start_agent().await;
    let mut s = sh("sleep 100 & echo $!; echo partial; wait");
    s.timeout_ms = 500;
    let out = run(&agent, s).await;
    assert!(out.timed_out);
    assert_eq!(out.exit_code, 128 + 9);
    let grandchild = parse_pid(&out.stdout);
    assert!(text(&out.stdout).contains("partial"));
    assert!(
        pid_gone(grandchild, Duration::from_secs(5)).await,
        "grandchild {grandchild} survived the timeout"
    );
}

#[tokio::test]
async fn fifty_mib_output_gives_exactly_the_cap_and_the_flag() {
    let agent = start_agent().await;
    let out = run(
        &agent,
        sh("head -c 52428800 /dev/zero; head -c 52428800 /dev/zero >&2"),
    )
    .await;
    assert_eq!(out.exit_code, 0, "the program ran to its end");
    assert_eq!(out.stdout.len(), MIB);
    assert_eq!(out.stderr.len(), MIB);
    assert!(out.stdout_truncated && out.stderr_truncated);

    let mut s = sh("printf 0123456789");
    s.max_output_bytes = 10;
    let out = run(&agent, s).await;
    assert_eq!(text(&out.stdout), "0123456789");
    assert!(!out.stdout_truncated, "exactly the cap is not truncated");
}

#[tokio::test]
async fn background_child_holding_stdout_returns_at_the_timeout() {
    let agent = start_agent().await;
    let mut s = sh("echo early; sleep 60 & exit 0");
    s.timeout_ms = 1000;
    let started = Instant::now();
    let out = run(&agent, s).await;
    let took = started.elapsed();
    assert_eq!(text(&out.stdout), "early\n");
    assert!(out.timed_out, "output never closed before the deadline");
    assert_eq!(out.exit_code, 0, "the main process's own status is kept");
    assert!(
        took < Duration::from_secs(30),
        "returned after {took:?}, not at the timeout"
    );
}

#[tokio::test]
async fn orphans_are_reaped_and_exec_statuses_are_not_stolen() {
    let agent = start_agent().await;
    let out = run(&agent, sh("sleep 0.2 >/dev/null 2>&1 & echo $!; exit 7")).await;
    assert_eq!(out.exit_code, 7);
    let orphan = parse_pid(&out.stdout);
    assert!(
        pid_gone(orphan, Duration::from_secs(5)).await,
        "orphan {orphan} left as a zombie"
    );
}

#[tokio::test]
async fn a_thousand_print_then_exit_runs_lose_no_tail() {
    let agent = start_agent().await;
    let expected: String = (1..=2000).map(|i| format!("{i}\n")).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..4 {
        let client = agent.client.clone();
        let expected = expected.clone();
        tasks.spawn(async move {
            for run in 0..250 {
                let out = client
                    .exec(spec(&["seq", "1", "2000"]))
                    .await
                    .expect("exec");
                assert_eq!(out.exit_code, 0);
                assert!(
                    out.stdout == expected.as_bytes(),
                    "worker {worker} run {run}: {} of {} bytes",
                    out.stdout.len(),
                    expected.len()
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("worker finished");
    }
}

#[tokio::test]
async fn five_execs_run_at_once() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_string_lossy().into_owned();
    let mut tasks = Vec::new();
    for i in 0..5 {
        // Each waits until all five have started: only possible if they run together.
        let script = format!(
            "touch {d}/{i}; while [ $(ls {d} | wc -l) -lt 5 ]; do sleep 0.02; done; echo ok{i}"
        );
        let mut s = sh(&script);
        s.timeout_ms = 20_000;
        let client = agent.client.clone();
        tasks.push(tokio::spawn(async move { client.exec(s).await }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let out = task.await.expect("task").expect("exec");
        assert!(!out.timed_out, "exec {i} waited for the others in vain");
        assert_eq!(text(&out.stdout), format!("ok{i}\n"));
    }
}

/// Peak resident memory of a process, from /proc (kB).
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM line")
}

#[tokio::test]
async fn agent_memory_stays_bounded_whatever_the_program_prints() {
    let agent = start_agent().await;
    let pid = agent.child.id().expect("running");
    let before = peak_rss_kb(pid);
    let mut s = sh("head -c 1073741824 /dev/zero; head -c 1073741824 /dev/zero >&2");
    s.timeout_ms = 120_000;
    let out = run(&agent, s).await;
    assert_eq!(out.exit_code, 0);
    assert_eq!((out.stdout.len(), out.stderr.len()), (MIB, MIB));
    let after = peak_rss_kb(pid);
    // 2 GiB went through; the agent's peak may grow by buffers, not by the output.
    assert!(
        after < before + 64 * 1024,
        "agent peak RSS grew from {before} kB to {after} kB"
    );
}

#[tokio::test]
async fn extreme_limits_do_not_break_the_agent() {
    let agent = start_agent().await;
    let mut s = spec(&["echo", "far"]);
    s.timeout_ms = u64::MAX;
    let out = run(&agent, s).await;
    assert_eq!(text(&out.stdout), "far\n");

    let mut s = spec(&["echo", "silent"]);
    s.max_output_bytes = 0;
    let out = run(&agent, s).await;
    assert!(out.stdout.is_empty() && out.stdout_truncated);
}

#[tokio::test]
async fn programs_start_with_no_signal_blocked_so_sigterm_reaches_them() {
    let agent = start_agent().await;
    let out = run(&agent, spec(&["grep", "SigBlk", "/proc/self/status"])).await;
    assert_eq!(text(&out.stdout).trim(), "SigBlk:\t0000000000000000");
    // SIGPIPE (bit 13), which the agent ignores, is at its default in the program again.
    let out = run(&agent, spec(&["grep", "SigIgn", "/proc/self/status"])).await;
    let ignored = text(&out.stdout);
    let mask = u64::from_str_radix(ignored.trim().trim_start_matches("SigIgn:").trim(), 16)
        .expect("a hex mask");
    assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "{ignored}");
    let out = run(
        &agent,
        sh("trap 'echo got-term; exit 0' TERM; kill -TERM $$; sleep 5; echo missed"),
    )
    .await;
    assert_eq!(text(&out.stdout), "got-term\n");
}

/// Signals ignored where the agent was started (a script's `adapter &` ignores SIGINT and
/// SIGQUIT; a service may ignore SIGHUP) are not the sandbox's programs' business: they start
/// with every signal at its default, so ^C at their terminal interrupts them.
#[tokio::test]
async fn programs_start_with_no_signal_ignored_whatever_the_agent_inherited() {
    let agent = start_agent_from(
        Command::new("/bin/sh")
            .args(["-c", "trap '' INT QUIT HUP TERM USR1; exec \"$0\" --stdio"])
            .arg(agent_bin()),
    )
    .await;
    let ignored = |status: &str| -> u64 {
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .expect("SigIgn");
        u64::from_str_radix(mask.trim(), 16).expect("hex mask")
    };
    let trapped = [
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGHUP,
        libc::SIGTERM,
        libc::SIGUSR1,
    ]
    .iter()
    .fold(0u64, |mask, sig| mask | 1 << (sig - 1));
    let agent_status =
        std::fs::read_to_string(format!("/proc/{}/status", agent.child.id().unwrap())).unwrap();
    assert_eq!(
        ignored(&agent_status) & trapped,
        trapped,
        "the agent was started ignoring them"
    );
    let out = run(&agent, sh("cat /proc/self/status")).await;
    assert_eq!(
        ignored(text(&out.stdout)) & trapped,
        0,
        "{}",
        text(&out.stdout)
    );
}
