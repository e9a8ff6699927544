//! What keeps the agent serving whatever its programs do: each program is the OOM killer's
//! first choice (`oom_score_adj` 1000, the agent keeps its own), and the agent's standard
//! descriptors are `/dev/null`, the host link elsewhere and close-on-exec, so bytes written
//! into `/proc/<agent>/fd/0` or `/fd/1` never reach the link.

mod common;

use common::*;

#[tokio::test]
async fn programs_are_the_oom_killers_first_choice() {
    let agent = start_agent().await;
    let out = run(
        &agent,
        sh("cat /proc/self/oom_score_adj; cat /proc/$PPID/oom_score_adj"),
    )
    .await;
    let scores: Vec<&str> = text(&out.stdout).lines().collect();
    assert_eq!(scores.len(), 2, "{out:?}");
    assert_eq!(scores[0], "1000", "the program's score: {out:?}");
    assert_ne!(scores[1], "1000", "the agent keeps a lower one: {out:?}");
    // What the program starts inherits it.
    let out = run(&agent, sh("sh -c 'cat /proc/self/oom_score_adj'")).await;
    assert_eq!(text(&out.stdout), "1000\n");
}

#[tokio::test]
async fn bytes_written_into_the_agents_stdio_never_reach_the_link() {
    let agent = start_agent().await;
    // $PPID is the agent (these tests run it as a child, not as PID 1).
    let out = run(
        &agent,
        sh("readlink /proc/$PPID/fd/0 /proc/$PPID/fd/1; ls /proc/$PPID/fd"),
    )
    .await;
    let lines: Vec<&str> = text(&out.stdout).lines().collect();
    assert_eq!(&lines[..2], ["/dev/null", "/dev/null"], "{out:?}");

    for fd in [0, 1] {
        let script = format!(
            "printf 'garbage\\000\\377\\377\\377\\377 not a frame' > /proc/$PPID/fd/{fd}; echo done"
        );
        let out = run(&agent, sh(&script)).await;
        assert_eq!(text(&out.stdout), "done\n", "{out:?}");
    }
    // The link is whole: the next exec and a burst after it answer normally.
    let out = run(&agent, spec(&["echo", "ok"])).await;
    assert_eq!(text(&out.stdout), "ok\n");
    for _ in 0..8 {
        let out = run(&agent, spec(&["echo", "ok"])).await;
        assert_eq!(text(&out.stdout), "ok\n");
    }
}
