//! Names that differ between the two sides: `--map FILE`, rules of the form
//! `A pattern = B pattern`, one a line.
//!
//! Dumps of two frameworks name the same stage differently (`{layer}_post_attn` against
//! `layers.{layer}.self_attn`). A rule says so once for every layer: a placeholder in braces
//! matches a part of a name — `{layer}` (or any name ending in `layer`, such as `{sublayer}`)
//! digits only, any other placeholder (`{stage}`) any text without a `/` — and the B name it
//! matches pairs with the A name the same values make. Rules are tried in order, the first that
//! matches a B name wins; a B name no rule matches keeps its own name. Blank lines and lines
//! starting with `#` are ignored.
//!
//! ```text
//! # A (reference) = B (port)
//! {layer}_post_ln_pre_attn = blocks.{layer}.ln1
//! {layer}_post_attn        = blocks.{layer}.attn
//! embed                    = tok_embeddings
//! ```

use std::collections::HashMap;
use std::path::Path;

/// A piece of a pattern.
#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Text(String),
    /// A placeholder, and whether it matches digits only.
    Hole(String, bool),
}

#[derive(Clone, Debug, PartialEq)]
struct Pattern {
    text: String,
    pieces: Vec<Piece>,
}

impl Pattern {
    fn parse(text: &str) -> Result<Pattern, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("`{text}`: a `{{` without its `}}`"))?
                + open;
            let name = &rest[open + 1..close];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "`{text}`: `{{{name}}}` is not a placeholder (letters, digits and `_`)"
                ));
            }
            if matches!(pieces.last(), Some(Piece::Hole(..))) {
                return Err(format!(
                    "`{text}`: two placeholders side by side cannot be told apart"
                ));
            }
            pieces.push(Piece::Hole(name.to_string(), name.ends_with("layer")));
            rest = &rest[close + 1..];
        }
        if rest.contains('}') {
            return Err(format!("`{text}`: a `}}` without its `{{`"));
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Pattern {
            text: text.to_string(),
            pieces,
        })
    }

    fn holes(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Hole(n, _) => Some(n.as_str()),
                Piece::Text(_) => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The placeholders' values if the whole of `name` matches.
    fn matches(&self, name: &str) -> Option<HashMap<String, String>> {
        let mut values = HashMap::new();
        self.match_from(0, name, &mut values).then_some(values)
    }

    fn match_from(&self, at: usize, rest: &str, values: &mut HashMap<String, String>) -> bool {
        let Some(piece) = self.pieces.get(at) else {
            return rest.is_empty();
        };
        match piece {
            Piece::Text(t) => rest
                .strip_prefix(t.as_str())
                .is_some_and(|r| self.match_from(at + 1, r, values)),
            Piece::Hole(name, digits) => {
                // Shortest first; a placeholder seen before must take the same value.
                if let Some(v) = values.get(name).cloned() {
                    return rest
                        .strip_prefix(v.as_str())
                        .is_some_and(|r| self.match_from(at + 1, r, values));
                }
                for (end, c) in rest.char_indices().map(|(i, c)| (i + c.len_utf8(), c)) {
                    let fits = if *digits {
                        c.is_ascii_digit()
                    } else {
                        c != '/'
                    };
                    if !fits {
                        break;
                    }
                    values.insert(name.clone(), rest[..end].to_string());
                    if self.match_from(at + 1, &rest[end..], values) {
                        return true;
                    }
                    values.remove(name);
                }
                false
            }
        }
    }

    fn fill(&self, values: &HashMap<String, String>) -> String {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.as_str(),
                Piece::Hole(n, _) => values.get(n).map_or("", String::as_str),
            })
            .collect()
    }
}

/// The rules of a `--map` file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mapping {
    rules: Vec<(Pattern, Pattern)>,
}

