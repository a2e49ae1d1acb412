//! How fast the port is beside its reference (`run/speed.rs`): a deliberately slow port — the
//! zoo's TinyLM whose block 2 makes copies nothing needs, its numbers right — shows in block 2, and
//! in block 2's MLP, not elsewhere; a port beyond its `speed(max = x)` fails with a speed failure
//! of its own, told apart from the numbers. Live: the reference's time needs PyTorch (a golden
//! store holds no timings), and a check in live mode fails where it cannot reach it.
//!
//! The assertions are on ratios relative to each other (a block against its siblings, each beside
//! the reference's same block), never on seconds: shared machines are noisy.

mod common;

use candle_core::{Module, Tensor};
use golden::internal::describe::env::Mode;
use golden::internal::judge::speed::{Point, Speed};
use golden::{DimExpr, Dist, FailureKind, Layer};
use golden_zoo::model::TinyLm;

use common::tiny_lm::{layer, CONFIG};

/// The tests of this file run one at a time: the cases of one check (a Python worker, the port)
/// would otherwise load the machine while another is timed.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copies of block 2's hidden activations in the slow model. One copy of a tiny model's
/// activations costs a fraction of a microsecond, which no shared machine's noise lets through:
/// the mistake is repeated until block 2 takes a few times its siblings' time (about 2 ms more
/// in a debug build, where a block takes about 1 ms).
const COPIES: usize = 6000;

fn point<'a>(speed: &'a Speed, name: &str) -> &'a Point {
    speed
        .points
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no point `{name}` in {:#?}", speed.points))
}

fn ratio(speed: &Speed, name: &str) -> f64 {
    point(speed, name)
        .ratio()
        .unwrap_or_else(|| panic!("`{name}` has no ratio"))
        .median
}

/// Each block's ratio (port over reference), and block `i`'s over the median of the others'.
fn blocks(speed: &Speed, i: usize) -> (Vec<f64>, f64) {
    let ratios: Vec<f64> = (0..CONFIG.n_layers)
        .map(|k| ratio(speed, &format!("blocks.{k}")))
        .collect();
    let mut others: Vec<f64> = (0..ratios.len())
        .filter(|&k| k != i)
        .map(|k| ratios[k])
        .collect();
    others.sort_by(f64::total_cmp);
    let median = others[others.len() / 2];
    (ratios.clone(), ratios[i] / median)
}

#[test]
fn a_slow_block_shows_where_it_is() {
    let _alone = alone();
    let slow = common::must_pass(&layer("t_tiny_lm_slow_block2").mode(Mode::Live), |i| {
        TinyLm::new(i.var_builder(), CONFIG)?
            .with_copies_in_block(2, COPIES)
            .forward(i.tensor(0))
    });
    let speed = &slow.speed[0];
    // Every layer of the model and the points inside them are timed on both sides.
    assert!(speed.reference.is_some(), "{speed:#?}");
    for name in [
        "tok",
        "blocks.0",
        "blocks.2.attn",
        "blocks.2.mlp",
        "ln_f",
        "head",
    ] {
        point(speed, name);
    }
    assert_eq!(point(speed, "blocks.2").depth, 0);
    assert_eq!(point(speed, "blocks.2.mlp").depth, 1);
    assert_eq!(point(speed, "blocks.2.attn.proj").depth, 2);

    // Block 2 stands out among the blocks, each beside the reference's same block.
    let (ratios, outstanding) = blocks(speed, 2);
    assert!(
        outstanding > 2.0,
        "block 2 is {outstanding:.2}× the other blocks' ratio: {ratios:?}"
    );
    // Inside block 2, its MLP is where the time goes.
    let inside: Vec<(&str, f64)> = speed
        .points
        .iter()
        .filter(|p| p.name.starts_with("blocks.2.") && p.depth == 1)
        .map(|p| (p.name.as_str(), p.ratio().map_or(0.0, |r| r.median)))
        .collect();
    let worst = inside
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("points inside block 2");
    assert_eq!(worst.0, "blocks.2.mlp", "{inside:?}");
    assert!(
        ratio(speed, "blocks.2.mlp") > 2.0 * ratio(speed, "blocks.1.mlp"),
        "{inside:?}"
    );

    // The same model without the copies: no block stands out.
    let right = common::must_pass(&layer("t_tiny_lm_right").mode(Mode::Live), |i| {
        TinyLm::new(i.var_builder(), CONFIG)?.forward(i.tensor(0))
    });
    let (ratios, outstanding) = blocks(&right.speed[0], 2);
    assert!(
        outstanding < 2.0,
        "block 2 of the right port is {outstanding:.2}× the others' ratio: {ratios:?}"
    );
}

