//! What the starter's helper processes keep of their privilege. The resolver proxy and the bus
//! forward are forked from a launcher that is root of the sandbox's outer user namespace (every
//! capability there) and they read what a hostile guest sends: each keeps only the
//! capabilities its work needs (the proxy CAP_NET_ADMIN of the gate, for `nft`; the forward
//! none), with no_new_privs and the sandbox's own seccomp filters, so a helper taken over by
//! its input holds no more than its job.

/// Keeps only `caps` (capability numbers below 32) in every set, the bounding set included
/// (an exec regains nothing), sets no_new_privs and installs the sandbox's seccomp filters.
pub(crate) fn keep_only(caps: &[u32]) -> Result<(), String> {
    keep_capabilities(caps)?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    seccomp_policy::install().map_err(|e| e.to_string())?;
    Ok(())
}

/// Keeps only `caps` (capability numbers below 32) in every set of the calling thread, the
/// bounding set included (an exec regains nothing), ambient cleared. Threads made after
/// inherit it. Also the VM runner's, before its VM starts.
pub fn keep_capabilities(caps: &[u32]) -> Result<(), String> {
    use seccomp_policy::capabilities;
    capabilities::keep_only(caps, capabilities::last_cap())
        .map(|_| ())
        .map_err(|e| e.to_string())
}
