//! The starter's side of a sandbox's egress (see `network.rs`; the starter is the bwrap
//! launcher or the VM runner): a new network namespace, its loopback up, the policy loaded,
//! the resolver proxy (`dns.rs`) listening in it from a process of the host's namespace, and
//! pasta attached to it from the host's namespace. Runs in the starter only, single-threaded.

// Bringing an interface up is an ioctl nix does not wrap.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Write};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{dup2, fork, ForkResult, Pid};

use crate::dns::{Listeners, V6};
use crate::network::{host_elements, NetworkSetup};

/// How long pasta gets to configure the namespace.
const PASTA_READY: Duration = Duration::from_secs(10);
/// How often the launcher looks for pasta's route meanwhile: pasta takes a few milliseconds,
/// and a reading of the route table costs microseconds.
const PASTA_POLL: Duration = Duration::from_micros(500);
/// Upper bound of pasta's command line as sent to its starter.
const MAX_ARGV: usize = 64 * 1024;

/// A child forked before the sandbox's namespaces exist, waiting to become pasta: pasta's
/// sockets must be the host's and its ids the host's (it joins the sandbox's user and network
/// namespaces by pid, as their owner). Dropped unused, it exits.
pub struct PastaStarter {
    socket: OwnedFd,
    pid: Pid,
}

/// The two ends of the message channel between a forked helper and its parent (close-on-exec:
/// the helper passes its end on only on purpose).
pub(crate) fn seqpacket_pair() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    Ok(socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?)
}

impl PastaStarter {
    /// Call while single-threaded (it forks).
    pub fn fork() -> io::Result<PastaStarter> {
        let (ours, theirs) = seqpacket_pair()?;
        // SAFETY: the launcher is single-threaded; the child only rearranges its own
        // descriptors, reads one message and execs (or exits).
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop(ours);
                let error = become_pasta(theirs);
                eprintln!("{}: pasta: {error}", crate::program());
                // SAFETY: _exit ends the forked child without the parent's destructors.
                unsafe { libc::_exit(1) }
            }
            ForkResult::Parent { child } => Ok(PastaStarter {
                socket: ours,
                pid: child,
            }),
        }
    }
}

/// Moves the caller (the launcher, inside the sandbox's user namespace) into a new network
/// namespace with `setup`'s policy loaded, the resolver proxy serving and pasta attached;
/// returns once the namespace has its default route. Failures name their cause.
pub fn connect(starter: PastaStarter, setup: &NetworkSetup, log: &str) -> Result<(), String> {
    connect_to(starter, setup, log, None)
}

/// [`connect`] for a starter that stays host root (a root adapter's VM runner, whose files
/// are the host's): the new network namespace belongs to a user namespace that `owner` (the
/// sandbox's unprivileged host ids, which pasta runs as) holds, never host root's, so pasta
/// joins it as its owner and never runs as root. A child of ours holds that user namespace
/// (pasta joins it by that child's pid) as long as we live.
pub fn connect_owned_by(
    starter: PastaStarter,
    setup: &NetworkSetup,
    log: &str,
    owner: (u32, u32),
) -> Result<(), String> {
    connect_to(starter, setup, log, Some(owner))
}

fn connect_to(
    starter: PastaStarter,
    setup: &NetworkSetup,
    log: &str,
    owner: Option<(u32, u32)>,
) -> Result<(), String> {
    // Forked while this process is still in the host's network namespace, where the proxy's
    // sockets to the resolvers are made before it joins the sandbox's (so the sandbox's
    // policy never judges them, and they are all it has of the host's network).
    let proxy =
        DnsProxy::fork(setup).map_err(|e| format!("cannot fork the resolver proxy: {e}"))?;
    // Read while still in the host's namespace (see `start_loading_rules`).
    let host_addrs = crate::network::host_addresses();
    let pasta_target = match owner {
        None => {
            unshare(CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("cannot make the sandbox's network namespace: {e}"))?;
            nix::unistd::getpid()
        }
        Some(owner) => enter_namespace_held_by(owner)?,
    };
    loopback_up().map_err(|e| format!("cannot bring the sandbox's loopback up: {e}"))?;
    // Bound before the sandbox exists: nothing of its own can take the port first.
    // On the namespace's loopback, IPv6's only where the namespace has it.
    let listeners = Listeners::bind(
        std::net::Ipv4Addr::LOCALHOST,
        V6::IfAvailable(std::net::Ipv6Addr::LOCALHOST),
    )?;
    load_rules(setup, &host_addrs)?;
    proxy.hand_over(listeners)?;
    attach_pasta(starter, setup, log, pasta_target)
}

