//! Deadlines of fs calls. Each call runs on a thread of its own; one watchdog thread answers
//! for any call still running at its deadline (`FS_CALL_TIMEOUT`, S216) and cancels it. A
//! cancelled call stops at its next check (each directory and file of a walk, each chunk of
//! a read) and sends nothing more: the host hears exactly one answer per request.
//!
//! A thread blocked in the kernel (a hung network or FUSE filesystem: no signal interrupts
//! such a wait) is answered for at the deadline all the same, and ends once the kernel lets
//! go. Such threads are bounded: at most `MAX_RUNNING` calls run at once and at most
//! `MAX_THREADS` exist (running or waiting for a turn); a call beyond that is refused at
//! once. FIFOs, sockets and devices never block a call: every open is `O_NONBLOCK` and the
//! calls that need a regular file refuse anything else.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use agent_proto::{FsError, FsErrorCode, FsReply, Message, FS_CALL_TIMEOUT};

use crate::log::log;
use crate::outbox::Outbox;

/// fs calls doing their work at once; more wait for a turn (within their deadline).
const MAX_RUNNING: usize = 16;
/// fs call threads at once, running or waiting; a call beyond is refused (S216).
const MAX_THREADS: usize = 64;

/// One call's shared state: whether it was cancelled, and whether it was answered.
#[derive(Default)]
struct State {
    cancelled: AtomicBool,
    answered: AtomicBool,
}

impl State {
    /// True for whoever answers first; everyone else must stay silent.
    fn claim_answer(&self) -> bool {
        !self.answered.swap(true, Ordering::SeqCst)
    }
}

/// A call's cancellation, checked by long work. `Cancel::never()` is never cancelled.
#[derive(Clone, Default)]
pub struct Cancel(Option<Arc<State>>);

impl Cancel {
    pub fn never() -> Cancel {
        Cancel(None)
    }

    pub fn is_cancelled(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|s| s.cancelled.load(Ordering::SeqCst))
    }

    /// `Err(S216)` once the call is past its deadline.
    pub fn check(&self) -> Result<(), FsError> {
        if self.is_cancelled() {
            return Err(timed_out());
        }
        Ok(())
    }
}

thread_local! {
    static CURRENT: RefCell<Cancel> = RefCell::new(Cancel::never());
}

/// The cancellation of the call this thread serves (never cancelled outside a call, and on
/// helper threads, which get it passed instead).
pub fn current() -> Cancel {
    CURRENT.with(|c| c.borrow().clone())
}

/// The answer at the deadline.
fn timed_out() -> FsError {
    FsError::new(
        FsErrorCode::Io,
        format!(
            "the call did not finish within {} s (a stalled filesystem or device?): timed out",
            FS_CALL_TIMEOUT.as_secs()
        ),
    )
}

/// What the watchdog keeps per call.
struct Entry {
    id: u32,
    deadline: Instant,
    state: Arc<State>,
    outbox: Outbox,
}

#[derive(Default)]
struct Counts {
    threads: usize,
    running: usize,
}

