//! Data as inert markdown: what `golden report --markdown` writes of names, paths, failure
//! messages and snapshot lines, which come from the user's code, the dumps and the base branch.
//!
//! Every piece of data becomes either a code span or text with every ASCII punctuation character
//! backslash-escaped (CommonMark lets any of them be escaped, and then none of them opens a link,
//! an image, emphasis, raw HTML, an entity or a heading). A code span's fence is one backtick
//! longer than the longest run of backticks inside it, so nothing inside can close it early. Text
//! that GitHub would link by itself (`https://…`, `www.…`, an e-mail address or `@someone`) is
//! written as a code span, where GitHub links nothing. Whitespace becomes single spaces, so a
//! piece stays on its line (a table row stays one row), and in a table cell a pipe is written as
//! `\|`, which GitHub's tables read as a pipe and not as the end of the cell.
//!
//! Messages golden composes put names between backticks (`` `out` differs ``): [`prose`] reads
//! those as CommonMark reads code spans (a run of backticks closed by the next run of the same
//! length), so they show as code, and writes everything else as escaped text.

/// Where a piece goes: a table cell escapes its pipes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A cell of a table.
    Cell,
    /// A line of text outside tables.
    Line,
}

/// Whether GitHub would turn text holding `s` into a link or a mention by itself.
fn links_itself(s: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    lower.contains("://") || lower.contains("www.") || lower.contains('@')
}

/// `s` as one line: any run of whitespace becomes one space.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text shown as it is: every ASCII punctuation character escaped.
fn escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A code span showing `s` (one line, not empty).
fn span(s: &str, place: Place) -> String {
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    // CommonMark strips one space from each end when both ends have one: the padding, when the
    // content starts or ends with a backtick or a space.
    let pad = if s.starts_with(['`', ' ']) || s.ends_with(['`', ' ']) {
        " "
    } else {
        ""
    };
    let body = match place {
        Place::Line => s.to_string(),
        // GitHub's tables split a row at every pipe that is not escaped, code spans included, and
        // turn `\|` back into `|` before reading the cell. A backslash right before a pipe would
        // escape the escape: that pipe is shown as `│` (U+2502) instead.
        Place::Cell => s.replace("\\|", "\\│").replace('|', "\\|"),
    };
    format!("{fence}{pad}{body}{pad}{fence}")
}

/// Text of the data: escaped, or a code span when GitHub would link it.
fn plain(s: &str, place: Place) -> String {
    if s.is_empty() {
        String::new()
    } else if links_itself(s) {
        span(s, place)
    } else {
        escaped(s)
    }
}

/// A piece of data as a code span (a name, a path, a case): inert, on one line.
pub fn code(s: &str, place: Place) -> String {
    let s = one_line(s);
    if s.is_empty() {
        String::new()
    } else {
        span(&s, place)
    }
}

/// A piece of data as text (a figure, a snapshot's line): inert, on one line.
pub fn text(s: &str, place: Place) -> String {
    plain(&one_line(s), place)
}

/// A message's parts: text, and code spans as CommonMark finds them (a run of backticks closed by
/// the next run of exactly its length; an unclosed run is text).
fn parts(s: &str) -> Vec<(bool, String)> {
    let chars: Vec<char> = s.chars().collect();
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let mut out: Vec<(bool, String)> = Vec::new();
    let mut plain_text = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            plain_text.push(chars[i]);
            i += 1;
            continue;
        }
        let n = run_at(i);
        // The closing run: the next run of exactly n backticks.
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = run_at(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                let inner: String = chars[i + n..j].iter().collect();
                let inner = match inner.strip_prefix(' ').and_then(|x| x.strip_suffix(' ')) {
                    Some(x) if !inner.trim().is_empty() => x.to_string(),
                    _ => inner,
                };
                if !plain_text.is_empty() {
                    out.push((false, std::mem::take(&mut plain_text)));
                }
                out.push((true, inner));
                i = j + n;
            }
            None => {
                plain_text.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    if !plain_text.is_empty() {
        out.push((false, plain_text));
    }
    out
}

/// A message golden composed around data (a failure's headline, its likely cause): its code spans
/// as code, the rest as text; inert, on one line, at most `limit` characters shown (then `…`).
pub fn prose(s: &str, place: Place, limit: usize) -> String {
    let mut out = String::new();
    let mut left = limit;
    for (is_code, part) in parts(&one_line(s)) {
        let count = part.chars().count();
        let (part, cut) = if count > left {
            (part.chars().take(left).collect::<String>(), true)
        } else {
            (part, false)
        };
        left -= part.chars().count();
        if is_code {
            out.push_str(&code(&part, place));
        } else {
            out.push_str(&plain(&part, place));
        }
        if cut {
            out.push('…');
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_spans_are_fenced_past_any_backticks_inside() {
        assert_eq!(code("fc1.weight", Place::Cell), "`fc1.weight`");
        assert_eq!(code("a``b", Place::Cell), "```a``b```");
        assert_eq!(code("`x", Place::Line), "`` `x ``");
        assert_eq!(code("a|b", Place::Cell), "`a\\|b`");
        assert_eq!(code("a|b", Place::Line), "`a|b`");
        assert_eq!(code("a\\|b", Place::Cell), "`a\\│b`");
        assert_eq!(code("x\ny", Place::Cell), "`x y`");
        assert_eq!(code(" \n", Place::Cell), "");
    }

    #[test]
    fn text_escapes_every_punctuation_and_links_nothing() {
        assert_eq!(
            text("a <b> [c](d)", Place::Cell),
            "a \\<b\\> \\[c\\]\\(d\\)"
        );
        assert_eq!(text("*x* _y_", Place::Line), "\\*x\\* \\_y\\_");
        assert_eq!(
            text("see https://x.test", Place::Cell),
            "`see https://x.test`"
        );
        assert_eq!(text("@someone", Place::Line), "`@someone`");
        assert_eq!(text("max |Δ|", Place::Cell), "max \\|Δ\\|");
    }

    #[test]
    fn prose_keeps_code_spans_as_commonmark_reads_them() {
        assert_eq!(
            prose("golden: `out` differs <b>", Place::Cell, 400),
            "golden\\: `out` differs \\<b\\>"
        );
        // A run of two opens a span that only a run of two closes.
        assert_eq!(
            parts("`a`` <img> ``"),
            vec![(false, "`a".into()), (true, "<img>".into())]
        );
        assert_eq!(parts("``x` y``"), vec![(true, "x` y".into())]);
        assert_eq!(parts("a ` b"), vec![(false, "a ` b".into())]);
        let long = prose(&format!("`{}` tail", "y".repeat(50)), Place::Cell, 10);
        assert_eq!(long, format!("`{}`…", "y".repeat(10)));
    }
}
