//! Control characters out of the terminal and the logs. Writers' data (aggregate type and id,
//! event type, destination, error text, headers, payload) is printed and logged by the CLI; a
//! newline in it would forge a log line or a table row, an escape sequence would reach the
//! operator's terminal. Each such character is written as a visible escape instead: `\n`,
//! `\r`, `\t`, `\x1b`, `\u{9b}`, `\u{202e}`.

use std::{
    borrow::Cow,
    fmt::{self, Write},
};

/// `text` with its control characters (C0, DEL, C1), line and paragraph separators and
/// bidirectional overrides escaped; borrowed as it is when it has none.
pub fn control(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let _ = Escaping(&mut out).write_str(text);
    Cow::Owned(out)
}

/// A [`fmt::Write`] that writes through to `W` with control characters escaped as
/// [`control`] does, for text formatted on its way out (log fields).
pub struct Escaping<W>(pub W);

impl<W: Write> Write for Escaping<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut clean = 0;
        for (i, c) in text.char_indices() {
            if needs_escape(c) {
                self.0.write_str(&text[clean..i])?;
                write_escaped(&mut self.0, c)?;
                clean = i + c.len_utf8();
            }
        }
        self.0.write_str(&text[clean..])
    }
}

/// What the CLI prints to stdout, its line breaks and tabs kept and every other character
/// [`control`] escapes written as `\uXXXX`: the last guard for a command that prints writers'
/// data (a saga's correlation id, a held event's type) without escaping its fields. The form
/// is JSON's own escape, so `--json` output stays valid JSON meaning the same text (serde_json
/// already escaped every C0 control inside its strings; C1 controls and bidirectional marks it
/// writes as they are).
pub fn output(text: &str) -> Cow<'_, str> {
    let escaped = |c: char| c != '\n' && c != '\t' && needs_escape(c);
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            // Every such character is in the Basic Multilingual Plane: one \uXXXX each.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            // Line and paragraph separators: a new line to some terminals and viewers.
            '\u{2028}' | '\u{2029}'
            // Bidirectional marks, embeddings, overrides and isolates: they reorder what the
            // operator reads ("Trojan Source").
            | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn write_escaped(out: &mut impl Write, c: char) -> fmt::Result {
    match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        c if (c as u32) < 0x80 => write!(out, "\\x{:02x}", c as u32),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::control;

    #[test]
    fn output_keeps_lines_and_json_valid() {
        use super::output;
        assert_eq!(output("a\tb\nc"), "a\tb\nc");
        assert_eq!(output("o1\x1b[2J\r"), "o1\\u001b[2J\\u000d");
        let json = serde_json::to_string(&"Order\u{202e}desreveR \u{9b}").unwrap();
        let printed = output(&json);
        assert!(
            !printed.contains('\u{202e}') && !printed.contains('\u{9b}'),
            "{printed}"
        );
        assert_eq!(
            serde_json::from_str::<String>(&printed).unwrap(),
            "Order\u{202e}desreveR \u{9b}",
            "still valid JSON of the same text"
        );
    }

    #[test]
    fn escapes_what_a_terminal_or_a_log_reader_would_obey() {
        assert_eq!(control("a\nFAKE LOG LINE"), "a\\nFAKE LOG LINE");
        assert_eq!(
            control("\x1b[31mred\r\t\x00\x7f"),
            "\\x1b[31mred\\r\\t\\x00\\x7f"
        );
        assert_eq!(
            control("\u{9b}2J \u{202e}txt.exe"),
            "\\u{9b}2J \\u{202e}txt.exe"
        );
        assert_eq!(control("plain, ünïcode ✓"), "plain, ünïcode ✓");
        assert!(matches!(control("plain"), std::borrow::Cow::Borrowed(_)));
    }
}
