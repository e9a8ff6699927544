//! A small in-process registry (axum on 127.0.0.1:0) serving images from memory, counting
//! requests and injecting faults.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use futures::StreamExt;

use super::oci::Image;

#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    None,
    /// Layer blobs are served with one byte changed.
    WrongDigest,
    /// Layer blobs are served cut in half (consistent Content-Length).
    Truncated,
    /// Layer blob requests answer 500 (after manifest and config succeeded).
    Error500,
    /// Layer blobs stream half their bytes and then the connection breaks.
    AbortMidStream,
    /// Layer blobs stream half their bytes and then hang (never finish).
    Stall,
    /// Layer blobs are served correctly after this many milliseconds.
    Delay(u64),
}

#[derive(Default)]
struct Inner {
    manifests: HashMap<String, Vec<u8>>,
    blobs: HashMap<String, Vec<u8>>,
    layers: std::collections::HashSet<String>,
    fault: Option<Fault>,
    counts: HashMap<String, usize>,
    /// When set, the registry demands a Bearer token issued by `/token` for these credentials.
    bearer: Option<(String, String)>,
}

const TOKEN: &str = "fake-token-for-tests";

#[derive(Clone, Default)]
pub struct FakeRegistry {
    inner: Arc<Mutex<Inner>>,
    pub addr: String,
}

impl FakeRegistry {
    pub async fn start() -> FakeRegistry {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let reg = FakeRegistry {
            inner: Arc::default(),
            addr,
        };
        let app = Router::new()
            .route("/v2/", get(root))
            .route("/token", get(token))
            .route("/v2/{*rest}", get(serve).head(serve))
            .with_state(reg.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        reg
    }

    /// Serves `image` as `repo:tag`.
    pub fn put(&self, repo: &str, tag: &str, image: &Image) {
        let mut g = self.inner.lock().unwrap();
        g.manifests
            .insert(format!("{repo}:{tag}"), image.manifest.clone());
        g.manifests
            .insert(format!("{repo}:{}", image.digest()), image.manifest.clone());
        for (d, b) in &image.blobs {
            g.blobs.insert(d.clone(), b.clone());
        }
        g.layers.extend(image.layer_digests.iter().cloned());
    }

    /// Requires the Docker token flow with these Basic credentials from now on.
    pub fn require_bearer(&self, user: &str, password: &str) {
        self.inner.lock().unwrap().bearer = Some((user.to_string(), password.to_string()));
    }

    pub fn set_fault(&self, f: Fault) {
        self.inner.lock().unwrap().fault = Some(f);
    }

    /// GET requests seen for `path_suffix` (e.g. a digest).
    pub fn gets(&self, path_suffix: &str) -> usize {
        let g = self.inner.lock().unwrap();
        g.counts
            .iter()
            .filter(|(k, _)| k.starts_with("GET") && k.ends_with(path_suffix))
            .map(|(_, v)| v)
            .sum()
    }
}

fn challenge(reg: &FakeRegistry) -> Response {
    let realm = format!(
        "Bearer realm=\"http://{}/token\",service=\"fake\"",
        reg.addr
    );
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, realm)],
        "unauthorized",
    )
        .into_response()
}

fn bearer_ok(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {TOKEN}"))
}

async fn root(State(reg): State<FakeRegistry>, headers: HeaderMap) -> Response {
    let needs = reg.inner.lock().unwrap().bearer.is_some();
    if needs && !bearer_ok(&headers) {
        return challenge(&reg);
    }
    "{}".into_response()
}

/// Counts the request and answers manifests and errors directly; for a blob returns its bytes
/// and the fault to apply (the lock is released before any await).
fn lookup(
    reg: &FakeRegistry,
    method: &Method,
    headers: &HeaderMap,
    rest: &str,
) -> Result<(Vec<u8>, Fault), Response> {
    let mut g = reg.inner.lock().unwrap();
    *g.counts.entry(format!("{method} {rest}")).or_default() += 1;
    if g.bearer.is_some() && !bearer_ok(headers) {
        drop(g);
        return Err(challenge(reg));
    }
    if let Some((repo, reference)) = rest.split_once("/manifests/") {
        return Err(match g.manifests.get(&format!("{repo}:{reference}")) {
            Some(m) => {
                let body = if method == Method::HEAD {
                    Vec::new()
                } else {
                    m.clone()
                };
                let headers = [
                    (
                        header::CONTENT_TYPE,
                        "application/vnd.oci.image.manifest.v1+json".to_string(),
                    ),
                    (
                        header::HeaderName::from_static("docker-content-digest"),
                        super::oci::sha(m),
                    ),
                ];
                (headers, body).into_response()
            }
            None => StatusCode::NOT_FOUND.into_response(),
        });
    }
    let Some((_, digest)) = rest.split_once("/blobs/") else {
        return Err(StatusCode::NOT_FOUND.into_response());
    };
    let Some(blob) = g.blobs.get(digest).cloned() else {
        return Err(StatusCode::NOT_FOUND.into_response());
    };
    let fault = if g.layers.contains(digest) {
        g.fault.clone().unwrap_or(Fault::None)
    } else {
        Fault::None
    };
    Ok((blob, fault))
}

/// The token endpoint: checks Basic credentials, hands out a fixed token.
async fn token(State(reg): State<FakeRegistry>, headers: HeaderMap) -> Response {
    use base64::Engine as _;
    let want = reg.inner.lock().unwrap().bearer.clone();
    let Some((user, pw)) = want else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    );
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if given != Some(expected.as_str()) {
        return (StatusCode::UNAUTHORIZED, "bad credentials").into_response();
    }
    axum::Json(serde_json::json!({"token": TOKEN, "expires_in": 300})).into_response()
}

async fn serve(
    State(reg): State<FakeRegistry>,
    method: Method,
    headers: HeaderMap,
    Path(rest): Path<String>,
) -> Response {
    let (mut blob, fault) = match lookup(&reg, &method, &headers, &rest) {
        Ok(found) => found,
        Err(response) => return response,
    };
    match fault {
        Fault::None => blob.into_response(),
        Fault::Delay(ms) => {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            blob.into_response()
        }
        Fault::WrongDigest => {
            let mid = blob.len() / 2;
            blob[mid] ^= 0xff;
            blob.into_response()
        }
        Fault::Truncated => {
            blob.truncate(blob.len() / 2);
            blob.into_response()
        }
        Fault::Error500 => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Fault::AbortMidStream => {
            let len = blob.len();
            let half = blob[..len / 2].to_vec();
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                vec![Ok(half), Err(std::io::Error::other("connection dropped"))];
            let body = Body::from_stream(futures::stream::iter(chunks));
            ([(header::CONTENT_LENGTH, len.to_string())], body).into_response()
        }
        Fault::Stall => {
            let len = blob.len();
            let half: Result<Vec<u8>, std::io::Error> = Ok(blob[..len / 2].to_vec());
            let stream = futures::stream::iter([half]).chain(futures::stream::pending());
            (
                [(header::CONTENT_LENGTH, len.to_string())],
                Body::from_stream(stream),
            )
                .into_response()
        }
    }
}
