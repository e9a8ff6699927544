use super::search::{cut, next_line, search_buffer};
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
