//! Taps and traces: where in a whole model the port first leaves its reference.
//!
//! A port calls [`tap`] at points of interest, named like the reference's submodules (the
//! state_dict prefix, which is what a candle `VarBuilder`'s `prefix()` gives):
//!
//! ```no_run
//! # fn block(vb: candle_nn::VarBuilder, x: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
//! let h = x.clone(); // ... the block's computation
//! golden::tap(vb.prefix(), &h); // e.g. "blocks.2"
//! # Ok(h) }
//! ```
//!
//! With `trace` on the attribute (module form), the worker records every submodule's output with
//! forward hooks (leaves `trace.<name>`, in execution order, with their own rounding estimates) —
//! a submodule that returns a tuple or a list is a point per tensor (`self_attn.0`,
//! `self_attn.1`) — and what the reference taps itself with `golden_ref.tap("q_rot", q)`
//! (intermediates no submodule returns). The forward check records the port's taps and compares
//! the two by name in the reference's execution order: the first point that differs is where the
//! port leaves the reference, and the failure's headline. Points the port never tapped are listed,
//! not failed; a tap whose name the reference does not have fails the case before anything is
//! compared, with the names it could mean ([`unknown_tap`]): a typo would otherwise compare
//! nothing, and it is no divergence.
//!
//! A tap costs two thread-local lookups when no trace is recording and no call is timed (every
//! check but a traced forward check, and every use outside golden); while golden times the port
//! (`judge/speed.rs`), it marks the time too.

use crate::judge::compare::{Leaf, Verdict};
use candle_core::Tensor;
use std::cell::RefCell;

thread_local! {
    static RECORDING: RefCell<Option<Vec<(String, Tensor)>>> = const { RefCell::new(None) };
}

/// Record `t` as the trace point `name` when a traced check is running the port on this thread;
/// otherwise do nothing. `name` is a point of the reference: a submodule's state_dict prefix
/// (`vb.prefix()`), `<module>.0` for the first tensor of a module that returns a tuple, or a name
/// the reference taps itself (`golden_ref.tap`). Tapped again, a name is `<name>#2`, `#3`, … on
/// both sides.
pub fn tap(name: impl AsRef<str>, t: &Tensor) {
    crate::judge::speed::mark(name.as_ref());
    RECORDING.with(|r| {
        if let Some(taps) = r.borrow_mut().as_mut() {
            taps.push((name.as_ref().to_string(), t.clone()));
        }
    });
}

/// Run `f` with tap recording on; returns its result and the taps, in the order they were made.
pub(crate) fn record<R>(f: impl FnOnce() -> R) -> (R, Vec<(String, Tensor)>) {
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            RECORDING.with(|r| *r.borrow_mut() = None);
        }
    }
    RECORDING.with(|r| *r.borrow_mut() = Some(Vec::new()));
    let stop = Stop;
    let result = f();
    let taps = RECORDING
        .with(|r| r.borrow_mut().take())
        .unwrap_or_default();
    drop(stop);
    (result, taps)
}

/// The first step of a schedule at which a leaf fails, with that leaf (its cached comparison
/// before its one-shot one): where a port first leaves its reference in time.
pub fn first_failing_step(leaves: &[Leaf]) -> Option<(usize, &Leaf)> {
    leaves
        .iter()
        .filter(|l| !l.passes())
        .filter_map(|l| crate::describe::schedule::step_of(&l.name).map(|(k, _)| (k, l)))
        .min_by_key(|(k, l)| (*k, !l.name.starts_with("step.")))
}

/// The prefix of trace leaves.
pub const PREFIX: &str = "trace.";

/// Leaf names for the taps: `trace.<name>`, a name tapped again `<name>#2` (as the worker names a
/// module called twice).
pub(crate) fn leaf_names(taps: &[(String, Tensor)]) -> Vec<String> {
    numbered(taps.iter().map(|(name, _)| name.as_str()))
}

