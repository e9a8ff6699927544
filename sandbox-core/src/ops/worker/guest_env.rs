//! What a worker VM's program sees of the world: its environment, cleaned of the worker
//! token, plus how to reach the engine. The token is read from our environment only to
//! filter it out; it is never logged, stored or passed on.

/// The worker token's variable (the shell checks it; here it is only filtered out).
pub const TOKEN_ENV: &str = "III_SANDBOX_WORKER_TOKEN";
/// The engine's address, for the guest: its own end of the line to the bus guard.
pub const URL_ENV: &str = "III_URL";
/// The namespace a Compose worker's SDK announces itself and acts in.
pub const NAMESPACE_ENV: &str = "III_NAMESPACE";
/// The worker VM's own id, for the guest.
pub const VM_ID_ENV: &str = "III_WORKER_VM_ID";

/// Tokens at least this long are also found inside longer text (`Bearer <token>`).
pub const SUBSTRING_MIN: usize = 8;

/// Recognises the token wherever a request might try to smuggle it into a guest.
#[derive(Clone, Default)]
pub struct TokenFilter(Option<String>);

impl std::fmt::Debug for TokenFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenFilter(..)")
    }
}

impl TokenFilter {
    pub fn from_env() -> Self {
        Self::new(std::env::var(TOKEN_ENV).ok())
    }

    pub fn new(token: Option<String>) -> Self {
        Self(token.filter(|t| !t.is_empty()))
    }

    /// Whether `text` holds the token: anywhere in it, or, for a token shorter than
    /// [`SUBSTRING_MIN`] (which would turn up in ordinary text), as the whole of it.
    pub fn mentions(&self, text: &str) -> bool {
        self.0.as_deref().is_some_and(|token| {
            if token.len() >= SUBSTRING_MIN {
                text.contains(token)
            } else {
                text == token
            }
        })
    }

    /// `env` without the token's variable and without any value holding the token.
    pub fn clean(&self, env: Vec<(String, String)>) -> Vec<(String, String)> {
        env.into_iter()
            .filter(|(name, value)| name != TOKEN_ENV && !self.mentions(value))
            .collect()
    }
}

/// The whole environment of a worker's program: the image's, the request's (already
/// cleaned), then ours, which win.
pub fn guest_env(
    image_env: &[String],
    request_env: &[(String, String)],
    vm_id: &str,
    engine_url: &str,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = image_env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(request_env.iter().cloned());
    env.retain(|(name, _)| name != URL_ENV && name != VM_ID_ENV && name != TOKEN_ENV);
    env.push((URL_ENV.into(), engine_url.into()));
    env.push((VM_ID_ENV.into(), vm_id.into()));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_token_is_removed_by_name_and_by_value() {
        let filter = TokenFilter::new(Some("t0k3n-long".into()));
        let env = pairs(&[
            (TOKEN_ENV, "anything"),
            ("SNEAKY", "t0k3n-long"),
            ("BEARER", "Bearer t0k3n-long"),
            ("KEEP", "1"),
        ]);
        assert_eq!(filter.clean(env), pairs(&[("KEEP", "1")]));
        assert!(!TokenFilter::new(None).mentions(""));
        let short = TokenFilter::new(Some("t".into()));
        assert!(short.mentions("t") && !short.mentions("echo test"));
        assert!(!TokenFilter::new(Some(String::new())).mentions("x"));
    }

    #[test]
    fn ours_win_over_the_image_and_the_request() {
        let env = guest_env(
            &["PATH=/bin".into(), "III_URL=ws://image".into()],
            &pairs(&[("III_WORKER_VM_ID", "fake"), ("A", "1")]),
            "w1",
            "ws://engine:1",
        );
        assert_eq!(
            env,
            pairs(&[
                ("PATH", "/bin"),
                ("A", "1"),
                (URL_ENV, "ws://engine:1"),
                (VM_ID_ENV, "w1")
            ])
        );
    }
}
