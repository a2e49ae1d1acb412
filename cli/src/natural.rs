//! The order tensors are listed and compared in: layer number first, then the stage within the
//! layer, as a model runs — `0_pre_attn`, `0_post_attn`, …, `2_…`, `10_…` (not `10` before `2`), and
//! `post_ln_pre_attn` before `post_attn` before `pre_mlp` before `post_mlp` (not alphabetical).

use std::cmp::Ordering;

/// Stage names in the order a transformer layer runs them; other words sort alphabetically after.
const STAGES: &[&str] = &[
    "embed",
    "embeddings",
    "tok",
    "wte",
    "input",
    "pre_attn",
    "post_ln_pre_attn",
    "ln1",
    "ln_1",
    "attn",
    "self_attn",
    "attention",
    "post_attn",
    "post_attn_pre_resid",
    "pre_mlp",
    "post_ln_pre_mlp",
    "ln2",
    "ln_2",
    "mlp",
    "ffn",
    "post_mlp",
    "ln_f",
    "norm",
    "final_norm",
    "head",
    "lm_head",
    "logits",
    "out",
    "output",
];

#[derive(Debug, PartialEq, Eq)]
enum Part<'a> {
    Num(u128),
    Text(&'a str),
}

fn parts(name: &str) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    let bytes = name.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        let digit = bytes[start].is_ascii_digit();
        let mut end = start;
        while end < bytes.len() && bytes[end].is_ascii_digit() == digit {
            end += 1;
        }
        let run = &name[start..end];
        if digit {
            out.push(Part::Num(run.parse().unwrap_or(u128::MAX)));
        } else {
            let trimmed = run.trim_matches(|c: char| matches!(c, '_' | '.' | '/' | '-' | ':'));
            if !trimmed.is_empty() {
                out.push(Part::Text(trimmed));
            }
        }
        start = end;
    }
    out
}

/// A word without a tensor file's extension.
fn stem(s: &str) -> &str {
    match s.rsplit_once('.') {
        Some((stem, "npy" | "npz" | "pt" | "pth" | "safetensors" | "bin")) => stem,
        _ => s,
    }
}

fn text_order(a: &str, b: &str) -> Ordering {
    let rank = |s: &str| STAGES.iter().position(|t| *t == stem(s));
    match (rank(a), rank(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// Compare two tensor names in natural order.
pub fn compare(a: &str, b: &str) -> Ordering {
    let (pa, pb) = (parts(a), parts(b));
    for (x, y) in pa.iter().zip(&pb) {
        let o = match (x, y) {
            (Part::Num(x), Part::Num(y)) => x.cmp(y),
            (Part::Text(x), Part::Text(y)) => text_order(x, y),
            (Part::Num(_), Part::Text(_)) => Ordering::Less,
            (Part::Text(_), Part::Num(_)) => Ordering::Greater,
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    pa.len().cmp(&pb.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<&str>) -> Vec<&str> {
        v.sort_by(|a, b| compare(a, b));
        v
    }

    #[test]
    fn layers_by_number_then_stages_in_running_order() {
        let names = vec![
            "10_pre_mlp.pth",
            "2_post_attn.pth",
            "0_post_mlp.pth",
            "0_pre_mlp.pth",
            "0_post_attn_pre_resid.pth",
            "0_post_attn.pth",
            "0_post_ln_pre_attn.pth",
            "1_post_attn.pth",
        ];
        assert_eq!(
            sorted(names),
            [
                "0_post_ln_pre_attn.pth",
                "0_post_attn.pth",
                "0_post_attn_pre_resid.pth",
                "0_pre_mlp.pth",
                "0_post_mlp.pth",
                "1_post_attn.pth",
                "2_post_attn.pth",
                "10_pre_mlp.pth",
            ]
        );
    }

    #[test]
    fn numbered_dumps_keep_their_numbers_order() {
        let names = vec![
            "021_blocks.2.attn.proj",
            "003_blocks.0.attn.proj",
            "000_tok",
            "100_head",
        ];
        assert_eq!(
            sorted(names),
            [
                "000_tok",
                "003_blocks.0.attn.proj",
                "021_blocks.2.attn.proj",
                "100_head"
            ]
        );
        assert_eq!(
            sorted(vec!["blocks.10.mlp", "blocks.2.mlp", "blocks.2.attn"]),
            ["blocks.2.attn", "blocks.2.mlp", "blocks.10.mlp"]
        );
    }
}
