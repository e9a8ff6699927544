//! File watches (`fs::watch`, see `agent_proto::watch` for the wire): one thread and one
//! inotify instance per watch, polling the inotify descriptor and an eventfd the reader loop
//! pokes (acks, stop). Events are coalesced and queued within a byte bound, sent in batches
//! within the host's window; what the bound cannot hold is dropped and marked with an
//! `overflow` event where it was lost.
//!
//! Symbolic links are never followed: the watched path must not be one (S212), a recursive
//! walk opens each directory below with `O_NOFOLLOW` from the directory it holds, and inotify
//! watches are added through the descriptor so opened (`/proc/self/fd/N`), never by a path a
//! guest could swap meanwhile. A link to a directory reports as a file and is never entered.
//!
//! Budget: the watches of one agent together hold at most [`MAX_WATCHES`] inotify instances and
//! [`MAX_WATCH_DIRS`] inotify watches (one pool of directories for all of them), less where
//! the agent's own namespace states smaller limits (a VM's: then half of them). On bwrap the
//! agent's namespace states none (a nested one reads `INT_MAX`): the sandbox's share is the
//! launcher's, one level up (9 instances and 14,440 watches for an ordinary user's sandboxes
//! here), which the kernel enforces on the agent as on every program, and which these caps
//! leave the larger part of to the sandbox's programs.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use agent_proto::watch::{
    escape_name, MAX_BATCH_BYTES, MAX_BATCH_EVENTS, MAX_EVENT_PATH, WATCH_WINDOW,
};
use agent_proto::{
    ErrorCode, FsError, FsErrorCode, Message, RequestError, WatchBatch, WatchEnd, WatchEvent,
    WatchKind, WatchRequest, MAX_WATCHES, MAX_WATCH_DIRS,
};

use crate::fs::at::{self, Dir, Kind};
use crate::log::log;
use crate::outbox::Outbox;

/// Stack of each watch thread: its buffers are on the heap.
const THREAD_STACK: usize = 256 * 1024;
/// How long the first event of a batch waits for more (the window in which the same path and
/// kind coalesce even when the host takes everything at once).
const BATCH_DELAY: Duration = Duration::from_millis(50);
/// Bytes of events (paths plus a fixed cost each) a watch queues while the host's window is
/// full; past it events are dropped and an overflow marked.
const MAX_QUEUE_BYTES: usize = 1024 * 1024;
/// What one queued event costs besides its paths.
const EVENT_COST: usize = 64;
/// One read of the inotify descriptor.
const READ_BUF: usize = 64 * 1024;
/// Reads of the inotify descriptor between two looks at the host's window and stop.
const READS_PER_TURN: usize = 16;

const MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MODIFY
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_EXCL_UNLINK;

/// The watches running now, by request id.
#[derive(Clone, Default)]
pub struct Watches {
    map: Arc<Mutex<HashMap<u32, Arc<Control>>>>,
    /// Directories (inotify watches) all watches hold now.
    pool: Arc<AtomicU32>,
}

/// What the reader loop shares with a watch's thread.
struct Control {
    state: Mutex<Ctl>,
    /// An eventfd: written to wake the thread out of its poll.
    wake: OwnedFd,
}

struct Ctl {
    /// Batches the thread may send before the host's next ack.
    credit: u64,
    stop: bool,
}

