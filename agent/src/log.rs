//! Logging: one line per event on stderr (stdout may be the protocol stream). stderr is the
//! host's log of this sandbox: a line that code in the sandbox can cause at will (a signal
//! sent to the agent) goes through a [`RateLimit`], so the log grows by about a line a second
//! of that kind whatever the guest does, the next line saying how many were held back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `log!("...")` writes `sandbox-agent[pid]: ...` to stderr. A write that fails (the host's
/// end of the log gone) is dropped: logging never stops the agent.
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr().lock(),
            "sandbox-agent[{}]: {}",
            std::process::id(),
            format_args!($($arg)*)
        );
    }};
}
pub(crate) use log;

/// How often a rate-limited kind of line may be written.
pub const PERIOD: Duration = Duration::from_secs(1);

/// One kind of line, written at most once a [`PERIOD`]; the lines held back in between are
/// counted, and the next line written (or [`RateLimit::held_back`] once the period is over)
/// says how many.
pub struct RateLimit(Mutex<Window>);

#[derive(Default)]
struct Window {
    /// When the last line of this kind was written.
    written: Option<Instant>,
    held: u64,
}

impl RateLimit {
    pub const fn new() -> Self {
        RateLimit(Mutex::new(Window {
            written: None,
            held: 0,
        }))
    }

    /// Whether a line may be written at `now`: `Some(lines held back before it)`, or `None`
    /// (it is counted instead).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut window = self.window();
        match window.written {
            Some(written) if now.saturating_duration_since(written) < PERIOD => {
                window.held += 1;
                None
            }
            _ => {
                window.written = Some(now);
                Some(std::mem::take(&mut window.held))
            }
        }
    }

    /// How long until the lines held back may be reported; `None` when none are held.
    pub fn report_due_in(&self, now: Instant) -> Option<Duration> {
        let window = self.window();
        let written = window.written?;
        (window.held > 0).then(|| PERIOD.saturating_sub(now.saturating_duration_since(written)))
    }

    /// The count of lines held back, once the period since the last line is over (which then
    /// counts as a line written); `None` before, or when none are held.
    pub fn held_back(&self, now: Instant) -> Option<u64> {
        if self.report_due_in(now)? > Duration::ZERO {
            return None;
        }
        let mut window = self.window();
        window.written = Some(now);
        Some(std::mem::take(&mut window.held))
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_a_line_a_period_and_a_count_of_the_rest() {
        let limit = RateLimit::new();
        let start = Instant::now();
        assert_eq!(limit.admit(start), Some(0));
        assert_eq!(limit.report_due_in(start), None, "nothing held yet");
        for n in 1..=1000 {
            assert_eq!(limit.admit(start + Duration::from_micros(n)), None);
        }
        let half = start + PERIOD / 2;
        assert_eq!(limit.report_due_in(half), Some(PERIOD / 2));
        assert_eq!(limit.held_back(half), None, "not before the period is over");
        assert_eq!(limit.admit(start + PERIOD), Some(1000));
        assert_eq!(limit.admit(start + PERIOD), None);
    }

    #[test]
    fn what_was_held_back_is_reported_once_the_flood_stops() {
        let limit = RateLimit::new();
        let start = Instant::now();
        limit.admit(start);
        limit.admit(start);
        limit.admit(start);
        let later = start + PERIOD * 3;
        assert_eq!(limit.report_due_in(later), Some(Duration::ZERO));
        assert_eq!(limit.held_back(later), Some(2));
        assert_eq!(limit.held_back(later), None, "reported once");
        assert_eq!(limit.report_due_in(later), None);
        // The report counts as a line: the next one waits its period.
        assert_eq!(limit.admit(later), None);
        assert_eq!(limit.admit(later + PERIOD), Some(1));
    }
}
