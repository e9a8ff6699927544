//! Registry credentials from a Docker `config.json` (`auths` entries; credential helpers are
//! not run: a sandbox host should not execute arbitrary helpers, configure `auths` instead).

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// Credentials per registry host, loaded once.
#[derive(Debug, Default, Clone)]
pub struct Credentials {
    by_host: BTreeMap<String, (String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl Credentials {
    /// Loads `path`; a missing file means no credentials, a malformed one is an error.
    pub fn load(path: Option<&Path>) -> Result<Self, AuthFileError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(AuthFileError::Read {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        let cfg: DockerConfig =
            serde_json::from_slice(&text).map_err(|source| AuthFileError::Parse {
                path: path.display().to_string(),
                source,
            })?;
        let mut by_host = BTreeMap::new();
        for (key, entry) in cfg.auths {
            if let Some(pair) = entry.pair() {
                by_host.insert(normalise_host(&key), pair);
            }
        }
        Ok(Credentials { by_host })
    }

    /// The credentials for `host` (as written in the reference, `host[:port]`).
    pub fn for_host(&self, host: &str) -> RegistryAuth {
        let key = normalise_host(host);
        match self.by_host.get(&key) {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

impl AuthEntry {
    fn pair(&self) -> Option<(String, String)> {
        if let (Some(u), Some(p)) = (&self.username, &self.password) {
            return Some((u.clone(), p.clone()));
        }
        if let Some(encoded) = &self.auth {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()?;
            let text = String::from_utf8(raw).ok()?;
            let (u, p) = text.split_once(':')?;
            return Some((u.to_string(), p.to_string()));
        }
        // An identity token alone is an OAuth refresh token; oci-client has no flow for it.
        let _ = &self.identity_token;
        None
    }
}

/// `https://index.docker.io/v1/` -> `docker.io`, `http://h:5000/x` -> `h:5000`.
fn normalise_host(key: &str) -> String {
    let no_scheme = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = no_scheme.split('/').next().unwrap_or(no_scheme);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".into()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auths_entries_are_found_by_host() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{b64}"}},
                "127.0.0.1:5000":{{"username":"bob","password":"pw"}},
                "broken.example":{{"auth":"!!!"}}}},"credsStore":"desktop"}}"#
            ),
        )
        .unwrap();
        let c = Credentials::load(Some(&path)).unwrap();
        assert_eq!(
            c.for_host("docker.io"),
            RegistryAuth::Basic("alice".into(), "s3cret".into())
        );
        assert_eq!(
            c.for_host("127.0.0.1:5000"),
            RegistryAuth::Basic("bob".into(), "pw".into())
        );
        assert_eq!(c.for_host("broken.example"), RegistryAuth::Anonymous);
        assert_eq!(c.for_host("other:1"), RegistryAuth::Anonymous);
        assert!(Credentials::load(Some(&dir.path().join("missing.json"))).is_ok());
        std::fs::write(&path, b"{not json").unwrap();
        assert!(Credentials::load(Some(&path)).is_err());
    }
}
