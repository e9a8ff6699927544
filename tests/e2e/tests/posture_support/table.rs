//! A posture table: processes by role, each an ordered list of fields whose values are
//! strings or lists of strings, kept in the repository as TOML (the subset written here:
//! `[role]` headers, `key = "string"` and `key = ["a", "b"]` over one or more lines, `#`
//! comments). Comments are kept with the section or key they precede, so a table printed
//! from observations in an expected file's layout keeps its explanations.

use std::fmt::Write as _;

/// A field's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Text(String),
    List(Vec<String>),
}

impl Value {
    pub fn text(s: impl Into<String>) -> Value {
        Value::Text(s.into())
    }

    fn render(&self) -> String {
        match self {
            Value::Text(s) => quote(s),
            Value::List(items) if items.is_empty() => "[]".into(),
            Value::List(items) if items.iter().map(|i| i.len() + 4).sum::<usize>() < 70 => {
                let inner: Vec<String> = items.iter().map(|i| quote(i)).collect();
                format!("[{}]", inner.join(", "))
            }
            Value::List(items) => {
                let mut out = "[\n".to_string();
                for item in items {
                    let _ = writeln!(out, "  {},", quote(item));
                }
                out.push(']');
                out
            }
        }
    }

    /// For a failure message: the value on one line.
    pub fn show(&self) -> String {
        match self {
            Value::Text(s) => format!("{s:?}"),
            Value::List(items) => format!("{items:?}"),
        }
    }
}

/// One `key = value` with the comment lines above it and its trailing comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub key: String,
    pub value: Value,
    pub comments: Vec<String>,
    pub trailing: Option<String>,
}

/// One process: `[role]` with the comment lines above it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub role: String,
    pub comments: Vec<String>,
    pub fields: Vec<Field>,
}

impl Process {
    pub fn new(role: impl Into<String>) -> Process {
        Process {
            role: role.into(),
            comments: Vec::new(),
            fields: Vec::new(),
        }
    }

    pub fn set(&mut self, key: &str, value: Value) {
        match self.fields.iter_mut().find(|f| f.key == key) {
            Some(field) => field.value = value,
            None => self.fields.push(Field {
                key: key.into(),
                value,
                comments: Vec::new(),
                trailing: None,
            }),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.iter().find(|f| f.key == key).map(|f| &f.value)
    }
}

/// A whole table: the file's opening comments, then the processes in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub header: Vec<String>,
    pub processes: Vec<Process>,
}

/// Why a table file could not be read.
#[derive(Debug)]
pub enum ParseError {
    Bad { line: usize, what: String },
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Bad { line, what } => write!(f, "line {line}: {what}"),
        }
    }
}

impl Table {
    pub fn process(&self, role: &str) -> Option<&Process> {
        self.processes.iter().find(|p| p.role == role)
    }

    pub fn parse(text: &str) -> Result<Table, ParseError> {
        let mut table = Table::default();
        let mut comments: Vec<String> = Vec::new();
        let mut lines = text.lines().enumerate().peekable();
        let bad = |line: usize, what: &str| ParseError::Bad {
            line: line + 1,
            what: what.into(),
        };
        while let Some((n, raw)) = lines.next() {
            let line = raw.trim();
            if line.is_empty() {
                // A blank line ends the file's header: what follows belongs to the first
                // section.
                if table.processes.is_empty() && table.header.is_empty() && !comments.is_empty() {
                    table.header = std::mem::take(&mut comments);
                }
                continue;
            }
            if line.starts_with('#') {
                comments.push(raw.trim_end().to_string());
                continue;
            }
            if let Some(name) = line.strip_prefix('[') {
                let name = name
                    .split_once(']')
                    .map(|(name, _)| name.trim())
                    .ok_or_else(|| bad(n, "a section header without `]`"))?;
                if table.processes.iter().any(|p| p.role == name) {
                    return Err(bad(n, &format!("[{name}] twice")));
                }
                let mut process = Process::new(name);
                process.comments = std::mem::take(&mut comments);
                table.processes.push(process);
                continue;
            }
            let (key, rest) = line
                .split_once('=')
                .ok_or_else(|| bad(n, "neither a comment, a section nor `key = value`"))?;
            let key = key.trim().to_string();
            let mut rest = rest.trim().to_string();
            // A list may go on over several lines, up to its `]`.
            if rest.starts_with('[') {
                while !closes_list(&rest) {
                    let (_, more) = lines
                        .next()
                        .ok_or_else(|| bad(n, &format!("{key}: a list without `]`")))?;
                    let more = strip_comment(more.trim());
                    rest.push(' ');
                    rest.push_str(more.trim());
                }
            }
            let (value, trailing) = parse_value(&rest).map_err(|what| bad(n, &what))?;
            let process = table
                .processes
                .last_mut()
                .ok_or_else(|| bad(n, "a key before any [section]"))?;
            if process.get(&key).is_some() {
                return Err(bad(n, &format!("{key} twice in [{}]", process.role)));
            }
            process.fields.push(Field {
                key,
                value,
                comments: std::mem::take(&mut comments),
                trailing,
            });
        }
        if table.processes.is_empty() && table.header.is_empty() {
            table.header = comments;
        }
        Ok(table)
    }

