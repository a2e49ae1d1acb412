//! Outputs of another structure than the reference's: a leaf one side returns and the other does
//! not (a port returning `(out, probs)` where the reference returns `(out, None)`, a bare tensor
//! where a causal LM returns `{"logits": …}`). No case changes it, so it is said before any case is
//! shrunk and without a diagnosis: what each side returns, and how the port returns what the
//! reference does, in Rust.

use crate::judge::compare::{Leaf, Verdict};
use crate::judge::trace;

/// The names of the output leaves each side returns, when they differ: (port's, reference's),
/// trace points left out (a trace has its own messages).
pub fn mismatch(leaves: &[Leaf]) -> Option<(Vec<&str>, Vec<&str>)> {
    let outputs: Vec<&Leaf> = leaves
        .iter()
        .filter(|l| !trace::is_trace(&l.name))
        .collect();
    let differs = outputs.iter().any(|l| {
        matches!(
            l.verdict,
            Verdict::MissingInPort | Verdict::MissingInReference
        )
    });
    if !differs {
        return None;
    }
    let side = |missing: Verdict| {
        outputs
            .iter()
            .filter(|l| l.verdict != missing)
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>()
    };
    Some((
        side(Verdict::MissingInPort),
        side(Verdict::MissingInReference),
    ))
}

/// What a set of leaf names is: "a tensor (`out`)", "a tuple of 2 (`out.0`, `out.1`)", "a mapping
/// with `logits`", or the names.
pub fn describe(names: &[&str]) -> String {
    let listed = || {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match shape(names) {
        Shape::Nothing => "nothing".into(),
        Shape::Tensor => "a tensor (`out`)".into(),
        Shape::Tuple(n) => format!("a tuple of {n} ({})", listed()),
        Shape::Mapping(keys) => format!(
            "a mapping with {} ({})",
            keys.iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            listed()
        ),
        Shape::Other => format!("the leaves {}", listed()),
    }
}

/// How the port returns what the reference returns (`reference`: its leaf names), in Rust.
pub fn fix(reference: &[&str]) -> String {
    match shape(reference) {
        Shape::Nothing | Shape::Other => format!(
            "return leaves with the reference's names ({}): a tuple names its elements `out.0`, \
             `out.1`, …, a `BTreeMap` its keys `out.<key>`",
            reference.join(", ")
        ),
        Shape::Tensor => "return the tensor itself (`Ok(t)`), not a tuple or a map".into(),
        Shape::Tuple(1) => {
            "return a one-element tuple `(t,)`: golden skips the reference's `None` \
             entries (an attention's `(out, None)`), so its only leaf is `out.0`"
                .into()
        }
        Shape::Tuple(n) => format!(
            "return a tuple of {n} tensors (or a `Vec` of {n}), in the reference's order: its \
             leaves are `out.0` … `out.{}`",
            n - 1
        ),
        Shape::Mapping(keys) => format!(
            "return a map from the reference's names: `BTreeMap::from([{}])` (a causal LM \
             returns its logits under `logits`)",
            keys.iter()
                .map(|k| format!("(\"{k}\", {})", k.replace('.', "_")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

enum Shape<'a> {
    Nothing,
    Tensor,
    Tuple(usize),
    Mapping(Vec<&'a str>),
    Other,
}

fn shape<'a>(names: &[&'a str]) -> Shape<'a> {
    if names.is_empty() {
        return Shape::Nothing;
    }
    if names == ["out"] {
        return Shape::Tensor;
    }
    let tails: Option<Vec<&str>> = names.iter().map(|n| n.strip_prefix("out.")).collect();
    let Some(tails) = tails else {
        return Shape::Other;
    };
    if tails.iter().all(|t| t.parse::<usize>().is_ok()) {
        return Shape::Tuple(tails.len());
    }
    if tails
        .iter()
        .all(|t| !t.contains('.') && t.parse::<usize>().is_err())
    {
        return Shape::Mapping(tails);
    }
    Shape::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_structure_reads_as_what_it_is() {
        assert_eq!(describe(&["out"]), "a tensor (`out`)");
        assert_eq!(
            describe(&["out.0", "out.1"]),
            "a tuple of 2 (`out.0`, `out.1`)"
        );
        assert_eq!(
            describe(&["out.logits"]),
            "a mapping with `logits` (`out.logits`)"
        );
    }

    #[test]
    fn the_fix_returns_the_reference_s_structure() {
        assert!(fix(&["out.logits"]).contains("BTreeMap::from([(\"logits\", logits)])"));
        assert!(fix(&["out.0"]).contains("`(t,)`"));
        assert!(fix(&["out"]).contains("the tensor itself"));
    }
}
