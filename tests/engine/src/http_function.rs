//! HTTP-invoked functions: a `registerfunction` carrying `invocation: {url, method?,
//! headers?, timeout_ms?, auth?}` registers a function the ENGINE serves by sending an HTTP
//! request from its own host, as the real engine's `http_functions` worker does. The call's
//! data is the request body; the response body (JSON) is the call's result. `auth` names
//! variables of the engine's environment, read when the function is registered: a bearer
//! token, an API key header, or an HMAC secret that signs the body.
//!
//! The request is written by hand over a `TcpStream` (HTTP/1.1, `Connection: close`): the
//! engine needs one POST-shaped request per call and nothing else of an HTTP client, and a
//! client crate with TLS would add a long build to every test run for a feature the tests
//! exercise over plain http only. `https` URLs are therefore refused at registration.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::env::EngineEnv;
use crate::wire::ErrorBody;

/// Per-call deadline when the registration names none (the real engine's default).
const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Largest response body read; a larger one fails the call.
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// The `invocation` object of a `registerfunction`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HttpInvocation {
    pub url: String,
    #[serde(default)]
    pub method: HttpMethod,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub auth: Option<AuthRef>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    #[default]
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Delete => "DELETE",
        }
    }
}

/// Which environment variable holds the credential; the registration names the variable,
/// the engine supplies its value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum AuthRef {
    Hmac {
        secret_key: String,
    },
    Bearer {
        token_key: String,
    },
    #[serde(rename = "api_key")]
    ApiKey {
        header: String,
        value_key: String,
    },
}

/// A credential as read from the environment.
#[derive(Clone, PartialEq, Eq)]
enum Auth {
    Hmac { secret: String },
    Bearer { token: String },
    ApiKey { header: String, value: String },
}

impl std::fmt::Debug for Auth {
    // The values are secrets: a log line of the target must not carry them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Hmac { .. } => f.write_str("Hmac(..)"),
            Auth::Bearer { .. } => f.write_str("Bearer(..)"),
            Auth::ApiKey { header, .. } => write!(f, "ApiKey({header}: ..)"),
        }
    }
}

/// Which URLs an HTTP function may name. The real engine refuses plain http and private,
/// loopback and link-local addresses unless its `http_functions` security settings allow
/// them; see [`UrlPolicy::real_engine_default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UrlPolicy {
    pub require_https: bool,
    pub block_private_ips: bool,
}

impl UrlPolicy {
    /// The real engine's defaults: https only, no private addresses. Under it this engine
    /// registers no HTTP function at all, as it has no TLS.
    pub fn real_engine_default() -> Self {
        Self {
            require_https: true,
            block_private_ips: true,
        }
    }

    /// An engine whose security settings allow http and private addresses (a development
    /// engine), or, from a test's point of view, a public https endpoint an attacker owns:
    /// the test engine's default, so a test's listener on the host's loopback stands for it.
    pub fn permissive() -> Self {
        Self {
            require_https: false,
            block_private_ips: false,
        }
    }
}

impl Default for UrlPolicy {
    fn default() -> Self {
        Self::permissive()
    }
}

/// Where an HTTP function's calls go, with its credential resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    host: String,
    port: u16,
    /// `Host:` header: the URL's authority as written.
    authority: String,
    /// Path and query.
    path: String,
    method: HttpMethod,
    timeout: Duration,
    headers: BTreeMap<String, String>,
    auth: Option<Auth>,
    block_private_ips: bool,
}

