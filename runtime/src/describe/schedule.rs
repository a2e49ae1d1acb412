//! Checks through time: a module driven through a *schedule* of calls instead of one forward.
//!
//! `decode(...)` on the attribute ([`Decode`]) says which input is a sequence (`input_ids`, or
//! hidden states for a submodule) and along which axis. Each case then draws, with its dims, a
//! schedule ([`Steps`]): the sequence split into chunks — a prefill of p tokens and one-token
//! decode steps, a chunked prefill (several tokens on a non-empty cache), or all at once — and,
//! where asked, a padding of the batch ([`Padding`]: left, right, one row of a single token) and a
//! number of tokens to generate greedily after the prompt. Both sides are driven through the same
//! schedule: the reference with its own cache (`golden_ref/schedule.py`), the port with the state
//! it keeps (`run/steps.rs`). Every step's outputs are compared, at every position, with the
//! reference's cached step and with its one-shot forward of the whole sequence.
//!
//! Shrinking makes a schedule simpler the way a person would: fewer and shorter steps (the
//! sequence's dim goes down, a decode becomes a shorter one), no padding, fewer generated tokens.
//! Around a sliding window (`window`, or the configuration's `sliding_window`), lengths and prefills
//! are drawn at w − 1, w, w + 1 and 2w + 1 often, so that the window is crossed in the prefill and
//! in the decode.

use crate::describe::rng::Rng;
use golden_files::{HostTensor, WireDType};
use proptest::prelude::*;
use std::fmt;

/// What `decode(...)` declares: how a check's module is driven through time.
#[derive(Clone, Debug, PartialEq)]
pub struct Decode {
    /// The argument that is a sequence, split into the schedule's chunks.
    pub over: String,
    /// Its sequence axis (1 for `[batch, seq, ...]`).
    pub axis: usize,
    /// Draw padded batches (left, right, one row of a single token) with their attention mask.
    pub padding: bool,
    /// Generate up to this many tokens greedily after the prompt (0: none), teacher-forced with
    /// the reference's tokens, then free-running.
    pub generate: usize,
    /// A sliding window: lengths and prefills are drawn around it.
    pub window: Option<usize>,
    /// Generate by sampling (`sample(...)`), as `generate(do_sample=True)` does, rather than
    /// greedily: the reference's draws take golden's uniforms (`describe/sampling.rs`), and the
    /// port's sampler is checked exactly or in distribution.
    pub sample: Option<crate::describe::sampling::Sampling>,
}

impl Decode {
    /// A schedule over `arg`'s axis 1, no padding, no generation.
    pub fn over(arg: &str) -> Self {
        Decode {
            over: arg.to_string(),
            axis: 1,
            padding: false,
            generate: 0,
            window: None,
            sample: None,
        }
    }
}

impl fmt::Display for Decode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "over {} (axis {})", self.over, self.axis)?;
        if self.padding {
            f.write_str(", padded batches")?;
        }
        if self.generate > 0 {
            write!(f, ", up to {} generated tokens", self.generate)?;
        }
        if let Some(w) = self.window {
            write!(f, ", lengths around the window {w}")?;
        }
        if let Some(sampling) = &self.sample {
            write!(f, ", {sampling}")?;
        }
        Ok(())
    }
}

/// What `steps(...)` declares: a step function (a sampler's step, a denoising step, a recurrent
/// cell) driven through a loop by golden on both sides. The loop has as many steps as the dim
/// `over` in the case, and each call gets the step's index (`step`); `carry` feeds an output of
/// each step back as an input of the next. An argument whose first axis is that dim (a sampler's
/// random numbers) is drawn once by golden for the whole loop and given whole to both sides at
/// every step, each taking its step's part: sampling is reproducible, and a port that takes
/// another step's numbers is caught. The port is compared teacher-forced (each step from the
/// reference's state: where a bug is) and free-running (from its own: the drift).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepLoop {
    /// The dim that counts the steps.
    pub over: String,
    /// `(argument, output leaf)`: the argument each step gets from the previous step's output.
    pub carry: Vec<(String, String)>,
}

impl fmt::Display for StepLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} steps", self.over)?;
        for (arg, leaf) in &self.carry {
            write!(f, ", {arg} carried from the step's {leaf}")?;
        }
        Ok(())
    }
}

