//! Validated sha256 digests and hashing adapters.
//!
//! A digest is used as a file name in the cache, so it is validated strictly
//! (`sha256:` + 64 lowercase hex) before it ever touches a path.

use std::fmt;

use sha2::{Digest as _, Sha256};

/// A `sha256:<64 hex>` content digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

/// The digest text is not a sha256 digest we accept.
#[derive(Debug, thiserror::Error)]
#[error("unsupported or malformed digest {0:?} (only sha256 is accepted)")]
pub struct BadDigest(pub String);

impl Digest {
    pub fn parse(text: &str) -> Result<Self, BadDigest> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| BadDigest(text.to_string()))?;
        let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if ok {
            Ok(Digest(text.to_string()))
        } else {
            Err(BadDigest(text.to_string()))
        }
    }

    pub fn of(bytes: &[u8]) -> Self {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex characters, safe as a file name.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Running sha256 plus byte count.
#[derive(Default, Clone)]
pub struct Hasher {
    inner: Sha256,
    bytes: u64,
}

impl Hasher {
    pub fn update(&mut self, data: &[u8]) {
        self.inner.update(data);
        self.bytes += data.len() as u64;
    }
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    pub fn finish(self) -> Digest {
        Digest(format!("sha256:{}", hex::encode(self.inner.finalize())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_paths_and_other_algorithms() {
        let good = Digest::of(b"x");
        assert!(Digest::parse(good.as_str()).is_ok());
        assert!(Digest::parse("sha256:../../etc/passwd").is_err());
        assert!(Digest::parse(&good.as_str().to_uppercase()).is_err());
        assert!(Digest::parse(&good.as_str().replace("sha256", "sha512")).is_err());
        assert!(Digest::parse(&good.as_str()[..70]).is_err());
    }

    #[test]
    fn hasher_matches_one_shot_digest() {
        let data = vec![7u8; 100_000];
        let mut h = Hasher::default();
        h.update(&data[..10]);
        h.update(&data[10..]);
        assert_eq!(h.bytes(), 100_000);
        assert_eq!(h.finish(), Digest::of(&data));
    }
}
