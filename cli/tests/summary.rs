//! `golden report --markdown`: the pull-request summary rendered as GitHub renders it (a
//! CommonMark renderer with GitHub's tables), from results and a base whose every piece of data
//! is hostile — markup, links, images, emphasis, code spans of odd backtick counts, newlines and
//! pipes in names, failure messages, paths and the base's snapshot text. Data is shown as text:
//! no element of the rendered summary comes from it. And what the summary says against a base:
//! failures that got worse are changes, the tag of a failure says what the base says of it, and a
//! snapshot folder is read as one whatever else it holds.

mod common;

use common::Dir;
use golden_cli::summary::{Summary, GITHUB_LIMIT};
use pulldown_cmark::{Event, Options, Parser, Tag};
use serde_json::json;
use std::path::Path;

/// A results file as the runtime writes it (`target/golden/results/<crate>/<check>.json`).
fn result(results: &Path, krate: &str, doc: serde_json::Value) {
    let dir = results.join(krate);
    std::fs::create_dir_all(&dir).unwrap();
    let name = doc["check"].as_str().unwrap().replace(['/', '\n'], "_");
    let mut doc = doc;
    doc["run"] = json!("run-1");
    doc["written_ms"] = json!(1);
    std::fs::write(
        dir.join(format!(
            "{}.json",
            name.chars().take(40).collect::<String>()
        )),
        doc.to_string(),
    )
    .unwrap();
}

/// A snapshot as insta writes it.
fn snap(dir: &Path, name: &str, body: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.snap")),
        format!("---\nsource: tests/x.rs\nexpression: report\n---\n{body}"),
    )
    .unwrap();
}

fn snapshot_text(layer: &str, reference: &str, ratio: f64) -> String {
    format!(
        "layer: {layer}\nreference: {reference}\ncases: 32 per dtype, seed 0\nf32:\n  out f32 [b, t, d]\n    tolerance: golden default\n    max |port - ref|: 1e-6, worst element {ratio}× allowed\n"
    )
}

/// The rendered summary: its events, with the tags open around each.
struct Rendered {
    /// (the event, the tags it is inside).
    events: Vec<(Event<'static>, Vec<Tag<'static>>)>,
}

fn render(markdown: &str) -> Rendered {
    let mut options = Options::empty();
    options.insert(Options::ENABLE_TABLES);
    options.insert(Options::ENABLE_STRIKETHROUGH);
    options.insert(Options::ENABLE_TASKLISTS);
    let mut open: Vec<Tag<'static>> = Vec::new();
    let mut events = Vec::new();
    for event in Parser::new_ext(markdown, options) {
        let event = event.into_static();
        match &event {
            Event::Start(tag) => {
                events.push((event.clone(), open.clone()));
                open.push(tag.clone());
            }
            Event::End(_) => {
                open.pop();
            }
            _ => events.push((event.clone(), open.clone())),
        }
    }
    Rendered { events }
}

impl Rendered {
    /// What a reader sees as text (text and code spans), in order.
    fn text(&self) -> String {
        self.events
            .iter()
            .filter_map(|(e, _)| match e {
                Event::Text(t) | Event::Code(t) => Some(t.to_string()),
                Event::SoftBreak | Event::HardBreak => Some(" ".into()),
                _ => None,
            })
            .collect()
    }

    /// The tables: each a header and its rows, each cell's text.
    fn tables(&self) -> Vec<Vec<Vec<String>>> {
        let mut tables = Vec::new();
        let mut rows: Vec<Vec<String>> = Vec::new();
        for (e, open) in &self.events {
            match e {
                Event::Start(Tag::Table(_)) => rows = Vec::new(),
                Event::Start(Tag::TableHead) | Event::Start(Tag::TableRow) => rows.push(Vec::new()),
                Event::Start(Tag::TableCell) => rows.last_mut().unwrap().push(String::new()),
                Event::Text(t) | Event::Code(t)
                    if open.iter().any(|t| matches!(t, Tag::TableCell)) =>
                {
                    rows.last_mut().unwrap().last_mut().unwrap().push_str(t)
                }
                _ => {}
            }
            if let Event::Start(Tag::Table(_)) = e {
                tables.push(Vec::new());
            }
            if let Some(t) = tables.last_mut() {
                *t = rows.clone();
            }
        }
        tables
    }
}