/// The watchdog's list and the turn-taking of the calls.
#[derive(Default)]
struct Calls {
    entries: Mutex<Vec<Entry>>,
    /// Wakes the watchdog when a call with an earlier deadline arrives.
    changed: Condvar,
    counts: Mutex<Counts>,
    /// Wakes calls waiting for a turn (a turn freed, or a call cancelled).
    turn: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Calls {
    /// Answers and cancels every call past its deadline; sleeps until the next deadline.
    fn watch(&self) {
        loop {
            let mut entries = lock(&self.entries);
            let now = Instant::now();
            let mut expired = Vec::new();
            entries.retain(|entry| {
                if entry.deadline > now {
                    return true;
                }
                entry.state.cancelled.store(true, Ordering::SeqCst);
                expired.push((entry.id, Arc::clone(&entry.state), entry.outbox.clone()));
                false
            });
            if !expired.is_empty() {
                // Answered outside the lock: a slow host link must not hold up other calls.
                drop(entries);
                for (id, state, outbox) in expired {
                    if state.claim_answer() {
                        log!("fs request {id} timed out");
                        outbox.send(id, Message::FsReply(FsReply::Err(timed_out())));
                    }
                }
                // Calls waiting for a turn give up their wait.
                let _counts = lock(&self.counts);
                self.turn.notify_all();
                continue;
            }
            match entries.iter().map(|e| e.deadline).min() {
                Some(at) => {
                    let wait = at.saturating_duration_since(now);
                    drop(self.changed.wait_timeout(entries, wait));
                }
                None => drop(self.changed.wait(entries)),
            }
        }
    }

    fn forget(&self, state: &Arc<State>) {
        lock(&self.entries).retain(|e| !Arc::ptr_eq(&e.state, state));
    }

    /// Waits for a turn to run; false when the call was cancelled meanwhile.
    fn take_turn(&self, state: &State, deadline: Instant) -> bool {
        let mut counts = lock(&self.counts);
        loop {
            if state.cancelled.load(Ordering::SeqCst) {
                return false;
            }
            if counts.running < MAX_RUNNING {
                counts.running += 1;
                return true;
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            counts = self
                .turn
                .wait_timeout(counts, wait.max(Duration::from_millis(10)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn end(&self, ran: bool) {
        let mut counts = lock(&self.counts);
        counts.threads -= 1;
        if ran {
            counts.running -= 1;
            self.turn.notify_one();
        }
    }
}

/// The one watchdog of the process, started with the first call.
fn calls() -> &'static Arc<Calls> {
    static CALLS: OnceLock<Arc<Calls>> = OnceLock::new();
    CALLS.get_or_init(|| {
        let calls = Arc::new(Calls::default());
        let watched = Arc::clone(&calls);
        let started = std::thread::Builder::new()
            .name("fs-deadlines".into())
            .spawn(move || watched.watch());
        if let Err(e) = started {
            // Calls still run, without deadlines: better than none at all.
            log!("cannot start the fs deadline thread: {e}");
        }
        calls
    })
}

/// Why a call could not be started; the caller answers it.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{MAX_THREADS} fs calls are already in flight in this sandbox: retry later")]
    Busy,
    #[error("no thread for the fs call: {0}")]
    NoThread(std::io::Error),
}

/// Runs `work` for request `id` on a thread of its own, with the deadline `timeout`, and sends
/// its reply unless the deadline answered first. `work` may send `Data` frames itself before
/// it returns (a read); it should stop when [`current`] says the call is cancelled.
pub fn spawn(
    id: u32,
    outbox: &Outbox,
    timeout: Duration,
    work: impl FnOnce(&Outbox) -> FsReply + Send + 'static,
) -> Result<(), Refused> {
    let calls = Arc::clone(calls());
    {
        let mut counts = lock(&calls.counts);
        if counts.threads >= MAX_THREADS {
            return Err(Refused::Busy);
        }
        counts.threads += 1;
    }
    let state = Arc::new(State::default());
    let deadline = Instant::now() + timeout;
    {
        let mut entries = lock(&calls.entries);
        entries.push(Entry {
            id,
            deadline,
            state: Arc::clone(&state),
            outbox: outbox.clone(),
        });
        calls.changed.notify_one();
    }
    let outbox = outbox.clone();
    let thread_calls = Arc::clone(&calls);
    let thread_state = Arc::clone(&state);
    let spawned = std::thread::Builder::new()
        .name(format!("fs-{id}"))
        .spawn(move || {
            let (calls, state) = (thread_calls, thread_state);
            let ran = calls.take_turn(&state, deadline);
            if ran {
                CURRENT.with(|c| *c.borrow_mut() = Cancel(Some(Arc::clone(&state))));
                let reply = work(&outbox);
                CURRENT.with(|c| *c.borrow_mut() = Cancel::never());
                if state.claim_answer() {
                    outbox.send(id, Message::FsReply(reply));
                }
            }
            calls.forget(&state);
            calls.end(ran);
        });
    match spawned {
        Ok(_) => Ok(()),
        Err(e) => {
            calls.forget(&state);
            lock(&calls.counts).threads -= 1;
            Err(Refused::NoThread(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_proto::{Frame, FsResponse};
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// An outbox whose frames land in a buffer the test reads.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        /// Every reply sent so far, by request id.
        fn replies(&self) -> Vec<(u32, FsReply)> {
            let bytes = lock(&self.0).clone();
            let mut reader = &bytes[..];
            let mut replies = Vec::new();
            while let Ok(frame) = Frame::read_from(&mut reader) {
                let id = frame.id;
                if let Ok(Message::FsReply(reply)) = Message::from_frame(frame) {
                    replies.push((id, reply));
                }
            }
            replies
        }
    }

    /// The tests share the process's one watchdog and its ceilings: one at a time.
    fn serial() -> MutexGuard<'static, ()> {
        static ONE: Mutex<()> = Mutex::new(());
        lock(&ONE)
    }

    fn blocking_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
        use std::os::fd::FromRawFd;
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 succeeded: both are open and owned by nobody else.
        unsafe {
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        }
    }

    fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !check() {
            assert!(Instant::now() < until, "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|name| name.trim_end().starts_with(prefix))
            })
            .count()
    }

    #[test]
    fn a_call_past_its_deadline_is_answered_once_and_its_thread_ends() {
        let _one = serial();
        let sink = Sink::default();
        let outbox = Outbox::new(Box::new(sink.clone()));
        // Cooperative: stops at its next check once cancelled.
        spawn(7001, &outbox, Duration::from_millis(200), |_| loop {
            if let Err(e) = current().check() {
                return FsReply::Err(e);
            }
            std::thread::sleep(Duration::from_millis(5));
        })
        .unwrap();
        // Blocked in the kernel: a read of a pipe nobody writes, until the test writes.
        let (read, write) = blocking_pipe();
        let fd = read.as_raw_fd();
        spawn(7002, &outbox, Duration::from_millis(200), move |_| {
            let mut byte = [0u8; 1];
            // SAFETY: reads one byte into a valid buffer from a descriptor this closure owns.
            let _ = unsafe { libc::read(fd, byte.as_mut_ptr().cast(), 1) };
            drop(read);
            FsReply::Ok(FsResponse::Removed { removed: true })
        })
        .unwrap();
        // A quick one answers itself.
        spawn(7003, &outbox, Duration::from_secs(60), |_| {
            FsReply::Ok(FsResponse::Created { created: true })
        })
        .unwrap();
        wait_for("three answers", || sink.replies().len() == 3);
        let replies = sink.replies();
        for id in [7001, 7002] {
            let (_, reply) = replies.iter().find(|(i, _)| *i == id).unwrap();
            let FsReply::Err(e) = reply else {
                panic!("{id}: {reply:?}")
            };
            assert_eq!(e.code.s_code(), "S216", "{e}");
            assert!(e.message.contains("timed out"), "{e}");
        }
        assert!(replies.contains(&(7003, FsReply::Ok(FsResponse::Created { created: true }))));
        // The cooperative thread is gone; the blocked one goes once the kernel lets go, and
        // says nothing more.
        wait_for("fs-7001 ended", || threads_named("fs-7001") == 0);
        assert_eq!(threads_named("fs-7002"), 1);
        crate::sys::write_byte(&write);
        wait_for("fs-7002 ended", || threads_named("fs-7002") == 0);
        assert_eq!(sink.replies().len(), 3, "one answer per request");
    }

    #[test]
    fn calls_past_the_thread_ceiling_are_refused_and_waiting_ones_time_out() {
        let _one = serial();
        let sink = Sink::default();
        let outbox = Outbox::new(Box::new(sink.clone()));
        let release = Arc::new(AtomicBool::new(false));
        let mut started = 0;
        let refused = loop {
            let release = Arc::clone(&release);
            let id = 8000 + started;
            match spawn(id, &outbox, Duration::from_millis(300), move |_| {
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                FsReply::Ok(FsResponse::Removed { removed: true })
            }) {
                Ok(()) => started += 1,
                Err(e) => break e,
            }
            assert!(started <= MAX_THREADS as u32, "no ceiling");
        };
        assert!(matches!(refused, Refused::Busy), "{refused}");
        // Every one is answered at its deadline, those waiting for a turn included.
        wait_for("all answered", || sink.replies().len() == started as usize);
        assert!(sink
            .replies()
            .iter()
            .all(|(_, r)| matches!(r, FsReply::Err(e) if e.code.s_code() == "S216")));
        release.store(true, Ordering::SeqCst);
        wait_for("threads ended", || threads_named("fs-80") == 0);
        assert_eq!(lock(&calls().counts).threads, 0);
        assert_eq!(sink.replies().len(), started as usize);
    }
}
