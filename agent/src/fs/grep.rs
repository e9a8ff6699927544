//! `fs::grep`: the lines of regular files that match a regex. Binary files (a NUL byte in
//! their first 8 KiB, as GNU grep decides) are skipped; lines count from 1; `content` is the
//! line without its newline, cut to `max_line_bytes` bytes at a UTF-8 boundary and decoded
//! lossily. Files that cannot be read while walking are skipped (like `grep -rs`).
//! `truncated` is set when a further match exists beyond `max_matches`, or when the
//! reply would outgrow one frame (`wire::REPLY_BUDGET`).
//!
//! Files up to `WHOLE_FILE_MAX` are read into a buffer each search thread reuses and searched
//! as one buffer (past `SCRATCH_KEEP` bytes only while the agent's buffer budget has room,
//! see `budget`; else line by line): the regex (with `^`/`$` at line boundaries) skips to a candidate, and the
//! candidate's line is then checked on its own, so the result is exactly that of a
//! line-by-line search, several times faster. Larger files, and patterns whose meaning
//! differs between a buffer and a line (`\A`, `\z`, a `-m` flag), are read line by line with
//! bounded memory.
//!
//! A directory is walked by one thread (the descriptor walk of `walk`: nothing is ever
//! opened through a link) which opens each file and hands them, `BATCH` at a time, to up to
//! `MAX_WORKERS` search threads; their results are merged in walk order, so the reply is the
//! one a single thread gives. What the threads hold unmerged is bounded by `HELD_MAX` bytes of matches and
//! `WINDOW` files: a file whose matches would pass the bound is searched again, in turn.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};

use agent_proto::fs::{GrepMatch, GREP_MAX_LINE_BYTES, GREP_MAX_MATCHES};
use agent_proto::{FsError, FsErrorCode, FsResponse};
use regex::bytes::Regex;

use super::budget::{self, Grant};
use super::call::{self, Cancel};
use super::pattern::{self, Filter};
use super::walk;
use super::wire::{json_str_len, REPLY_BUDGET};
use super::{at, os_error};

/// Bytes looked at to decide whether a file is binary.
pub const BINARY_PROBE: usize = 8 * 1024;
/// Longest line held in memory: a longer line is matched on its first `SCAN_LINE_CAP` bytes,
/// or its first `LINE_CAP_UNBUDGETED` bytes while the agent's buffer budget has no room.
const SCAN_LINE_CAP: usize = 8 * 1024 * 1024;
const LINE_CAP_UNBUDGETED: usize = 1024 * 1024;
/// Largest file searched as one buffer.
const WHOLE_FILE_MAX: u64 = 16 * 1024 * 1024;
/// JSON around one match besides its two strings: `{"path":,"line":N,"content":},`.
const MATCH_OVERHEAD: usize = 64;
/// Search threads of one request at most (each may hold a `WHOLE_FILE_MAX` buffer).
const MAX_WORKERS: usize = 4;
/// Files opened and not yet merged, at most.
const WINDOW: usize = 64;
/// Files handed to a search thread at once (fewer wake-ups), and their bytes at most.
const BATCH: usize = 8;
const BATCH_BYTES: u64 = 4 * 1024 * 1024;
/// Bytes of matches (as encoded) the search threads hold unmerged, at most.
const HELD_MAX: usize = REPLY_BUDGET;
/// A search thread's buffer larger than this is released after its file.
const SCRATCH_KEEP: usize = 1024 * 1024;

/// One `fs::grep` request, as the agent receives it.
pub struct Query<'a> {
    pub pattern: &'a str,
    pub recursive: bool,
    pub ignore_case: bool,
    pub include_glob: &'a [String],
    pub exclude_glob: &'a [String],
    pub max_matches: u64,
    pub max_line_bytes: u64,
}

pub fn grep(root: &Path, query: &Query) -> Result<FsResponse, FsError> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_WORKERS);
    grep_with(root, query, workers, HELD_MAX)
}

