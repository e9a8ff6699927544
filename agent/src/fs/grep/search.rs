//! Searching one file: as one buffer where the pattern means the same there as on a line (the
//! regex skips to a candidate, whose line is then checked on its own), else line by line with
//! bounded memory; lines cut to `max_line_bytes` at a UTF-8 boundary.

use super::*;

/// The pattern compiled for a line, and for a whole buffer when that means the same.
pub(super) struct Patterns {
    pub(super) line: Regex,
    pub(super) buffer: Option<Regex>,
}

impl Patterns {
    pub(super) fn new(pattern: &str, ignore_case: bool) -> Result<Patterns, FsError> {
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
pub(super) struct Search {
    pub(super) patterns: Patterns,
    pub(super) line_bytes: usize,
    /// The call's deadline, looked at while reading a large file line by line (the search
    /// threads have no call of their own).
    pub(super) cancel: Cancel,
}

impl Search {
    /// Calls `found(number, content)` for each matching line of `file` (a regular file of
    /// `len` bytes when opened), until it breaks. `scratch` is the buffer reused per file.
    pub(super) fn file(
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

    pub(super) fn file_in(
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
pub(super) fn fill(
    mut file: &File,
    buf: &mut Vec<u8>,
    from: usize,
    upto: usize,
) -> io::Result<usize> {
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
pub(super) fn search_buffer(
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
pub(super) fn next_line(
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
pub(super) fn cut(line: &[u8], max: usize) -> &[u8] {
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
