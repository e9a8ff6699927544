//! The text a guest names things with (worker names, function ids, trigger ids, namespaces,
//! descriptions and the strings of its worker announcement), judged as people and the engine
//! will read it: NFC-normalised, with no character that cannot be seen (control, format such
//! as U+202E or U+200B, default-ignorable, private-use, noncharacters), bounded in length.
//!
//! Names are also compared in a folded form (NFKC, lower case, without whitespace and the
//! characters above), so a reserved name is reserved under every variant the engine's own
//! sanitising or a reader's eye would take for it: `"Sandbox-Libkrun"`, fullwidth
//! `"ｓａｎｄｂｏｘ-libkrun"`, `"sandbox-libkrun\u{7}"` all fold to `"sandbox-libkrun"`.

use unicode_normalization::UnicodeNormalization;

/// The longest id or name taken, in characters (ids are names, not documents).
pub const MAX_NAME_CHARS: usize = 256;
/// The longest free text taken (a description, the strings of an announcement), in
/// characters.
pub const MAX_TEXT_CHARS: usize = 4096;

/// What a piece of text is for: how much whitespace it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An id: no whitespace at all.
    Id,
    /// A name shown to people (a worker's name, an OS string): single spaces inside.
    Label,
    /// Free text (a description): spaces, tabs and line feeds.
    Text,
}

/// Why a text is refused (names the rule, never the text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadText {
    Empty,
    TooLong,
    Invisible,
    Whitespace,
}

impl BadText {
    pub fn rule(self) -> &'static str {
        match self {
            BadText::Empty => "empty name",
            BadText::TooLong => "name too long",
            BadText::Invisible => "control, format or invisible character",
            BadText::Whitespace => "whitespace in a name",
        }
    }
}

/// The text in NFC, or why it is refused.
pub(crate) fn clean(text: &str, kind: Kind) -> Result<String, BadText> {
    let max = match kind {
        Kind::Id | Kind::Label => MAX_NAME_CHARS,
        Kind::Text => MAX_TEXT_CHARS,
    };
    // Bounded before normalising: NFC of a long run costs in proportion to it.
    if text.len() > max * 4 {
        return Err(BadText::TooLong);
    }
    let text: String = text.nfc().collect();
    if text.chars().count() > max {
        return Err(BadText::TooLong);
    }
    if text.trim().is_empty() && kind != Kind::Text {
        return Err(BadText::Empty);
    }
    for c in text.chars() {
        let allowed_space = match kind {
            Kind::Id => false,
            Kind::Label => c == ' ',
            Kind::Text => matches!(c, ' ' | '\t' | '\n'),
        };
        if allowed_space {
            continue;
        }
        if invisible(c) {
            return Err(BadText::Invisible);
        }
        if c.is_whitespace() {
            return Err(BadText::Whitespace);
        }
    }
    if kind == Kind::Label && (text.starts_with(' ') || text.ends_with(' ') || text.contains("  "))
    {
        return Err(BadText::Whitespace);
    }
    Ok(text)
}

/// The form names are compared in: NFKC (fullwidth and compatibility forms folded), lower
/// case, with whitespace and invisible characters taken out.
pub(crate) fn fold(text: &str) -> String {
    let folded: String = text
        .nfkc()
        .filter(|c| !c.is_whitespace() && !invisible(*c))
        .flat_map(char::to_lowercase)
        .collect();
    // Lower-casing may make new compatibility forms (rare); once more settles them.
    folded.nfkc().collect()
}

