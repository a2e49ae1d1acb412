//! Names, paths and messages from the files as the text output shows them.
//!
//! Tensor names, file names and what a file holds come from the dumps, not from golden: a name
//! may carry a terminal escape (SGR 8 conceals what follows it), a carriage return (which
//! overwrites the line) or a newline (which forges one: `x\nall tensors match`). Every such
//! character is written as its escape (`\u{1b}`, `\n`) wherever a name reaches the text, and the
//! text as a whole is passed through [`lines`] on its way out. `--json` keeps names as they are:
//! JSON escapes them itself.

use std::borrow::Cow;

/// Whether `c` may not reach a terminal as itself: a control character (C0, DEL, C1) or a Unicode
/// bidirectional formatting character (which reorders what follows it on screen).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn escaped(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| hidden(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if hidden(c) && !keep(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A name, a path or a message as part of one line: every control and bidi character escaped.
pub fn shown(s: &str) -> Cow<'_, str> {
    escaped(s, |_| false)
}

/// [`shown`] of a path.
pub fn path(p: &std::path::Path) -> String {
    shown(&p.display().to_string()).into_owned()
}

/// Text output, built line by line: only [`Lines::line`] ends a line. Whatever a line is made of,
/// every control and bidi character in it — a newline in a tensor's, a file's or an archive
/// entry's name among them — is escaped, so a name cannot forge a line or restyle the terminal
/// wherever it is printed, escaped by its printer or not.
#[derive(Debug, Default)]
pub struct Lines(String);

impl Lines {
    /// One line (`format_args!(…)`), its controls escaped, then a line break.
    pub fn line(&mut self, text: std::fmt::Arguments<'_>) {
        let text = text.to_string();
        self.0.push_str(&shown(&text));
        self.0.push('\n');
    }

    /// Each line of `text` (golden's own lines, such as a histogram's) as [`Lines::line`].
    pub fn lines(&mut self, text: &str) {
        for l in text.lines() {
            self.line(format_args!("{l}"));
        }
    }

    /// The text.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// Text golden composed, on its way out: its own newlines kept, any other control or bidi
/// character escaped (what [`shown`] missed cannot restyle the terminal either).
pub fn lines(s: &str) -> Cow<'_, str> {
    escaped(s, |c| c == '\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_become_escapes_and_the_rest_stays() {
        assert_eq!(shown("fc1.weight"), "fc1.weight");
        assert_eq!(shown("a\u{1b}[8mb"), "a\\u{1b}[8mb");
        assert_eq!(shown("x\nforged"), "x\\nforged");
        assert_eq!(shown("r\u{202E}tl"), "r\\u{202e}tl");
        assert_eq!(shown("é — ok"), "é — ok");
        assert_eq!(lines("one\ntwo\u{1b}\n"), "one\ntwo\\u{1b}\n");
        let mut text = Lines::default();
        text.line(format_args!("  {}  {:<4}|", "x\nforged", "y"));
        text.lines("a\nb\n");
        assert_eq!(text.into_string(), "  x\\nforged  y   |\na\nb\n");
    }
}
