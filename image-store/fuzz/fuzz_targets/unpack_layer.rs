//! Fuzzes the layer unpacker: any input may fail, but must not panic and must never create
//! anything outside the target root.
#![no_main]

use std::io::{BufReader, Cursor};

use image_store::unpack::apply_layer;
use image_store::Digest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else { return };
    let root = dir.path().join("root");
    if std::fs::create_dir(&root).is_err() {
        return;
    }
    let _ = apply_layer(
        &root,
        BufReader::new(Cursor::new(data.to_vec())),
        &Digest::of(data),
    );
    let outside: Vec<_> = std::fs::read_dir(dir.path())
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(
        outside,
        vec![std::ffi::OsString::from("root")],
        "wrote outside the root"
    );
});
