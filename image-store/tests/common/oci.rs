//! Builds small OCI images in memory for the in-process registry.

use std::collections::HashMap;
use std::io::Write;

use sha2::{Digest as _, Sha256};

pub fn sha(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// A raw tar, entry by entry, with names written unchecked (so `../x` can be built).
#[derive(Default)]
pub struct Tar(Vec<u8>);

impl Tar {
    fn push(
        mut self,
        name: &str,
        kind: tar::EntryType,
        link: &str,
        data: &[u8],
        mode: u32,
    ) -> Self {
        let mut h = tar::Header::new_gnu();
        {
            let raw = h.as_old_mut();
            raw.name[..name.len()].copy_from_slice(name.as_bytes());
            raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        self.0
            .extend(std::iter::repeat_n(0, (512 - data.len() % 512) % 512));
        self
    }
    pub fn file(self, name: &str, data: &[u8]) -> Self {
        self.push(name, tar::EntryType::Regular, "", data, 0o644)
    }
    pub fn dir(self, name: &str) -> Self {
        self.push(name, tar::EntryType::Directory, "", b"", 0o755)
    }
    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.push(name, tar::EntryType::Symlink, target, b"", 0o777)
    }
    pub fn hardlink(self, name: &str, target: &str) -> Self {
        self.push(name, tar::EntryType::Link, target, b"", 0o644)
    }
    pub fn finish(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0, 1024));
        self.0
    }
}

pub fn gzip(raw: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(raw).expect("gzip");
    gz.finish().expect("gzip")
}

/// An image: its blobs by digest and its manifest bytes.
pub struct Image {
    pub manifest: Vec<u8>,
    pub blobs: HashMap<String, Vec<u8>>,
    pub layer_digests: Vec<String>,
}

impl Image {
    pub fn digest(&self) -> String {
        sha(&self.manifest)
    }
}

/// Makes an image from raw tars (gzip-compressed). `diff_id_override` replaces the diff_ids
/// written in the config (to build a lying image).
pub fn image(layers: &[Vec<u8>], diff_id_override: Option<Vec<String>>) -> Image {
    let mut blobs = HashMap::new();
    let mut descs = Vec::new();
    let mut layer_digests = Vec::new();
    let mut diff_ids = Vec::new();
    for raw in layers {
        let gz = gzip(raw);
        let d = sha(&gz);
        descs.push(
            serde_json::json!({"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip",
                                      "digest": d, "size": gz.len()}),
        );
        layer_digests.push(d.clone());
        diff_ids.push(sha(raw));
        blobs.insert(d, gz);
    }
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_id_override.unwrap_or(diff_ids)}
    }))
    .expect("json");
    let cd = sha(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": descs
    }))
    .expect("json");
    blobs.insert(cd, config);
    Image {
        manifest,
        blobs,
        layer_digests,
    }
}

/// A plain two-layer image with a few files.
pub fn good_image(marker: &str) -> Image {
    image(
        &[
            Tar::default()
                .dir("etc/")
                .file("etc/hello", b"hello\n")
                .finish(),
            Tar::default()
                .file("etc/marker", marker.as_bytes())
                .finish(),
        ],
        None,
    )
}