/// Every element that is not text: none of them may hold or wrap data (`EVIL`).
fn assert_inert(markdown: &str, rendered: &Rendered) {
    for (e, open) in &rendered.events {
        match e {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                panic!("a link or image ({dest_url}) in:\n{markdown}")
            }
            Event::Html(h) | Event::InlineHtml(h) => {
                let h = h.trim();
                assert!(
                    !h.contains("EVIL")
                        && (h.starts_with("<details><summary>") || h == "</details>"),
                    "HTML from data: {h:?} in:\n{markdown}"
                );
            }
            Event::Text(t) => {
                let styled = open.iter().any(|t| {
                    matches!(
                        t,
                        Tag::Emphasis | Tag::Strong | Tag::Strikethrough | Tag::Link { .. }
                    )
                });
                assert!(
                    !(styled && t.contains("EVIL")),
                    "data in emphasis: {t:?} in:\n{markdown}"
                );
                // GitHub links bare addresses, `www.` names and e-mail addresses in text (not in
                // code spans): data with them must be code.
                for trigger in ["://", "www.", "@"] {
                    assert!(
                        !(t.contains(trigger) && t.contains("EVIL")),
                        "{trigger} in text, which GitHub would link: {t:?} in:\n{markdown}"
                    );
                }
            }
            Event::TaskListMarker(_) | Event::FootnoteReference(_) => {
                panic!("{e:?} from data in:\n{markdown}")
            }
            Event::Start(Tag::Heading { .. })
            | Event::Start(Tag::BlockQuote(_))
            | Event::Start(Tag::List(_))
            | Event::Start(Tag::CodeBlock(_)) => {
                let text = format!("{e:?}");
                assert!(!text.contains("EVIL"), "{text} in:\n{markdown}");
            }
            _ => {}
        }
    }
    for (_, open) in &rendered.events {
        for tag in open {
            assert!(
                !matches!(
                    tag,
                    Tag::BlockQuote(_) | Tag::List(_) | Tag::CodeBlock(_) | Tag::Item
                ),
                "{tag:?}: a block that golden does not write in:\n{markdown}"
            );
        }
    }
}

#[test]
fn hostile_data_in_the_summary_renders_as_text_and_never_as_markup() {
    let d = Dir::new("summary-hostile");
    let results = d.path().join("results");
    let headline = "golden: `out` differs `a`` <img src=x onerror=EVIL1> `` [click](http://EVIL2.test) \
                    ![pixel](http://EVIL3.test/p.png) **EVIL4** _EVIL5_ <http://EVIL6.test> \
                    https://EVIL7.test www.EVIL8.test mail@EVIL9.test &lt;b&gt;EVIL10 \\<i>EVIL11</i>\n\
                    | forged | row | of | the | table |\n# EVIL12 heading";
    let cause = "``` <script>EVIL13</script> use `x` \\| [a](javascript:EVIL14) ~~EVIL15~~";
    let case = "b=1`<b>EVIL16</b>` | t=2\nnext";
    let layer = "lay`er](http://EVIL17.test) <u>EVIL18</u>";
    let name = "norm__x<img src=EVIL19>`|";
    result(
        &results,
        "krate",
        json!({
            "check": name,
            "layer": layer,
            "status": "fail",
            "headline": headline,
            "case": case,
            "dtype": "f32 *EVIL20*",
            "likely_cause": cause,
            "leaves": [{"worst_ratio": 3.0}],
        }),
    );
    // A passing check whose snapshot is not the committed one, at a path made of markup.
    let odd = d
        .path()
        .join("snap <img src=EVIL21> [x](http://EVIL22.test)");
    std::fs::create_dir_all(&odd).unwrap();
    result(
        &results,
        "krate",
        json!({
            "check": "passing",
            "layer": "passing",
            "status": "pass",
            "snapshot": snapshot_text("passing", "r.Passing", 0.1),
            "snapshot_file": odd.join("passing `*EVIL23*`.snap"),
        }),
    );
    // A check whose base snapshot says other things, all of them hostile.
    result(
        &results,
        "krate",
        json!({
            "check": "changed",
            "layer": "changed",
            "status": "pass",
            "snapshot": snapshot_text("changed", "r.Changed", 0.1),
        }),
    );
    let base = d
        .path()
        .join("base `<b>EVIL24</b>` [b](http://EVIL25.test)");
    snap(
        &base,
        "changed",
        &snapshot_text(
            "changed",
            "[EVIL26](http://EVIL27.test) <img src=EVIL28> `` `EVIL29",
            0.1,
        ),
    );
    snap(
        &base,
        "passing",
        &snapshot_text("passing", "r.Passing", 0.1),
    );
    let summary = Summary::build(&results, Some(&base)).unwrap();
    let markdown = summary.markdown(GITHUB_LIMIT);
    println!("{markdown}");
    let rendered = render(&markdown);
    assert_inert(&markdown, &rendered);

    // Nothing was dropped: every piece of data is there to read, as it was (its whitespace
    // made one line).
    let text = rendered.text();
    for evil in (1..=29).filter(|k| ![2, 3, 6, 7, 8, 9, 17, 22, 25, 27].contains(k)) {
        assert!(
            text.contains(&format!("EVIL{evil}")),
            "EVIL{evil} is gone from:\n{text}"
        );
    }
    for piece in [
        "<img src=x onerror=EVIL1>",
        "[click](http://EVIL2.test)",
        "![pixel](http://EVIL3.test/p.png)",
        "**EVIL4**",
        "<http://EVIL6.test>",
        "mail@EVIL9.test",
        "&lt;b&gt;EVIL10",
        "<script>EVIL13</script>",
        "[a](javascript:EVIL14)",
        "| forged | row |",
        "[EVIL26](http://EVIL27.test) <img src=EVIL28>",
    ] {
        assert!(
            text.contains(piece),
            "`{piece}` is not shown as written in:\n{text}"
        );
    }
    // The tables are whole: the failure is one row of six cells, its name, layer and case
    // exactly as they are.
    let tables = rendered.tables();
    let failed = tables
        .iter()
        .find(|t| t[0].contains(&"likely cause".to_string()))
        .unwrap_or_else(|| panic!("no table of failures in:\n{markdown}"));
    assert_eq!(failed.len(), 2, "{failed:?}");
    for table in &tables {
        for row in table {
            assert_eq!(
                row.len(),
                table[0].len(),
                "a broken row {row:?} in:\n{markdown}"
            );
        }
    }
    let row = &failed[1];
    assert!(row[0].starts_with(name), "{row:?}");
    assert_eq!(row[1], layer);
    assert!(
        row[2].starts_with("b=1`<b>EVIL16</b>` | t=2 next"),
        "{row:?}"
    );
    // The base's path, and the committed snapshot's.
    assert!(text.contains(&base.display().to_string()), "{text}");
    assert!(text.contains("passing `*EVIL23*`.snap"), "{text}");
}

