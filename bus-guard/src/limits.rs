//! What one sandbox's connections share, so that reconnecting resets nothing: the refusal log's
//! budget and the channel budget.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusal lines logged one by one per sandbox and rule; past them, one summary line per
/// [`REFUSAL_SUMMARY_INTERVAL`] counts the rest.
pub const LOGGED_REFUSALS: u32 = 16;
/// How often a sandbox's refusals past [`LOGGED_REFUSALS`] of one rule are summed up.
pub const REFUSAL_SUMMARY_INTERVAL: Duration = Duration::from_secs(10);
/// Rules tracked apart per sandbox; more share one count (rules are few: this only bounds
/// the table).
const RULES: usize = 64;

/// Channels (`engine::channels::create`) a sandbox may create per second, with as large a
/// burst: each costs the engine memory until it is used or expires.
pub const CHANNEL_RATE: u32 = 16;
/// Channels a sandbox may create within [`CHANNEL_WINDOW`]. The guard cannot see a channel
/// end, so it counts one as live for the engine's lifetime of an unused channel.
pub const MAX_LIVE_CHANNELS: usize = 64;
/// How long a created channel counts as live.
pub const CHANNEL_WINDOW: Duration = Duration::from_secs(300);

/// What to do with one refusal's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogLine {
    /// Log it.
    Line,
    /// Log a summary: this many refusals of the rule were not logged one by one.
    Summary(u64),
    /// Count it only.
    Quiet,
}

#[derive(Default)]
pub(crate) struct RefusalLog {
    rules: HashMap<String, RuleLog>,
}

struct RuleLog {
    logged: u32,
    unlogged: u64,
    summarised: Option<Instant>,
}

impl RefusalLog {
    pub fn note(&mut self, rule: &str, now: Instant) -> LogLine {
        let key = if self.rules.len() >= RULES && !self.rules.contains_key(rule) {
            "(other rules)"
        } else {
            rule
        };
        let entry = self.rules.entry(key.to_string()).or_insert(RuleLog {
            logged: 0,
            unlogged: 0,
            summarised: None,
        });
        if entry.logged < LOGGED_REFUSALS {
            entry.logged += 1;
            return LogLine::Line;
        }
        entry.unlogged += 1;
        let due = entry
            .summarised
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_SUMMARY_INTERVAL);
        if due {
            entry.summarised = Some(now);
            LogLine::Summary(std::mem::take(&mut entry.unlogged))
        } else {
            LogLine::Quiet
        }
    }
}

/// Channel creations of one sandbox: a token bucket and the creations of the last window.
pub(crate) struct ChannelBudget {
    tokens: f64,
    at: Option<Instant>,
    created: std::collections::VecDeque<Instant>,
}

impl Default for ChannelBudget {
    fn default() -> Self {
        ChannelBudget {
            tokens: f64::from(CHANNEL_RATE),
            at: None,
            created: std::collections::VecDeque::new(),
        }
    }
}

/// Which channel ceiling a creation met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChannelCeiling {
    Rate,
    Live,
}

impl ChannelBudget {
    pub fn take(&mut self, now: Instant) -> Result<(), ChannelCeiling> {
        while self
            .created
            .front()
            .is_some_and(|at| now.duration_since(*at) >= CHANNEL_WINDOW)
        {
            self.created.pop_front();
        }
        let rate = f64::from(CHANNEL_RATE);
        if let Some(at) = self.at {
            self.tokens = (self.tokens + now.duration_since(at).as_secs_f64() * rate).min(rate);
        }
        self.at = Some(now);
        if self.created.len() >= MAX_LIVE_CHANNELS {
            return Err(ChannelCeiling::Live);
        }
        if self.tokens < 1.0 {
            return Err(ChannelCeiling::Rate);
        }
        self.tokens -= 1.0;
        self.created.push_back(now);
        Ok(())
    }
}

/// The per-sandbox state every connection of a sandbox shares.
#[derive(Default)]
pub(crate) struct Shared {
    pub log: Mutex<RefusalLog>,
    pub channels: Mutex<ChannelBudget>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_past_the_first_are_summed_up_per_interval() {
        let mut log = RefusalLog::default();
        let start = Instant::now();
        for _ in 0..LOGGED_REFUSALS {
            assert_eq!(log.note("rule", start), LogLine::Line);
        }
        assert_eq!(log.note("rule", start), LogLine::Summary(1));
        for _ in 0..1000 {
            assert_eq!(log.note("rule", start), LogLine::Quiet);
        }
        let later = start + REFUSAL_SUMMARY_INTERVAL;
        assert_eq!(log.note("rule", later), LogLine::Summary(1001));
        // Another rule has its own first lines.
        assert_eq!(log.note("other", later), LogLine::Line);
        // The table stays bounded whatever the rules.
        for n in 0..1000 {
            log.note(&format!("r{n}"), later);
        }
        assert!(log.rules.len() <= RULES + 1);
    }

    #[test]
    fn channels_are_bounded_by_rate_and_by_window() {
        let mut budget = ChannelBudget::default();
        let start = Instant::now();
        for _ in 0..CHANNEL_RATE {
            assert_eq!(budget.take(start), Ok(()));
        }
        assert_eq!(budget.take(start), Err(ChannelCeiling::Rate));
        let mut now = start;
        let mut made = CHANNEL_RATE as usize;
        while made < MAX_LIVE_CHANNELS {
            now += Duration::from_secs(1);
            assert_eq!(budget.take(now), Ok(()));
            made += 1;
        }
        now += Duration::from_secs(10);
        assert_eq!(budget.take(now), Err(ChannelCeiling::Live));
        // Once the first ones are out of the window, creations come back.
        assert_eq!(budget.take(start + CHANNEL_WINDOW), Ok(()));
    }
}
