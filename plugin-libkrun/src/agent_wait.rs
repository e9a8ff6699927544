//! How long a booting microVM may take until its agent connects: 60 s (under the VM lab's
//! emulation a boot takes 4-10 s, longer on a loaded host), or what the operator sets in
//! `SANDBOX_LIBKRUN_BOOT_TIMEOUT_SECS` (1..=3600) for slow or heavily shared hosts.

use std::ffi::OsString;
use std::time::Duration;

/// The wait when nothing else is set.
pub const DEFAULT: Duration = Duration::from_secs(60);
/// The variable that sets it, in whole seconds.
pub const ENV: &str = "SANDBOX_LIBKRUN_BOOT_TIMEOUT_SECS";
const MAX_SECS: u64 = 3600;

/// The wait from the adapter's environment; a value that is not a number of seconds in
/// range is logged and the default used (like the `III_VM_*` tuning).
pub fn from_env() -> Duration {
    let (wait, problem) = parse(std::env::var_os(ENV));
    if let Some(problem) = problem {
        tracing::warn!("{problem}");
    }
    wait
}

/// `value` as the wait, and why it was not taken when it was not.
pub fn parse(value: Option<OsString>) -> (Duration, Option<String>) {
    let Some(value) = value else {
        return (DEFAULT, None);
    };
    let text = value.to_string_lossy();
    match text.trim().parse::<u64>() {
        Ok(secs @ 1..=MAX_SECS) => (Duration::from_secs(secs), None),
        _ => (
            DEFAULT,
            Some(format!(
                "{ENV}={} is not a number of seconds from 1 to {MAX_SECS}: the agent wait \
                 stays {} s",
                sandbox_core::ops::worker::shown_env_value(&text),
                DEFAULT.as_secs()
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_in_range_are_taken_and_anything_else_is_the_default_with_a_reason() {
        assert_eq!(parse(None), (DEFAULT, None));
        assert_eq!(parse(Some("180".into())), (Duration::from_secs(180), None));
        assert_eq!(parse(Some(" 5 ".into())), (Duration::from_secs(5), None));
        for bad in ["0", "-1", "3601", "1.5", "", "ninety", &"9".repeat(40)] {
            let (wait, problem) = parse(Some(bad.into()));
            assert_eq!(wait, DEFAULT, "{bad}");
            let problem = problem.expect(bad);
            assert!(problem.contains(ENV), "{problem}");
            assert!(
                problem.len() < 200,
                "the value is not echoed whole: {problem}"
            );
        }
    }
}
