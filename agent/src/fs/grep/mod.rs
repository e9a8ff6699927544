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
//! `WINDOW` files: a file whose matches would pass the bound is searched again, in turn.//!
//! [`parallel`] holds the walk's hand-out to the search threads and the merge in walk order;
//! [`search`] searches one file, as one buffer or line by line.

mod parallel;
mod search;

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

use parallel::in_parallel;
pub use search::is_binary;
use search::{Patterns, Search};

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

#[cfg(test)]
mod tests;