/// Characters that show nothing or change how the text around them shows: controls, format
/// characters (Cf), the other default-ignorable code points, line and paragraph separators,
/// private use and noncharacters.
pub(crate) fn invisible(c: char) -> bool {
    let u = u32::from(c);
    c.is_control()
        || matches!(
            u,
            // Format characters (Cf).
            0x00AD
                | 0x0600..=0x0605
                | 0x061C
                | 0x06DD
                | 0x070F
                | 0x0890..=0x0891
                | 0x08E2
                | 0x180E
                | 0x200B..=0x200F
                | 0x202A..=0x202E
                | 0x2060..=0x2064
                | 0x2066..=0x206F
                | 0xFEFF
                | 0xFFF9..=0xFFFB
                | 0x110BD
                | 0x110CD
                | 0x13430..=0x1343F
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0001
                | 0xE0020..=0xE007F
                // Other default-ignorable or blank-looking code points.
                | 0x034F
                | 0x115F..=0x1160
                | 0x17B4..=0x17B5
                | 0x180B..=0x180F
                | 0x2028..=0x2029
                | 0x2800
                | 0x3164
                | 0xFE00..=0xFE0F
                | 0xFFA0
                | 0xFFFC..=0xFFFD
                | 0xE0100..=0xE01EF
                // Private use.
                | 0xE000..=0xF8FF
                | 0xF0000..=0x10FFFF
                // Noncharacters.
                | 0xFDD0..=0xFDEF
        )
        || (u & 0xFFFE) == 0xFFFE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_names_pass_in_nfc() {
        assert_eq!(clean("math::add", Kind::Id).unwrap(), "math::add");
        // "e" + combining acute becomes one "é".
        assert_eq!(clean("cafe\u{301}", Kind::Id).unwrap(), "caf\u{e9}");
        assert_eq!(clean("host:1234", Kind::Label).unwrap(), "host:1234");
        assert_eq!(clean("my worker", Kind::Label).unwrap(), "my worker");
        assert!(clean("two\nlines\tok", Kind::Text).is_ok());
    }

    #[test]
    fn invisible_and_control_characters_are_refused() {
        for bad in [
            "sandbox-libkrun\u{7}",
            "\u{1b}sandbox-libkrun",
            "sandbox-libkrun\u{202e}",
            "sand\u{200b}box",
            "\u{feff}x",
            "x\u{2028}y",
            "x\u{e000}",
            "x\u{fe0f}",
            "x\u{ffff}",
            "x\u{e0041}",
        ] {
            assert_eq!(clean(bad, Kind::Label), Err(BadText::Invisible), "{bad:?}");
            assert!(clean(bad, Kind::Text).is_err(), "{bad:?}");
        }
        assert_eq!(clean("a b", Kind::Id), Err(BadText::Whitespace));
        assert_eq!(clean("a\u{a0}b", Kind::Label), Err(BadText::Whitespace));
        assert_eq!(clean(" lead", Kind::Label), Err(BadText::Whitespace));
        assert_eq!(clean("a\nb", Kind::Label), Err(BadText::Invisible));
        assert_eq!(clean("", Kind::Id), Err(BadText::Empty));
        assert_eq!(clean("   ", Kind::Label), Err(BadText::Empty));
        assert_eq!(
            clean(&"x".repeat(MAX_NAME_CHARS + 1), Kind::Id),
            Err(BadText::TooLong)
        );
        assert_eq!(
            clean(&"x".repeat(10 * MAX_TEXT_CHARS), Kind::Text),
            Err(BadText::TooLong)
        );
    }

    #[test]
    fn variants_of_a_name_fold_to_it() {
        for variant in [
            "sandbox-libkrun",
            "Sandbox-LibKrun",
            "\u{ff53}\u{ff41}\u{ff4e}\u{ff44}\u{ff42}\u{ff4f}\u{ff58}-libkrun",
            "sandbox-libkrun\u{7}",
            "\u{1b}sandbox-libkrun",
            "sandbox-libkrun\u{202e}",
            " sandbox-libkrun ",
            "sandbox\u{200b}-libkrun",
            "sandbox -libkrun",
        ] {
            assert_eq!(fold(variant), "sandbox-libkrun", "{variant:?}");
        }
        assert_ne!(fold("sandbox-libkrun2"), "sandbox-libkrun");
    }
}