impl Control {
    fn lock(&self) -> MutexGuard<'_, Ctl> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poke(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd; a full counter only fails.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// The sandbox's share for watches: (watches at once, inotify watches of all of them).
fn budget() -> (usize, u32) {
    static BUDGET: OnceLock<(usize, u32)> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let read = |name: &str| -> Option<u64> {
            std::fs::read_to_string(format!("/proc/sys/user/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let instances = read("max_inotify_instances")
            .map(|n| (n / 2).clamp(1, MAX_WATCHES as u64) as usize)
            .unwrap_or(MAX_WATCHES);
        let dirs = read("max_inotify_watches")
            .map(|n| (n / 2).clamp(1, u64::from(MAX_WATCH_DIRS)) as u32)
            .unwrap_or(MAX_WATCH_DIRS);
        (instances, dirs)
    })
}

impl Watches {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Arc<Control>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `WatchStart`: the watch runs on a thread of its own, which answers.
    pub fn start(&self, id: u32, request: WatchRequest, outbox: &Outbox) {
        let refuse = |code, message: String| {
            outbox.send(id, Message::Error(RequestError::new(code, message)));
        };
        let (most, dirs) = budget();
        let mut map = self.lock();
        if map.contains_key(&id) {
            return refuse(ErrorCode::DuplicateId, format!("watch {id} is running"));
        }
        if map.len() >= most {
            return refuse(
                ErrorCode::Busy,
                format!("{most} watches are running, the sandbox's limit"),
            );
        }
        // SAFETY: eventfd has no memory effects; the result is checked.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            let e = io::Error::last_os_error();
            return refuse(ErrorCode::Busy, format!("no eventfd for the watch: {e}"));
        }
        // SAFETY: eventfd succeeded: `wake` is open and owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let control = Arc::new(Control {
            state: Mutex::new(Ctl {
                credit: WATCH_WINDOW,
                stop: false,
            }),
            wake,
        });
        let pool = Pool {
            used: self.pool.clone(),
            most: dirs,
        };
        let max_dirs = request.max_dirs.clamp(1, dirs);
        let (watches, thread_control, thread_outbox) =
            (self.clone(), control.clone(), outbox.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("watch-{id}"))
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let end = run(
                    id,
                    &request,
                    max_dirs,
                    pool,
                    &thread_control,
                    &thread_outbox,
                );
                let mut map = watches.lock();
                if map
                    .get(&id)
                    .is_some_and(|c| Arc::ptr_eq(c, &thread_control))
                {
                    map.remove(&id);
                }
                drop(map);
                thread_outbox.send(id, Message::WatchEnd(end));
            });
        match spawned {
            Ok(_) => {
                map.insert(id, control);
            }
            Err(e) => refuse(ErrorCode::Busy, format!("no thread for the watch: {e}")),
        }
    }

    /// `WatchAck`: the host passed `batches` on.
    pub fn ack(&self, id: u32, batches: u64) {
        if let Some(control) = self.lock().get(&id) {
            let mut ctl = control.lock();
            ctl.credit = ctl.credit.saturating_add(batches).min(WATCH_WINDOW);
            drop(ctl);
            control.poke();
        }
    }

    /// `WatchStop` (or the agent shutting down): the thread ends and sends `WatchEnd`.
    pub fn stop(&self, id: u32) {
        if let Some(control) = self.lock().get(&id) {
            control.lock().stop = true;
            control.poke();
        }
    }

    pub fn stop_all(&self) {
        for control in self.lock().values() {
            control.lock().stop = true;
            control.poke();
        }
    }
}

fn fs_error(code: FsErrorCode, path: &str, what: impl std::fmt::Display) -> FsError {
    FsError::new(code, format!("{path}: {what}"))
}

fn os_error(path: &str, err: &io::Error) -> FsError {
    let code = match err.raw_os_error() {
        Some(libc::ENOENT) => FsErrorCode::NotFound,
        Some(libc::ENOTDIR) => FsErrorCode::WrongType,
        Some(libc::EACCES) | Some(libc::EPERM) => FsErrorCode::Permission,
        _ => FsErrorCode::Io,
    };
    fs_error(code, path, err)
}

/// The whole life of one watch; its `WatchEnd`.
fn run(
    id: u32,
    request: &WatchRequest,
    max_dirs: u32,
    pool: Pool,
    control: &Control,
    outbox: &Outbox,
) -> WatchEnd {
    let error = match Watcher::open(request, max_dirs, pool) {
        Ok(mut watcher) => {
            let ready = WatchBatch {
                events: Vec::new(),
                watched: watcher.watched(),
            };
            outbox.send(id, Message::WatchEvents(ready));
            watcher.serve(id, control, outbox)
        }
        Err(e) => Some(e),
    };
    if let Some(e) = &error {
        log!("watch {id} of {}: {e}", request.path);
    }
    WatchEnd { error }
}

/// One directory watched: its path relative to the watched one (escaped, `/` separated).
struct Watched {
    rel: String,
}