impl HttpTarget {
    /// Checks the URL against `policy` and reads the credential from `env`, as the real
    /// engine does when the function registers (a missing variable refuses the registration).
    pub fn prepare(
        invocation: &HttpInvocation,
        env: &EngineEnv,
        policy: UrlPolicy,
    ) -> Result<HttpTarget, ErrorBody> {
        let invalid = |why: &str| ErrorBody::new("url_validation_failed", why.to_string());
        let url = invocation.url.trim();
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("Invalid URL"))?;
        if scheme.eq_ignore_ascii_case("https") {
            return Err(invalid(
                "HTTPS is not supported by the test engine (it has no TLS)",
            ));
        }
        if !scheme.eq_ignore_ascii_case("http") {
            return Err(invalid("Invalid URL"));
        }
        if policy.require_https {
            return Err(invalid("HTTPS is required"));
        }
        let rest = rest.split('#').next().unwrap_or_default();
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        if authority.is_empty()
            || authority.contains('@')
            || authority.contains(char::is_whitespace)
        {
            return Err(invalid("Invalid URL"));
        }
        let (host, port) = split_host_port(authority).ok_or_else(|| invalid("Invalid URL"))?;
        if policy.block_private_ips {
            let private = match host.parse::<IpAddr>() {
                Ok(ip) => is_private(ip),
                Err(_) => host.eq_ignore_ascii_case("localhost"),
            };
            if private {
                return Err(invalid("Private IP blocked"));
            }
        }
        let path = match path {
            "" => "/".to_string(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_string(),
        };
        let auth = invocation
            .auth
            .as_ref()
            .map(|auth| resolve_auth(auth, env))
            .transpose()?;
        Ok(HttpTarget {
            host,
            port,
            authority: authority.to_string(),
            path,
            method: invocation.method,
            timeout: Duration::from_millis(invocation.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
            headers: invocation.headers.clone(),
            auth,
            block_private_ips: policy.block_private_ips,
        })
    }

    /// Sends one call: `data` as the JSON body. The result is the response's JSON body
    /// (`null` when empty); a status of 400 or more is an error, its `{error: {code,
    /// message}}` body when it has one.
    pub async fn call(
        &self,
        function_id: &str,
        invocation_id: &str,
        data: &Value,
    ) -> Result<Value, ErrorBody> {
        match tokio::time::timeout(
            self.timeout,
            self.exchange(function_id, invocation_id, data),
        )
        .await
        {
            Ok(outcome) => outcome,
            Err(_) => Err(ErrorBody::new(
                "http_request_failed",
                format!(
                    "no answer from {} within {:?}",
                    self.authority, self.timeout
                ),
            )),
        }
    }

    async fn exchange(
        &self,
        function_id: &str,
        invocation_id: &str,
        data: &Value,
    ) -> Result<Value, ErrorBody> {
        let failed = |what: String| ErrorBody::new("http_request_failed", what);
        let body = serde_json::to_vec(data)
            .map_err(|e| ErrorBody::new("serialization_error", e.to_string()))?;
        let request = self.request(function_id, invocation_id, &body)?;
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| failed(format!("cannot resolve {}: {e}", self.host)))?
            .collect();
        // Checked on the addresses actually connected to, so a name cannot resolve to a
        // private address after registration.
        if self.block_private_ips && addresses.iter().any(|a| is_private(a.ip())) {
            return Err(ErrorBody::new(
                "url_validation_failed",
                "Private IP blocked".to_string(),
            ));
        }
        let mut stream = TcpStream::connect(addresses.as_slice())
            .await
            .map_err(|e| failed(format!("cannot connect to {}: {e}", self.authority)))?;
        stream
            .write_all(&request)
            .await
            .map_err(|e| failed(format!("sending to {}: {e}", self.authority)))?;
        let mut response = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let n = stream
                .read(&mut chunk)
                .await
                .map_err(|e| ErrorBody::new("http_response_failed", e.to_string()))?;
            if n == 0 {
                break;
            }
            response.extend_from_slice(&chunk[..n]);
            if response.len() > MAX_RESPONSE_BYTES + 64 * 1024 {
                return Err(ErrorBody::new(
                    "http_response_failed",
                    format!("response larger than {MAX_RESPONSE_BYTES} bytes"),
                ));
            }
        }
        let (status, body) = parse_response(&response)
            .ok_or_else(|| ErrorBody::new("http_response_failed", "malformed HTTP response"))?;
        outcome(status, &body)
    }

    /// The request's bytes: head and body.
    fn request(
        &self,
        function_id: &str,
        invocation_id: &str,
        body: &[u8],
    ) -> Result<Vec<u8>, ErrorBody> {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut headers: Vec<(String, String)> = vec![
            ("Host".into(), self.authority.clone()),
            ("Content-Type".into(), "application/json".into()),
            ("Content-Length".into(), body.len().to_string()),
            ("Connection".into(), "close".into()),
            ("x-iii-Function-Path".into(), function_id.into()),
            ("x-iii-Invocation-ID".into(), invocation_id.into()),
            ("x-iii-Timestamp".into(), timestamp.to_string()),
        ];
        headers.extend(self.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
        match &self.auth {
            Some(Auth::Bearer { token }) => {
                headers.push(("Authorization".into(), format!("Bearer {token}")));
            }
            Some(Auth::ApiKey { header, value }) => headers.push((header.clone(), value.clone())),
            Some(Auth::Hmac { secret }) => {
                headers.push(("x-iii-Signature".into(), sign(body, secret, timestamp)));
            }
            None => {}
        }
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method.as_str(), self.path);
        for (name, value) in &headers {
            // A name or value that would end the line would let a registration write its own
            // request lines; an HTTP client refuses to build such a request.
            let bad_name = name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            let bad_value = value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0);
            if bad_name || bad_value {
                return Err(ErrorBody::new(
                    "http_request_failed",
                    format!("invalid header {name:?}"),
                ));
            }
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        Ok(request)
    }
}