/// Has pasta (waiting in `starter`) join `target`'s user and network namespaces; returns once
/// it configured this process's network namespace (the one `target` is in).
pub(crate) fn attach_pasta(
    starter: PastaStarter,
    setup: &NetworkSetup,
    log: &str,
    pasta_target: Pid,
) -> Result<(), String> {
    // pasta, as this process's host uid, opens /proc/<us>/ns/*: entering the sandbox's user
    // namespace made us non-dumpable, which would refuse it. Nothing in the sandbox can see
    // this process (its own pid namespace).
    nix::sys::prctl::set_dumpable(true)
        .map_err(|e| format!("cannot let pasta join the namespace: {e}"))?;
    let ids = setup
        .run_as
        .map_or_else(String::new, |(uid, gid)| format!("{uid}:{gid}"));
    let mut argv = vec![log.to_string(), ids, setup.pasta.clone()];
    argv.extend(setup.pasta_args.iter().cloned());
    argv.push(pasta_target.to_string());
    let message = argv.join("\0");
    if message.len() > MAX_ARGV {
        return Err("pasta's command line is too long".into());
    }
    sendmsg::<()>(
        starter.socket.as_raw_fd(),
        &[IoSlice::new(message.as_bytes())],
        &[],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("cannot start pasta: {e}"))?;
    wait_until_ready(starter.pid, &setup.forwarded_ports)
}

/// Makes a user namespace of `owner` (uid, gid) holding a new network namespace, in a child
/// that becomes `owner` first, maps itself to root there and then waits to die with us; moves
/// this (root) process into that network namespace. Returns the child's pid, by which pasta
/// joins both. Call while single-threaded (it forks).
fn enter_namespace_held_by(owner: (u32, u32)) -> Result<Pid, String> {
    let (ready_read, ready_write) =
        nix::unistd::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
    let parent = nix::unistd::getpid();
    // SAFETY: the starter is single-threaded; the child only changes its own credentials and
    // namespaces, writes a byte and waits to be killed.
    let holder = match unsafe { fork() }.map_err(|e| format!("cannot fork: {e}"))? {
        ForkResult::Child => {
            drop(ready_read);
            // Nothing of the starter's stays open here but stderr (the log) and the pipe.
            let _ = detach_stdio();
            let _ = dup2(ready_write.as_raw_fd(), 3);
            std::mem::forget(ready_write);
            // SAFETY: close_range only closes descriptors; none above 3 is used from here on.
            unsafe { libc::close_range(4, libc::c_uint::MAX, 0) };
            // SAFETY: descriptor 3 is the pipe just placed there, owned by nothing else now.
            let ready_write = unsafe { OwnedFd::from_raw_fd(3) };
            let outcome = hold_namespace(owner, parent);
            let byte: &[u8] = if outcome.is_ok() { b"1" } else { b"0" };
            let _ = nix::unistd::write(&ready_write, byte);
            if let Err(e) = outcome {
                eprintln!("{}: network namespace holder: {e}", crate::program());
                // SAFETY: _exit ends the forked child without the parent's destructors.
                unsafe { libc::_exit(1) }
            }
            drop(ready_write);
            loop {
                nix::unistd::pause();
            }
        }
        ForkResult::Parent { child } => child,
    };
    drop(ready_write);
    let mut byte = [0u8; 1];
    let read = nix::unistd::read(ready_read.as_raw_fd(), &mut byte);
    if read != Ok(1) || byte[0] != b'1' {
        let _ = waitpid(holder, None);
        return Err("cannot make the sandbox's network namespace (see the log)".into());
    }
    let netns = File::open(format!("/proc/{holder}/ns/net"))
        .map_err(|e| format!("cannot open the sandbox's network namespace: {e}"))?;
    setns(netns, CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("cannot enter the sandbox's network namespace: {e}"))?;
    Ok(holder)
}