/// Tap names as trace leaves: `trace.<name>`, a name tapped again `<name>#2`, `#3`, ….
pub(crate) fn numbered<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    names
        .map(|name| {
            let count = match seen.iter_mut().find(|(n, _)| *n == name) {
                Some((_, c)) => {
                    *c += 1;
                    *c
                }
                None => {
                    seen.push((name, 1));
                    1
                }
            };
            if count == 1 {
                format!("{PREFIX}{name}")
            } else {
                format!("{PREFIX}{name}#{count}")
            }
        })
        .collect()
}

/// Whether a leaf is a trace point.
pub fn is_trace(leaf: &str) -> bool {
    leaf.starts_with(PREFIX)
}

/// The first trace point (in the reference's execution order) whose comparison fails.
pub fn first_divergence(leaves: &[Leaf]) -> Option<(usize, &Leaf)> {
    leaves
        .iter()
        .filter(|l| is_trace(&l.name))
        .enumerate()
        .find(|(_, l)| !l.passes())
}

/// Why the port's tap `leaf` (`trace.<name>`, of shape `shape`) names no trace point of the
/// reference, and what it could name instead; `points` are the reference's points (`trace.<name>`,
/// with their shapes), in execution order.
///
/// A module that returns a tuple or a list has no point of its own name: each of its tensors is
/// one (`self_attn.0`, `self_attn.1`: Hugging Face's attention returns the output and
/// the attention weights). golden does not map the module's name to one of them — which tensor
/// the port means is the port's to say — but names them, with their shapes, and the one whose
/// shape is the tap's.
pub fn unknown_tap(leaf: &str, shape: &[usize], points: &[(&str, &[usize])]) -> String {
    let name = leaf.strip_prefix(PREFIX).unwrap_or(leaf);
    let points: Vec<(&str, &[usize])> = points
        .iter()
        .filter_map(|(n, s)| Some((n.strip_prefix(PREFIX)?, *s)))
        .collect();
    let mut out =
        format!("the port taps `{name}` {shape:?}, which is not a trace point of the reference");
    // A name tapped more often than the reference records it: `q_rot#2`.
    if let Some((base, nth)) = name.rsplit_once('#') {
        if let Ok(nth) = nth.parse::<usize>() {
            if points.iter().any(|(n, _)| *n == base) {
                let times = points
                    .iter()
                    .filter(|(n, _)| {
                        *n == base || n.strip_prefix(base).is_some_and(|r| r.starts_with('#'))
                    })
                    .count();
                out.push_str(&format!(
                    ": the port taps `{base}` {nth} times or more, the reference records it {times} \
                     time{} (a tap inside a loop or a layer that runs more often in the port?)",
                    if times == 1 { "" } else { "s" }
                ));
                return out;
            }
        }
    }
    // The tensors of a module that returns a tuple or a list: the points `<name>.<index>`.
    let under: Vec<(&str, &[usize])> = points
        .iter()
        .filter(|(n, _)| {
            n.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
        })
        .copied()
        .collect();
    if !under.is_empty() {
        let listed: Vec<String> = under
            .iter()
            .take(8)
            .map(|(n, s)| format!("`{n}` {s:?}"))
            .collect();
        let same_shape: Vec<&str> = under
            .iter()
            .filter(|(_, s)| *s == shape)
            .map(|(n, _)| *n)
            .collect();
        out.push_str(&format!(
            "; under it the reference has {}{}: a module that returns a tuple or a list is a \
             point per tensor (Hugging Face's attention returns its output and its attention \
             weights). Tap one of them: ",
            listed.join(", "),
            if under.len() > listed.len() {
                ", …"
            } else {
                ""
            }
        ));
        match same_shape.as_slice() {
            [one] => out.push_str(&format!("`{one}` has your tap's shape")),
            _ => out.push_str(&format!(
                "`{}`, the first, is usually the module's output",
                under[0].0
            )),
        }
        return out;
    }
    // A typo: the closest names.
    let limit = (name.chars().count() / 4).max(2);
    let mut close: Vec<(usize, &str)> = points
        .iter()
        .map(|(n, _)| (edit_distance(name, n), *n))
        .filter(|(d, _)| *d <= limit)
        .collect();
    close.sort_by_key(|(d, _)| *d);
    if let Some((_, best)) = close.first() {
        out.push_str(&format!("; did you mean `{best}`?"));
        return out;
    }
    // Otherwise the points that share the longest dotted prefix with it.
    let shared = |n: &str| {
        name.split('.')
            .zip(n.split('.'))
            .take_while(|(a, b)| a == b)
            .count()
    };
    let longest = points.iter().map(|(n, _)| shared(n)).max().unwrap_or(0);
    let near: Vec<&str> = points
        .iter()
        .filter(|(n, _)| shared(n) == longest)
        .map(|(n, _)| *n)
        .collect();
    if near.is_empty() {
        out.push_str("; the reference records no trace points at all");
    } else {
        out.push_str(&format!(
            "; its points{}: {}{}",
            if longest > 0 { " nearest to it" } else { "" },
            near.iter()
                .take(8)
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
            if near.len() > 8 { ", …" } else { "" }
        ));
    }
    out.push_str(&format!(
        ". An intermediate that no submodule returns can be tapped in the reference too: \
         `golden_ref.tap(\"{name}\", tensor)` in its forward"
    ));
    out
}

