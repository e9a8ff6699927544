//! Searching the files of a walk on a few threads, and merging what they found in walk order
//! so the reply is the one a single thread gives, within bounds of what they hold unmerged.

use super::*;

/// A file handed to a search thread, numbered in walk order.
struct Job {
    seq: usize,
    path: String,
    file: File,
    len: u64,
    /// Room left in the reply when the file was handed out: never less at its merge.
    room_matches: usize,
    room_bytes: usize,
}

/// What a search thread found in one file.
#[derive(Default)]
struct Found {
    matches: Vec<(u64, String)>,
    /// Encoded bytes of `matches`, counted in the shared `held`.
    held: usize,
    /// False when `HELD_MAX` stopped it early: the file is searched again at its merge.
    complete: bool,
}

/// Searches the files `walk` yields on `workers` threads and merges their matches into
/// `hits` in walk order, exactly as one thread would have pushed them.
pub(super) fn in_parallel<W>(
    search: &Search,
    hits: &mut Hits,
    workers: usize,
    held_max: usize,
    walk: W,
) -> Result<(), FsError>
where
    W: FnOnce(&mut dyn FnMut(String, File, u64) -> ControlFlow<()>) -> Result<(), FsError>,
{
    let held = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (job_tx, job_rx) = mpsc::sync_channel::<Vec<Job>>(WINDOW / BATCH);
    let job_rx = Mutex::new(job_rx);
    let (found_tx, found_rx) = mpsc::channel::<Vec<(Job, Found)>>();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let found_tx = found_tx.clone();
            let (job_rx, held, stop) = (&job_rx, &held, &stop);
            scope.spawn(move || {
                let mut scratch = Vec::new();
                loop {
                    let next = job_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok(jobs) = next else {
                        return; // the walk is over
                    };
                    let mut done = Vec::with_capacity(jobs.len());
                    for job in jobs {
                        let found = if stop.load(Ordering::Relaxed) {
                            Found::default()
                        } else {
                            search_job(search, &job, &mut scratch, held, held_max)
                        };
                        done.push((job, found));
                    }
                    if found_tx.send(done).is_err() {
                        return;
                    }
                }
            });
        }
        // Only the search threads hold senders: should they all end, `recv` says so.
        drop(found_tx);
        let mut merge = Merge {
            search,
            hits,
            held: &held,
            waiting: BTreeMap::new(),
            next: 0,
            scratch: Vec::new(),
        };
        let mut out = Outgoing {
            tx: job_tx,
            batch: Vec::new(),
            batch_bytes: 0,
            queued: 0,
            sent: 0,
        };
        let mut stopped = false;
        let walked = walk(&mut |path, file, len| {
            let flow = out.visit(&mut merge, &found_rx, path, file, len);
            stopped = flow.is_break();
            flow
        });
        if !stopped && out.flush().is_break() {
            stopped = true;
        }
        let sent = out.sent;
        // No more files: the threads end once the queue is empty.
        drop(out);
        // The walk ends early only when the reply is full (or no thread is left): the files
        // still out are then not merged.
        let mut done = stopped;
        while walked.is_ok() && !done && merge.next < sent {
            done = merge.wait(&found_rx).is_break();
        }
        // Whatever is still queued is skipped.
        stop.store(true, Ordering::Relaxed);
        walked
    })
}

/// Files on their way to the search threads, in batches of `BATCH`.
struct Outgoing {
    tx: mpsc::SyncSender<Vec<Job>>,
    batch: Vec<Job>,
    batch_bytes: u64,
    /// Files numbered so far, and how many of them were sent.
    queued: usize,
    sent: usize,
}

impl Outgoing {
    /// Queues one file of the walk (sending the batch once full, waiting while `WINDOW`
    /// files are out) and merges what has come back; breaks once the reply is full.
    fn visit(
        &mut self,
        merge: &mut Merge,
        found_rx: &mpsc::Receiver<Vec<(Job, Found)>>,
        path: String,
        file: File,
        len: u64,
    ) -> ControlFlow<()> {
        self.batch.push(Job {
            seq: self.queued,
            path,
            file,
            len,
            room_matches: merge.hits.max - merge.hits.matches.len(),
            room_bytes: merge.hits.budget,
        });
        self.queued += 1;
        self.batch_bytes += len;
        if self.batch.len() >= BATCH || self.batch_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        // Only files sent are waited for: a batch being filled never is.
        while self.sent - merge.next >= WINDOW {
            merge.wait(found_rx)?;
        }
        merge.ready(found_rx)
    }

