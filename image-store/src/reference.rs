//! Parsing OCI references and rewriting them onto configured registry mirrors.

use std::collections::BTreeMap;

use oci_client::Reference;

/// Names Docker Hub goes by in references and in `registry_mirrors` keys.
const DOCKER_HUB: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

/// Parses `oci_ref` and, when its registry has a mirror, points it at the mirror instead
/// (same repository, tag and digest). The original text stays the image's identity.
pub fn effective(
    oci_ref: &str,
    mirrors: &BTreeMap<String, String>,
) -> Result<Reference, oci_client::ParseError> {
    let parsed: Reference = oci_ref.parse()?;
    let registry = parsed.registry();
    let is_hub = DOCKER_HUB.contains(&registry);
    let mirror = mirrors
        .iter()
        .find(|(from, _)| {
            from.as_str() == registry || (is_hub && DOCKER_HUB.contains(&from.as_str()))
        })
        .map(|(_, to)| to.clone());
    let Some(mirror) = mirror else {
        return Ok(parsed);
    };
    let repo = parsed.repository().to_string();
    Ok(match (parsed.tag(), parsed.digest()) {
        (Some(t), Some(d)) => Reference::with_tag_and_digest(mirror, repo, t.into(), d.into()),
        (None, Some(d)) => Reference::with_digest(mirror, repo, d.into()),
        (Some(t), None) => Reference::with_tag(mirror, repo, t.into()),
        (None, None) => Reference::with_tag(mirror, repo, "latest".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_references_move_to_the_mirror_and_others_stay() {
        let mut m = BTreeMap::new();
        m.insert("docker.io".to_string(), "127.0.0.1:5000".to_string());
        let r = effective("docker.io/library/python:3.12-slim", &m).unwrap();
        assert_eq!(r.whole(), "127.0.0.1:5000/library/python:3.12-slim");
        let r = effective("python:3.12", &m).unwrap();
        assert_eq!(r.whole(), "127.0.0.1:5000/library/python:3.12");
        let r = effective("ghcr.io/o/i:1", &m).unwrap();
        assert_eq!(r.whole(), "ghcr.io/o/i:1");
        assert!(effective("UPPER/Case:bad tag", &m).is_err());
    }
}
