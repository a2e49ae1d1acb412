//! The order tensors are listed and compared in when nothing says in which order they were
//! computed: layer number first, then the stage within the layer, as a model usually runs —
//! `0_pre_attn`, `0_post_attn`, …, `2_…`, `10_…` (not `10` before `2`), and `post_ln_pre_attn`
//! before `post_attn` before `pre_mlp` before `post_mlp`, Hugging Face's `input_layernorm` before
//! `self_attn` before `post_attention_layernorm` before `mlp` (not alphabetical).
//!
//! The stages are a guess from usual names; only the numbers are taken as an order
//! ([`certainly_before`]): `golden diff` says so when the first divergence depends on the guess.

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
    "input_layernorm",
    "q_proj",
    "k_proj",
    "v_proj",
    "q_rot",
    "k_rot",
    "o_proj",
    "attn",
    "self_attn",
    "attention",
    "post_attn",
    "post_attn_pre_resid",
    "pre_mlp",
    "post_ln_pre_mlp",
    "ln2",
    "ln_2",
    "post_attention_layernorm",
    "gate_proj",
    "up_proj",
    "act_fn",
    "down_proj",
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

/// Whether `a` certainly runs before `b` by its name alone: the two agree up to a number, and
/// `a`'s is smaller (`2_mlp` before `10_input_layernorm`, `layers.0.mlp` before `layers.1.attn`:
/// layers run in the order of their numbers). Words are no order: `0_self_attn` and
/// `0_input_layernorm` are not known to run in either order.
pub fn certainly_before(a: &str, b: &str) -> bool {
    for (x, y) in parts(a).iter().zip(&parts(b)) {
        match (x, y) {
            (Part::Num(x), Part::Num(y)) if x != y => return x < y,
            (x, y) if x == y => {}
            _ => return false,
        }
    }
    false
}

/// The number a name starts with (`021` of `021_blocks.2.attn`), when a separator or nothing
/// follows it: a dump's own numbering.
pub fn leading_number(name: &str) -> Option<u128> {
    let digits = name.bytes().take_while(u8::is_ascii_digit).count();
    let rest = &name[digits..];
    if digits == 0 || !(rest.is_empty() || rest.starts_with(['_', '.', '-', ' '])) {
        return None;
    }
    name[..digits].parse().ok()
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
    fn hugging_face_stage_names_are_guessed_in_running_order() {
        let names = vec![
            "0_mlp.npy",
            "0_post_attention_layernorm.npy",
            "0_self_attn.npy",
            "0_input_layernorm.npy",
            "1_input_layernorm.npy",
        ];
        assert_eq!(
            sorted(names),
            [
                "0_input_layernorm.npy",
                "0_self_attn.npy",
                "0_post_attention_layernorm.npy",
                "0_mlp.npy",
                "1_input_layernorm.npy",
            ]
        );
    }

    #[test]
    fn only_numbers_are_a_certain_order() {
        assert!(certainly_before("0_mlp", "1_input_layernorm"));
        assert!(certainly_before("2_post_attn", "10_pre_attn"));
        assert!(certainly_before("layers.0.mlp", "layers.1.self_attn"));
        assert!(!certainly_before("1_input_layernorm", "0_mlp"));
        assert!(!certainly_before("0_input_layernorm", "0_self_attn"));
        assert!(!certainly_before("0_self_attn", "0_input_layernorm"));
        assert!(!certainly_before("embed", "0_input_layernorm"));
        assert!(!certainly_before("blocks.2.attn.proj", "blocks.2.attn"));
        assert_eq!(leading_number("021_blocks.2.attn"), Some(21));
        assert_eq!(leading_number("7"), Some(7));
        assert_eq!(leading_number("0x12"), None);
        assert_eq!(leading_number("layers.0"), None);
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
