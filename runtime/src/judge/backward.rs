//! Where a port's gradient stops, and at which of candle's ops: candle's fused ops have no backward
//! (BRIEF.md §5: their outputs leave its autograd graph, and every gradient before them is
//! silently lost), and `Tensor::op` is private to candle, so golden cannot walk the port's graph to
//! the op. What it can see from outside:
//!
//! * **Which values left the graph.** A tensor computed from tracked values (a `Var`, or a value
//!   made from one) is tracked itself (`Tensor::track_op`), unless the op that made it has no
//!   backward (or the port detached it). So among the port's taps (`golden::tap`), in execution
//!   order, the first one that is not tracked while one before it was is where the gradient stops:
//!   [`cut`].
//! * **Which op it is.** [`NO_BACKWARD`] lists candle's ops without a backward, each with what it
//!   computes and the names a model gives such a step (`norm`, `rotary`, `softmax`, ...); the cut's
//!   name, or the names of the parameters that get no gradient, pick the ones that fit
//!   ([`candidates`]). The list is checked against the candle golden is built with, op by op, by
//!   this module's tests: an op that gains a backward fails them.

use candle_core::Tensor;

/// One of candle's ops without a backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoBackward {
    /// The op, as a port calls it.
    pub op: &'static str,
    /// What computes the same with a backward.
    pub instead: &'static str,
    /// Parts of the names a model gives the step it computes (lower case).
    pub hints: &'static [&'static str],
    /// Parts of the names of what feeds it (lower case): a weaker sign.
    pub fed_by: &'static [&'static str],
}

/// candle's ops without a backward (candle-nn 0.11.1; this module's tests apply each to tracked
/// values and check that its output is not).
pub const NO_BACKWARD: &[NoBackward] = &[
    NoBackward {
        op: "candle_nn::ops::rms_norm (which RmsNorm::forward takes on a contiguous input)",
        instead: "candle_nn::ops::rms_norm_slow, or the norm from sqr, mean and sqrt",
        hints: &["norm", "rms", "ln"],
        fed_by: &[],
    },
    NoBackward {
        op: "candle_nn::ops::layer_norm (which LayerNorm::forward takes on a contiguous input)",
        instead: "candle_nn::ops::layer_norm_slow",
        hints: &["norm", "ln"],
        fed_by: &[],
    },
    NoBackward {
        op: "candle_nn::ops::softmax_last_dim",
        instead: "candle_nn::ops::softmax(x, D::Minus1)",
        hints: &["softmax", "score", "prob"],
        fed_by: &["q_", "k_", "query", "key"],
    },
    NoBackward {
        op: "candle_nn::rotary_emb::rope, rope_i or rope_thd",
        instead: "the rotation from narrow, neg, cat and broadcast_mul (rotate_half)",
        hints: &["rot", "rope", "rotary"],
        fed_by: &["q_", "k_", "query", "key"],
    },
    NoBackward {
        op: "candle_nn::ops::sdpa",
        instead: "the attention from matmul and candle_nn::ops::softmax",
        hints: &["sdpa", "attn", "attention"],
        fed_by: &["q_", "k_", "v_", "query", "key", "value"],
    },
];

