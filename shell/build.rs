//! Embeds the files of `$SANDBOX_LIBKRUN_EMBED_DIR` (when set) as opaque bytes.
//!
//! The shell knows nothing about them: it writes them to a content-addressed directory on
//! first use (see `src/bundle.rs`). `$SANDBOX_LIBKRUN_EMBED_ENV` (`VAR=file,VAR=file`) names
//! environment variables the shell points at extracted files before loading a plugin, unless
//! the operator set them. Without `$SANDBOX_LIBKRUN_EMBED_DIR` nothing is embedded, so a plain
//! `cargo build --workspace` (which cannot build the plugins before the shell) keeps working;
//! `scripts/release.sh` builds the parts first, then the shell with the variable set.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const DIR_VAR: &str = "SANDBOX_LIBKRUN_EMBED_DIR";
const ENV_VAR: &str = "SANDBOX_LIBKRUN_EMBED_ENV";

struct File {
    name: String,
    path: PathBuf,
    mode: u32,
    sha256: String,
}

fn main() {
    // The startup log names the target, so a log says which release archive is installed.
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    println!("cargo:rustc-env=SANDBOX_TARGET={target}");
    println!("cargo:rerun-if-env-changed={DIR_VAR}");
    println!("cargo:rerun-if-env-changed={ENV_VAR}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("embedded.rs");
    let files = match std::env::var_os(DIR_VAR).filter(|d| !d.is_empty()) {
        Some(dir) => collect(Path::new(&dir)),
        None => Vec::new(),
    };
    let env = std::env::var(ENV_VAR).unwrap_or_default();
    let env = parse_env(&env, &files);

    let mut bundle = Sha256::new();
    let mut code = String::from("pub static FILES: &[EmbeddedFile] = &[\n");
    for file in &files {
        bundle.update(format!("{}\0{:o}\0{}\n", file.name, file.mode, file.sha256));
        writeln!(
            code,
            "    EmbeddedFile {{ name: {:?}, mode: 0o{:o}, sha256: {:?}, bytes: include_bytes!({:?}) }},",
            file.name,
            file.mode,
            file.sha256,
            file.path.to_str().expect("embedded file paths are UTF-8"),
        )
        .unwrap();
    }
    code.push_str("];\n\npub static HELPER_ENV: &[(&str, &str)] = &[\n");
    for (var, name) in &env {
        writeln!(code, "    ({var:?}, {name:?}),").unwrap();
    }
    let digest = hex(&bundle.finalize());
    writeln!(
        code,
        "];\n\npub const BUNDLE_HASH: &str = {:?};",
        &digest[..16]
    )
    .unwrap();
    std::fs::write(&out, code).expect("write embedded.rs");
}

/// The regular files of `dir` but hidden ones, by name; names must be plain.
fn collect(dir: &Path) -> Vec<File> {
    println!("cargo:rerun-if-changed={}", dir.display());
    let dir = dir
        .canonicalize()
        .unwrap_or_else(|e| panic!("{DIR_VAR}={}: {e}", dir.display()));
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{DIR_VAR}: {e}")) {
        let entry = entry.expect("read the embed directory");
        let name = entry.file_name().into_string().expect("UTF-8 file name");
        let path = entry.path();
        let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // Hidden names are temporaries of whoever stages the directory.
        if !meta.is_file() || name.starts_with('.') {
            continue;
        }
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
            "{DIR_VAR}: `{name}` is not a plain file name"
        );
        println!("cargo:rerun-if-changed={}", path.display());
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mode = if meta.permissions().mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        files.push(File {
            name,
            path,
            mode,
            sha256: hex(&Sha256::digest(&bytes)),
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
}

/// `VAR=file,VAR=file`: every file must be embedded.
fn parse_env(text: &str, files: &[File]) -> Vec<(String, String)> {
    text.split([',', ' ', '\n'])
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (var, name) = item
                .trim()
                .split_once('=')
                .unwrap_or_else(|| panic!("{ENV_VAR}: `{item}` is not VAR=file"));
            assert!(
                files.iter().any(|f| f.name == name),
                "{ENV_VAR}: `{name}` is not one of the embedded files"
            );
            (var.to_string(), name.to_string())
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        write!(s, "{b:02x}").unwrap();
        s
    })
}
