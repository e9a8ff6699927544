//! A look at a plugin file before `dlopen` maps it.
//!
//! The dynamic loader trusts the ELF headers: a truncated library (an interrupted copy, a
//! half-written build) has segments that point past the end of the file, and touching them
//! kills the process with SIGBUS instead of returning an error. Checking that every loadable
//! segment lies inside the file turns that crash into a refusal with a reason.

use std::path::Path;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfCheckError {
    #[error("cannot read it: {0}")]
    Unreadable(String),
    #[error("it is not a regular file")]
    NotAFile,
    #[error("it is not an ELF shared library")]
    NotElf,
    #[error("it is an ELF file but not a shared library")]
    NotShared,
    #[error("it is truncated: {0} reaches past the end of the file ({1} bytes)")]
    Truncated(&'static str, u64),
}

const PT_LOAD: u32 = 1;
const ET_DYN: u16 = 3;

/// Checks that `path` is a whole ELF shared library, as far as its headers tell.
pub fn check(path: &Path) -> Result<(), ElfCheckError> {
    let metadata = std::fs::metadata(path).map_err(|e| ElfCheckError::Unreadable(e.to_string()))?;
    if !metadata.is_file() {
        return Err(ElfCheckError::NotAFile);
    }
    let bytes = std::fs::read(path).map_err(|e| ElfCheckError::Unreadable(e.to_string()))?;
    check_bytes(&bytes)
}

/// The header fields this check needs, read with the file's own class and byte order.
struct Reader<'a> {
    bytes: &'a [u8],
    wide: bool,
    little: bool,
}

impl Reader<'_> {
    fn uint(&self, at: u64, size: usize) -> Option<u64> {
        let start = usize::try_from(at).ok()?;
        let raw = self.bytes.get(start..start.checked_add(size)?)?;
        let mut value = 0u64;
        for i in 0..size {
            let byte = if self.little {
                raw[size - 1 - i]
            } else {
                raw[i]
            };
            value = (value << 8) | u64::from(byte);
        }
        Some(value)
    }

    /// An address-sized field (`Elf32_Off`/`Elf64_Off`) at `at32` or `at64`.
    fn word(&self, at32: u64, at64: u64) -> Option<u64> {
        if self.wide {
            self.uint(at64, 8)
        } else {
            self.uint(at32, 4)
        }
    }
}

fn check_bytes(bytes: &[u8]) -> Result<(), ElfCheckError> {
    if bytes.len() < 16 || &bytes[..4] != b"\x7fELF" {
        return Err(ElfCheckError::NotElf);
    }
    let wide = match bytes[4] {
        1 => false,
        2 => true,
        _ => return Err(ElfCheckError::NotElf),
    };
    let little = match bytes[5] {
        1 => true,
        2 => false,
        _ => return Err(ElfCheckError::NotElf),
    };
    let elf = Reader {
        bytes,
        wide,
        little,
    };
    let size = bytes.len() as u64;
    let truncated = |what| ElfCheckError::Truncated(what, size);
    let e_type = elf.uint(16, 2).ok_or(truncated("the ELF header"))?;
    if e_type != u64::from(ET_DYN) {
        return Err(ElfCheckError::NotShared);
    }
    let header = (|| {
        let phoff = elf.word(28, 32)?;
        let shoff = elf.word(32, 40)?;
        let (phentsize, phnum, shentsize, shnum) = if wide {
            (
                elf.uint(54, 2)?,
                elf.uint(56, 2)?,
                elf.uint(58, 2)?,
                elf.uint(60, 2)?,
            )
        } else {
            (
                elf.uint(42, 2)?,
                elf.uint(44, 2)?,
                elf.uint(46, 2)?,
                elf.uint(48, 2)?,
            )
        };
        Some((phoff, phentsize, phnum, shoff, shentsize, shnum))
    })();
    let (phoff, phentsize, phnum, shoff, shentsize, shnum) =
        header.ok_or(truncated("the ELF header"))?;
    let fits = |offset: u64, length: u64| offset.checked_add(length).is_some_and(|end| end <= size);
    if !fits(phoff, phentsize * phnum) {
        return Err(truncated("the program header table"));
    }
    if shnum > 0 && !fits(shoff, shentsize * shnum) {
        return Err(truncated("the section header table"));
    }
    for index in 0..phnum {
        let entry = phoff + index * phentsize;
        let segment = (|| {
            let p_type = elf.uint(entry, 4)?;
            let (offset, filesz) = if wide {
                (elf.uint(entry + 8, 8)?, elf.uint(entry + 32, 8)?)
            } else {
                (elf.uint(entry + 4, 4)?, elf.uint(entry + 16, 4)?)
            };
            Some((p_type, offset, filesz))
        })();
        let (p_type, offset, filesz) = segment.ok_or(truncated("a program header"))?;
        if p_type == u64::from(PT_LOAD) && !fits(offset, filesz) {
            return Err(truncated("a loadable segment"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test executable itself is a whole ELF file (a PIE is `ET_DYN` too).
    fn own_executable() -> Vec<u8> {
        std::fs::read(std::env::current_exe().unwrap()).unwrap()
    }

    #[test]
    fn a_whole_library_passes_and_every_truncation_is_refused() {
        let bytes = own_executable();
        if check_bytes(&bytes) == Err(ElfCheckError::NotShared) {
            println!("*** the test executable is not PIE: truncation test DID NOT RUN ***");
            return;
        }
        assert_eq!(check_bytes(&bytes), Ok(()));
        for keep in [16, 40, 64, 100, 4096, bytes.len() / 2, bytes.len() - 1] {
            let error = check_bytes(&bytes[..keep]).unwrap_err();
            assert!(
                matches!(error, ElfCheckError::Truncated(..)),
                "{keep} bytes: {error:?}"
            );
        }
    }

    #[test]
    fn text_and_other_files_are_not_elf() {
        assert_eq!(check_bytes(b"hello, world\n"), Err(ElfCheckError::NotElf));
        assert_eq!(check_bytes(b""), Err(ElfCheckError::NotElf));
        assert_eq!(
            check_bytes(b"\x7fELF\x09\x01rest-of-it"),
            Err(ElfCheckError::NotElf)
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(dir.path()), Err(ElfCheckError::NotAFile));
        assert!(matches!(
            check(&dir.path().join("missing")),
            Err(ElfCheckError::Unreadable(_))
        ));
    }
}