/// The holder's side: tied to the starter's life, becomes `owner`, makes the user and
/// network namespaces and maps itself to root in the former.
fn hold_namespace(owner: (u32, u32), parent: Pid) -> Result<(), String> {
    let (uid, gid) = owner;
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setgid(nix::unistd::Gid::from_raw(gid)).map_err(|e| format!("setgid: {e}"))?;
    nix::unistd::setuid(nix::unistd::Uid::from_raw(uid)).map_err(|e| format!("setuid: {e}"))?;
    // Tied to the starter only now: a change of credentials clears the parent-death signal
    // (set before the setuid, the holder outlived its runner, and kept the runner's mount
    // namespace, a worker's layer image with it, alive).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| format!("cannot tie to the starter: {e}"))?;
    if nix::unistd::getppid() != parent {
        return Err("the starter is gone".into());
    }
    // setuid made us non-dumpable, which leaves /proc/self/* root's: our own maps below, and
    // pasta (as `owner`) opening /proc/<us>/ns/*, need them ours.
    nix::sys::prctl::set_dumpable(true).map_err(|e| format!("cannot be dumpable: {e}"))?;
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("cannot make the user and network namespaces: {e}"))?;
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("0 {uid} 1\n")),
        ("/proc/self/gid_map", format!("0 {gid} 1\n")),
    ] {
        std::fs::write(file, text).map_err(|e| format!("cannot write {file}: {e}"))?;
    }
    Ok(())
}

/// Points stdin and stdout at `/dev/null`: in the bwrap launcher they are the agent's
/// channel, in the VM runner the guest console, and no child of the starter may hold them.
pub(crate) fn detach_stdio() -> Result<(), String> {
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("cannot open /dev/null: {e}"))?;
    for fd in [0, 1] {
        dup2(null.as_raw_fd(), fd)
            .map_err(|e| format!("cannot detach from the agent's channel: {e}"))?;
    }
    Ok(())
}

/// The starter's side: detaches from the agent's channel, waits for its command line
/// (`log NUL uid:gid-or-empty NUL pasta NUL args...`) and execs pasta. Returns only on
/// failure.
fn become_pasta(socket: OwnedFd) -> String {
    // stdin and stdout are the agent's channel: pasta must never hold them.
    if let Err(e) = detach_stdio() {
        return format!("pasta: {e}");
    }
    let mut buffer = vec![0u8; MAX_ARGV];
    let mut iov = [IoSliceMut::new(&mut buffer)];
    let length = match recvmsg::<()>(socket.as_raw_fd(), &mut iov, None, MsgFlags::empty()) {
        Ok(message) => message.bytes,
        Err(e) => return format!("no word from the launcher: {e}"),
    };
    if length == 0 {
        // No network for this sandbox (or the launcher failed first and said why).
        // SAFETY: _exit ends the forked child without the parent's destructors.
        unsafe { libc::_exit(0) }
    }
    let text = String::from_utf8_lossy(&buffer[..length]).into_owned();
    let mut argv = text.split('\0');
    let (Some(log), Some(ids), Some(program)) = (argv.next(), argv.next(), argv.next()) else {
        return "a garbled command line".into();
    };
    // Opened while still allowed to (a root adapter's log is root's).
    match File::options().append(true).open(log) {
        Ok(log) => {
            let _ = dup2(log.as_raw_fd(), 2);
        }
        Err(e) => return format!("cannot open the sandbox log {log}: {e}"),
    }
    // A root adapter's pasta becomes the sandbox's root host id itself, before exec: a
    // change of credentials clears the parent-death signal, so pasta's own `--runas` would
    // leave it running after the sandbox.
    if let Some((uid, gid)) = ids.split_once(':') {
        let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) else {
            return format!("bad ids {ids}");
        };
        let (uid, gid) = (
            nix::unistd::Uid::from_raw(uid),
            nix::unistd::Gid::from_raw(gid),
        );
        let dropped = nix::unistd::setgroups(&[])
            .and_then(|()| nix::unistd::setresgid(gid, gid, gid))
            .and_then(|()| nix::unistd::setresuid(uid, uid, uid));
        if let Err(e) = dropped {
            return format!("cannot become {ids}: {e}");
        }
    }
    // Set after any change of credentials, which would clear it; kept across exec.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        return format!("cannot tie pasta to the sandbox: {e}");
    }
    // pasta parses every frame the sandbox sends, in the host's network namespace: it runs
    // from its first instruction with no_new_privs and under the allowlist of what it calls
    // (seccomp-policy's pasta.rs), its own tighter filter stacked on once it is set up.
    let confined = seccomp_policy::pasta::pasta_program()
        .and_then(|program| seccomp_policy::pasta::install_pasta(&program));
    if let Err(e) = confined {
        return format!("cannot confine pasta: {e}");
    }
    let error = Command::new(program).args(argv).env_clear().exec();
    format!("cannot start {program}: {error}")
}

