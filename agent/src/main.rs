//! sandbox-agent: the guest agent. It runs as PID 1 of a sandbox (a libkrun microVM or a
//! bubblewrap namespace), speaks agent-proto with the host over one byte stream
//! (`--stdio`, `--vsock-port N`, or `--unix PATH`), runs execs and fs operations, reaps
//! every zombie and forwards SIGTERM/SIGINT to its execs. With a leading `--confine` it
//! locks the sandbox down once its link is open (read-only kernel knobs, Docker's
//! capabilities but raw sockets, seccomp) and refuses to serve if it cannot. It is not the host side: the
//! client lives in agent-proto, the policy (limits, S-codes) in sandbox-core.
//!
//! Threads plus poll rather than an async runtime: each exec is one thread blocked in
//! poll on its two pipes, the binary stays small and static, and PID 1 duties (sigwait,
//! waitpid(-1)) fit a plain thread naturally.

mod confine;
mod exec;
mod fs;
mod log;
mod outbox;
mod procs;
mod server;
mod sys;
mod tcp;
mod transport;
mod watch;

use std::process::ExitCode;

use log::log;

const USAGE: &str = "usage: sandbox-agent [--confine] (--stdio | --vsock-port PORT | --unix PATH)";

enum Mode {
    Stdio,
    Vsock(u32),
    Unix(String),
}

fn parse_args(args: &[String]) -> Option<Mode> {
    match args {
        [flag] if flag == "--stdio" => Some(Mode::Stdio),
        [flag, port] if flag == "--vsock-port" => port.parse().ok().map(Mode::Vsock),
        [flag, path] if flag == "--unix" => Some(Mode::Unix(path.clone())),
        _ => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (confine, args) = match args.split_first() {
        Some((first, rest)) if first == "--confine" => (true, rest),
        _ => (false, &args[..]),
    };
    let Some(mode) = parse_args(args) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    // The link to the host first: in a microVM it is the one vsock socket of the sandbox's
    // life, and the filter below refuses every new one (to the agent too, so no guest
    // program can reach the host side of the agent's port). Opening it starts no thread
    // and says nothing to the host.
    let stream = match &mode {
        Mode::Stdio => transport::stdio(),
        Mode::Vsock(port) => transport::vsock(*port),
        Mode::Unix(path) => transport::unix(path),
    };
    let (mut reader, writer) = match stream {
        Ok(s) => s,
        Err(e) => {
            log!("cannot open the host stream: {e}");
            return ExitCode::from(1);
        }
    };
    // Terminals for execs that ask for one: libkrun's init may leave /dev without devpts.
    // Before confinement, which gives up the right to mount. Best effort: only `tty`
    // execs need it, and they say so when it is missing.
    if matches!(mode, Mode::Vsock(_)) {
        match sys::ensure_devpts() {
            Ok(true) => log!("mounted devpts at /dev/pts"),
            Ok(false) => {}
            Err(e) => log!("no devpts at /dev/pts ({e}); execs with a terminal will fail"),
        }
    }
    // Before any thread exists (the seccomp filter is applied to this thread only, and
    // every later thread and exec inherits it). Fail closed: never serve unconfined.
    if confine {
        match confine::confine() {
            Ok(done) => log!("{done}"),
            Err(e) => {
                log!("cannot confine the sandbox, not serving: {e}");
                return ExitCode::from(1);
            }
        }
    }
    // Nothing in the sandbox may reach the agent's descriptors through /proc/1/fd (the host
    // link among them) or its memory.
    if let Err(e) = sys::make_non_dumpable() {
        log!("cannot make the agent non-dumpable: {e}");
        return ExitCode::from(1);
    }
    // The OOM killer takes a program before the agent: here by the agent's own score where
    // it may lower it (a VM: -1000), and always by each exec's raised one (1000). In a user
    // namespace (bwrap) the agent keeps the score it inherited (the kernel lets only a
    // holder of CAP_SYS_RESOURCE in the host lower it) and its memory stays small (fs calls
    // work in bounded buffers), so any program larger than it goes first.
    fs::settle_allocator();
    if let Err(e) = sys::avoid_oom_killer() {
        let kept = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default();
        log!(
            "oom_score_adj stays {} ({e}); programs start at 1000",
            kept.trim()
        );
    }
    // Before any thread exists, so every thread inherits the mask.
    if let Err(e) = sys::block_handled_signals() {
        log!("cannot block signals: {e}");
        return ExitCode::from(1);
    }
    if std::process::id() != 1 {
        if let Err(e) = sys::become_subreaper() {
            log!("cannot become a subreaper ({e}); orphans go to init");
        }
    }
    let table = procs::ProcTable::default();
    if let Err(e) = procs::start_signal_thread(table.clone()) {
        log!("cannot start the signal thread: {e}");
        return ExitCode::from(1);
    }
    let ctx = exec::ExecContext {
        table: table.clone(),
        outbox: outbox::Outbox::new(writer),
    };
    let ending = server::serve(&mut reader, ctx);
    // Whatever ended the session, nothing we started may outlive it.
    table.signal_all(libc::SIGKILL);
    log!("exiting: {ending}");
    match ending {
        server::Ending::Shutdown | server::Ending::StreamClosed => ExitCode::SUCCESS,
        server::Ending::StreamBroken(_) | server::Ending::Handshake(_) => ExitCode::from(1),
    }
}
