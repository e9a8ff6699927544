//! The errors the image store hands to its callers, each mapped to one S-code of SPEC.md.

use crate::pull::PullError;

/// Why an image could not be made ready. `code()` gives the S-code sent on the bus.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The name is neither a preset nor a configured custom image.
    #[error("image {name:?} is not in the catalog (known: {known})")]
    NotInCatalog { name: String, known: String },
    /// The image exists in the catalog but `image_allowlist` does not name it.
    #[error("image {name:?} is not allowed by image_allowlist")]
    NotAllowed { name: String },
    /// The image is not in the cache and `auto_install` is off.
    #[error("image {name:?} ({oci_ref}) is not installed and auto_install is off; pre-pull it with sandbox-libkrun-pull")]
    NotInstalled { name: String, oci_ref: String },
    /// Pulling or unpacking failed; names the reference and the cause.
    #[error("pull of {reference} failed: {source}")]
    Pull {
        reference: String,
        #[source]
        source: PullError,
    },
    /// The cache directory could not be prepared.
    #[error("image cache {path}: {source}")]
    Cache {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl ImageError {
    /// The S-code of SPEC.md section 4.
    pub fn code(&self) -> &'static str {
        match self {
            ImageError::NotInCatalog { .. } | ImageError::NotAllowed { .. } => "S100",
            ImageError::NotInstalled { .. } => "S101",
            ImageError::Pull { .. } | ImageError::Cache { .. } => "S102",
        }
    }

    /// Whether trying again later may succeed (pull failures, except an image over the limits).
    pub fn retryable(&self) -> bool {
        match self {
            ImageError::Pull { source, .. } => !source.is_too_large(),
            ImageError::Cache { .. } => true,
            _ => false,
        }
    }
}