    fn flush(&mut self) -> ControlFlow<()> {
        if self.batch.is_empty() {
            return ControlFlow::Continue(());
        }
        self.batch_bytes = 0;
        if self.tx.send(std::mem::take(&mut self.batch)).is_err() {
            return ControlFlow::Break(()); // no search thread left
        }
        self.sent = self.queued;
        ControlFlow::Continue(())
    }
}

/// The search threads' results, put back in walk order.
struct Merge<'a> {
    search: &'a Search,
    hits: &'a mut Hits,
    held: &'a AtomicUsize,
    waiting: BTreeMap<usize, (Job, Found)>,
    /// The number of the next file to merge.
    next: usize,
    scratch: Vec<u8>,
}

impl Merge<'_> {
    /// Merges what has arrived, without waiting.
    fn ready(&mut self, rx: &mpsc::Receiver<Vec<(Job, Found)>>) -> ControlFlow<()> {
        while let Ok(done) = rx.try_recv() {
            self.arrived(done);
        }
        self.drain()
    }

    fn arrived(&mut self, done: Vec<(Job, Found)>) {
        for (job, found) in done {
            self.waiting.insert(job.seq, (job, found));
        }
    }

    /// Waits for one more file's result, then merges what is in order.
    fn wait(&mut self, rx: &mpsc::Receiver<Vec<(Job, Found)>>) -> ControlFlow<()> {
        match rx.recv() {
            Ok(done) => {
                self.arrived(done);
                self.drain()
            }
            Err(_) => ControlFlow::Break(()), // the search threads are gone
        }
    }

    fn drain(&mut self) -> ControlFlow<()> {
        while let Some((job, found)) = self.waiting.remove(&self.next) {
            self.next += 1;
            self.held.fetch_sub(found.held, Ordering::Relaxed);
            let hits = &mut *self.hits;
            if found.complete {
                for (number, content) in found.matches {
                    hits.push(&job.path, number, content)?;
                }
                continue;
            }
            drop(found);
            // Stopped by the bound: searched again from its start, straight into the reply.
            let mut file = &job.file;
            let again = file.rewind().and_then(|()| {
                self.search
                    .file(file, job.len, &mut self.scratch, &mut |number, content| {
                        hits.push(&job.path, number, content)
                    })
            });
            again.unwrap_or(ControlFlow::Continue(()))?;
        }
        ControlFlow::Continue(())
    }
}

/// One file searched by a search thread. It keeps matches while a reply with the room the
/// job saw could take them (and the one that would not fit, which truncates at the merge),
/// and while `held` stays within `held_max`.
fn search_job(
    search: &Search,
    job: &Job,
    scratch: &mut Vec<u8>,
    held: &AtomicUsize,
    held_max: usize,
) -> Found {
    let path_cost = json_str_len(&job.path) + MATCH_OVERHEAD;
    let (mut room_matches, mut room_bytes) = (job.room_matches, job.room_bytes);
    let mut found = Found {
        complete: true,
        ..Found::default()
    };
    let searched = search.file(&job.file, job.len, scratch, &mut |number, content| {
        let cost = path_cost + json_str_len(&content);
        let last = room_matches == 0 || cost > room_bytes;
        if held.fetch_add(cost, Ordering::Relaxed) + cost > held_max && !last {
            held.fetch_sub(cost, Ordering::Relaxed);
            found.complete = false;
            return ControlFlow::Break(());
        }
        found.held += cost;
        found.matches.push((number, content));
        if last {
            return ControlFlow::Break(());
        }
        room_matches -= 1;
        room_bytes -= cost;
        ControlFlow::Continue(())
    });
    // A file that fails midway keeps the matches found before, as a single thread does.
    drop(searched);
    found
}