/// A pull request's summary against its base (`golden report --markdown --base`): the base a run
/// of the right model, the head a run of the slow one, each its results file. The slow block is
/// listed apart from the numbers' changes, the most moved first, and fails nothing.
#[test]
fn a_pull_request_sees_the_slow_block_against_its_base() {
    let _alone = alone();
    let layer = layer("t_tiny_lm_pr").mode(Mode::Live);
    let scratch = common::Scratch::new("speed-pr");
    let file = golden::internal::report::results::results_dir(&common::declared_with_store(
        &layer, &scratch,
    ))
    .expect("a results folder")
    .join("t_tiny_lm_pr.json");
    let keep = |run: &str| {
        let to = scratch.dir.join(run);
        std::fs::create_dir_all(to.join("speed")).unwrap();
        std::fs::copy(&file, to.join("speed").join("t_tiny_lm_pr.json")).unwrap();
        to
    };
    common::must_pass(&layer, |i| {
        TinyLm::new(i.var_builder(), CONFIG)?.forward(i.tensor(0))
    });
    let base = keep("base");
    common::must_pass(&layer, |i| {
        TinyLm::new(i.var_builder(), CONFIG)?
            .with_copies_in_block(2, COPIES)
            .forward(i.tensor(0))
    });
    let head = keep("head");
    let summary = golden_cli::summary::Summary::build(&head, Some(&base)).unwrap();
    let markdown = summary.markdown(golden_cli::summary::GITHUB_LIMIT);
    println!("{markdown}");
    // Not a failure, nor a change of the check (its snapshot, written by no run here, is the
    // summary's only other finding).
    assert!(
        markdown.starts_with("### ❌ golden: 1 of 1 check passed\n")
            && markdown.contains("**1 passed · 0 failed**")
            && markdown.contains(": 0 checks changed")
            && markdown.contains("#### Snapshots not accepted"),
        "{markdown}"
    );
    let table = &markdown[markdown
        .find("#### Speed against the base")
        .unwrap_or_else(|| panic!("no speed section:\n{markdown}"))..];
    let first = table
        .lines()
        .find(|l| l.starts_with("| `t_tiny_lm_pr` |"))
        .expect("a moved figure");
    assert!(
        (first.contains("| `blocks.2.mlp` |") || first.contains("| `blocks.2` |"))
            && first.ends_with("slower** |"),
        "the most moved figure is block 2's: {first}"
    );
}

/// The zoo's exact GELU, in the function form.
fn gelu_layer(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.gelu")
        .dim("b", 1, 2)
        .dim("n", 1, 64)
        .arg(
            "x",
            [DimExpr::Sym("b".into()), DimExpr::Sym("n".into())],
            Dist::default(),
        )
        .cases(2)
        .speed_max(50.0)
        .mode(Mode::Live)
}

#[test]
fn a_port_beyond_its_speed_limit_fails_apart_from_the_numbers() {
    let _alone = alone();
    // Right, and within its limit.
    let report = common::must_pass(&gelu_layer("t_gelu_within_limit"), |i| {
        i.tensor(0).gelu_erf()
    });
    assert_eq!(report.speed.len(), 1);

    // Right, and slow: a fifth of a second per call, where the reference takes microseconds.
    let slow = |i: &golden::PortInputs| -> candle_core::Result<Tensor> {
        std::thread::sleep(std::time::Duration::from_millis(200));
        i.tensor(0).gelu_erf()
    };
    let failure = common::must_fail(&gelu_layer("t_gelu_beyond_limit"), slow);
    let FailureKind::Speed(too_slow) = &failure.kind else {
        panic!("not a speed failure: {failure}");
    };
    assert_eq!(too_slow.max, 50.0);
    assert!(too_slow.speed.ratio().unwrap().lo > 50.0);
    let message = failure.to_string();
    println!("{message}");
    let headline = message.lines().next().unwrap();
    assert!(
        headline.starts_with(
            "golden: `t_gelu_beyond_limit` is slower than its speed limit allows: it takes"
        ) && headline.ends_with(
            "the time of its reference `zoo_ref.gelu` in f32; `speed(max = 50)` allows 50×"
        ),
        "{message}"
    );
    for line in [
        "  case: ",
        "  the numbers match: 2 cases passed in f32; this failure is the port's speed alone",
        "  the port: ",
        "  the runs agree: the port's lower quartile is",
        "  fix: profile the port where it is furthest behind the reference",
        "  re-run the check on this case: GOLDEN_CASE='",
    ] {
        assert!(message.contains(line), "no `{line}` in:\n{message}");
    }
    assert!(
        failure
            .likely_cause()
            .is_some_and(|c| c.starts_with("the port takes")),
        "{:?}",
        failure.likely_cause()
    );
}