fn resolve_auth(auth: &AuthRef, env: &EngineEnv) -> Result<Auth, ErrorBody> {
    let read = |name: &str, code: &str, what: &str| {
        env.var(name)
            .ok_or_else(|| ErrorBody::new(code, format!("{what} not found: {name}")))
    };
    Ok(match auth {
        AuthRef::Hmac { secret_key } => Auth::Hmac {
            secret: read(secret_key, "secret_not_found", "Secret")?,
        },
        AuthRef::Bearer { token_key } => Auth::Bearer {
            token: read(token_key, "token_not_found", "Token")?,
        },
        AuthRef::ApiKey { header, value_key } => Auth::ApiKey {
            header: header.clone(),
            value: read(value_key, "api_key_not_found", "API key")?,
        },
    })
}

/// `host` and port (80 when absent) of an authority; `[v6]` hosts lose their brackets.
fn split_host_port(authority: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 80,
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// Loopback, private, link-local, unspecified, broadcast and documentation addresses (an
/// IPv4-mapped IPv6 address counts as its IPv4 address).
fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_unspecified()
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_private(IpAddr::V4(v4)),
            None => {
                let first = v6.segments()[0];
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || (first & 0xfe00) == 0xfc00
                    || (first & 0xffc0) == 0xfe80
            }
        },
    }
}

/// Status code and (de-chunked) body of a complete HTTP/1.x response.
fn parse_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let mut parts = status_line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status: u16 = parts.next()?.parse().ok()?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().ok()?);
        }
    }
    if chunked {
        return Some((status, dechunk(body)?));
    }
    let body = match length {
        Some(n) if n <= body.len() => &body[..n],
        Some(_) => return None,
        None => body,
    };
    Some((status, body.to_vec()))
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size_text = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if raw.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// The call's outcome from the response, as the real engine reads it.
fn outcome(status: u16, body: &[u8]) -> Result<Value, ErrorBody> {
    if (200..300).contains(&status) {
        if body.is_empty() {
            return Ok(Value::Null);
        }
        return serde_json::from_slice(body)
            .map_err(|e| ErrorBody::new("invalid_response", e.to_string()));
    }
    if status < 400 {
        return Ok(serde_json::from_slice(body).unwrap_or(Value::Null));
    }
    let error = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("error").cloned());
    match error {
        Some(error) => Err(ErrorBody::new(
            error
                .get("code")
                .and_then(Value::as_str)
                .unwrap_or("http_error"),
            error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("HTTP request failed"),
        )),
        None => Err(ErrorBody::new("http_error", format!("HTTP {status}"))),
    }
}

