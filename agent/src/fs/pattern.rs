//! The patterns of `fs::grep` / `fs::sed`: the regex (bytes API, so any file can be searched)
//! and the include/exclude globs. Anything that does not compile is S217 (`BadRegex`).

use std::path::Path;

use agent_proto::{FsError, FsErrorCode};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use regex::bytes::{Regex, RegexBuilder};

/// Compiled regexes larger than this are refused (S217): the guest's memory is small.
const REGEX_SIZE_LIMIT: usize = 16 * 1024 * 1024;

/// `pattern` as a regex; `literal` escapes it first. `multi_line` lets `^`/`$` match at line
/// boundaries (sed runs over a whole file, grep over one line at a time).
pub fn regex(
    pattern: &str,
    literal: bool,
    ignore_case: bool,
    multi_line: bool,
) -> Result<Regex, FsError> {
    let source = if literal {
        regex::escape(pattern)
    } else {
        pattern.to_string()
    };
    RegexBuilder::new(&source)
        .case_insensitive(ignore_case)
        .multi_line(multi_line)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| FsError::new(FsErrorCode::BadRegex, format!("bad pattern: {e}")))
}

/// Which files a walk keeps. A glob without `/` matches the file name (`*.rs`), a glob with
/// `/` the path relative to the walk's root (`src/**/*.rs`; `*` does not cross `/`, `**`
/// does). A file is kept when no include glob is given or one matches, and no exclude glob
/// matches; exclude globs also prune directories (`node_modules`, `target`).
pub struct Filter {
    include: Globs,
    exclude: Globs,
}

struct Globs {
    by_name: GlobSet,
    by_path: GlobSet,
    empty: bool,
}

impl Filter {
    pub fn new(include: &[String], exclude: &[String]) -> Result<Filter, FsError> {
        Ok(Filter {
            include: Globs::new(include)?,
            exclude: Globs::new(exclude)?,
        })
    }

    /// Whether the walk reports the file at `relative` (its path under the walk's root).
    pub fn keeps_file(&self, relative: &Path) -> bool {
        (self.include.empty || self.include.matches(relative)) && !self.exclude.matches(relative)
    }

    /// Whether the walk descends into the directory at `relative`.
    pub fn enters_dir(&self, relative: &Path) -> bool {
        !self.exclude.matches(relative)
    }
}

impl Globs {
    fn new(globs: &[String]) -> Result<Globs, FsError> {
        let mut by_name = GlobSetBuilder::new();
        let mut by_path = GlobSetBuilder::new();
        for text in globs {
            let glob = GlobBuilder::new(text)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| FsError::new(FsErrorCode::BadRegex, format!("bad glob: {e}")))?;
            if text.contains('/') {
                by_path.add(glob);
            } else {
                by_name.add(glob);
            }
        }
        let built = |set: GlobSetBuilder| {
            set.build()
                .map_err(|e| FsError::new(FsErrorCode::BadRegex, format!("bad glob: {e}")))
        };
        Ok(Globs {
            by_name: built(by_name)?,
            by_path: built(by_path)?,
            empty: globs.is_empty(),
        })
    }

    fn matches(&self, relative: &Path) -> bool {
        let name_hit = relative
            .file_name()
            .is_some_and(|name| self.by_name.is_match(Path::new(name)));
        name_hit || self.by_path.is_match(relative)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(include: &[&str], exclude: &[&str]) -> Filter {
        let owned = |globs: &[&str]| globs.iter().map(|g| g.to_string()).collect::<Vec<_>>();
        Filter::new(&owned(include), &owned(exclude)).unwrap()
    }

    #[test]
    fn globs_without_slash_match_names_with_slash_relative_paths() {
        let f = filter(&["*.rs"], &[]);
        assert!(f.keeps_file(Path::new("main.rs")));
        assert!(f.keeps_file(Path::new("src/deep/lib.rs")));
        assert!(!f.keeps_file(Path::new("src/lib.rs.bak")));

        let f = filter(&["src/*.rs"], &[]);
        assert!(f.keeps_file(Path::new("src/lib.rs")));
        assert!(
            !f.keeps_file(Path::new("src/deep/lib.rs")),
            "* must not cross /"
        );
        assert!(!f.keeps_file(Path::new("lib.rs")));

        let f = filter(&["src/**/*.rs"], &[]);
        assert!(f.keeps_file(Path::new("src/deep/lib.rs")));
        assert!(f.keeps_file(Path::new("src/lib.rs")));
    }

    #[test]
    fn excludes_win_and_prune_directories() {
        let f = filter(&["*.js"], &["node_modules", "*.min.js"]);
        assert!(f.keeps_file(Path::new("a/app.js")));
        assert!(!f.keeps_file(Path::new("a/app.min.js")));
        assert!(!f.enters_dir(Path::new("a/node_modules")));
        assert!(f.enters_dir(Path::new("a/src")));
        let none = filter(&[], &[]);
        assert!(none.keeps_file(Path::new("anything")));
        assert!(none.enters_dir(Path::new("anything")));
    }

    #[test]
    fn bad_patterns_are_bad_regex() {
        for bad in ["(", "[a-", "a{99999999}"] {
            let e = regex(bad, false, false, false).err().unwrap();
            assert_eq!(e.code, FsErrorCode::BadRegex, "{bad}");
        }
        assert!(
            regex("(", true, false, false).is_ok(),
            "literal mode escapes"
        );
        let e = Filter::new(&["[".to_string()], &[]).err().unwrap();
        assert_eq!(e.code, FsErrorCode::BadRegex);
        let e = Filter::new(&[], &["a/{b".to_string()]).err().unwrap();
        assert_eq!(e.code, FsErrorCode::BadRegex);
    }

    #[test]
    fn case_and_lines() {
        let re = regex("^hello$", false, true, true).unwrap();
        assert!(re.is_match(b"x\nHELLO\ny"));
        assert!(!regex("^hello$", false, false, false)
            .unwrap()
            .is_match(b"x\nhello\ny"));
    }
}
