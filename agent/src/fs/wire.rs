//! How much of a reply frame a grep or sed result may fill. Replies travel as one JSON
//! frame of at most `MAX_PAYLOAD` bytes, so results are sized as they would be encoded.

use agent_proto::MAX_PAYLOAD;

/// Bytes of a reply's result list; the rest of the frame is room for the envelope.
pub const REPLY_BUDGET: usize = MAX_PAYLOAD - 64 * 1024;

/// Length of `text` as a JSON string, quotes included (serde_json's escaping).
pub fn json_str_len(text: &str) -> usize {
    2 + text
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum::<usize>()
}

/// `text` cut to at most `max` bytes at a character boundary.
pub fn truncate_text(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lengths_match_serde_json() {
        for text in [
            "",
            "plain",
            "q\"b\\",
            "tab\tnl\n\r",
            "\u{0}\u{1f}\u{7f}",
            "é€😀",
        ] {
            let encoded = serde_json::to_string(text).unwrap();
            assert_eq!(json_str_len(text), encoded.len(), "{text:?}");
        }
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_text("héllo".into(), 2), "h");
        assert_eq!(truncate_text("héllo".into(), 3), "hé");
        assert_eq!(truncate_text("ab".into(), 5), "ab");
    }
}