/// The resolver proxy's process, forked before the sandbox's network namespace exists and
/// waiting for its listening sockets. Dropped unused, it exits.
pub(crate) struct DnsProxy {
    socket: OwnedFd,
}

/// The one capability the proxy keeps (`nft` changes the sets of its namespace).
const CAP_NET_ADMIN: u32 = 12;

/// What the proxy's process calls itself (`/proc/PID/comm`).
pub const DNS_PROXY_NAME: &str = "iii-dns-proxy";

impl DnsProxy {
    /// Call while single-threaded (it forks).
    pub(crate) fn fork(setup: &NetworkSetup) -> io::Result<DnsProxy> {
        let (ours, theirs) = seqpacket_pair()?;
        let parent = nix::unistd::getpid();
        // SAFETY: the launcher is single-threaded; the child starts its own runtime from
        // scratch and never returns into the launcher's code.
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop(ours);
                let error = become_dns_proxy(theirs, parent, setup);
                eprintln!("{}: dns: {error}", crate::program());
                // SAFETY: _exit ends the forked child without the parent's destructors.
                unsafe { libc::_exit(1) }
            }
            ForkResult::Parent { .. } => Ok(DnsProxy { socket: ours }),
        }
    }

    /// Sends the proxy its listening sockets and this (the sandbox's) network namespace.
    pub(crate) fn hand_over(self, listeners: Listeners) -> Result<(), String> {
        let netns = File::open("/proc/self/ns/net")
            .map_err(|e| format!("cannot name the sandbox's network namespace: {e}"))?;
        let mut kinds = Vec::new();
        let mut fds = Vec::new();
        for udp in &listeners.udp {
            kinds.push(b'u');
            fds.push(udp.as_raw_fd());
        }
        for tcp in &listeners.tcp {
            kinds.push(b't');
            fds.push(tcp.as_raw_fd());
        }
        kinds.push(b'n');
        fds.push(netns.as_raw_fd());
        sendmsg::<()>(
            self.socket.as_raw_fd(),
            &[IoSlice::new(&kinds)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("cannot start the resolver proxy: {e}"))?;
        // Ours are closed here: the sandbox (bwrap is exec'd next) never holds them.
        Ok(())
    }
}

/// The start of a helper process forked by the starter (the resolver proxy, the bus forward):
/// tied to the starter's life (`parent`), named `name`, not dumpable (not traceable, even by
/// the sandbox's root, which cannot see its pid anyway), detached from the agent's channel and
/// holding nothing of the starter's (pasta's starter, the layers, the other helpers' sockets)
/// but `socket`, its channel to the starter, which it returns.
pub(crate) fn become_helper(socket: OwnedFd, parent: Pid, name: &str) -> Result<OwnedFd, String> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| format!("cannot tie {name} to the sandbox: {e}"))?;
    if nix::unistd::getppid() != parent {
        return Err("the launcher is gone".into());
    }
    let _ = nix::sys::prctl::set_dumpable(false);
    let _ = nix::sys::prctl::set_name(&std::ffi::CString::new(name).unwrap_or_default());
    // stdin and stdout are the agent's channel, the working directory the launcher's: never
    // ours.
    detach_stdio()?;
    let _ = std::env::set_current_dir("/");
    dup2(socket.as_raw_fd(), 3).map_err(|e| format!("cannot keep the launcher's socket: {e}"))?;
    std::mem::forget(socket);
    // SAFETY: close_range only closes descriptors; none above 3 is used by this process.
    unsafe { libc::close_range(4, libc::c_uint::MAX, 0) };
    // SAFETY: descriptor 3 is the socket just placed there, owned by nothing else now.
    Ok(unsafe { OwnedFd::from_raw_fd(3) })
}

