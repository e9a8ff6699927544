//! Logging: one line per event on stderr (stdout may be the protocol stream).

/// `log!("...")` writes `sandbox-agent: ...` to stderr.
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("sandbox-agent[{}]: {}", std::process::id(), format_args!($($arg)*))
    };
}
pub(crate) use log;