    /// The TOML text: header, then each process with its comments.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for line in &self.header {
            let _ = writeln!(out, "{line}");
        }
        for process in &self.processes {
            out.push('\n');
            for line in &process.comments {
                let _ = writeln!(out, "{line}");
            }
            let _ = writeln!(out, "[{}]", process.role);
            for field in &process.fields {
                for line in &field.comments {
                    let _ = writeln!(out, "{line}");
                }
                let _ = write!(out, "{} = {}", field.key, field.value.render());
                if let Some(comment) = &field.trailing {
                    let _ = write!(out, "  {comment}");
                }
                out.push('\n');
            }
        }
        out
    }

    /// `observed` in this (expected) table's layout: its header, its order and comments
    /// where a role or key is in both, new keys at the end of their process, new processes
    /// at the end. What `POSTURE_PRINT` prints, ready to replace the file.
    pub fn observed_in_layout(&self, observed: &Table) -> Table {
        let mut out = Table {
            header: self.header.clone(),
            processes: Vec::new(),
        };
        let mut order: Vec<&str> = self
            .processes
            .iter()
            .map(|p| p.role.as_str())
            .filter(|role| observed.process(role).is_some())
            .collect();
        for process in &observed.processes {
            if !order.contains(&process.role.as_str()) {
                order.push(&process.role);
            }
        }
        for role in order {
            let seen = observed.process(role).expect("in the order from observed");
            let Some(expected) = self.process(role) else {
                out.processes.push(seen.clone());
                continue;
            };
            let mut process = Process {
                role: role.into(),
                comments: expected.comments.clone(),
                fields: Vec::new(),
            };
            for field in &expected.fields {
                if let Some(value) = seen.get(&field.key) {
                    process.fields.push(Field {
                        value: value.clone(),
                        ..field.clone()
                    });
                }
            }
            for field in &seen.fields {
                if expected.get(&field.key).is_none() {
                    process.fields.push(field.clone());
                }
            }
            out.processes.push(process);
        }
        out
    }
}

/// One difference between the expected and the observed table, naming the process and field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// A process the table lists was not found.
    Missing { role: String },
    /// A process the table does not list was found.
    Unexpected { role: String },
    /// A field differs (or is on one side only: `None`).
    Field {
        role: String,
        key: String,
        expected: Option<Value>,
        observed: Option<Value>,
    },
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<Value>| v.as_ref().map_or("(absent)".into(), Value::show);
        match self {
            Drift::Missing { role } => write!(f, "process {role}: expected, not found"),
            Drift::Unexpected { role } => write!(f, "process {role}: found, not in the table"),
            Drift::Field {
                role,
                key,
                expected,
                observed,
            } => {
                write!(
                    f,
                    "process {role}: field {key}: expected {}, observed {}",
                    show(expected),
                    show(observed)
                )?;
                if let (Some(Value::List(want)), Some(Value::List(got))) = (expected, observed) {
                    let extra: Vec<&String> = got.iter().filter(|g| !want.contains(g)).collect();
                    let lacking: Vec<&String> = want.iter().filter(|w| !got.contains(w)).collect();
                    write!(f, " (extra {extra:?}, lacking {lacking:?})")?;
                }
                Ok(())
            }
        }
    }
}

/// Every drift of `observed` from `expected`, in the expected table's order.
pub fn compare(expected: &Table, observed: &Table) -> Vec<Drift> {
    let mut drifts = Vec::new();
    for want in &expected.processes {
        let Some(got) = observed.process(&want.role) else {
            drifts.push(Drift::Missing {
                role: want.role.clone(),
            });
            continue;
        };
        for field in &want.fields {
            let seen = got.get(&field.key);
            if seen != Some(&field.value) {
                drifts.push(Drift::Field {
                    role: want.role.clone(),
                    key: field.key.clone(),
                    expected: Some(field.value.clone()),
                    observed: seen.cloned(),
                });
            }
        }
        for field in &got.fields {
            if want.get(&field.key).is_none() {
                drifts.push(Drift::Field {
                    role: want.role.clone(),
                    key: field.key.clone(),
                    expected: None,
                    observed: Some(field.value.clone()),
                });
            }
        }
    }
    for got in &observed.processes {
        if expected.process(&got.role).is_none() {
            drifts.push(Drift::Unexpected {
                role: got.role.clone(),
            });
        }
    }
    drifts
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether `text` (starting with `[`) holds its closing `]` outside strings.
fn closes_list(text: &str) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_string = !in_string,
            (false, _, ']') => return true,
            _ => {}
        }
    }
    false
}