/// A step loop resolved for a case: which arguments have an axis of steps first (drawn for the
/// whole loop), which are carried from which output leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopPlan {
    /// Indices of the arguments drawn for every step at once (first axis: the steps).
    pub per_step: Vec<usize>,
    /// `(argument index, output leaf)`.
    pub carry: Vec<(usize, String)>,
}

/// How a case's batch is padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Padding {
    /// Every row is the whole sequence.
    None,
    /// Rows shorter than the longest start with padding (what `generate` uses).
    Left,
    /// Rows shorter than the longest end with padding.
    Right,
    /// One row is a single token (left-padded), the others whole: a row whose keys are all masked
    /// but one.
    OneToken,
}

impl Padding {
    /// In shrinking order.
    pub const ALL: [Padding; 4] = [
        Padding::None,
        Padding::Left,
        Padding::Right,
        Padding::OneToken,
    ];

    /// Its name in `GOLDEN_CASE` and messages.
    pub fn token(self) -> &'static str {
        match self {
            Padding::None => "none",
            Padding::Left => "left",
            Padding::Right => "right",
            Padding::OneToken => "one-token",
        }
    }
}

/// One case's schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Steps {
    /// The prompt's chunks, in order; they sum to its length.
    pub chunks: Vec<usize>,
    /// How the batch is padded.
    pub padding: Padding,
    /// Tokens generated greedily after the prompt, one step each.
    pub generate: usize,
    /// A step loop (`steps(...)`): the chunks are its steps, one each.
    pub looped: bool,
}

impl Steps {
    /// Every step's length: the prompt's chunks, then one per generated token.
    pub fn lengths(&self) -> Vec<usize> {
        let mut all = self.chunks.clone();
        all.extend(std::iter::repeat_n(1, self.generate));
        all
    }

    /// The prompt's length.
    pub fn prompt(&self) -> usize {
        self.chunks.iter().sum()
    }

    /// The positions of step `k`: where it starts, and how many tokens it has.
    pub fn span(&self, k: usize) -> (usize, usize) {
        let lengths = self.lengths();
        (lengths[..k].iter().sum(), lengths[k])
    }

    /// What step `k` is, for messages: `the prefill of 4 tokens`, `the decode step at position 6`.
    pub fn describe(&self, k: usize) -> String {
        if self.looped {
            return format!("step {k} of {}", self.chunks.len());
        }
        let (start, len) = self.span(k);
        let prompt = self.prompt();
        if start >= prompt {
            return format!(
                "step {k}, generating the token at position {start} (teacher-forced with the \
                 reference's tokens)"
            );
        }
        let plural = if len == 1 { "" } else { "s" };
        if k == 0 {
            format!("step 0, the prefill of {len} token{plural}")
        } else if len == 1 {
            format!("step {k}, the decode step at position {start} (after {start} cached)")
        } else {
            format!(
                "step {k}, a chunk of {len} tokens at positions {start}..={} on a cache of {start}",
                start + len - 1
            )
        }
    }

    /// The `GOLDEN_CASE` part: `steps=3+1+1,pad=left,gen=2` (padding and generation only when
    /// there are).
    pub fn token(&self) -> String {
        let chunks: Vec<String> = self.chunks.iter().map(ToString::to_string).collect();
        let mut s = format!("steps={}", chunks.join("+"));
        if self.padding != Padding::None {
            s.push_str(&format!(",pad={}", self.padding.token()));
        }
        if self.generate > 0 {
            s.push_str(&format!(",gen={}", self.generate));
        }
        s
    }