/// Levenshtein distance in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The error at each tapped point relative to its tolerance, as a line of blocks (the drift
/// against depth): `▁` well inside the tolerance, `█` at 10× outside it, `✗` for a shape or
/// missing value.
pub fn drift_line(leaves: &[Leaf]) -> String {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    leaves
        .iter()
        .filter(|l| is_trace(&l.name))
        .map(|l| match &l.verdict {
            Verdict::Values(v) => {
                // log10 of error/allowed from -6 (▁) to +1 (█).
                let level = if v.worst_ratio > 0.0 {
                    ((v.worst_ratio.log10() + 6.0) / 7.0 * 7.0).round()
                } else {
                    0.0
                };
                LEVELS[level.clamp(0.0, 7.0) as usize]
            }
            _ => '✗',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn taps_are_recorded_only_inside_record() {
        let t = Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu).unwrap();
        tap("outside", &t);
        let ((), taps) = record(|| {
            tap("a", &t);
            tap("b", &t);
            tap("a", &t);
        });
        tap("after", &t);
        let names: Vec<&str> = taps.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "a"]);
        assert_eq!(leaf_names(&taps), ["trace.a", "trace.b", "trace.a#2"]);
        // A panic inside stops the recording too.
        let _ = std::panic::catch_unwind(|| record(|| panic!("port")));
        let ((), taps) = record(|| ());
        assert!(taps.is_empty());
    }

    #[test]
    fn an_unknown_tap_names_what_it_could_mean() {
        let points: [(&str, &[usize]); 5] = [
            ("trace.layer.input_layernorm", &[1, 2, 16]),
            ("trace.layer.self_attn.q_proj", &[1, 2, 16]),
            ("trace.layer.self_attn.0", &[1, 2, 16]),
            ("trace.layer.self_attn.1", &[1, 4, 2, 2]),
            ("trace.q_rot", &[1, 4, 2, 4]),
        ];
        let tuple = unknown_tap("trace.layer.self_attn", &[1, 2, 16], &points);
        assert_eq!(
            tuple,
            "the port taps `layer.self_attn` [1, 2, 16], which is not a trace point of the \
             reference; under it the reference has `layer.self_attn.0` [1, 2, 16], \
             `layer.self_attn.1` [1, 4, 2, 2]: a module that returns a tuple or a list is a point \
             per tensor (Hugging Face's attention returns its output and its attention \
             weights). Tap one of them: `layer.self_attn.0` has your tap's shape"
        );
        let typo = unknown_tap("trace.layer.input_layrnorm", &[1, 2, 16], &points);
        assert!(
            typo.ends_with("did you mean `layer.input_layernorm`?"),
            "{typo}"
        );
        let again = unknown_tap("trace.q_rot#2", &[1, 4, 2, 4], &points);
        assert!(
            again
                .contains("the port taps `q_rot` 2 times or more, the reference records it 1 time"),
            "{again}"
        );
        let elsewhere = unknown_tap("trace.layer.mlp.gate", &[1, 2, 32], &points);
        assert!(
            elsewhere.contains("its points nearest to it: `layer.input_layernorm`")
                && elsewhere.contains("`golden_ref.tap(\"layer.mlp.gate\", tensor)`"),
            "{elsewhere}"
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