/// [`grep`] with `workers` search threads holding at most `held_max` bytes unmerged.
fn grep_with(
    root: &Path,
    query: &Query,
    workers: usize,
    held_max: usize,
) -> Result<FsResponse, FsError> {
    if !(1..=GREP_MAX_MATCHES).contains(&query.max_matches) {
        return Err(FsError::new(
            FsErrorCode::BadRequest,
            format!("max_matches must be 1..={GREP_MAX_MATCHES}"),
        ));
    }
    if query.max_line_bytes > GREP_MAX_LINE_BYTES {
        return Err(FsError::new(
            FsErrorCode::BadRequest,
            format!("max_line_bytes must be 0..={GREP_MAX_LINE_BYTES}"),
        ));
    }
    let search = Search {
        patterns: Patterns::new(query.pattern, query.ignore_case)?,
        line_bytes: query.max_line_bytes as usize,
        cancel: call::current(),
    };
    let filter = Filter::new(query.include_glob, query.exclude_glob)?;
    let mut hits = Hits::new(query.max_matches as usize);
    match walk::start(root)? {
        // A file named as the root: its errors are the call's.
        walk::Start::File => {
            let shown = root.to_string_lossy();
            // Non-blocking: a FIFO swapped in since `start` must not hold the open.
            let searched = at::open_nonblocking(root, libc::O_RDONLY, 0).and_then(|file| {
                let meta = file.metadata()?;
                if !meta.is_file() {
                    return Ok(ControlFlow::Continue(())); // swapped for a FIFO or a device
                }
                search.file(
                    &file,
                    meta.len(),
                    &mut Vec::new(),
                    &mut |number, content| hits.push(&shown, number, content),
                )
            });
            if let Err(e) = searched {
                return Err(os_error(root, e));
            }
        }
        walk::Start::Dir(dir) => {
            let files = |visit: &mut dyn FnMut(String, File, u64) -> ControlFlow<()>| {
                walk::files(&dir, root, query.recursive, &filter, &mut |found| {
                    // Opened from the directory holding it; one that cannot be is skipped.
                    let Ok(file) = found.dir.open_file(found.name) else {
                        return ControlFlow::Continue(());
                    };
                    match file.metadata() {
                        // Not one swapped for a FIFO or a device meanwhile.
                        Ok(meta) if meta.is_file() => {
                            visit(found.path.to_string_lossy().into_owned(), file, meta.len())
                        }
                        _ => ControlFlow::Continue(()),
                    }
                })
            };
            if workers > 1 {
                in_parallel(&search, &mut hits, workers, held_max, files)?;
            } else {
                let mut scratch = Vec::new();
                files(&mut |path, file, len| {
                    // A file that fails midway keeps the matches found before.
                    search
                        .file(&file, len, &mut scratch, &mut |number, content| {
                            hits.push(&path, number, content)
                        })
                        .unwrap_or(ControlFlow::Continue(()))
                })?;
            }
        }
    }
    Ok(FsResponse::Matches {
        matches: hits.matches,
        truncated: hits.truncated,
    })
}

/// The matches gathered so far and what room is left for more.
struct Hits {
    matches: Vec<GrepMatch>,
    max: usize,
    budget: usize,
    truncated: bool,
}

impl Hits {
    fn new(max: usize) -> Hits {
        Hits {
            matches: Vec::new(),
            max,
            budget: REPLY_BUDGET,
            truncated: false,
        }
    }