/// The proxy's side: tied to the launcher's life, detached from the agent's channel, out of
/// reach of the sandbox's processes; opens its sockets to the resolvers, waits for its
/// listening sockets, moves into the sandbox's network namespace and serves. Returns only on
/// failure.
fn become_dns_proxy(socket: OwnedFd, parent: Pid, setup: &NetworkSetup) -> String {
    let socket = match become_helper(socket, parent, DNS_PROXY_NAME) {
        Ok(socket) => socket,
        Err(e) => return e,
    };
    // Still in the host's network namespace: the proxy's one way out, and its ear on the
    // host's addresses, opened here.
    let watch = match crate::host_watch::HostWatch::open() {
        Ok(watch) => watch,
        Err(e) => return format!("cannot follow the host's addresses: {e}"),
    };
    let upstreams = crate::dns::open_upstreams(&setup.dns.upstream);
    let mut kinds = [0u8; 16];
    let mut iov = [IoSliceMut::new(&mut kinds)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 16]);
    let (length, fds) = match recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    ) {
        Ok(message) => {
            let mut fds = Vec::new();
            if let Ok(cmsgs) = message.cmsgs() {
                for cmsg in cmsgs {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        // SAFETY: the kernel just gave us these descriptors; nothing else
                        // owns them.
                        fds.extend(
                            received
                                .into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
            }
            (message.bytes, fds)
        }
        Err(e) => return format!("no word from the launcher: {e}"),
    };
    if length == 0 {
        // The launcher failed before the network was up, and said why.
        // SAFETY: _exit ends the forked child without the parent's destructors.
        unsafe { libc::_exit(0) }
    }
    if fds.len() != length {
        return "a garbled hand-over".into();
    }
    let mut listeners = Listeners {
        udp: Vec::new(),
        tcp: Vec::new(),
    };
    let mut netns = None;
    for (kind, fd) in kinds[..length].iter().zip(fds) {
        match kind {
            b'u' => listeners.udp.push(std::net::UdpSocket::from(fd)),
            b't' => listeners.tcp.push(std::net::TcpListener::from(fd)),
            b'n' => netns = Some(fd),
            _ => return "a garbled hand-over".into(),
        }
    }
    let Some(netns) = netns else {
        return "no network namespace in the hand-over".into();
    };
    // Into the sandbox's namespace, for good: nothing the proxy makes from now on is the
    // host's, and `nft` changes the sandbox's sets.
    if let Err(e) = setns(netns, CloneFlags::CLONE_NEWNET) {
        return format!("cannot enter the sandbox's network namespace: {e}");
    }
    // Of its capabilities only what `nft` needs to change the sets.
    if let Err(e) = crate::privilege::keep_only(&[CAP_NET_ADMIN]) {
        return format!("cannot give up privilege: {e}");
    }
    crate::dns::serve(
        listeners,
        upstreams,
        Some(watch),
        setup.nft.clone(),
        setup.dns.clone(),
    )
}

/// Loads `setup`'s egress policy into the caller's network namespace with `nft -f -`, the
/// host's sets holding `host_addrs` too.
pub(crate) fn load_rules(setup: &NetworkSetup, host_addrs: &[IpAddr]) -> Result<(), String> {
    start_loading_rules(setup, host_addrs)?.wait()
}

/// `nft -f -` at work on the egress policy, in the network namespace the caller was in when
/// it started: a gate goes on linking itself meanwhile, and waits before anything of the
/// sandbox runs.
pub(crate) struct RulesLoading {
    nft: Child,
    written: Option<io::Result<()>>,
    program: String,
}

/// Starts loading `setup`'s egress policy into the caller's network namespace, with
/// `host_addrs` (the starter's reading of the host's addresses, made while it was in the
/// host's namespace: the adapter's may be hours old) added to the host's sets in the same
/// transaction. From there the resolver proxy keeps the sets equal to the host's addresses.
pub(crate) fn start_loading_rules(
    setup: &NetworkSetup,
    host_addrs: &[IpAddr],
) -> Result<RulesLoading, String> {
    // A copy of stderr (the sandbox log) for each of nft's outputs.
    let log = || {
        nix::unistd::dup(2)
            // SAFETY: dup returned a new descriptor that nothing else owns.
            .map(|fd| Stdio::from(unsafe { OwnedFd::from_raw_fd(fd) }))
            .unwrap_or_else(|_| Stdio::null())
    };
    let mut nft = Command::new(&setup.nft)
        .args(["-f", "-"])
        .env_clear()
        .stdin(Stdio::piped())
        // fd 1 is the agent's channel: nothing of nft's may reach it.
        .stdout(log())
        .stderr(log())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", setup.nft))?;
    // Closed once written: nft reads to the end before it loads anything.
    let script = format!("{}{}", setup.rules, host_elements(host_addrs));
    let written = nft
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(script.as_bytes()));
    Ok(RulesLoading {
        nft,
        written,
        program: setup.nft.clone(),
    })
}

impl RulesLoading {
    /// Whether the whole policy is in force (nft loads a file as one transaction).
    pub(crate) fn wait(mut self) -> Result<(), String> {
        let status = self
            .nft
            .wait()
            .map_err(|e| format!("cannot wait for {}: {e}", self.program))?;
        match self.written {
            Some(Ok(())) if status.success() => Ok(()),
            _ => Err(format!(
                "{} could not load the egress policy ({status}); nothing was started",
                self.program
            )),
        }
    }
}

