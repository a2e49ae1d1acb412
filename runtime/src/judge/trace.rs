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
//! forward hooks (leaves `trace.<name>`, in execution order, with their own rounding estimates), the
//! forward check records the port's taps, and compares the two by name in the reference's
//! execution order: the first point that differs is where the port leaves the reference, and the
//! failure's headline. Points the port never tapped are listed, not failed; a tap whose name the
//! reference does not have fails (a typo would otherwise compare nothing).
//!
//! A tap costs a thread-local lookup when no trace is recording (every check but a traced forward
//! check, and every use outside golden).

use crate::judge::compare::{Leaf, Verdict};
use candle_core::Tensor;
use std::cell::RefCell;

thread_local! {
    static RECORDING: RefCell<Option<Vec<(String, Tensor)>>> = const { RefCell::new(None) };
}

/// Record `t` as the trace point `name` when a traced check is running the port on this thread;
/// otherwise do nothing.
pub fn tap(name: impl AsRef<str>, t: &Tensor) {
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

/// The prefix of trace leaves.
pub const PREFIX: &str = "trace.";

/// Leaf names for the taps: `trace.<name>`, a name tapped again `<name>#2` (as the worker names a
/// module called twice).
pub(crate) fn leaf_names(taps: &[(String, Tensor)]) -> Vec<String> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    taps.iter()
        .map(|(name, _)| {
            let count = match seen.iter_mut().find(|(n, _)| n == name) {
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
}