/// A line without its `#` comment (outside strings).
fn strip_comment(line: &str) -> &str {
    split_comment(line).0
}

fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_string = !in_string,
            (false, _, '#') => return (line[..i].trim_end(), Some(&line[i..])),
            _ => {}
        }
    }
    (line, None)
}

/// A value and its trailing comment.
fn parse_value(text: &str) -> Result<(Value, Option<String>), String> {
    let (text, comment) = split_comment(text.trim());
    let comment = comment.map(String::from);
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| format!("text after a list's `]`: {text}"))?;
        let mut items = Vec::new();
        let mut rest = inner.trim();
        while !rest.is_empty() {
            let (item, after) = parse_string(rest)?;
            items.push(item);
            rest = after.trim_start();
            rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
        }
        return Ok((Value::List(items), comment));
    }
    let (item, after) = parse_string(text)?;
    if !after.trim().is_empty() {
        return Err(format!("text after a string: {after}"));
    }
    Ok((Value::Text(item), comment))
}

/// A basic string at the start of `text` (escapes `\"` and `\\` only), and what follows.
fn parse_string(text: &str) -> Result<(String, &str), String> {
    let body = text
        .strip_prefix('"')
        .ok_or_else(|| format!("not a \"string\": {text}"))?;
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &body[i + 1..])),
            '\\' => match chars.next() {
                Some((_, c @ ('"' | '\\'))) => out.push(c),
                other => return Err(format!("an escape this table does not use: {other:?}")),
            },
            c => out.push(c),
        }
    }
    Err(format!("a string without its closing quote: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# The file's header.
# Two lines.

# Why this process.
[net.pasta]
parent = "net.bwrap"
# Why these capabilities.
cap_eff = ["CAP_NET_BIND_SERVICE"]  # a trailing comment
fds = [
  "0 r /dev/null",
  "1 w /dev/null",  # the agent's channel is not pasta's
]

[nonet.agent]
uids = "sub+0 sub+0 sub+0 sub+0"
"#;

    #[test]
    fn a_table_reads_back_as_it_was_written() {
        let table = Table::parse(TEXT).unwrap();
        assert_eq!(table.header, ["# The file's header.", "# Two lines."]);
        let pasta = table.process("net.pasta").unwrap();
        assert_eq!(pasta.comments, ["# Why this process."]);
        assert_eq!(
            pasta.get("fds"),
            Some(&Value::List(vec![
                "0 r /dev/null".into(),
                "1 w /dev/null".into()
            ]))
        );
        assert_eq!(
            pasta.fields[1].trailing.as_deref(),
            Some("# a trailing comment")
        );
        assert_eq!(Table::parse(&table.render()).unwrap(), table);
    }

    #[test]
    fn bad_tables_are_refused_with_their_line() {
        for (text, line) in [
            ("[a]\nx = 1\n", 2),
            ("x = \"a\"\n", 1),
            ("[a]\nx = [\"a\"\n", 2),
            ("[a]\n[a]\n", 2),
            ("[a]\nx = \"a\"\nx = \"b\"\n", 3),
        ] {
            match Table::parse(text) {
                Err(ParseError::Bad { line: got, .. }) => assert_eq!(got, line, "{text}"),
                Ok(table) => panic!("{text} parsed: {table:?}"),
            }
        }
    }

    #[test]
    fn observed_values_take_the_expected_layout() {
        let expected = Table::parse(TEXT).unwrap();
        let mut observed = Table::default();
        let mut agent = Process::new("nonet.agent");
        agent.set("uids", Value::text("adapter adapter adapter adapter"));
        let mut pasta = Process::new("net.pasta");
        pasta.set("new_key", Value::text("x"));
        pasta.set("cap_eff", Value::List(vec![]));
        observed.processes = vec![agent, pasta, Process::new("net.forwarder")];
        let laid = expected.observed_in_layout(&observed);
        let roles: Vec<&str> = laid.processes.iter().map(|p| p.role.as_str()).collect();
        assert_eq!(roles, ["net.pasta", "nonet.agent", "net.forwarder"]);
        let pasta = &laid.processes[0];
        assert_eq!(pasta.comments, ["# Why this process."]);
        let keys: Vec<&str> = pasta.fields.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(
            keys,
            ["cap_eff", "new_key"],
            "absent keys go, new ones follow"
        );
        assert_eq!(pasta.fields[0].comments, ["# Why these capabilities."]);
        assert_eq!(laid.header, expected.header);
    }
}
