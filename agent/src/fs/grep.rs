//! `fs::grep`: the lines of regular files that match a regex. Binary files (a NUL byte in
//! their first 8 KiB, as GNU grep decides) are skipped; lines count from 1; `content` is the
//! line without its newline, cut to `max_line_bytes` bytes at a UTF-8 boundary and decoded
//! lossily. Files that cannot be read while walking are skipped (like `grep -rs`).
//! `truncated` is set when a further match exists beyond `max_matches`, or when the
//! reply would outgrow one frame (`wire::REPLY_BUDGET`).
//!
//! Files up to `WHOLE_FILE_MAX` are searched as one buffer: the regex (with `^`/`$` at line
//! boundaries) skips to a candidate, and the candidate's line is then checked on its own, so
//! the result is exactly that of a line-by-line search, several times faster. Larger files,
//! and patterns whose meaning differs between a buffer and a line (`\A`, `\z`, a `-m`
//! flag), are read line by line with bounded memory.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::ops::ControlFlow;
use std::path::Path;

use agent_proto::fs::{GrepMatch, GREP_MAX_LINE_BYTES, GREP_MAX_MATCHES};
use agent_proto::{FsError, FsErrorCode, FsResponse};
use regex::bytes::Regex;

use super::os_error;
use super::pattern::{self, Filter};
use super::walk;
use super::wire::{json_str_len, REPLY_BUDGET};

/// Bytes looked at to decide whether a file is binary.
pub const BINARY_PROBE: usize = 8 * 1024;
/// Longest line held in memory: a longer line is matched on its first `SCAN_LINE_CAP` bytes.
const SCAN_LINE_CAP: usize = 8 * 1024 * 1024;
/// Largest file searched as one buffer.
const WHOLE_FILE_MAX: u64 = 16 * 1024 * 1024;
/// JSON around one match besides its two strings: `{"path":,"line":N,"content":},`.
const MATCH_OVERHEAD: usize = 64;

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
    let regex = Patterns::new(query.pattern, query.ignore_case)?;
    let filter = Filter::new(query.include_glob, query.exclude_glob)?;
    let mut hits = Hits {
        matches: Vec::new(),
        max: query.max_matches as usize,
        budget: REPLY_BUDGET,
        truncated: false,
    };
    let line_bytes = query.max_line_bytes as usize;
    match walk::start(root)? {
        // A file named as the root: its errors are the call's.
        walk::Start::File => {
            let searched = File::open(root)
                .and_then(|file| search_file(file, root, &regex, line_bytes, &mut hits));
            if let Err(e) = searched {
                return Err(os_error(root, e));
            }
        }
        // Files met while walking are opened from the directory holding them; those that
        // cannot be read are skipped.
        walk::Start::Dir(dir) => walk::files(&dir, root, query.recursive, &filter, &mut |found| {
            let searched = found
                .dir
                .open_file(found.name)
                .and_then(|file| search_file(file, found.path, &regex, line_bytes, &mut hits));
            searched.unwrap_or(ControlFlow::Continue(()))
        })?,
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

fn search_file(
    mut file: File,
    path: &Path,
    patterns: &Patterns,
    line_bytes: usize,
    hits: &mut Hits,
) -> io::Result<ControlFlow<()>> {
    if !file.metadata()?.is_file() {
        return Ok(ControlFlow::Continue(())); // swapped for a FIFO or a device meanwhile
    }
    let mut head = Vec::with_capacity(BINARY_PROBE);
    (&mut file)
        .take(BINARY_PROBE as u64)
        .read_to_end(&mut head)?;
    if is_binary(&head) {
        return Ok(ControlFlow::Continue(()));
    }
    let shown = path.to_string_lossy();
    let mut found = |number: u64, line: &[u8]| {
        let content = String::from_utf8_lossy(cut(line, line_bytes)).into_owned();
        hits.push(&shown, number, content)
    };
    if let Some(buffer) = &patterns.buffer {
        if file.metadata()?.len() <= WHOLE_FILE_MAX {
            let mut data = head;
            // A file growing meanwhile is searched up to the bound.
            (&mut file)
                .take(WHOLE_FILE_MAX.saturating_sub(data.len() as u64))
                .read_to_end(&mut data)?;
            return Ok(search_buffer(&data, buffer, &patterns.line, &mut found));
        }
    }
    let mut reader = BufReader::with_capacity(64 * 1024, io::Cursor::new(head).chain(file));
    let mut line = Vec::new();
    let mut number = 0u64;
    while next_line(&mut reader, &mut line, SCAN_LINE_CAP)? {
        number += 1;
        if patterns.line.is_match(&line) && found(number, &line).is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
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
    head.iter().take(BINARY_PROBE).any(|&b| b == 0)
}

/// Reads the next line into `line` without its newline, keeping at most `cap` bytes of it
/// (the rest of a longer line is consumed unseen). False at the end of the input.
fn next_line(reader: &mut impl BufRead, line: &mut Vec<u8>, cap: usize) -> io::Result<bool> {
    line.clear();
    let mut any = false;
    loop {
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
        while next_line(&mut input, &mut line, usize::MAX).unwrap() {
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
        assert!(next_line(&mut input, &mut line, 4).unwrap());
        assert_eq!(line, b"0123");
        assert!(next_line(&mut input, &mut line, 4).unwrap());
        assert_eq!(line, b"ab");
        assert!(next_line(&mut input, &mut line, 4).unwrap());
        assert_eq!(line, b"last");
        assert!(!next_line(&mut input, &mut line, 4).unwrap());
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
}
