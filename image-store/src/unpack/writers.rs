//! A small pool that writes regular files in parallel while the tar stream is read in order.
//!
//! Creating files is mostly kernel time (inode allocation), so two writers nearly halve a
//! cold unpack of a many-file layer. Ordering rules live with the caller (`Layer::apply`):
//! only regular files go to the pool, and every entry that removes something or creates a
//! symlink or hard link first waits for the pool to be idle (`wait_idle`). Workers never
//! create symlinks, so no path a worker opens can traverse a symlink made concurrently.

use std::ffi::CString;
use std::io;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::entry::{self, Meta};
use super::pax;

/// Files up to this size are buffered and handed to a worker; larger ones are written inline
/// (the queue then holds at most DEPTH * SMALL_FILE bytes).
pub const SMALL_FILE: u64 = 256 * 1024;
const DEPTH: usize = 64;

pub struct Job {
    pub path: PathBuf,
    pub data: Vec<u8>,
    pub meta: Meta,
    pub xattrs: Vec<(CString, Vec<u8>)>,
}

#[derive(Default)]
struct State {
    pending: Mutex<usize>,
    idle: Condvar,
    error: Mutex<Option<(PathBuf, io::Error)>>,
}

pub struct Writers {
    tx: Option<SyncSender<Job>>,
    handles: Vec<JoinHandle<()>>,
    state: Arc<State>,
}

impl Writers {
    pub fn new(threads: usize) -> io::Result<Writers> {
        let (tx, rx) = sync_channel::<Job>(DEPTH);
        let rx = Arc::new(Mutex::new(rx));
        let state = Arc::new(State::default());
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let (rx, state) = (rx.clone(), state.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("layer-write-{i}"))
                    .spawn(move || work(&rx, &state))?,
            );
        }
        Ok(Writers {
            tx: Some(tx),
            handles,
            state,
        })
    }

    /// Queues a file; fails fast with the first error a worker met.
    pub fn submit(&self, job: Job) -> Result<(), (PathBuf, io::Error)> {
        self.take_error()?;
        *lock(&self.state.pending) += 1;
        let sent = self.tx.as_ref().map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            *lock(&self.state.pending) -= 1;
            return Err((PathBuf::new(), io::Error::other("file writers stopped")));
        }
        Ok(())
    }

    /// Waits until every queued file is written; returns the first error of any of them.
    pub fn wait_idle(&self) -> Result<(), (PathBuf, io::Error)> {
        let mut pending = lock(&self.state.pending);
        while *pending > 0 {
            pending = match self.state.idle.wait(pending) {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
        drop(pending);
        self.take_error()
    }

    fn take_error(&self) -> Result<(), (PathBuf, io::Error)> {
        match lock(&self.state.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        self.tx = None; // workers see the channel close and exit
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn work(rx: &Mutex<Receiver<Job>>, state: &State) {
    loop {
        let job = match lock(rx).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let res = entry::write_file(&job.path, &mut job.data.as_slice(), &job.meta);
        match res {
            Ok(_) => pax::apply_xattrs(&job.path, &job.xattrs),
            Err(e) => {
                let mut slot = lock(&state.error);
                if slot.is_none() {
                    *slot = Some((job.path, e));
                }
            }
        }
        let mut pending = lock(&state.pending);
        *pending -= 1;
        if *pending == 0 {
            state.idle.notify_all();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
