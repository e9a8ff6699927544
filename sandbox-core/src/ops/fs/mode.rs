//! File modes as the contract writes them: octal strings of 3 or 4 digits ("755", "0644").

use agent_proto::FsEntry;
use serde_json::{json, Value};

use crate::error::SandboxError;

/// Parses `text` (or takes `default` when absent); anything but 3-4 octal digits is S001.
pub fn parse(field: &str, text: Option<&str>, default: u32) -> Result<u32, SandboxError> {
    let Some(text) = text else {
        return Ok(default);
    };
    let octal = (3..=4).contains(&text.len()) && text.bytes().all(|b| (b'0'..=b'7').contains(&b));
    if !octal {
        return Err(SandboxError::InvalidRequest(format!(
            "`{field}` must be an octal mode string of 3 or 4 digits like \"0755\", got {text:?}"
        )));
    }
    u32::from_str_radix(text, 8)
        .map_err(|e| SandboxError::InvalidRequest(format!("`{field}` {text:?}: {e}")))
}

/// The SPEC's rendering: always four octal digits.
pub fn render(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// One entry as `fs::ls` and `fs::stat` answer it.
pub fn entry_json(entry: &FsEntry) -> Value {
    json!({
        "name": entry.name,
        "is_dir": entry.is_dir,
        "is_symlink": entry.is_symlink,
        "size": entry.size,
        "mode": render(entry.mode),
        "mtime": entry.mtime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_render() {
        assert_eq!(parse("mode", None, 0o644).unwrap(), 0o644);
        assert_eq!(parse("mode", Some("0755"), 0).unwrap(), 0o755);
        assert_eq!(parse("mode", Some("700"), 0).unwrap(), 0o700);
        assert_eq!(parse("mode", Some("4755"), 0).unwrap(), 0o4755);
        for bad in ["", "75", "07555", "0789", "rwx", "+755", "-755", "0x1f"] {
            assert_eq!(
                parse("mode", Some(bad), 0).unwrap_err().code(),
                "S001",
                "{bad:?}"
            );
        }
        assert_eq!(render(0o755), "0755");
        assert_eq!(render(0o4755), "4755");
        assert_eq!(render(0o100644), "0644");
    }
}