    /// Read one `key=value` of [`Steps::token`] into `self`; `Ok(false)` for a key that is not
    /// the schedule's.
    pub fn parse_part(&mut self, key: &str, value: &str) -> Result<bool, String> {
        match key {
            "steps" => {
                self.chunks = value
                    .split('+')
                    .map(|c| match c.trim().parse::<usize>() {
                        Ok(n) if n > 0 => Ok(n),
                        _ => Err(format!(
                            "`steps={value}`: each chunk is a positive whole number (`4+1+1`)"
                        )),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "pad" => {
                self.padding = Padding::ALL
                    .into_iter()
                    .find(|p| p.token() == value.trim())
                    .ok_or_else(|| format!("`pad={value}`: one of none, left, right, one-token"))?;
            }
            "gen" => {
                self.generate = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("`gen={value}` is not a whole number"))?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The number of valid (not padding) tokens of each row of a `batch` × `len` prompt, derived
    /// from the case seed: the first row is whole (a batch is as long as its longest row).
    pub fn valid_lengths(&self, batch: usize, len: usize, seed: u64) -> Vec<usize> {
        let mut rng = Rng::new(seed, "golden.padding");
        (0..batch)
            .map(|row| match self.padding {
                Padding::None => len,
                Padding::OneToken if row + 1 == batch => 1,
                Padding::OneToken => len,
                Padding::Left | Padding::Right if row == 0 && batch > 1 => len,
                Padding::Left | Padding::Right => 1 + rng.below(len.max(1) as u64) as usize,
            })
            .collect()
    }

    /// The prompt's attention mask, `[batch, len]` i64 (1 valid, 0 padding), or `None` without
    /// padding.
    pub fn mask(&self, batch: usize, len: usize, seed: u64) -> Option<HostTensor> {
        if self.padding == Padding::None {
            return None;
        }
        let valid = self.valid_lengths(batch, len, seed);
        let right = self.padding == Padding::Right;
        let values: Vec<f64> = valid
            .iter()
            .flat_map(|&v| {
                (0..len).map(move |j| {
                    let ok = if right { j < v } else { j >= len - v };
                    if ok {
                        1.0
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let data: Vec<u8> = values
            .iter()
            .flat_map(|&v| (v as i64).to_le_bytes())
            .collect();
        Some(HostTensor {
            dtype: WireDType::I64,
            shape: vec![batch, len],
            data: data.into(),
        })
    }
}

impl fmt::Display for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.looped {
            return write!(f, "{} steps", self.chunks.len());
        }
        let chunks: Vec<String> = self.chunks.iter().map(ToString::to_string).collect();
        write!(f, "steps {}", chunks.join("+"))?;
        if self.generate > 0 {
            write!(f, " then {} generated", self.generate)?;
        }
        if self.padding != Padding::None {
            write!(f, ", padding {}", self.padding.token())?;
        }
        Ok(())
    }
}

/// One case's schedule, resolved against its inputs: what the worker and the port's driver get.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The index of the argument that is split.
    pub arg: usize,
    /// Its sequence axis.
    pub axis: usize,
    /// The steps.
    pub steps: Steps,
    /// The prompt's attention mask (`[batch, len]` i64, 1 valid), when the batch is padded.
    pub mask: Option<HostTensor>,
    /// The diagnosis: drive the reference with this porting mistake made in what the schedule
    /// gives it (`None` for the reference itself).
    pub mistake: Option<Mistake>,
    /// A step loop (`steps(...)`) rather than a decode.
    pub looped: Option<LoopPlan>,
    /// Sampled generation: its parameters and golden's uniforms.
    pub sample: Option<SamplePlan>,
}

/// A case's sampled generation: what the worker's `generate()` and the port's sampler get.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplePlan {
    /// The sampling parameters.
    pub sampling: crate::describe::sampling::Sampling,
    /// golden's uniforms, `[batch, generate]` f64 (`describe/sampling.rs`'s `uniforms`).
    pub uniforms: HostTensor,
    /// The probe's uniforms, `[PROBE_DRAWS]` f64.
    pub probe_uniforms: HostTensor,
}

/// Which of a step's positions an output holds along the sequence axis ([`Plan::holds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holds {
    /// Every position of the step, in order (the reference's own outputs, a port's alike).
    Step,
    /// The step's last position only (candle-transformers' models return the last position's
    /// logits): the axis has length 1 (`[b, 1, vocab]`), or is gone (`[b, vocab]`).
    Last,
}

impl Plan {
    /// Whether the reference's leaf of step `k`, of shape `reference`, holds the step's positions:
    /// its first axis is the batch and its sequence axis has the step's length — what the
    /// reference was given. The one rule by which padded positions are excluded from the
    /// comparison, on both sides: the worker zeroes the reference's leaves by it
    /// (`golden_ref/schedule.py`), and a port's outputs are zeroed at the positions the reference's
    /// leaf of the same name holds (`run/steps.rs`).
    pub(crate) fn positional(&self, k: usize, reference: &[usize]) -> bool {
        let (_, len) = self.steps.span(k);
        let batch = self.mask.as_ref().and_then(|m| m.shape.first().copied());
        reference.len() > self.axis
            && reference[self.axis] == len
            && batch.is_none_or(|b| reference.first() == Some(&b))
    }

    /// Which positions of step `k` a port's output of shape `port` holds, known from the
    /// reference's leaf of the same name (shape `reference`), never guessed from the port's own
    /// lengths: the same shape holds what the reference's holds; the reference's shape with the
    /// sequence axis 1 long, or without it, holds the last position. `None` where the reference's
    /// leaf holds no positions ([`Plan::positional`]) or the shapes do not align (the comparison
    /// says so).
    pub(crate) fn holds(&self, k: usize, reference: &[usize], port: &[usize]) -> Option<Holds> {
        if !self.positional(k, reference) {
            return None;
        }
        if port == reference {
            return Some(Holds::Step);
        }
        let mut one = reference.to_vec();
        one[self.axis] = 1;
        let mut without = reference.to_vec();
        without.remove(self.axis);
        (port == one.as_slice() || port == without.as_slice()).then_some(Holds::Last)
    }
}

/// A porting mistake in how a model is driven through time, made in the reference's driving so
/// that a failing port can be matched against it (the diagnosis of a schedule's failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mistake {
    /// Position ids restart at 0 in every call.
    PositionsRestart,
    /// Position ids `offset..offset + t` in a padded batch, not counted over valid tokens.
    PositionsUnpadded,
    /// The padding mask is not applied: padded keys are attended to.
    MaskUnpadded,
    /// Padding treated as tokens: no padding mask, and position ids counting the padding (a
    /// model driven as if the batch were not padded).
    PaddingIgnored,
    /// Every call sees only its own tokens: the cache is not read.
    NoCache,
    /// The sliding window keeps one key more.
    WindowWider,
    /// The sliding window keeps one key less.
    WindowNarrower,
    /// The sliding window is not applied to the cached keys: a cache never trimmed, no mask on a
    /// one-token step.
    WindowUncached,
    /// A step loop's per-step inputs (a sampler's random numbers) taken in reverse order.
    InputsReversed,
    /// A step loop's per-step inputs taken one step ahead (the last repeated).
    InputsAhead,
}

impl Mistake {
    /// Every mistake, in the order they are tried.
    pub const ALL: [Mistake; 10] = [
        Mistake::InputsReversed,
        Mistake::InputsAhead,
        Mistake::PositionsRestart,
        Mistake::NoCache,
        Mistake::PositionsUnpadded,
        Mistake::MaskUnpadded,
        Mistake::PaddingIgnored,
        Mistake::WindowWider,
        Mistake::WindowNarrower,
        Mistake::WindowUncached,
    ];

    /// Its name on the wire (`golden_ref/schedule.py`) and in store keys.
    pub fn token(self) -> &'static str {
        match self {
            Mistake::PositionsRestart => "positions-restart",
            Mistake::PositionsUnpadded => "positions-unpadded",
            Mistake::MaskUnpadded => "mask-unpadded",
            Mistake::PaddingIgnored => "padding-ignored",
            Mistake::NoCache => "no-cache",
            Mistake::WindowWider => "window-wider",
            Mistake::WindowNarrower => "window-narrower",
            Mistake::WindowUncached => "window-uncached",
            Mistake::InputsReversed => "inputs-reversed",
            Mistake::InputsAhead => "inputs-ahead",
        }
    }

    /// Whether the mistake can show in this case: positions after a first step, padding where the
    /// batch is padded, a window where there is one.
    pub fn applies(self, steps: &Steps, window: Option<usize>) -> bool {
        let several = steps.lengths().len() > 1;
        if steps.looped {
            return several && matches!(self, Mistake::InputsReversed | Mistake::InputsAhead);
        }
        match self {
            Mistake::InputsReversed | Mistake::InputsAhead => false,
            Mistake::PositionsRestart | Mistake::NoCache => several,
            Mistake::PositionsUnpadded | Mistake::MaskUnpadded | Mistake::PaddingIgnored => {
                steps.padding != Padding::None
            }
            Mistake::WindowWider => window.is_some(),
            Mistake::WindowNarrower => window.is_some_and(|w| w > 1),
            Mistake::WindowUncached => window.is_some() && several,
        }
    }

    /// What the mistaken reference does, what the right one does instead, and the fix in the
    /// port.
    pub fn explain(self, window: Option<usize>) -> (String, String, String) {
        let w = window.unwrap_or(0);
        let (what, instead, fix) = match self {
            Mistake::PositionsRestart => (
                "position ids that restart at 0 in every call".to_string(),
                "positions offset by the cache's length".to_string(),
                "rotate (or embed) the step's tokens at `step.offset()..` (`step.positions()`), \
                 not at 0.. — the rotary tables or position embeddings must advance with the cache"
                    .to_string(),
            ),
            Mistake::NoCache => (
                "no state kept between calls (no cache: every call sees only its own tokens)"
                    .to_string(),
                "each call continuing from the state the calls before it left".to_string(),
                "keep the state from one call to the next and use it: append each step's keys \
                 and values to the cache and attend over all of them (a streaming buffer: carry \
                 its last frames into the next call)"
                    .to_string(),
            ),
            Mistake::PositionsUnpadded => (
                "position ids `offset..offset + t` in every row, padding counted".to_string(),
                "positions counted over each row's valid tokens".to_string(),
                "take position ids from the attention mask (`step.positions()`: cumsum of the \
                 mask − 1), as `generate` does for a padded batch"
                    .to_string(),
            ),
            Mistake::MaskUnpadded => (
                "no padding mask: padded keys are attended to".to_string(),
                "padded keys masked out".to_string(),
                "mask the keys where `step.attention_mask()` is 0, in every call".to_string(),
            ),
            Mistake::PaddingIgnored => (
                "the padding treated as tokens: no padding mask, and position ids counting the \
                 padding"
                    .to_string(),
                "padded keys masked out, positions counted over each row's valid tokens"
                    .to_string(),
                "mask the keys where `step.attention_mask()` is 0, in every call (a model that \
                 takes no mask cannot be given a padded batch: candle-transformers' Mistral and \
                 Gemma take one through `forward_embeds`); position ids from `step.positions()`, \
                 or for rotary positions `step.offset()` once the padding is masked (rotary \
                 attention depends on positions' differences only)"
                    .to_string(),
            ),
            Mistake::WindowWider => (
                format!("a sliding window of {} keys", w + 1),
                format!("{w} keys: key j is seen by query i when j > i − {w}"),
                format!("keep keys j with i − {w} < j ≤ i (`j > i - w`, not `j >= i - w`)"),
            ),
            Mistake::WindowNarrower => (
                format!("a sliding window of {} keys", w.saturating_sub(1)),
                format!("{w} keys: key j is seen by query i when j > i − {w}"),
                format!("keep keys j with i − {w} < j ≤ i (`j > i - w`, not `j > i - w + 1`)"),
            ),
            Mistake::InputsReversed => (
                "its per-step inputs (random numbers) taken in reverse order".to_string(),
                "step k taking the k-th".to_string(),
                "take step k's inputs at index k of their first axis, counting up from 0 (a \
                 sampler's timesteps run down, its random numbers do not)"
                    .to_string(),
            ),
            Mistake::InputsAhead => (
                "its per-step inputs taken one step ahead".to_string(),
                "step k taking the k-th".to_string(),
                "take step k's inputs at index k, not k + 1 (the random numbers drawn for a step \
                 are used in that step)"
                    .to_string(),
            ),
            Mistake::WindowUncached => (
                "a sliding window that is not applied to the cached keys".to_string(),
                format!("every call seeing only the last {w} positions"),
                format!(
                    "apply the window to the cache as well: mask cached keys j ≤ i − {w} in every \
                     call, a one-token step included (or trim the cache to its last {} \
                     positions)",
                    w.saturating_sub(1)
                ),
            ),
        };
        (what, instead, fix)
    }
}

/// Whether a leaf is a step's output compared with the reference's one-shot forward
/// (`oneshot.<k>.<rest>`): a copy of the port's cached step, not an output of its own.
pub fn is_oneshot(name: &str) -> bool {
    name.starts_with("oneshot.")
}

/// A step's leaf `step.<k>.<rest>` (compared with the one-shot forward, `oneshot.<k>.<rest>`; a
/// step loop's free-running step, `free.<k>.<rest>`): `k` and `rest`.
pub fn step_of(name: &str) -> Option<(usize, &str)> {
    let rest = name
        .strip_prefix("step.")
        .or_else(|| name.strip_prefix("oneshot."))
        .or_else(|| name.strip_prefix("free."))?;
    let (k, rest) = rest.split_once('.')?;
    Some((k.parse().ok()?, rest))
}

/// How a port's steps are fed (`run/steps.rs`).
#[derive(Clone, Debug)]
pub(crate) struct PortSchedule {
    /// The case's schedule.
    pub(crate) plan: Plan,
    /// The reference's generated tokens, `[batch, generate]` i64: fed to the port after the
    /// prompt (teacher forcing). `None` on the free-running pass: the port's own greedy tokens.
    pub(crate) forced: Option<HostTensor>,
    /// The step running now, for a message about a port that did not return.
    pub(crate) at: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The shapes of the reference's step leaves (`step.<k>.<leaf>`): which positions each of the
    /// port's outputs holds is read from them ([`Plan::holds`]).
    pub(crate) reference_shapes: Vec<(String, Vec<usize>)>,
    /// Draws asked of the port's sampler instead of its steps (`run/sampling.rs`): the port is
    /// built, its sampler given each job, and its tokens returned (`draw.<i>`, and `took.<i>`: 1
    /// where the sampler took golden's uniform).
    pub(crate) draws: Option<std::sync::Arc<Vec<crate::describe::sampling::DrawJob>>>,
}

/// The kinds of schedule, in shrinking order.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A prefill, then one-token steps.
    Decode,
    /// A prefill, then chunks of several tokens on the cache.
    Chunked,
    /// The whole prompt in one call.
    OneShot,
}

/// The strategy of a case's schedule for a prompt of `len` tokens.
pub(crate) fn strategy(decode: &Decode, len: usize) -> BoxedStrategy<Steps> {
    let len = len.max(1);
    let kind = prop_oneof![
        5 => Just(Kind::Decode),
        3 => Just(Kind::Chunked),
        1 => Just(Kind::OneShot),
    ];
    // Around a window, the prefill ends just before, at and just after it often.
    let near: Vec<usize> = decode
        .window
        .map(|w| [w.saturating_sub(1), w, w + 1])
        .into_iter()
        .flatten()
        .filter(|&p| (1..=len).contains(&p))
        .collect();
    // A prefill leaves at least one step after it (the whole prompt at once is `OneShot`).
    let last = (len - 1).max(1);
    let near: Vec<usize> = near.into_iter().filter(|&p| p <= last).collect();
    let prefill = if near.is_empty() {
        (1..=last).boxed()
    } else {
        prop_oneof![1 => 1..=last, 1 => proptest::sample::select(near)].boxed()
    };
    let padding = if decode.padding {
        prop_oneof![
            3 => Just(Padding::None),
            3 => Just(Padding::Left),
            1 => Just(Padding::Right),
            1 => Just(Padding::OneToken),
        ]
        .boxed()
    } else {
        Just(Padding::None).boxed()
    };
    let generate = if decode.generate > 0 {
        (1..=decode.generate).boxed()
    } else {
        Just(0).boxed()
    };
    (kind, prefill, 2usize..=4, padding, generate)
        .prop_map(move |(kind, prefill, chunk, padding, generate)| {
            let chunks = match kind {
                Kind::OneShot => vec![len],
                Kind::Decode => {
                    let mut c = vec![prefill];
                    c.extend(std::iter::repeat_n(1, len - prefill));
                    c
                }
                Kind::Chunked => {
                    let mut c = vec![prefill];
                    let mut left = len - prefill;
                    while left > 0 {
                        let n = chunk.min(left);
                        c.push(n);
                        left -= n;
                    }
                    c
                }
            };
            // Generating after right padding would continue a row from its padding: generate
            // pads on the left, and so does golden.
            let generate = if padding == Padding::Right {
                0
            } else {
                generate
            };
            Steps {
                chunks,
                padding,
                generate,
                looped: false,
            }
        })
        .boxed()
}

/// Values of the sequence's dim drawn more often around a window `w`: w − 1, w, w + 1, 2w + 1.
pub(crate) fn window_lengths(w: usize, lo: usize, hi: usize) -> Vec<usize> {
    [w.saturating_sub(1), w, w + 1, 2 * w + 1]
        .into_iter()
        .filter(|n| (lo..=hi).contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn a_token_round_trips_and_bad_parts_are_named() {
        let steps = Steps {
            chunks: vec![3, 1, 1],
            padding: Padding::Left,
            generate: 2,
            looped: false,
        };
        assert_eq!(steps.token(), "steps=3+1+1,pad=left,gen=2");
        let mut parsed = Steps {
            chunks: Vec::new(),
            padding: Padding::None,
            generate: 0,
            looped: false,
        };
        for part in steps.token().split(',') {
            let (k, v) = part.split_once('=').unwrap();
            assert!(parsed.parse_part(k, v).unwrap());
        }
        assert_eq!(parsed, steps);
        assert!(parsed.parse_part("steps", "3+0").is_err());
        assert!(parsed.parse_part("pad", "middle").is_err());
        assert!(!parsed.parse_part("b", "2").unwrap());
    }

    #[test]
    fn masks_pad_the_short_rows_on_their_side() {
        let mut steps = Steps {
            chunks: vec![5],
            padding: Padding::OneToken,
            generate: 0,
            looped: false,
        };
        let mask = steps.mask(2, 5, 7).unwrap().to_i64();
        assert_eq!(mask, vec![1, 1, 1, 1, 1, 0, 0, 0, 0, 1]);
        steps.padding = Padding::Right;
        let valid = steps.valid_lengths(3, 5, 7);
        let mask = steps.mask(3, 5, 7).unwrap().to_i64();
        for (row, v) in valid.iter().enumerate() {
            let row = &mask[row * 5..(row + 1) * 5];
            assert_eq!(row.iter().sum::<i64>() as usize, *v);
            assert!(row[..*v].iter().all(|&m| m == 1), "{row:?}");
        }
        assert_eq!(valid[0], 5);
        steps.padding = Padding::None;
        assert!(steps.mask(2, 5, 7).is_none());
    }

    #[test]
    fn schedules_cover_the_prompt_and_shrink_to_a_short_decode() {
        let decode = Decode {
            padding: true,
            generate: 3,
            ..Decode::over("ids")
        };
        let mut runner = TestRunner::deterministic();
        for _ in 0..200 {
            let steps = strategy(&decode, 7)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            assert_eq!(steps.prompt(), 7, "{steps}");
            assert!(steps.chunks.iter().all(|&c| c > 0));
            if steps.padding == Padding::Right {
                assert_eq!(steps.generate, 0);
            }
        }
        let mut tree = strategy(&decode, 7).new_tree(&mut runner).unwrap();
        while tree.simplify() {}
        let simplest = tree.current();
        assert_eq!(simplest.padding, Padding::None);
        assert_eq!(simplest.generate, 1);
        assert_eq!(simplest.chunks[0], 1, "{simplest}");
    }

    #[test]
    fn an_output_holds_the_positions_the_reference_s_leaf_of_its_name_holds() {
        let steps = Steps {
            chunks: vec![3, 1],
            padding: Padding::Left,
            generate: 0,
            looped: false,
        };
        let plan = Plan {
            arg: 0,
            axis: 1,
            mask: steps.mask(2, 4, 7),
            steps,
            mistake: None,
            looped: None,
            sample: None,
        };
        // The prefill of 3: the reference's logits [2, 3, 32].
        assert_eq!(plan.holds(0, &[2, 3, 32], &[2, 3, 32]), Some(Holds::Step));
        assert_eq!(plan.holds(0, &[2, 3, 32], &[2, 1, 32]), Some(Holds::Last));
        assert_eq!(plan.holds(0, &[2, 3, 32], &[2, 32]), Some(Holds::Last));
        assert_eq!(plan.holds(0, &[2, 3, 32], &[2, 3, 16]), None);
        // A decode step of 1: the same shape holds its one position, whatever the port's lengths.
        assert_eq!(plan.holds(1, &[2, 1, 32], &[2, 1, 32]), Some(Holds::Step));
        assert_eq!(plan.holds(1, &[2, 1, 32], &[2, 32]), Some(Holds::Last));
        // A leaf of the reference that holds no positions (its axis is not the step's length, or
        // its first is not the batch): nothing of the port's is taken for positions.
        assert_eq!(plan.holds(0, &[2, 4, 3], &[2, 4, 3]), None);
        assert_eq!(plan.holds(0, &[3, 3], &[3, 3]), None);
    }

    #[test]
    fn steps_are_described_by_what_they_do() {
        let steps = Steps {
            chunks: vec![4, 1, 3],
            padding: Padding::None,
            generate: 1,
            looped: false,
        };
        assert_eq!(steps.describe(0), "step 0, the prefill of 4 tokens");
        assert_eq!(
            steps.describe(1),
            "step 1, the decode step at position 4 (after 4 cached)"
        );
        assert!(steps
            .describe(2)
            .contains("a chunk of 3 tokens at positions 5..=7"));
        assert!(steps
            .describe(3)
            .contains("generating the token at position 8"));
        assert_eq!(window_lengths(4, 2, 8), vec![3, 4, 5]);
    }
}
