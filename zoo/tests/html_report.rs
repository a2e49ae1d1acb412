//! The HTML report (`golden report`), rendered by a real headless Chromium (Debian's `chromium`;
//! `cargo xtask setup` installs it where it can): from the results of checks run here in replay —
//! one passing, a traced model failing at block 2, a wrong port, a training — and of a traced
//! model timed live beside its reference, its block 2 deliberately slow, the page must render
//! offline, name the first divergence, draw the drift plot and fill the slice viewer, show the
//! training's losses and parity, the speed column and the chart of where the time goes (block 2's
//! MLP marked), and keep an earlier run's result of a removed check apart as stale; its
//! screenshots must show the pass and fail badges, the plot and the chart's bars.

mod common;

use candle_core::Module;
use golden::internal::describe::env::Mode;
use golden::{IntoOutputs, PortInputs};
use golden_zoo::model::TinyLm;
use std::path::{Path, PathBuf};
use std::process::Command;

fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| {
            ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name))
        })
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the HTML report's test needs a headless Chromium: install Debian's `chromium` \
                 (apt-get install chromium; `cargo xtask setup` does it when run as root)"
            )
        })
}

fn headless(page: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg("--user-data-dir=".to_string() + &page.with_extension("profile").to_string_lossy())
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs")
}

/// Run the checks with results and artifacts in `target`; returns the results folder. An earlier
/// run (`GOLDEN_RUN=earlier`) leaves the result of a check the last run no longer has, and one of
/// a check the last run runs again; the last run has four checks, one of them a training.
fn run_checks(target: &Path) -> PathBuf {
    // The runtime writes results and artifacts under CARGO_TARGET_DIR; this binary runs one test.
    std::env::set_var("CARGO_TARGET_DIR", target);
    std::env::set_var("GOLDEN_MODE", "replay");
    let scratch = common::Scratch::new("html_report");
    let passing = common::declared_with_store(&common::tiny_lm::untraced_block_layer(), &scratch);
    let port = |i: &PortInputs| {
        golden_zoo::blocks::TransformerBlock::new(i.var_builder(), 32, 4, 64)
            .and_then(|b| b.forward(i.tensor(0)))
            .into_outputs()
    };
    std::env::set_var("GOLDEN_RUN", "earlier");
    golden::check(&passing, &port).unwrap_or_else(|f| panic!("{f}"));
    // A check since removed (it fails: its store was never recorded).
    let removed = golden::Layer::function("html_removed_check", "zoo_ref.gelu")
        .dim("n", 1, 8)
        .arg("x", ["n"], golden::Dist::default());
    common::must_fail(&removed, |i| i.tensor(0).gelu_erf());
    std::env::set_var("GOLDEN_RUN", "latest");
    golden::check(&passing, &port).unwrap_or_else(|f| panic!("{f}"));
    let training = common::overfit_mlp::mlp_layer(
        "o_mlp_sgd_right",
        common::overfit_mlp::custom(common::overfit_mlp::sgd_step(1.0, None)),
    );
    common::must_pass_check(golden::internal::run::overfit::check, &training, |i| {
        common::overfit_mlp::mlp(i.var_builder(), i.tensor(0), false)
    });
    // A traced model timed beside its reference (live: a store holds no timings), its block 2
    // deliberately slow (`tests/speed.rs`): the report's chart of where the time goes.
    common::must_pass(
        &common::tiny_lm::layer("t_tiny_lm_timed").mode(Mode::Live),
        |i| {
            TinyLm::new(i.var_builder(), common::tiny_lm::CONFIG)?
                .with_copies_in_block(2, 6000)
                .forward(i.tensor(0))
        },
    );
    common::must_fail(&common::tiny_lm::layer("t_tiny_lm_block2"), |i| {
        TinyLm::new(i.var_builder(), common::tiny_lm::CONFIG)?
            .with_bug_in_block(2)
            .forward(i.tensor(0))
    });
    let gelu = golden::Layer::function("gelu_doubled", "zoo_ref.gelu")
        .dim("n", 1, 64)
        .arg("x", ["n"], golden::Dist::default());
    common::must_fail(&gelu, |i| i.tensor(0).gelu_erf()? * 2.0);
    target.join("golden").join("results")
}