    fn push(&mut self, path: &str, line: u64, content: String) -> ControlFlow<()> {
        let cost = json_str_len(path) + json_str_len(&content) + MATCH_OVERHEAD;
        if self.matches.len() >= self.max || cost > self.budget {
            self.truncated = true;
            return ControlFlow::Break(());
        }
        self.budget -= cost;
        self.matches.push(GrepMatch {
            path: path.to_string(),
            line,
            content,
        });
        ControlFlow::Continue(())
    }
}

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
fn in_parallel<W>(
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

/// The pattern compiled for a line, and for a whole buffer when that means the same.
struct Patterns {
    line: Regex,
    buffer: Option<Regex>,
}

impl Patterns {
    fn new(pattern: &str, ignore_case: bool) -> Result<Patterns, FsError> {
        let line = pattern::regex(pattern, false, ignore_case, false)?;
        let differs = [r"\A", r"\z", "-m"].iter().any(|s| pattern.contains(s));
        let buffer = if differs {
            None
        } else {
            Some(pattern::regex(pattern, false, ignore_case, true)?)
        };
        Ok(Patterns { line, buffer })
    }
}

/// What a search looks for and how a matching line is shown.
struct Search {
    patterns: Patterns,
    line_bytes: usize,
    /// The call's deadline, looked at while reading a large file line by line (the search
    /// threads have no call of their own).
    cancel: Cancel,
}

impl Search {
    /// Calls `found(number, content)` for each matching line of `file` (a regular file of
    /// `len` bytes when opened), until it breaks. `scratch` is the buffer reused per file.
    fn file(
        &self,
        file: &File,
        len: u64,
        scratch: &mut Vec<u8>,
        found: &mut dyn FnMut(u64, String) -> ControlFlow<()>,
    ) -> io::Result<ControlFlow<()>> {
        let mut grant = None;
        let result = self.file_in(file, len, scratch, &mut grant, found);
        if scratch.len() > SCRATCH_KEEP {
            *scratch = Vec::new();
        }
        // The budget gets back only what is freed.
        drop(grant);
        result
    }

    fn file_in(
        &self,
        mut file: &File,
        len: u64,
        scratch: &mut Vec<u8>,
        grant: &mut Option<Grant>,
        found: &mut dyn FnMut(u64, String) -> ControlFlow<()>,
    ) -> io::Result<ControlFlow<()>> {
        // A file of up to SCRATCH_KEEP bytes is read with one call, as much as its size says
        // (GNU grep trusts it too: a file growing meanwhile is searched up to its size when
        // opened); a larger one is probed first, so a big binary is not read whole. A size of
        // 0 (also what some kernel files say) reads up to SCRATCH_KEEP: all of it when it
        // ends there, else the rest line by line.
        let first = match len {
            0 => SCRATCH_KEEP,
            n if n <= SCRATCH_KEEP as u64 => n as usize,
            _ => BINARY_PROBE,
        };
        let head = fill(file, scratch, 0, first)?;
        if is_binary(&scratch[..head.min(BINARY_PROBE)]) {
            return Ok(ControlFlow::Continue(()));
        }
        let line_bytes = self.line_bytes;
        let mut found = |number: u64, line: &[u8]| {
            found(
                number,
                String::from_utf8_lossy(cut(line, line_bytes)).into_owned(),
            )
        };
        if let Some(buffer) = &self.patterns.buffer {
            let in_hand = match len {
                0 => head < SCRATCH_KEEP,
                n => first as u64 == n || head < first,
            };
            let mut whole = in_hand.then_some(head);
            if whole.is_none() && len <= WHOLE_FILE_MAX && len > 0 {
                // Room for the whole file, or the search goes line by line.
                if let Some(room) = budget::try_take(len as usize) {
                    *grant = Some(room);
                    whole = Some(fill(file, scratch, head, len as usize)?);
                }
            }
            if let Some(filled) = whole {
                let data = &scratch[..filled];
                return Ok(search_buffer(data, buffer, &self.patterns.line, &mut found));
            }
        }
        let line_cap = match budget::try_take(SCAN_LINE_CAP) {
            Some(room) => {
                *grant = Some(room);
                SCAN_LINE_CAP
            }
            None => LINE_CAP_UNBUDGETED,
        };
        let head = io::Cursor::new(&scratch[..head]);
        let mut reader = BufReader::with_capacity(64 * 1024, head.chain(&mut file));
        let mut line = Vec::new();
        let mut number = 0u64;
        while next_line(&mut reader, &mut line, line_cap, &self.cancel)? {
            number += 1;
            if self.patterns.line.is_match(&line) && found(number, &line).is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }
}

/// Reads `file` into `buf[from..]` until `upto` bytes are there or the file ends; the
/// buffer only ever grows (its bytes past what was read are stale), to `upto` at once when
/// that is at most `SCRATCH_KEEP`, else step by step. Returns the bytes held.
fn fill(mut file: &File, buf: &mut Vec<u8>, from: usize, upto: usize) -> io::Result<usize> {
    let mut filled = from;
    while filled < upto {
        if buf.len() <= filled {
            let want = if upto <= SCRATCH_KEEP {
                upto
            } else {
                (filled * 2).clamp(SCRATCH_KEEP, upto)
            };
            buf.resize(want, 0);
        }
        let end = buf.len().min(upto);
        match file.read(&mut buf[filled..end]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Calls `found(number, line)` for each line of `data` that `line_re` matches, using the
/// multi-line `buffer_re` to skip ahead: a line `line_re` matches holds a `buffer_re` match
/// at the same place, so a search from the start of any earlier line stops at or before it.
fn search_buffer(
    data: &[u8],
    buffer_re: &Regex,
    line_re: &Regex,
    found: &mut dyn FnMut(u64, &[u8]) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let mut pos = 0; // always the start of a line
    let mut number = 1u64; // the number of the line starting at `counted`
    let mut counted = 0;
    while pos <= data.len() {
        let Some(candidate) = buffer_re.find_at(data, pos) else {
            break;
        };
        let at = candidate.start();
        if at == data.len() && (data.is_empty() || data[at - 1] == b'\n') {
            break; // after the last newline: no line there
        }
        let start = memchr::memrchr(b'\n', &data[..at]).map_or(0, |i| i + 1);
        let end = memchr::memchr(b'\n', &data[at..]).map_or(data.len(), |i| at + i);
        number += memchr::memchr_iter(b'\n', &data[counted..start]).count() as u64;
        counted = start;
        let line = &data[start..end];
        if line_re.is_match(line) && found(number, line).is_break() {
            return ControlFlow::Break(());
        }
        pos = end + 1;
    }
    ControlFlow::Continue(())
}

/// GNU grep's test: a NUL byte in the probed head.
pub fn is_binary(head: &[u8]) -> bool {
    memchr::memchr(0, &head[..head.len().min(BINARY_PROBE)]).is_some()
}

/// Reads the next line into `line` without its newline, keeping at most `cap` bytes of it
/// (the rest of a longer line is consumed unseen). False at the end of the input, or once
/// `cancel` says the call is over (a line may be endless).
fn next_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    cap: usize,
    cancel: &Cancel,
) -> io::Result<bool> {
    line.clear();
    let mut any = false;
    loop {
        if cancel.is_cancelled() {
            return Ok(false);
        }
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(any);
        }
        any = true;
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = cap.saturating_sub(line.len());
        line.extend_from_slice(&buf[..take.min(room)]);
        reader.consume(take);
        if done {
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            return Ok(true);
        }
    }
}

/// `line` cut to at most `max` bytes, backing off from the middle of a UTF-8 sequence.
fn cut(line: &[u8], max: usize) -> &[u8] {
    if line.len() <= max {
        return line;
    }
    let mut end = max;
    // At most three continuation bytes belong to the character being cut.
    for _ in 0..3 {
        if end > 0 && line[end] & 0xC0 == 0x80 {
            end -= 1;
        } else {
            break;
        }
    }
    &line[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_proto::{FsReply, Message, MAX_PAYLOAD};

    fn query(pattern: &str) -> Query<'_> {
        Query {
            pattern,
            recursive: true,
            ignore_case: false,
            include_glob: &[],
            exclude_glob: &[],
            max_matches: 10_000,
            max_line_bytes: 4096,
        }
    }

    fn matches(response: FsResponse) -> (Vec<(String, u64, String)>, bool) {
        let FsResponse::Matches { matches, truncated } = response else {
            panic!("not matches: {response:?}");
        };
        let rows = matches
            .into_iter()
            .map(|m| (m.path, m.line, m.content))
            .collect();
        (rows, truncated)
    }

    #[test]
    fn lines_are_numbered_from_one_and_binary_files_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("a.txt");
        std::fs::write(&text, "foo\nbar foo\r\nbaz\nfoo").unwrap();
        std::fs::write(dir.path().join("bin.dat"), b"foo\0foo\n").unwrap();
        // Non-UTF-8 bytes never fail a search; they decode lossily.
        std::fs::write(dir.path().join("latin1.txt"), b"caf\xe9 foo\n").unwrap();
        let (rows, truncated) = matches(grep(dir.path(), &query("foo")).unwrap());
        let a = text.to_string_lossy().into_owned();
        let l = dir.path().join("latin1.txt").to_string_lossy().into_owned();
        assert_eq!(
            rows,
            [
                (a.clone(), 1, "foo".into()),
                (a.clone(), 2, "bar foo\r".into()),
                (a.clone(), 4, "foo".into()),
                (l, 1, "caf\u{fffd} foo".into()),
            ]
        );
        assert!(!truncated);
        // `\A` is read line by line: a line's start, as with any other pattern.
        let (rows, _) = matches(grep(&text, &query(r"\Afoo")).unwrap());
        let lines: Vec<u64> = rows.iter().map(|r| r.1).collect();
        assert_eq!(lines, [1, 4]);
        let mut q = query("FOO");
        q.ignore_case = true;
        assert_eq!(matches(grep(&text, &q).unwrap()).0.len(), 3);
        assert!(matches(grep(&text, &query("FOO")).unwrap()).0.is_empty());
    }

    #[test]
    fn max_matches_truncates_only_when_more_exist() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x\nx\nx\n").unwrap();
        let mut q = query("x");
        q.max_matches = 3;
        assert_eq!(matches(grep(dir.path(), &q).unwrap()), {
            let (rows, _) = matches(grep(dir.path(), &query("x")).unwrap());
            (rows, false)
        });
        q.max_matches = 2;
        let (rows, truncated) = matches(grep(dir.path(), &q).unwrap());
        assert_eq!((rows.len(), truncated), (2, true));
        q.max_matches = 0;
        assert_eq!(
            grep(dir.path(), &q).unwrap_err().code,
            FsErrorCode::BadRequest
        );
        let mut q = query("x");
        q.max_line_bytes = GREP_MAX_LINE_BYTES + 1;
        assert_eq!(
            grep(dir.path(), &q).unwrap_err().code,
            FsErrorCode::BadRequest
        );
    }

    #[test]
    fn lines_are_cut_at_utf8_boundaries() {
        assert_eq!(cut("aé".as_bytes(), 2), b"a");
        assert_eq!(cut("aé".as_bytes(), 3), "aé".as_bytes());
        assert_eq!(cut("a😀".as_bytes(), 4), b"a");
        assert_eq!(cut(b"abc", 0), b"");
        assert_eq!(cut(b"\x80\x80\x80\x80\x80", 4), b"\x80");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, format!("{}é\n", "a".repeat(9))).unwrap();
        let mut q = query("a");
        q.max_line_bytes = 10;
        assert_eq!(matches(grep(&f, &q).unwrap()).0[0].2, "a".repeat(9));
    }

    /// Every line `re` matches, read line by line: the reference for the buffer search.
    fn by_lines(data: &[u8], re: &Regex) -> Vec<(u64, Vec<u8>)> {
        let mut input = io::Cursor::new(data.to_vec());
        let mut line = Vec::new();
        let mut rows = Vec::new();
        let mut number = 0;
        while next_line(&mut input, &mut line, usize::MAX, &Cancel::never()).unwrap() {
            number += 1;
            if re.is_match(&line) {
                rows.push((number, line.clone()));
            }
        }
        rows
    }

    #[test]
    fn buffer_search_finds_exactly_the_lines_a_line_search_finds() {
        let patterns = [
            "",
            "^",
            "$",
            "a$",
            "^b",
            "a\\nb",
            "\\s+b",
            "x*",
            "[^a]",
            "\\bfoo\\b",
            "o$",
            "^$",
            "(?s)a.*b",
            "b|^",
            "\\n",
        ];
        let inputs: [&[u8]; 8] = [
            b"",
            b"\n",
            b"a\nb\n",
            b"ab",
            b"foo\nbar foo\n\nzap",
            b"a\n\nb",
            b"\n\n\nfoo",
            b"caf\xe9 foo\xff\n\xfe",
        ];
        for pattern in patterns {
            let p = Patterns::new(pattern, false).unwrap();
            let buffer_re = p.buffer.as_ref().expect("buffer mode");
            for data in inputs {
                let mut rows = Vec::new();
                let _ = search_buffer(data, buffer_re, &p.line, &mut |n, line| {
                    rows.push((n, line.to_vec()));
                    ControlFlow::Continue(())
                });
                assert_eq!(rows, by_lines(data, &p.line), "{pattern:?} on {data:?}");
            }
        }
        for whole_input_only in ["\\Aa", "b\\z", "(?-m)^b"] {
            assert!(Patterns::new(whole_input_only, false)
                .unwrap()
                .buffer
                .is_none());
        }
    }

    #[test]
    fn long_lines_are_scanned_up_to_the_cap() {
        let mut input = io::Cursor::new(b"0123456789\nab\nlast".to_vec());
        let mut line = Vec::new();
        assert!(next_line(&mut input, &mut line, 4, &Cancel::never()).unwrap());
        assert_eq!(line, b"0123");
        assert!(next_line(&mut input, &mut line, 4, &Cancel::never()).unwrap());
        assert_eq!(line, b"ab");
        assert!(next_line(&mut input, &mut line, 4, &Cancel::never()).unwrap());
        assert_eq!(line, b"last");
        assert!(!next_line(&mut input, &mut line, 4, &Cancel::never()).unwrap());
    }

    #[test]
    fn a_reply_always_fits_one_frame() {
        let dir = tempfile::tempdir().unwrap();
        // Control characters escape to six bytes each in JSON: the worst case.
        let line = "\u{1}".repeat(60_000);
        let body = format!("{line}\n").repeat(40);
        std::fs::write(dir.path().join("f"), body).unwrap();
        let mut q = query("\u{1}");
        q.max_line_bytes = GREP_MAX_LINE_BYTES;
        let response = grep(dir.path(), &q).unwrap();
        let FsResponse::Matches { matches, truncated } = &response else {
            panic!()
        };
        assert!(*truncated && !matches.is_empty() && matches.len() < 40);
        let frame = Message::FsReply(FsReply::Ok(response.clone()))
            .into_frame(7)
            .unwrap();
        assert!(frame.payload.len() <= MAX_PAYLOAD);
    }

    #[test]
    fn bad_inputs_have_their_codes() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            grep(dir.path(), &query("(")).unwrap_err().code,
            FsErrorCode::BadRegex
        );
        assert_eq!(
            grep(&dir.path().join("missing"), &query("x"))
                .unwrap_err()
                .code,
            FsErrorCode::NotFound
        );
    }

    #[test]
    fn threads_give_exactly_the_reply_of_one_thread() {
        let dir = tempfile::tempdir().unwrap();
        // Files of unequal sizes (some past one probe, one empty, one binary) in nested
        // directories, so that the search threads finish out of walk order.
        for f in 0..150usize {
            let sub = dir.path().join(format!("d{}/e{}", f % 7, f % 3));
            std::fs::create_dir_all(&sub).unwrap();
            let lines = (f * 37) % 900;
            let mut text = String::new();
            for l in 0..lines {
                let word = if (f + l) % 11 == 0 { "hit" } else { "miss" };
                text.push_str(&format!("{word} {l} {}\n", "x".repeat((f * l) % 50)));
            }
            std::fs::write(sub.join(format!("f{f:03}")), text).unwrap();
        }
        std::fs::write(dir.path().join("d0/bin"), b"hit\0hit\n").unwrap();
        let serial = |q: &Query| grep_with(dir.path(), q, 1, HELD_MAX).unwrap();
        for max_matches in [1, 2, 7, 100, 1000, 100_000] {
            for pattern in ["hit", "^miss 1", "zzz"] {
                let mut q = query(pattern);
                q.max_matches = max_matches;
                let expected = serial(&q);
                let rows = matches(expected.clone()).0.len();
                assert!(rows > 0 || pattern == "zzz");
                // A small bound on what the threads hold makes them stop early, and the
                // merge search those files again.
                for held_max in [HELD_MAX, 300, 0] {
                    for workers in [2, 3] {
                        let got = grep_with(dir.path(), &q, workers, held_max).unwrap();
                        assert_eq!(
                            matches(got),
                            matches(expected.clone()),
                            "{pattern:?} max {max_matches} held {held_max} workers {workers}"
                        );
                    }
                }
            }
        }
        // The byte budget truncates across files the same way.
        let mut q = query("\\d");
        q.max_line_bytes = GREP_MAX_LINE_BYTES;
        let expected = matches(serial(&q));
        assert!(expected.1, "the budget is reached");
        let got = matches(grep_with(dir.path(), &q, 2, 300).unwrap());
        assert_eq!(got, expected);
    }

    #[test]
    fn files_past_one_read_are_searched_whole() {
        let dir = tempfile::tempdir().unwrap();
        // Past SCRATCH_KEEP: probed, then read in steps; the last line has no newline.
        let filler = "filler line\n".repeat(300_000);
        std::fs::write(dir.path().join("big"), format!("hit 1\n{filler}hit 2")).unwrap();
        std::fs::write(dir.path().join("big.bin"), format!("\0{filler}hit")).unwrap();
        std::fs::write(dir.path().join("empty"), "").unwrap();
        for workers in [1, 2] {
            let got = matches(grep_with(dir.path(), &query("hit"), workers, HELD_MAX).unwrap());
            let lines: Vec<(u64, String)> = got.0.into_iter().map(|r| (r.1, r.2)).collect();
            assert_eq!(lines, [(1, "hit 1".into()), (300_002, "hit 2".into())]);
        }
    }
}