impl Mapping {
    /// Parse the rules; errors name the line.
    pub fn parse(text: &str) -> Result<Mapping, String> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |e: String| format!("line {}: {e}", i + 1);
            let (a, b) = line.split_once('=').ok_or_else(|| {
                at(format!(
                    "`{line}` is not a rule: write `A pattern = B pattern`, such as \
                     `{{layer}}_post_attn = layers.{{layer}}.attn`"
                ))
            })?;
            let (a, b) = (a.trim(), b.trim());
            if a.is_empty() || b.is_empty() || b.contains('=') {
                return Err(at(format!("`{line}`: one `=` between two patterns")));
            }
            let (pa, pb) = (
                Pattern::parse(a).map_err(at)?,
                Pattern::parse(b).map_err(at)?,
            );
            if pa.holes() != pb.holes() {
                return Err(at(format!(
                    "`{line}`: both sides must use the same placeholders ({} against {})",
                    list(&pa.holes()),
                    list(&pb.holes())
                )));
            }
            rules.push((pa, pb));
        }
        Ok(Mapping { rules })
    }

    /// Read a `--map` file (at most 1 MiB of rules).
    pub fn read(path: &Path) -> Result<Mapping, String> {
        use std::io::Read as _;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(1 << 20).read_to_string(&mut text))
            .map_err(|e| format!("--map {}: {e}", path.display()))?;
        Mapping::parse(&text).map_err(|e| format!("--map {}: {e}", path.display()))
    }

    /// The A name a B name stands for: that of the first rule whose B pattern matches it.
    pub fn to_a(&self, b_name: &str) -> Option<String> {
        self.rules
            .iter()
            .find_map(|(a, b)| b.matches(b_name).map(|values| a.fill(&values)))
    }

    /// The rule that maps `b_name`, as written (`{layer}_post_attn = layers.{layer}.attn`).
    pub fn rule_for(&self, b_name: &str) -> Option<String> {
        self.rules
            .iter()
            .find(|(_, b)| b.matches(b_name).is_some())
            .map(|(a, b)| format!("{} = {}", a.text, b.text))
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

fn list(holes: &[&str]) -> String {
    if holes.is_empty() {
        "none".into()
    } else {
        holes
            .iter()
            .map(|h| format!("{{{h}}}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_map_b_names_to_a_names_layer_by_layer() {
        let m = Mapping::parse(
            "# A = B\n\
             {layer}_post_ln_pre_attn = blocks.{layer}.ln1\n\
             {layer}_{stage} = blocks.{layer}.{stage}\n\
             embed = tok_embeddings\n",
        )
        .unwrap();
        assert_eq!(
            m.to_a("blocks.12.ln1").as_deref(),
            Some("12_post_ln_pre_attn")
        );
        assert_eq!(m.to_a("blocks.3.post_mlp").as_deref(), Some("3_post_mlp"));
        assert_eq!(m.to_a("tok_embeddings").as_deref(), Some("embed"));
        assert_eq!(m.to_a("blocks.x.ln1"), None, "{{layer}} is digits");
        assert_eq!(m.to_a("blocks.3.a/b"), None, "a placeholder stops at /");
        assert_eq!(
            m.rule_for("blocks.3.post_mlp").as_deref(),
            Some("{layer}_{stage} = blocks.{layer}.{stage}")
        );
        let same = Mapping::parse("{layer}_x = l{layer}_{layer}").unwrap();
        assert_eq!(same.to_a("l4_4").as_deref(), Some("4_x"));
        assert_eq!(same.to_a("l4_5"), None);
    }

    #[test]
    fn bad_rules_name_their_line() {
        for (text, says) in [
            ("a b", "line 1: `a b` is not a rule"),
            (
                "\n{layer}_x = y",
                "line 2: `{layer}_x = y`: both sides must use the same",
            ),
            ("{a}{b} = {a}.{b}", "two placeholders side by side"),
            ("{layer = x", "a `{` without its `}`"),
            ("a = b = c", "one `=` between two patterns"),
        ] {
            let e = Mapping::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