struct Watcher {
    inotify: OwnedFd,
    /// The watched directory, to open new subdirectories from (none for a file). Not held
    /// open: an open descriptor would keep a deleted directory's inode, and so its
    /// `IN_DELETE_SELF`, from the watch.
    root: Option<Root>,
    recursive: bool,
    max_dirs: u32,
    /// The agent's directories for all watches.
    pool: Pool,
    dirs: HashMap<i32, Watched>,
    limited: bool,
    queue: Queue,
    /// A rename's first half, waiting for its second in the same read.
    moved_from: Option<(u32, String, bool)>,
}

impl Watcher {
    fn open(request: &WatchRequest, max_dirs: u32, pool: Pool) -> Result<Watcher, FsError> {
        let path = request.path.as_str();
        if !path.starts_with('/') || path.contains('\0') {
            return Err(fs_error(
                FsErrorCode::BadRequest,
                path,
                "expected an absolute path",
            ));
        }
        let target = at::open_path(Path::new(path)).map_err(|e| os_error(path, &e))?;
        let kind = at::kind_of_fd(target.as_raw_fd()).map_err(|e| os_error(path, &e))?;
        if kind == Kind::Symlink {
            return Err(fs_error(
                FsErrorCode::WrongType,
                path,
                "is a symbolic link: fs::watch never follows one, watch its target",
            ));
        }
        // SAFETY: inotify_init1 has no memory effects; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(fs_error(
                FsErrorCode::Io,
                path,
                format!("no inotify instance left in the sandbox: {e}"),
            ));
        }
        let mut watcher = Watcher {
            // SAFETY: inotify_init1 succeeded: `fd` is open and owned by nobody else.
            inotify: unsafe { OwnedFd::from_raw_fd(fd) },
            root: None,
            recursive: request.recursive && kind == Kind::Dir,
            max_dirs,
            pool,
            dirs: HashMap::new(),
            limited: false,
            queue: Queue::default(),
            moved_from: None,
        };
        let is_dir = kind == Kind::Dir;
        let mask = if is_dir {
            MASK | libc::IN_ONLYDIR
        } else {
            MASK
        };
        if !watcher.pool.take() {
            return Err(fs_error(
                FsErrorCode::Io,
                path,
                format!(
                    "the sandbox's watches hold {} directories, their limit: end one first",
                    watcher.pool.most
                ),
            ));
        }
        let wd = match watcher.add(target.as_raw_fd(), path, mask) {
            Ok(wd) => wd,
            Err(e) => {
                watcher.pool.give(1);
                return Err(os_error(path, &e));
            }
        };
        watcher.dirs.insert(wd, Watched { rel: String::new() });
        if is_dir {
            let st = at::stat_fd(target.as_raw_fd()).map_err(|e| os_error(path, &e))?;
            if watcher.recursive {
                let below = at::reopen_dir(target.as_raw_fd()).map_err(|e| os_error(path, &e))?;
                watcher.walk(below, String::new());
            }
            watcher.root = Some(Root {
                path: path.into(),
                dev: st.st_dev,
                ino: st.st_ino,
            });
        }
        Ok(watcher)
    }

    fn watched(&self) -> u32 {
        self.dirs.len() as u32
    }

    /// An inotify watch on what `fd` refers to, through its `/proc/self/fd` entry (followed:
    /// it names that very inode, whatever the guest does to its path meanwhile); where
    /// `/proc` is missing, through `path`, never following its last component.
    fn add(&self, fd: RawFd, path: &str, mask: u32) -> io::Result<i32> {
        let magic = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number");
        // SAFETY: `magic` is NUL-terminated and outlives the call.
        let wd = unsafe { libc::inotify_add_watch(self.inotify.as_raw_fd(), magic.as_ptr(), mask) };
        if wd >= 0 {
            return Ok(wd);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ENOENT) || Path::new("/proc/self/fd").exists() {
            return Err(err);
        }
        let c_path = CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c_path` is NUL-terminated and outlives the call.
        let wd = unsafe {
            libc::inotify_add_watch(
                self.inotify.as_raw_fd(),
                c_path.as_ptr(),
                mask | libc::IN_DONT_FOLLOW,
            )
        };
        if wd < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(wd)
        }
    }

    /// Watches `dir` (already watched itself) and every directory below it, never through a
    /// link, up to the limit.
    fn walk(&mut self, dir: Dir, rel: String) {
        let mut stack = vec![(dir, rel)];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = dir.entries() else { continue };
            for entry in entries {
                if entry.kind != Kind::Dir {
                    continue;
                }
                let Ok(sub) = dir.sub(&entry.name) else {
                    continue; // gone, or swapped for a link meanwhile
                };
                let child = join(&rel, entry.name.as_bytes());
                if !self.watch_dir(&sub, &child) {
                    return;
                }
                stack.push((sub, child));
            }
        }
    }

    /// Adds a watch on the directory `dir` at `rel`; false once the limit is reached.
    fn watch_dir(&mut self, dir: &Dir, rel: &str) -> bool {
        if self.limited {
            return false;
        }
        if self.dirs.len() as u32 >= self.max_dirs {
            self.limit(format!("{} directories", self.max_dirs));
            return false;
        }
        if !self.pool.take() {
            self.limit(format!("{} directories of all watches", self.pool.most));
            return false;
        }
        let full = format!("/proc/self/fd/{}", dir.as_raw_fd());
        match self.add(dir.as_raw_fd(), &full, MASK | libc::IN_ONLYDIR) {
            Ok(wd) => {
                // The same inode seen again (a bind mount) keeps its first name.
                match self.dirs.entry(wd) {
                    Entry::Occupied(_) => self.pool.give(1),
                    Entry::Vacant(slot) => {
                        slot.insert(Watched {
                            rel: rel.to_string(),
                        });
                    }
                }
                true
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                self.pool.give(1);
                self.limit("the sandbox's inotify watches".into());
                false
            }
            Err(_) => {
                self.pool.give(1);
                true // gone meanwhile: nothing to watch
            }
        }
    }

    fn limit(&mut self, what: String) {
        if !self.limited {
            self.limited = true;
            log!("a watch reached its limit of {what}");
            self.queue.push_marker(WatchKind::Limit);
        }
    }

    /// Reads and sends until stopped; the error that ended the watch, if one did.
    fn serve(&mut self, id: u32, control: &Control, outbox: &Outbox) -> Option<FsError> {
        let mut buf = vec![0u8; READ_BUF];
        loop {
            let credit = {
                let ctl = control.lock();
                if ctl.stop {
                    return None;
                }
                ctl.credit
            };
            if credit > 0 {
                if let Some(first) = self.queue.first_at {
                    let due = first + BATCH_DELAY;
                    if Instant::now() >= due || self.queue.events.len() >= MAX_BATCH_EVENTS {
                        let batch = self.queue.take_batch(self.watched());
                        control.lock().credit -= 1;
                        outbox.send(id, Message::WatchEvents(batch));
                        continue;
                    }
                }
            }
            if self.dirs.is_empty() && self.queue.events.is_empty() {
                return Some(FsError::new(
                    FsErrorCode::NotFound,
                    "the watched path was deleted or moved away",
                ));
            }
            let timeout = match (credit > 0, self.queue.first_at) {
                (true, Some(first)) => {
                    let left = (first + BATCH_DELAY).saturating_duration_since(Instant::now());
                    left.as_millis().min(1000) as i32 + 1
                }
                _ => -1,
            };
            let mut fds = [
                libc::pollfd {
                    fd: self.inotify.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: control.wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a valid array of two pollfd for the call's duration.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Some(FsError::new(FsErrorCode::Io, format!("poll: {e}")));
            }
            if fds[1].revents != 0 {
                let mut count = 0u64;
                // SAFETY: reads 8 bytes into a live u64 from our eventfd (resets it).
                unsafe {
                    libc::read(
                        control.wake.as_raw_fd(),
                        (&mut count as *mut u64).cast(),
                        std::mem::size_of::<u64>(),
                    )
                };
            }
            if fds[0].revents != 0 {
                if let Err(e) = self.read_events(&mut buf) {
                    return Some(FsError::new(FsErrorCode::Io, format!("inotify: {e}")));
                }
            }
        }
    }

    /// Drains what the kernel has queued (a bounded number of reads per turn).
    fn read_events(&mut self, buf: &mut [u8]) -> io::Result<()> {
        for _ in 0..READS_PER_TURN {
            // SAFETY: `buf` is valid and writable for its length for the call.
            let n =
                unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            let n = n as usize;
            let mut at = 0;
            const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
            while at + HEAD <= n {
                let field = |o: usize| {
                    let b = &buf[at + o..at + o + 4];
                    [b[0], b[1], b[2], b[3]]
                };
                let wd = i32::from_ne_bytes(field(0));
                let mask = u32::from_ne_bytes(field(4));
                let cookie = u32::from_ne_bytes(field(8));
                let len = u32::from_ne_bytes(field(12)) as usize;
                let end = (at + HEAD).saturating_add(len).min(n);
                let raw = &buf[at + HEAD..end];
                let name = &raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())];
                self.event(wd, mask, cookie, name);
                at = end;
            }
            self.flush_moved_from();
        }
        Ok(())
    }

    /// One inotify event.
    fn event(&mut self, wd: i32, mask: u32, cookie: u32, name: &[u8]) {
        if mask & libc::IN_Q_OVERFLOW != 0 {
            self.flush_moved_from();
            self.queue.push_marker(WatchKind::Overflow);
            return;
        }
        if mask & libc::IN_IGNORED != 0 {
            if self.dirs.remove(&wd).is_some() {
                self.pool.give(1);
            }
            return;
        }
        let Some(dir) = self.dirs.get(&wd) else {
            return; // a watch removed meanwhile
        };
        let is_dir = mask & libc::IN_ISDIR != 0;
        let self_event = mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0;
        if self_event {
            // Its parent's watch reports the same change by name; only the watched path
            // itself has no parent watched.
            if dir.rel.is_empty() {
                let kind = if mask & libc::IN_DELETE_SELF != 0 {
                    WatchKind::Deleted
                } else {
                    WatchKind::Moved
                };
                let is_dir = self.root.is_some();
                self.queue.push(kind, String::new(), is_dir, None);
                if kind == WatchKind::Moved {
                    // Whatever it is called now is outside what was asked for.
                    self.remove_all();
                }
            }
            return;
        }
        let path = if name.is_empty() {
            dir.rel.clone()
        } else {
            join(&dir.rel, name)
        };
        if mask & libc::IN_MOVED_FROM != 0 {
            self.flush_moved_from();
            self.moved_from = Some((cookie, path, is_dir));
            return;
        }
        if mask & libc::IN_MOVED_TO != 0 {
            match self.moved_from.take() {
                Some((c, from, _)) if c == cookie => {
                    if is_dir {
                        self.rename_dirs(&from, &path);
                    }
                    self.queue
                        .push(WatchKind::Moved, path.clone(), is_dir, Some(from));
                }
                other => {
                    self.moved_from = other;
                    self.flush_moved_from();
                    self.queue
                        .push(WatchKind::Moved, path.clone(), is_dir, None);
                    if is_dir {
                        self.new_dir(&path);
                    }
                }
            }
            return;
        }
        self.flush_moved_from();
        let kind = if mask & libc::IN_CREATE != 0 {
            WatchKind::Created
        } else if mask & libc::IN_DELETE != 0 {
            WatchKind::Deleted
        } else {
            WatchKind::Modified
        };
        self.queue.push(kind, path.clone(), is_dir, None);
        if kind == WatchKind::Created && is_dir {
            self.new_dir(&path);
        }
    }

    /// A rename whose other half never came: it left the watched tree.
    fn flush_moved_from(&mut self) {
        if let Some((_, from, is_dir)) = self.moved_from.take() {
            if is_dir {
                self.remove_below(&from);
            }
            self.queue.push(WatchKind::Moved, from, is_dir, None);
        }
    }

    /// A directory that appeared at `rel`: watched with everything below it (recursive).
    fn new_dir(&mut self, rel: &str) {
        if !self.recursive || self.limited {
            return;
        }
        let Some(root) = self.root.as_ref().and_then(Root::open) else {
            return;
        };
        let Ok(dir) = root.resolve(Path::new(OsStr::from_bytes(&unescape(rel)))) else {
            return; // gone, or a link now
        };
        if self.watch_dir(&dir, rel) {
            self.walk(dir, rel.to_string());
        }
    }

    /// Directories at `from` and below are at `to` now.
    fn rename_dirs(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        for watched in self.dirs.values_mut() {
            if watched.rel == from {
                watched.rel = to.to_string();
            } else if let Some(rest) = watched.rel.strip_prefix(&prefix) {
                watched.rel = format!("{to}/{rest}");
            }
        }
    }

    /// Stops watching the directory at `rel` and everything below it.
    fn remove_below(&mut self, rel: &str) {
        let prefix = format!("{rel}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, w)| w.rel == rel || w.rel.starts_with(&prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            if self.dirs.remove(&wd).is_some() {
                self.pool.give(1);
            }
            // SAFETY: inotify_rm_watch has no memory effects; a stale wd only fails.
            unsafe { libc::inotify_rm_watch(self.inotify.as_raw_fd(), wd) };
        }
    }

    fn remove_all(&mut self) {
        for wd in self.dirs.keys() {
            // SAFETY: as in `remove_below`.
            unsafe { libc::inotify_rm_watch(self.inotify.as_raw_fd(), *wd) };
        }
        self.pool.give(self.dirs.len() as u32);
        self.dirs.clear();
    }
}

impl Drop for Watcher {
    /// The inotify instance closes with its watches: they go back to the pool.
    fn drop(&mut self) {
        self.pool.give(self.dirs.len() as u32);
    }
}

/// The directories all watches of the agent may hold, and how many they hold.
struct Pool {
    used: Arc<AtomicU32>,
    most: u32,
}

impl Pool {
    /// One more directory, if the pool has room.
    fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.most).then_some(n + 1)
            })
            .is_ok()
    }

    fn give(&self, n: u32) {
        let _ = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_sub(n))
            });
    }
}

/// The watched directory: its path and identity.
struct Root {
    path: std::path::PathBuf,
    dev: u64,
    ino: u64,
}

impl Root {
    /// The watched directory again, if its path still names it (not a link, nor another
    /// directory put in its place).
    fn open(&self) -> Option<Dir> {
        let fd = at::open_path(&self.path).ok()?;
        let st = at::stat_fd(fd.as_raw_fd()).ok()?;
        let same = st.st_mode & libc::S_IFMT == libc::S_IFDIR
            && st.st_dev == self.dev
            && st.st_ino == self.ino;
        same.then(|| at::reopen_dir(fd.as_raw_fd()).ok()).flatten()
    }
}

/// `rel` and one more name, escaped.
fn join(rel: &str, name: &[u8]) -> String {
    let mut out = String::with_capacity(rel.len() + 1 + name.len());
    out.push_str(rel);
    if !rel.is_empty() {
        out.push('/');
    }
    escape_name(name, &mut out);
    out
}

/// The bytes an escaped path stands for (see `escape_name`).
fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 1 < bytes.len() {
            if bytes[i + 1] == b'\\' {
                out.push(b'\\');
                i += 2;
                continue;
            }
            if bytes[i + 1] == b'x' && i + 3 < bytes.len() {
                if let Ok(b) = u8::from_str_radix(&text[i + 2..i + 4], 16) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Events waiting for the host's window: coalesced, within [`MAX_QUEUE_BYTES`].
#[derive(Default)]
struct Queue {
    events: VecDeque<(u64, WatchEvent)>,
    bytes: usize,
    /// When the oldest queued event came.
    first_at: Option<Instant>,
    /// Sequence number of the next event pushed.
    next: u64,
    /// Per path, the kind and sequence number of its latest queued event.
    latest: HashMap<String, (WatchKind, u64)>,
}

impl Queue {
    fn cost(event: &WatchEvent) -> usize {
        EVENT_COST + 2 * event.path.len() + event.from.as_ref().map_or(0, String::len)
    }

    fn head_seq(&self) -> u64 {
        self.events.front().map_or(self.next, |(seq, _)| *seq)
    }

    /// Queues an event, unless the same path's latest queued event is of the same kind
    /// (coalesced) or the queue is full (dropped, and an overflow marked).
    fn push(&mut self, kind: WatchKind, path: String, is_dir: bool, from: Option<String>) {
        let too_long =
            path.len() > MAX_EVENT_PATH || from.as_ref().is_some_and(|f| f.len() > MAX_EVENT_PATH);
        if too_long {
            return self.push_marker(WatchKind::Overflow);
        }
        let head = self.head_seq();
        if from.is_none() {
            if let Some((last, seq)) = self.latest.get(&path) {
                if *last == kind && *seq >= head {
                    return;
                }
            }
        }
        let event = WatchEvent {
            kind,
            path,
            is_dir,
            from,
        };
        let cost = Self::cost(&event);
        if self.bytes + cost > MAX_QUEUE_BYTES {
            return self.push_marker(WatchKind::Overflow);
        }
        if self.latest.len() >= 2 * MAX_BATCH_EVENTS.max(self.events.len()) {
            self.latest.retain(|_, (_, seq)| *seq >= head);
        }
        self.latest.insert(event.path.clone(), (kind, self.next));
        self.append(event, cost);
    }

    /// An overflow or limit marker, once per run of them (it has room beyond the bound).
    fn push_marker(&mut self, kind: WatchKind) {
        if self.events.back().is_some_and(|(_, e)| e.kind == kind) {
            return;
        }
        let event = WatchEvent {
            kind,
            path: String::new(),
            is_dir: false,
            from: None,
        };
        self.append(event, EVENT_COST);
    }

    fn append(&mut self, event: WatchEvent, cost: usize) {
        self.bytes += cost;
        self.first_at.get_or_insert_with(Instant::now);
        self.events.push_back((self.next, event));
        self.next += 1;
    }

    /// The oldest events, as one batch within the event and byte limits.
    fn take_batch(&mut self, watched: u32) -> WatchBatch {
        let mut events = Vec::new();
        let mut size = 64;
        while let Some((_, event)) = self.events.front() {
            let cost = Self::cost(event);
            if events.len() >= MAX_BATCH_EVENTS
                || (size + cost > MAX_BATCH_BYTES && !events.is_empty())
            {
                break;
            }
            let Some((_, event)) = self.events.pop_front() else {
                break;
            };
            size += cost;
            self.bytes = self.bytes.saturating_sub(cost.max(EVENT_COST));
            events.push(event);
        }
        self.first_at = if self.events.is_empty() {
            self.bytes = 0;
            self.latest.clear();
            None
        } else {
            Some(Instant::now())
        };
        WatchBatch { events, watched }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_path_and_kind_coalesce_but_order_changes_do_not() {
        let mut q = Queue::default();
        q.push(WatchKind::Created, "a".into(), false, None);
        q.push(WatchKind::Modified, "a".into(), false, None);
        q.push(WatchKind::Modified, "a".into(), false, None);
        q.push(WatchKind::Deleted, "a".into(), false, None);
        q.push(WatchKind::Created, "a".into(), false, None);
        let kinds: Vec<WatchKind> = q.take_batch(1).events.iter().map(|e| e.kind).collect();
        use WatchKind::*;
        assert_eq!(kinds, [Created, Modified, Deleted, Created]);
        // Once sent, the same event is news again.
        q.push(WatchKind::Created, "a".into(), false, None);
        assert_eq!(q.take_batch(1).events.len(), 1);
    }

    #[test]
    fn a_full_queue_drops_and_marks_one_overflow() {
        let mut q = Queue::default();
        for i in 0..100_000 {
            q.push(WatchKind::Created, format!("f{i}"), false, None);
        }
        assert!(q.bytes <= MAX_QUEUE_BYTES + EVENT_COST);
        let overflows = q
            .events
            .iter()
            .filter(|(_, e)| e.kind == WatchKind::Overflow)
            .count();
        assert_eq!(overflows, 1);
        assert_eq!(
            q.events.back().map(|(_, e)| e.kind),
            Some(WatchKind::Overflow)
        );
        let mut sent = 0;
        while !q.events.is_empty() {
            let batch = q.take_batch(1);
            assert!(batch.events.len() <= MAX_BATCH_EVENTS);
            assert!(serde_json::to_vec(&batch).unwrap().len() <= MAX_BATCH_BYTES);
            sent += batch.events.len();
        }
        assert!(sent > 1000 && sent < 100_000, "{sent}");
    }

    #[test]
    fn escaped_names_come_back_as_their_bytes() {
        let name = b"a\\b\xff/c";
        let joined = join("d", name);
        assert_eq!(unescape(&joined), b"d/a\\b\xff/c");
    }
}
