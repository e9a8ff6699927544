//! Registry access with oci-client: resolve a reference to one image manifest for this host,
//! fetch the config and stream layer blobs to disk, checking every digest and size ourselves.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tokio::io::AsyncWriteExt;

use crate::auth::{AuthFileError, Credentials};
use crate::digest::{BadDigest, Digest, Hasher};
use crate::manifest::{self, ImageManifest, ManifestError, Parsed, ACCEPTED};
use crate::progress::PullProgress;
use crate::settings::ImageSettings;
use crate::unpack::UnpackError;

/// Why a pull failed (wrapped in `ImageError::Pull`, S102).
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("bad reference: {0}")]
    Reference(#[from] oci_client::ParseError),
    #[error("registry {registry}: {source}")]
    Registry {
        registry: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    #[error("{0}")]
    Digest(#[from] BadDigest),
    #[error("{what} {expected}: content has digest {actual}")]
    DigestMismatch {
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error("blob {digest}: expected {expected} bytes, got {actual}")]
    Size {
        digest: String,
        expected: u64,
        actual: u64,
    },
    #[error("blob {digest}: {source}")]
    Stream {
        digest: String,
        #[source]
        source: std::io::Error,
    },
    #[error("image config lists {diff_ids} diff_ids for {layers} layers")]
    LayerCount { diff_ids: usize, layers: usize },
    #[error("layer {index} ({digest}): {source}")]
    Unpack {
        index: usize,
        digest: String,
        #[source]
        source: UnpackError,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    AuthFile(#[from] AuthFileError),
    #[error("background task failed: {0}")]
    Task(String),
    #[error("the image's layers weigh {bytes} bytes compressed, over the limit of {limit} bytes (`max_image_size_mb`)")]
    TooLarge { bytes: u64, limit: u64 },
}

impl PullError {
    /// Whether the image itself is over the configured limits (pulling again cannot help).
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            PullError::TooLarge { .. }
                | PullError::Unpack {
                    source: UnpackError::TooLarge { .. },
                    ..
                }
        )
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PullError + '_ {
    move |source| PullError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A reference resolved to one platform's image manifest.
pub struct Resolved {
    pub reference: Reference,
    pub manifest_digest: Digest,
    pub manifest: ImageManifest,
}

pub struct Registry {
    client: Client,
    credentials: Credentials,
    mirrors: std::collections::BTreeMap<String, String>,
}

impl Registry {
    pub fn new(settings: &ImageSettings) -> Result<Self, PullError> {
        let protocol = if settings.insecure_registries.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(settings.insecure_registries.clone())
        };
        let config = ClientConfig {
            protocol,
            connect_timeout: Some(std::time::Duration::from_secs(15)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            // We choose the platform ourselves (attestation entries, variants).
            platform_resolver: None,
            ..Default::default()
        };
        Ok(Registry {
            client: Client::new(config),
            credentials: Credentials::load(settings.docker_config.as_deref())?,
            mirrors: settings.registry_mirrors.clone(),
        })
    }

    fn auth(&self, r: &Reference) -> RegistryAuth {
        self.credentials.for_host(r.registry())
    }

    fn registry_err(
        r: &Reference,
    ) -> impl FnOnce(oci_client::errors::OciDistributionError) -> PullError + '_ {
        move |source| PullError::Registry {
            registry: r.registry().to_string(),
            source,
        }
    }

    async fn manifest_raw(&self, r: &Reference) -> Result<(Vec<u8>, Digest), PullError> {
        let (body, _) = self
            .client
            .pull_manifest_raw(r, &self.auth(r), ACCEPTED)
            .await
            .map_err(Self::registry_err(r))?;
        let actual = Digest::of(&body);
        if let Some(want) = r.digest() {
            if want != actual.as_str() {
                return Err(PullError::DigestMismatch {
                    what: "manifest",
                    expected: want.to_string(),
                    actual: actual.to_string(),
                });
            }
        }
        Ok((body.to_vec(), actual))
    }

    /// Resolves `oci_ref` (through its mirror, if any) to this host's image manifest.
    pub async fn resolve(&self, oci_ref: &str) -> Result<Resolved, PullError> {
        let reference = crate::reference::effective(oci_ref, &self.mirrors)?;
        let (body, digest) = self.manifest_raw(&reference).await?;
        let (manifest, manifest_digest) = match manifest::parse(&body)? {
            Parsed::Image(m) => (m, digest),
            Parsed::Index(entries) => {
                let chosen = manifest::select_platform(&entries, manifest::host_arch())?;
                let child_digest = Digest::parse(&chosen.digest)?;
                let child = reference.clone_with_digest(child_digest.to_string());
                let (body, digest) = self.manifest_raw(&child).await?;
                match manifest::parse(&body)? {
                    Parsed::Image(m) => (m, digest),
                    Parsed::Index(_) => {
                        return Err(ManifestError::MediaType("nested index".into()).into())
                    }
                }
            }
        };
        Ok(Resolved {
            reference,
            manifest_digest,
            manifest,
        })
    }

    /// Fetches the (small) config blob and checks its digest.
    pub async fn config(&self, r: &Resolved) -> Result<Vec<u8>, PullError> {
        let want = Digest::parse(&r.manifest.config.digest)?;
        let mut body = Vec::new();
        let mut stream = self
            .client
            .pull_blob_stream(&r.reference, want.as_str())
            .await
            .map_err(Self::registry_err(&r.reference))?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| PullError::Stream {
                digest: want.to_string(),
                source,
            })?;
            body.extend_from_slice(&chunk);
            if body.len() > 8 << 20 {
                return Err(PullError::Size {
                    digest: want.to_string(),
                    expected: r.manifest.config.size.max(0) as u64,
                    actual: body.len() as u64,
                });
            }
        }
        let actual = Digest::of(&body);
        if actual != want {
            return Err(PullError::DigestMismatch {
                what: "config",
                expected: want.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(body)
    }

    /// Streams blob `want` of `size` bytes into `tmp`, checking size and digest.
    /// The caller renames `tmp` into the cache on success and removes it on failure.
    pub async fn blob_to_file(
        &self,
        reference: &Reference,
        want: &Digest,
        size: u64,
        tmp: &Path,
        progress: &dyn PullProgress,
    ) -> Result<(), PullError> {
        let mut stream = self
            .client
            .pull_blob_stream(reference, want.as_str())
            .await
            .map_err(Self::registry_err(reference))?;
        // Created synchronously: an async create could finish after a cancelled pull's
        // cleanup already ran, leaving a stray partial file.
        let file = tokio::fs::File::from_std(std::fs::File::create(tmp).map_err(io_err(tmp))?);
        let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let mut hasher = Hasher::default();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| PullError::Stream {
                digest: want.to_string(),
                source,
            })?;
            hasher.update(&chunk);
            if hasher.bytes() > size {
                return Err(PullError::Size {
                    digest: want.to_string(),
                    expected: size,
                    actual: hasher.bytes(),
                });
            }
            out.write_all(&chunk).await.map_err(io_err(tmp))?;
            progress.downloaded(chunk.len() as u64);
        }
        out.flush().await.map_err(io_err(tmp))?;
        if hasher.bytes() != size {
            return Err(PullError::Size {
                digest: want.to_string(),
                expected: size,
                actual: hasher.bytes(),
            });
        }
        let actual = hasher.finish();
        if &actual != want {
            return Err(PullError::DigestMismatch {
                what: "blob",
                expected: want.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    }
}
