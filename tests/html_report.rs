//! The HTML report (`golden report`), rendered by a real headless Chromium (Debian's `chromium`;
//! `cargo xtask setup` installs it where it can): from the results of three checks run here in
//! replay — one passing, a traced model failing at block 2, a wrong port — the page must render
//! offline, name the first divergence, draw the drift plot and fill the slice viewer, and its
//! screenshot must show the pass and fail badges and the plot.

mod common;

use candle_core::Module;
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

/// Run the three checks with results and artifacts in `target`; returns the results folder.
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
    golden::check(&passing, &port).unwrap_or_else(|f| panic!("{f}"));
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
    assert!(
        dom.contains("<title>golden report: 3 checks, 2 failing</title>"),
        "{dom:.2000}"
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
    let dots = |class: &str| {
        dom.split(&format!("<circle class=\"{class}\" data-i=\""))
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

    // The screenshot: the badges' colours and the drift line's are on it.
    let shot = target.join("report.png");
    let out = headless(
        &page,
        &[
            "--window-size=1280,2600",
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
    assert_eq!((info.width, info.height), (1280, 2600));
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
    if std::env::var_os("GOLDEN_KEEP_REPORT").is_none() {
        let _ = std::fs::remove_dir_all(&target);
    }
}
