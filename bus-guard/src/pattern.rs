//! Function-id patterns of `sandbox_bus_call` and `sandbox_bus_register`: the id itself, with
//! `*` matching any run of characters (`::` included), so `"math::*"` names every function
//! under `math::` and `"*"` every id.

use std::fmt;

/// The longest pattern taken: ids are short names, never documents.
pub const MAX_PATTERN_LEN: usize = 256;

/// Why a pattern is refused (the configuration key is named by the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("a pattern is empty")]
    Empty,
    #[error("pattern {0:?} is longer than {MAX_PATTERN_LEN} characters")]
    TooLong(String),
    #[error("pattern {0:?} holds a space or a control character")]
    BadCharacter(String),
}

/// One pattern, checked once.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    pub fn new(text: &str) -> Result<Pattern, PatternError> {
        if text.is_empty() {
            return Err(PatternError::Empty);
        }
        if text.chars().count() > MAX_PATTERN_LEN {
            return Err(PatternError::TooLong(text.into()));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(PatternError::BadCharacter(text.into()));
        }
        Ok(Pattern(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `id` matches, `*` standing for any run of characters (none included).
    pub fn matches(&self, id: &str) -> bool {
        glob(self.0.as_bytes(), id.as_bytes())
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Iterative matching with one backtrack point (the last `*`): linear in practice, never
/// exponential whatever the pattern holds.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, id: &str) -> bool {
        Pattern::new(pattern).unwrap().matches(id)
    }

    #[test]
    fn a_star_matches_any_run_of_characters() {
        assert!(matches("*", ""));
        assert!(matches("*", "anything::at::all"));
        assert!(matches("math::*", "math::add"));
        assert!(matches("math::*", "math::"));
        assert!(matches("math::*", "math::deep::er"));
        assert!(!matches("math::*", "mathematics::add"));
        assert!(!matches("math::*", "other::math::add"));
        assert!(matches("*::add", "math::add"));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("**", "x"));
    }

    #[test]
    fn without_a_star_only_the_id_itself_matches() {
        assert!(matches("math::add", "math::add"));
        assert!(!matches("math::add", "math::add2"));
        assert!(!matches("math::add", "math::ad"));
        assert!(!matches("Math::add", "math::add"));
    }

    #[test]
    fn a_hostile_pattern_costs_no_more_than_its_length() {
        let pattern = "*a".repeat(100);
        let id = "a".repeat(4096) + "b";
        // Exponential backtracking would never return here.
        assert!(!matches(&pattern, &id));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(Pattern::new(""), Err(PatternError::Empty));
        assert!(matches!(
            Pattern::new(&"x".repeat(300)),
            Err(PatternError::TooLong(_))
        ));
        assert!(matches!(
            Pattern::new("a b"),
            Err(PatternError::BadCharacter(_))
        ));
        assert!(matches!(
            Pattern::new("a\nb"),
            Err(PatternError::BadCharacter(_))
        ));
    }
}
