//! `fs::sed`'s replacement, parsed once into literal bytes and group references with the
//! regex crate's own syntax (`$1`, `${1}`, `$name`, `${name}`, `$$`; an unknown group is
//! empty, a `$` that starts no reference is itself). Unlike `Captures::expand`, which builds
//! each match's expansion in memory, a template tells its size first and writes straight to
//! the output, so a reference repeated many times over a large group cannot grow the
//! agent's memory.

use std::io::{self, Write};

use regex::bytes::{Captures, Regex};

enum Piece {
    Literal(Vec<u8>),
    Group(usize),
}

pub struct Template(Vec<Piece>);

impl Template {
    /// `replacement` taken as is.
    pub fn literal(replacement: &[u8]) -> Template {
        Template(vec![Piece::Literal(replacement.to_vec())])
    }

    /// `replacement` with references to `regex`'s groups.
    pub fn parse(mut replacement: &[u8], regex: &Regex) -> Template {
        let mut pieces = Vec::new();
        let mut literal = Vec::new();
        while let Some(i) = memchr::memchr(b'$', replacement) {
            literal.extend_from_slice(&replacement[..i]);
            replacement = &replacement[i..];
            if replacement.get(1) == Some(&b'$') {
                literal.push(b'$');
                replacement = &replacement[2..];
                continue;
            }
            let Some((name, end)) = reference(replacement) else {
                literal.push(b'$');
                replacement = &replacement[1..];
                continue;
            };
            replacement = &replacement[end..];
            let index = match name.parse::<usize>() {
                Ok(index) => Some(index),
                Err(_) => regex.capture_names().position(|n| n == Some(name)),
            };
            if let Some(index) = index {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                pieces.push(Piece::Group(index));
            }
        }
        literal.extend_from_slice(replacement);
        pieces.push(Piece::Literal(literal));
        pieces.retain(|p| !matches!(p, Piece::Literal(bytes) if bytes.is_empty()));
        Template(pieces)
    }

    /// The bytes the expansion for `caps` takes.
    pub fn size(&self, caps: &Captures) -> u64 {
        self.0
            .iter()
            .map(|piece| match piece {
                Piece::Literal(bytes) => bytes.len() as u64,
                Piece::Group(i) => caps.get(*i).map_or(0, |m| m.len() as u64),
            })
            .sum()
    }

    pub fn write(&self, caps: &Captures, out: &mut dyn Write) -> io::Result<()> {
        for piece in &self.0 {
            match piece {
                Piece::Literal(bytes) => out.write_all(bytes)?,
                Piece::Group(i) => {
                    if let Some(m) = caps.get(*i) {
                        out.write_all(m.as_bytes())?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The group name (or number) of the reference `rep` starts with (`rep[0]` is `$`), and where
/// the reference ends; `None` when it starts none. The regex crate's rules: braces take any
/// UTF-8 up to `}`; without them, the longest run of `[0-9A-Za-z_]`.
fn reference(rep: &[u8]) -> Option<(&str, usize)> {
    if rep.get(1) == Some(&b'{') {
        let close = memchr::memchr(b'}', &rep[2..])? + 2;
        let name = std::str::from_utf8(&rep[2..close]).ok()?;
        return Some((name, close + 1));
    }
    let len = rep[1..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    if len == 0 {
        return None;
    }
    let name = std::str::from_utf8(&rep[1..1 + len]).ok()?;
    Some((name, 1 + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_exactly_as_the_regex_crate_does() {
        let regex = Regex::new(r"(?P<word>\w+)@(\w+)(x)?").unwrap();
        let haystack = b"alice@example".as_slice();
        let caps = regex.captures(haystack).unwrap();
        for replacement in [
            "",
            "plain",
            "$1 at $2",
            "${1}a",
            "$1a",
            "$word-${word}",
            "$$1 $$ $",
            "${2",
            "${}",
            "$nope|$9|$3|${name with spaces}",
            "$0$0",
            "trailing $",
            "$_",
            "${word}}",
            "é$1é",
        ] {
            let mut expected = Vec::new();
            caps.expand(replacement.as_bytes(), &mut expected);
            let template = Template::parse(replacement.as_bytes(), &regex);
            let mut got = Vec::new();
            template.write(&caps, &mut got).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&expected),
                "{replacement:?}"
            );
            assert_eq!(
                template.size(&caps),
                expected.len() as u64,
                "{replacement:?}"
            );
        }
        let literal = Template::literal(b"$1");
        let mut got = Vec::new();
        literal.write(&caps, &mut got).unwrap();
        assert_eq!(got, b"$1");
    }
}