/// The ops of [`NO_BACKWARD`] that fit one of `names` (a cut's tap, the parameters that get no
/// gradient): those whose step the name is, else those it feeds; all of them when none fits.
pub fn candidates<'a>(
    names: impl IntoIterator<Item = &'a str> + Clone,
) -> Vec<&'static NoBackward> {
    // The last part of a dotted name says what the step is (`input_layernorm` of
    // `layer.input_layernorm.weight`).
    let tails: Vec<String> = names
        .into_iter()
        .map(|name| {
            name.to_ascii_lowercase()
                .rsplit('.')
                .find(|part| *part != "weight" && *part != "bias")
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let fits = |hints: &[&str]| tails.iter().any(|t| hints.iter().any(|h| t.contains(h)));
    let is: Vec<&'static NoBackward> = NO_BACKWARD.iter().filter(|nb| fits(nb.hints)).collect();
    if !is.is_empty() {
        return is;
    }
    let fed: Vec<&'static NoBackward> = NO_BACKWARD.iter().filter(|nb| fits(nb.fed_by)).collect();
    if !fed.is_empty() {
        return fed;
    }
    NO_BACKWARD.iter().collect()
}

/// The port's first tap, in execution order, whose value is outside candle's autograd graph while
/// a value before it is inside (a tap, or with `from_tracked` the port's inputs and parameters,
/// which a gradient check gives it as `Var`s): where its gradient stops. `None` when no tap shows
/// it.
pub fn cut(taps: &[(String, Tensor)], from_tracked: bool) -> Option<&str> {
    let mut tracked_before = from_tracked;
    for (name, t) in taps {
        if !t.dtype().is_float() {
            continue;
        }
        if t.track_op() {
            tracked_before = true;
        } else if tracked_before {
            return Some(name);
        }
    }
    None
}

/// Why `target` (an input or parameter PyTorch gives a gradient) gets none in the port, as a
/// message: where the gradient stops (`taps`: the port's taps of the call, whose inputs and
/// parameters were `Var`s), the ops of candle that fit, and what to use instead.
///
/// The cut is the target's own step when the port taps it outside the graph (`layer.norm` for
/// `layer.norm.weight`), else the first tap outside it ([`cut`], the inputs and parameters being
/// in it). A constant the port taps before its steps (a mask, a rotary table) is outside the graph
/// too, and would be named instead: tap the steps, not the constants.
pub fn why_no_gradient(target: &str, taps: &[(String, Tensor)]) -> String {
    let own = taps.iter().find(|(name, t)| {
        t.dtype().is_float()
            && !t.track_op()
            && target
                .rsplit_once('.')
                .is_some_and(|(step, _)| step == name)
    });
    let at = own
        .map(|(name, _)| name.as_str())
        .or_else(|| cut(taps, true));
    let ops = match at {
        Some(tap) => candidates([tap]),
        None => candidates([target]),
    };
    let listed = ops
        .iter()
        .map(|nb| format!("{} (use {})", nb.op, nb.instead))
        .collect::<Vec<_>>()
        .join("; or ");
    match at {
        Some(tap) => format!(
            "`{target}` gets a gradient in PyTorch and none in the port: the gradient stops at the \
             port's tap `{tap}`, whose value is outside candle's autograd graph though the values \
             before it are in it: a fused op without backward made it — {listed}; or at a detach \
             there"
        ),
        None => format!(
            "`{target}` gets a gradient in PyTorch and none in the port: the gradient stops between \
             it and the output, at a fused op without backward — by the names, {listed}; or at a \
             detach, or a value taken out of the graph (`to_vec`, a tensor built anew); \
             golden::tap the port's steps and golden names the step where it stops"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor, Var, D};

    fn var(shape: &[usize]) -> Var {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
        Var::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    /// Every op of the list takes tracked values and returns an untracked one on this candle (the
    /// fused attention, where it runs on the CPU at all); the alternatives it names keep theirs.
    #[test]
    fn the_list_is_candles_ops_without_a_backward() {
        let x = var(&[2, 3, 4, 8]);
        let w = var(&[8]);
        let b = var(&[8]);
        let (cos, sin) = (
            Tensor::ones((4, 4), DType::F32, &Device::Cpu).unwrap(),
            Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap(),
        );
        let x = x.as_tensor();
        let untracked = [
            candle_nn::ops::rms_norm(x, w.as_tensor(), 1e-6).unwrap(),
            candle_nn::ops::layer_norm(x, w.as_tensor(), b.as_tensor(), 1e-6).unwrap(),
            candle_nn::ops::softmax_last_dim(x).unwrap(),
            candle_nn::rotary_emb::rope(x, &cos, &sin).unwrap(),
            candle_nn::rotary_emb::rope_i(x, &cos, &sin).unwrap(),
            candle_nn::rotary_emb::rope_thd(
                &x.transpose(1, 2).unwrap().contiguous().unwrap(),
                &cos,
                &sin,
            )
            .unwrap(),
        ];
        for (k, y) in untracked.iter().enumerate() {
            assert!(!y.track_op(), "op {k} of the list has a backward now");
        }
        if let Ok(y) = candle_nn::ops::sdpa(x, x, x, None, false, 1.0, 1.0) {
            assert!(!y.track_op(), "sdpa has a backward now");
        }
        let tracked = [
            candle_nn::ops::rms_norm_slow(x, w.as_tensor(), 1e-6).unwrap(),
            candle_nn::ops::layer_norm_slow(x, w.as_tensor(), b.as_tensor(), 1e-6).unwrap(),
            candle_nn::ops::softmax(x, D::Minus1).unwrap(),
        ];
        assert!(tracked.iter().all(Tensor::track_op));
    }

    #[test]
    fn the_first_untracked_tap_after_a_tracked_one_is_the_cut() {
        let x = var(&[2, 8]);
        let w = var(&[8]);
        let normed = candle_nn::ops::rms_norm(x.as_tensor(), w.as_tensor(), 1e-6).unwrap();
        let after = (&normed * 2.0).unwrap();
        let constant = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
        let taps = vec![
            ("table".to_string(), constant),
            ("embed".to_string(), (x.as_tensor() + 1.0).unwrap()),
            ("layer.input_layernorm".to_string(), normed),
            ("layer.mlp".to_string(), after),
        ];
        assert_eq!(cut(&taps, false), Some("layer.input_layernorm"));
        // The first tap is the cut when the port's inputs are tracked.
        assert_eq!(cut(&taps[2..], true), Some("layer.input_layernorm"));
        assert_eq!(cut(&taps[2..], false), None);
        let message = why_no_gradient("layer.input_layernorm.weight", &taps);
        assert!(
            message.contains("stops at the port's tap `layer.input_layernorm`")
                && message.contains("candle_nn::ops::rms_norm (which RmsNorm::forward")
                && !message.contains("rotary_emb"),
            "{message}"
        );
        // The target's own step, when tapped outside the graph, before the first cut.
        let second = candle_nn::ops::rms_norm(&taps[3].1, w.as_tensor(), 1e-6).unwrap();
        let both = vec![
            taps[2].clone(),
            ("layer.post_attention_layernorm".to_string(), second),
        ];
        let message = why_no_gradient("layer.post_attention_layernorm.weight", &both);
        assert!(
            message.contains("stops at the port's tap `layer.post_attention_layernorm`"),
            "{message}"
        );
        // Another target: the first tap outside the graph.
        let message = why_no_gradient("layer.mlp.up_proj.weight", &taps[1..]);
        assert!(
            message.contains("stops at the port's tap `layer.input_layernorm`"),
            "{message}"
        );
        // Without taps, the parameters' names pick the ops.
        let message = why_no_gradient("layer.self_attn.q_proj.weight", &[]);
        assert!(
            message.contains("rotary_emb::rope")
                && message.contains("softmax_last_dim")
                && !message.contains("ops::rms_norm"),
            "{message}"
        );
        assert_eq!(
            candidates(["layer.mlp.fc9.weight"]).len(),
            NO_BACKWARD.len()
        );
        let ops = |name| {
            candidates([name])
                .iter()
                .map(|nb| nb.op)
                .collect::<Vec<_>>()
        };
        assert_eq!(ops("q_rot"), [NO_BACKWARD[3].op]);
    }
}