/// Waits until pasta gave the namespace a default route (IPv4 or IPv6) and listens on every
/// forwarded port, or gave up.
pub(crate) fn wait_until_ready(pasta: Pid, ports: &[u16]) -> Result<(), String> {
    let deadline = Instant::now() + PASTA_READY;
    loop {
        if has_default_route() && ports.iter().all(|port| listening(*port)) {
            return Ok(());
        }
        match waitpid(pasta, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(status) => {
                return Err(format!(
                    "pasta ended before the network was up ({status:?})"
                ))
            }
            Err(e) => return Err(format!("cannot watch pasta: {e}")),
        }
        if Instant::now() > deadline {
            return Err(format!(
                "pasta did not configure the network within {}s",
                PASTA_READY.as_secs()
            ));
        }
        std::thread::sleep(PASTA_POLL);
    }
}

/// Whether a TCP socket of this namespace listens on `port` (`/proc/self/net/tcp{,6}`, state
/// 0A).
fn listening(port: u16) -> bool {
    let wanted = format!(":{port:04X}");
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .any(|table| {
            std::fs::read_to_string(table).is_ok_and(|text| {
                text.lines().skip(1).any(|line| {
                    let mut fields = line.split_whitespace();
                    let local = fields.nth(1).unwrap_or_default();
                    let state = fields.nth(1).unwrap_or_default();
                    local.ends_with(&wanted) && state == "0A"
                })
            })
        })
}

pub(crate) fn has_default_route() -> bool {
    has_v4_default_route() || has_v6_default_route()
}

fn has_v4_default_route() -> bool {
    std::fs::read_to_string("/proc/self/net/route").is_ok_and(|table| {
        table
            .lines()
            .skip(1)
            .any(|line| line.split_whitespace().nth(1) == Some("00000000"))
    })
}

pub(crate) fn has_v6_default_route() -> bool {
    std::fs::read_to_string("/proc/self/net/ipv6_route").is_ok_and(|table| {
        table.lines().any(|line| {
            let mut fields = line.split_whitespace();
            fields.next() == Some("00000000000000000000000000000000")
                && fields.next() == Some("00")
                && !line.ends_with(" lo")
        })
    })
}

/// `ip link set lo up`, through the one ioctl it needs.
pub(crate) fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() takes plain integers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket returned a new descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as i16;
    // SAFETY: `request` is a valid ifreq naming "lo"; SIOCSIFFLAGS only reads it.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set when this test binary is started again as the starter of a held namespace.
    const STARTER_ENV: &str = "EGRESS_TEST_HOLDER_STARTER";

    /// The holder of a namespace owned by other ids dies with its starter (a root runner):
    /// the starter, this test run again alone in a process of its own, makes the namespace,
    /// prints the holder's pid and is killed.
    #[test]
    fn a_namespace_holder_owned_by_other_ids_dies_with_its_starter() {
        if std::env::var_os(STARTER_ENV).is_some() {
            // The starter: single-threaded here (--test-threads=1 runs us on the main thread).
            let holder = enter_namespace_held_by((65534, 65534)).expect("the namespace");
            println!("holder {holder}");
            std::io::Write::flush(&mut std::io::stdout()).unwrap();
            loop {
                nix::unistd::pause();
            }
        }
        if !nix::unistd::geteuid().is_root() {
            println!("DID NOT RUN: needs root (the holder becomes other ids)");
            return;
        }
        let mut starter = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "netns::tests::a_namespace_holder_owned_by_other_ids_dies_with_its_starter",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STARTER_ENV, "1")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(starter.stdout.take().unwrap());
        let mut line = String::new();
        let holder = loop {
            line.clear();
            assert_ne!(
                std::io::BufRead::read_line(&mut out, &mut line).unwrap(),
                0,
                "the starter ended without a holder"
            );
            // libtest's "test NAME ... " has no newline before our line.
            if let Some((_, pid)) = line.trim().split_once("holder ") {
                break pid.parse::<i32>().unwrap();
            }
        };
        let alive = || {
            std::fs::read_to_string(format!("/proc/{holder}/stat"))
                .is_ok_and(|stat| !stat.contains(") Z "))
        };
        assert!(alive(), "the holder {holder} runs while its starter does");
        starter.kill().unwrap();
        starter.wait().unwrap();
        let gone = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            !alive()
        });
        assert!(gone, "the holder {holder} outlived its starter");
    }
}