#[test]
fn failures_that_got_worse_are_changes_and_their_tag_says_what_the_base_says() {
    let d = Dir::new("summary-worse");
    let results = d.path().join("results");
    let base = d.path().join("base");
    // Six checks that passed in the base (their snapshots are committed there, 0.1× allowed)
    // and fail now, 10^4 to 10^6 times worse.
    for k in 0..6 {
        let name = format!("layer{k}__port");
        snap(
            &base,
            &name,
            &snapshot_text(&format!("port{k}"), "r.Port", 0.1),
        );
        result(
            &results,
            "krate",
            json!({
                "check": name,
                "layer": format!("port{k}"),
                "status": "fail",
                "headline": format!("golden: `port{k}` does not match its reference"),
                "description": format!("layer: port{k}\nreference: r.Port\ncases: 32 per dtype, seed 0"),
                "leaves": [{"worst_ratio": 1000.0 * 10f64.powi(k / 2)}],
            }),
        );
    }
    result(
        &results,
        "krate",
        json!({"check": "same", "layer": "same", "status": "pass", "snapshot": snapshot_text("same", "r.Same", 0.1)}),
    );
    snap(&base, "same", &snapshot_text("same", "r.Same", 0.1));
    // A snapshot folder that holds a JSON file too (a tool's, not golden's results).
    std::fs::write(base.join("settings.json"), r#"{"editor": "vim"}"#).unwrap();
    let summary = Summary::build(&results, Some(&base)).unwrap();
    let markdown = summary.markdown(GITHUB_LIMIT);
    println!("{markdown}");
    assert!(
        !markdown.contains("(new)"),
        "a check the base has is not new:\n{markdown}"
    );
    assert!(
        markdown.contains(": 6 checks changed"),
        "six failures 10^4–10^6× worse are changes:\n{markdown}"
    );
    assert!(
        !markdown.contains("Nothing changed against the base"),
        "{markdown}"
    );
    let rendered = render(&markdown);
    let tables = rendered.tables();
    let failed = tables
        .iter()
        .find(|t| t[0].contains(&"likely cause".to_string()))
        .unwrap();
    assert_eq!(failed.len(), 7, "{failed:?}");
    for row in &failed[1..] {
        assert!(row[0].ends_with("(passed in the base)"), "{row:?}");
        // The base's figure, read from its snapshot: the move is said.
        assert!(row[5].starts_with("0.1× → "), "{row:?}");
        assert!(row[5].ends_with("× worse)"), "{row:?}");
    }
    // The base as the results of a run in which two of them failed already.
    let base_results = d.path().join("base-results");
    for k in 0..6 {
        let name = format!("layer{k}__port");
        let doc = if k < 2 {
            json!({"check": name, "layer": format!("port{k}"), "status": "fail",
                   "headline": "golden: failed", "leaves": [{"worst_ratio": 1000.0 * 10f64.powi(k / 2)}]})
        } else {
            json!({"check": name, "layer": format!("port{k}"), "status": "pass",
                   "snapshot": snapshot_text(&format!("port{k}"), "r.Port", 0.1)})
        };
        result(&base_results, "krate", doc);
    }
    result(
        &base_results,
        "krate",
        json!({"check": "same", "layer": "same", "status": "pass", "snapshot": snapshot_text("same", "r.Same", 0.1)}),
    );
    let summary = Summary::build(&results, Some(&base_results)).unwrap();
    let markdown = summary.markdown(GITHUB_LIMIT);
    println!("{markdown}");
    let failed = render(&markdown)
        .tables()
        .into_iter()
        .find(|t| t[0].contains(&"likely cause".to_string()))
        .unwrap();
    let tags: Vec<(String, bool)> = failed[1..]
        .iter()
        .map(|r| (r[0].clone(), r[0].ends_with("(failed in the base too)")))
        .collect();
    assert_eq!(tags.iter().filter(|(_, too)| *too).count(), 2, "{tags:?}");
    assert!(
        failed[1..]
            .iter()
            .filter(|r| !r[0].ends_with("(failed in the base too)"))
            .all(|r| r[0].ends_with("(passed in the base)")),
        "{failed:?}"
    );
    // The two that failed at the same figure did not change; the four others did.
    assert!(
        markdown.contains(": 4 checks changed (failing now)"),
        "{markdown}"
    );
    assert!(markdown.contains("1000× → 1000× (unchanged)"), "{markdown}");
    assert!(
        markdown.contains(
            "Nothing else changed against the base: the failures above are what changed."
        ),
        "{markdown}"
    );
}

/// A dtype's speed as the runtime writes it: the whole call's and each point's times (port,
/// reference), each `(median, min, max)` of 5 runs.
type Times = (f64, f64, f64);

fn speed(whole: (Times, Times), points: &[(&str, Times, Times)]) -> serde_json::Value {
    use golden::internal::judge::speed::{Point, Side, Speed, Spread};
    // Quartiles at the extremes: the range is every run's.
    let spread = |(median, min, max): Times| Spread {
        median,
        q1: min,
        q3: max,
        min,
        max,
        runs: 5,
    };
    let side = |t: Times| Side {
        seconds: spread(t),
        peak_bytes: None,
        threads: Some(1),
    };
    Speed {
        dtype: "f32".into(),
        case: "b=1:declared:0x1".into(),
        warmup: 1,
        port: side(whole.0),
        reference: Some(side(whole.1)),
        port_default_threads: 2,
        points: points
            .iter()
            .map(|(name, port, reference)| Point {
                name: name.to_string(),
                depth: 0,
                port: spread(*port),
                reference: spread(*reference),
            })
            .collect(),
        prefill: None,
        decode: None,
        notes: Vec::new(),
        build: "debug".into(),
        spent: 0.1,
    }
    .to_json()
}

#[test]
fn speed_that_moved_beyond_both_runs_noise_is_listed_apart_and_fails_nothing() {
    let d = Dir::new("summary-speed");
    let (results, base) = (d.path().join("results"), d.path().join("base"));
    let evil = "EVIL | *x* <b>y</b> [l](http://e.vil)";
    let model = |block2: Times, evil_point: Times| {
        json!([speed(
            ((2.0, 1.9, 2.1), (1.0, 0.95, 1.05)),
            &[
                ("blocks.1", (0.7, 0.68, 0.72), (0.1, 0.098, 0.102)),
                ("blocks.2", block2, (0.1, 0.098, 0.102)),
                (evil, evil_point, (0.1, 0.098, 0.102)),
            ]
        )])
    };
    let doc = |name: &str, speed: serde_json::Value| {
        json!({"check": name, "layer": name, "status": "pass",
               "snapshot": snapshot_text(name, "r.M", 0.1), "speed": speed})
    };
    // The base: block 2 at 7× its reference; the head: 25× (a copy too many), the whole call
    // within the noise, the hostile point twice as fast.
    result(
        &base,
        "krate",
        doc("model", model((0.7, 0.68, 0.72), (0.4, 0.39, 0.41))),
    );
    result(
        &results,
        "krate",
        doc("model", model((2.5, 2.4, 2.6), (0.2, 0.19, 0.21))),
    );
    let steady = json!([speed(((1.0, 0.9, 1.1), (1.0, 0.9, 1.1)), &[])]);
    result(&base, "krate", doc("steady", steady.clone()));
    result(&results, "krate", doc("steady", steady));

    let summary = Summary::build(&results, Some(&base)).unwrap();
    let markdown = summary.markdown(GITHUB_LIMIT);
    println!("{markdown}");
    // Never a failure: the run passes, and nothing else changed.
    assert!(
        markdown.starts_with("### ✅ golden: 2 of 2 checks passed"),
        "{markdown}"
    );
    let rendered = render(&markdown);
    assert_inert(&markdown, &rendered);
    let table = rendered
        .tables()
        .into_iter()
        .find(|t| t[0] == ["check", "dtype", "where", "before", "after", "moved"])
        .unwrap_or_else(|| panic!("no speed table:\n{markdown}"));
    assert_eq!(table.len(), 3, "{table:?}");
    assert_eq!(
        table[1],
        [
            "model",
            "f32",
            "blocks.2",
            "7× (6.67–7.35×) over 5 runs",
            "25× (24–27×) over 5 runs",
            "3.57× slower"
        ]
    );
    assert_eq!(table[2][2], evil);
    assert_eq!(table[2][5], "2× faster");
    assert!(
        markdown.contains(
            "Listed only where this run's range and the base's do not overlap (2 of 5 figures)"
        ),
        "{markdown}"
    );
    let json = summary.json();
    let model = json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["check"] == "model")
        .unwrap();
    assert_eq!(model["speed_compared"], 4);
    assert_eq!(model["speed_moves"][0]["what"], "blocks.2");

    // A base of snapshots holds no timings: nothing is compared, and the summary says why.
    let snapshots = d.path().join("snapshots");
    snap(&snapshots, "model", &snapshot_text("model", "r.M", 0.1));
    snap(&snapshots, "steady", &snapshot_text("steady", "r.M", 0.1));
    let markdown = Summary::build(&results, Some(&snapshots))
        .unwrap()
        .markdown(GITHUB_LIMIT);
    assert!(
        markdown.contains("Speed is compared with a base of results")
            && !markdown.contains("#### Speed against the base"),
        "{markdown}"
    );
}