#[test]
fn the_report_renders_in_headless_chromium() {
    let target = std::env::temp_dir().join(format!("golden-html-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);
    let results = run_checks(&target);
    let page = target.join("report.html");
    golden_cli::report::run(Some(results), Some(page.clone())).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "the page must work offline"
    );

    // The DOM after the script ran.
    let dom = headless(&page, &["--virtual-time-budget=5000", "--dump-dom"]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    // What the script rendered: everything before the scripts themselves (whose source contains
    // the same markup as templates).
    let dom = &dom[..dom.find("<script").expect("the page's scripts")];
    // The last run's four checks; the removed check's result is stale, apart, counted nowhere.
    assert!(
        dom.contains(
            "<title>golden report: 5 checks, 2 failing; 1 stale from earlier runs</title>"
        ),
        "{dom:.2000}"
    );
    let last = &dom[..dom
        .find("Older results, not from the last run")
        .expect("stale part")];
    let stale = &dom[dom.find("Older results, not from the last run").unwrap()..];
    let table_end = |t: &str| t[..t.find("</table>").unwrap()].to_string();
    let (last, stale) = (table_end(last), table_end(stale));
    assert!(!last.contains("html_removed_check"), "{last}");
    assert!(
        stale.contains(
            "<span class=\"badge stale\">stale</span> <span class=\"muted\">(failed)</span>"
        ) && stale.contains("<code>html_removed_check</code>")
            && stale.contains(" s older than the last run</td>"),
        "{stale}"
    );
    // The check both runs ran is the last run's.
    assert!(last.contains("<code>t_untraced_block</code>"), "{last}");
    assert!(!stale.contains("t_untraced_block"), "{stale}");
    // The training's row: its losses and its parity with PyTorch, not `0 / 0`.
    let training = &last[last
        .find("<code>o_mlp_sgd_right__overfit</code>")
        .expect(&last)..];
    let training = &training[..training.find("</tr>").unwrap()];
    assert!(
        training.contains("<td class=\"num\">1 batch</td><td class=\"num\">loss "),
        "{training}"
    );
    let worst: f64 = training
        .split("<td class=\"num\">")
        .nth(3)
        .and_then(|cell| cell.split('<').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no worst/allowed figure: {training}"));
    assert!(worst > 0.0 && worst < 1.0, "{training}");
    assert!(
        dom.contains("<h3>Training on one batch, beside PyTorch</h3>"),
        "{dom:.3000}"
    );
    assert!(
        dom.contains("data-rendered=\"1\""),
        "the script did not finish: {dom:.2000}"
    );
    assert!(
        dom.contains(
            "39 reference points, 31 tapped by the port; <span class=\"point diverged\">\
             first divergence: blocks.2.attn.proj (tapped point 18 of 31)"
        ),
        "{dom:.3000}"
    );
    // The drift plot has a dot per reference point: 31 tapped, 8 not (hollow, on the axis); the
    // slice viewer rows of both sides.
    // (In the failing model's section: the timed model passes with a trace of its own.)
    let failing = &dom[dom
        .find("t_tiny_lm_block2\"><h2>")
        .expect("the failing model's section")..];
    let failing = &failing[..failing.find("</section>").unwrap()];
    let dots = |class: &str| {
        failing
            .split(&format!("<circle class=\"{class}\" data-i=\""))
            .skip(1)
            .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            .count()
    };
    assert_eq!((dots("dot"), dots("dot untapped")), (31, 8));
    assert!(dom.contains("<pre class=\"ref\"><span"), "{dom:.3000}");
    assert!(
        dom.contains("class=\"off\""),
        "no element highlighted as differing"
    );
    assert!(dom.contains("not tapped"), "the untapped points say so");
    assert!(dom.contains("class=\"hist\""), "no error histogram");

    // Speed: the timed model's row has its port-over-reference ratio, the replayed checks their
    // port's time alone (a replay has no reference to time).
    let timed_row = &last[last.find("<code>t_tiny_lm_timed</code>").expect(&last)..];
    let timed_row = &timed_row[..timed_row.find("</tr>").unwrap()];
    assert!(
        timed_row.contains("<td class=\"num speed\"><span>") && timed_row.contains("×</span>"),
        "{timed_row}"
    );
    let replayed_row = &last[last.find("<code>t_untraced_block</code>").unwrap()..];
    assert!(
        replayed_row[..replayed_row.find("</tr>").unwrap()].contains("(port only)"),
        "{replayed_row}"
    );
    // Its chart: a pair of bars per point both sides have, block 2's MLP in red.
    assert!(
        dom.contains("<h3>Where the time goes, layer by layer (f32)</h3>"),
        "{dom:.3000}"
    );
    let chart = &dom[dom
        .find("<svg class=\"speed-chart\"")
        .expect("a speed chart")..];
    let chart = &chart[..chart.find("</svg>").unwrap()];
    let points = chart.matches("<g class=\"speed-point\"").count();
    assert_eq!(
        (
            points,
            chart.matches("class=\"port-bar\"").count(),
            chart.matches("class=\"reference-bar\"").count()
        ),
        (31, 31, 31),
        "{chart}"
    );
    let mlp = &chart[chart.find("data-point=\"blocks.2.mlp\"").expect(chart)..];
    let mlp = &mlp[..mlp.find("</g>").unwrap()];
    assert!(
        mlp.contains("class=\"speed-ratio hot\""),
        "block 2's MLP is not marked: {mlp}"
    );
    assert!(
        dom.contains("<h3>Speed beside the reference</h3>"),
        "{dom:.3000}"
    );

    // The screenshot: the badges' colours and the drift line's are on it.
    let shot = target.join("report.png");
    let out = headless(
        &page,
        &[
            "--window-size=1280,3000",
            "--virtual-time-budget=5000",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    assert!(
        shot.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::fs::File::open(&shot).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1280, 3000));
    let channels = info.color_type.samples();
    let count = |rgb: [u8; 3]| {
        buf[..info.buffer_size()]
            .chunks(channels)
            .filter(|p| p[..3] == rgb)
            .count()
    };
    let pass = count([0x1a, 0x7f, 0x37]);
    let fail = count([0xcf, 0x22, 0x2e]);
    let line = count([0x09, 0x69, 0xda]);
    let white = count([0xff, 0xff, 0xff]);
    let total = (info.width * info.height) as usize;
    assert!(pass > 300, "pass-badge green: {pass} pixels");
    assert!(fail > 600, "fail-badge red: {fail} pixels");
    assert!(line > 200, "drift-line blue: {line} pixels");
    assert!(white < total * 95 / 100, "the page is nearly blank");
    // The whole page, tall enough for the timed model's chart: its bars are on it, the
    // reference's in their own colour.
    let tall = target.join("report-tall.png");
    headless(
        &page,
        &[
            "--window-size=1280,7000",
            "--virtual-time-budget=5000",
            &format!("--screenshot={}", tall.display()),
        ],
    );
    let decoder = png::Decoder::new(std::fs::File::open(&tall).expect("the tall screenshot"));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let reference_bars = buf[..info.buffer_size()]
        .chunks(channels)
        .filter(|p| p[..3] == [0x82, 0x50, 0xdf])
        .count();
    // Each bar is as wide as its side's time over the longest time, at least 1 pixel by 8: a
    // debug-built port many times slower than its reference leaves the reference's bars thin, so
    // the count asks for the legend's square (80 pixels) and at least four bars, not an area.
    assert!(
        reference_bars > 80 + 4 * 8,
        "reference-bar purple: {reference_bars} pixels"
    );
    if std::env::var_os("GOLDEN_KEEP_REPORT").is_none() {
        let _ = std::fs::remove_dir_all(&target);
    }
}