/// `sha256=<hex HMAC-SHA256 of "<timestamp>:<base64 body>">`, the real engine's signature.
fn sign(body: &[u8], secret: &str, timestamp: u64) -> String {
    let payload = format!(
        "{timestamp}:{}",
        base64::engine::general_purpose::STANDARD.encode(body)
    );
    let mac = hmac_sha256(secret.as_bytes(), payload.as_bytes());
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// HMAC (RFC 2104) over SHA-256.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn invocation(value: Value) -> HttpInvocation {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn hmac_matches_the_rfc_4231_vector() {
        let mac = hmac_sha256(&[0x0b; 20], b"Hi There");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
    }

    #[test]
    fn urls_are_checked_against_the_policy() {
        let env = EngineEnv::default();
        let prepare = |url: &str, policy| {
            HttpTarget::prepare(&invocation(json!({ "url": url })), &env, policy)
        };
        let open = UrlPolicy::permissive();
        let target = prepare("http://127.0.0.1:8080/hook?a=1", open).unwrap();
        assert_eq!((target.host.as_str(), target.port), ("127.0.0.1", 8080));
        assert_eq!(target.path, "/hook?a=1");
        assert_eq!(prepare("http://[::1]", open).unwrap().host, "::1");
        assert_eq!(prepare("http://example.test", open).unwrap().path, "/");
        for bad in [
            "ftp://x/",
            "http://",
            "http://user@x/",
            "x",
            "https://example.test/",
        ] {
            assert!(prepare(bad, open).is_err(), "{bad}");
        }
        let strict = UrlPolicy {
            require_https: false,
            block_private_ips: true,
        };
        for private in [
            "http://127.0.0.1/",
            "http://10.1.2.3/",
            "http://localhost:1/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/",
        ] {
            let error = prepare(private, strict).unwrap_err();
            assert_eq!(error.message, "Private IP blocked", "{private}");
        }
        assert!(prepare("http://93.184.215.14/", strict).is_ok());
        assert!(prepare("http://93.184.215.14/", UrlPolicy::real_engine_default()).is_err());
    }

    #[test]
    fn credentials_come_from_the_engines_environment() {
        let name = format!("III_TEST_TOKEN_{}", uuid::Uuid::new_v4().simple());
        let spec = invocation(json!({
            "url": "http://127.0.0.1:9/",
            "auth": {"type": "bearer", "token_key": name},
        }));
        let mut env = EngineEnv::default();
        let missing = HttpTarget::prepare(&spec, &env, UrlPolicy::permissive()).unwrap_err();
        assert_eq!(missing.code, "token_not_found");
        env.set(&name, "s3cret");
        let target = HttpTarget::prepare(&spec, &env, UrlPolicy::permissive()).unwrap();
        let request = target.request("f::g", "inv-1", b"{}").unwrap();
        let text = String::from_utf8(request).unwrap();
        assert!(text.starts_with("POST / HTTP/1.1\r\n"), "{text}");
        assert!(
            text.contains("\r\nAuthorization: Bearer s3cret\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nx-iii-Function-Path: f::g\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{}"), "{text}");
        assert!(!format!("{target:?}").contains("s3cret"));
    }

    #[test]
    fn header_values_cannot_add_lines() {
        let spec = invocation(json!({
            "url": "http://127.0.0.1:9/",
            "headers": {"x-a": "1\r\nInjected: yes"},
        }));
        let target =
            HttpTarget::prepare(&spec, &EngineEnv::default(), UrlPolicy::permissive()).unwrap();
        assert!(target.request("f", "i", b"").is_err());
    }

    #[test]
    fn responses_map_to_results_and_errors() {
        let ok = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"a\":1}").unwrap();
        assert_eq!(outcome(ok.0, &ok.1).unwrap(), json!({"a": 1}));
        let chunked = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"b\r\n4\r\n\":2}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(outcome(chunked.0, &chunked.1).unwrap(), json!({"b": 2}));
        let empty = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
        assert_eq!(outcome(empty.0, &empty.1).unwrap(), Value::Null);
        let coded = outcome(500, br#"{"error":{"code":"E","message":"M"}}"#).unwrap_err();
        assert_eq!((coded.code.as_str(), coded.message.as_str()), ("E", "M"));
        assert_eq!(outcome(404, b"nope").unwrap_err().message, "HTTP 404");
        assert_eq!(outcome(200, b"nope").unwrap_err().code, "invalid_response");
        assert!(parse_response(b"garbage").is_none());
    }
}