/// A job that runs a share of the checks (nextest's `--partition`, or a filter): the base's checks
/// it did not run are not "removed" while their snapshots are still in the checkout; they are
/// counted as not run here. A check whose snapshot is gone from the checkout is removed.
#[test]
fn a_partition_s_summary_does_not_call_the_other_partition_s_checks_removed() {
    let d = Dir::new("summary-partition");
    let results = d.path().join("results");
    let base = d.path().join("base");
    let head = d.path().join("head-snapshots");
    for name in ["mine", "theirs", "gone"] {
        snap(&base, name, &snapshot_text(name, "r.Port", 0.1));
    }
    // The checkout's snapshots: the other partition's check is still there, `gone` is not.
    for name in ["mine", "theirs"] {
        snap(&head, name, &snapshot_text(name, "r.Port", 0.1));
    }
    result(
        &results,
        "krate",
        json!({"check": "mine", "layer": "mine", "status": "pass",
               "snapshot": snapshot_text("mine", "r.Port", 0.1),
               "snapshot_file": head.join("mine.snap")}),
    );
    let summary = Summary::build(&results, Some(&base)).unwrap();
    let md = summary.markdown(GITHUB_LIMIT);
    let removed: Vec<&str> = summary
        .entries
        .iter()
        .filter(|e| e.changes.iter().any(|c| c.kind == "removed check"))
        .map(|e| e.check.name.as_str())
        .collect();
    assert_eq!(removed, ["gone"], "{md}");
    assert!(md.contains("1 check of the base not run here"), "{md}");
    assert!(md.contains("1 check changed"), "{md}");
}
