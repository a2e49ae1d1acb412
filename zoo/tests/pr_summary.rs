//! The summary a reviewer reads in a pull request (`golden report --markdown`), built from two
//! runs of the example crate's checks (`examples/port-llama`, replayed from its committed golden
//! stores, its layers written out as its attributes declare them):
//!
//! * the base: the ports as they are, and the rotary embedding's store as recorded under an older
//!   transformers (5.22.0);
//! * the head: RMSNorm made less accurate but still inside its tolerance, the MLP made wrong (GELU
//!   where Llama has SiLU), the rotary embedding's store as committed (transformers 5.23.0).
//!
//! The markdown must name each change with its figures and factor (the factor computed here from
//! the two runs' own snapshots, not copied), say the failure with its case and likely cause, list
//! the unchanged check in a collapsed table, fit GitHub's 65,536 characters, and render: GitHub-
//! flavoured markdown parsed by `pulldown-cmark`, every table whole. The same holds with the base
//! given as the base run's results folder. 3000 failing checks are cut to the limit with a count,
//! never a broken table. The summary of the two runs is written to
//! `target/golden/pr-summary.md` (the book shows it: docs/src/snapshots.md).

use candle_core::{Tensor, D};
use candle_nn::{linear_no_bias, Module};
use golden::internal::describe::env::Mode;
use golden::{DimExpr, DimValue, Dist, GradSpec, IntoOutputs, Layer, PortInputs, Report, Value};
use golden_cli::summary::{Summary, GITHUB_LIMIT};
use std::path::{Path, PathBuf};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/port-llama");

fn times(k: i64, dim: &str) -> DimValue {
    DimValue::Mul(Box::new(DimValue::Lit(k)), Box::new(DimValue::dim(dim)))
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Declared as the attribute declares it in `examples/port-llama/src/<module>.rs`, with its
/// snapshots and stores in `snapshots` and its source file (where a failure's seed is saved) in a
/// scratch crate beside them, so that nothing lands in the example.
fn declared(layer: Layer, module: &str, snapshots: &Path) -> Layer {
    let name = layer.name().to_string();
    let src = snapshots.parent().unwrap().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("lib.rs"), "").unwrap();
    std::fs::write(src.join(format!("{module}.rs")), "").unwrap();
    layer.declared_at(golden::Declared {
        source_file: leak(src.join(format!("{module}.rs")).display().to_string()),
        module_path: leak(format!("port_llama::{module}::{name}")),
        manifest_dir: EXAMPLE,
        package: "port-llama",
        snapshot_dir: leak(snapshots.display().to_string()),
    })
}

fn rms_norm(snapshots: &Path) -> Layer {
    let layer = Layer::module(
        "rms_norm",
        "transformers.models.llama.modeling_llama.LlamaRMSNorm",
    )
    .dim("b", 1, 2)
    .dim("t", 1, 8)
    .dim("d", 1, 64)
    .arg("x", ["b", "t", "d"], Dist::default())
    .init("hidden_size", Value::dim("d"))
    .init("eps", 1e-6)
    .grad(GradSpec::default());
    declared(layer, "norm", snapshots)
}

fn llama_mlp(snapshots: &Path) -> Layer {
    let layer = Layer::module(
        "llama_mlp",
        "transformers.models.llama.modeling_llama.LlamaMLP",
    )
    .config("transformers.LlamaConfig")
    .config_value("hidden_size", Value::Dims(times(4, "k")))
    .config_value("intermediate_size", Value::Dims(times(6, "k")))
    .config_value("num_attention_heads", 2)
    .config_value("hidden_act", "silu")
    .dim("b", 1, 2)
    .dim("t", 1, 8)
    .dim("k", 1, 8)
    .arg(
        "x",
        ["b".into(), "t".into(), DimExpr::Expr(times(4, "k"))],
        Dist::default(),
    )
    .grad(GradSpec::default());
    declared(layer, "mlp", snapshots)
}

fn rope(snapshots: &Path) -> Layer {
    let axis = || DimExpr::Expr(times(2, "p"));
    let layer = Layer::function(
        "apply_rotary_pos_emb",
        "transformers.models.llama.modeling_llama.apply_rotary_pos_emb",
    )
    .dim("b", 1, 2)
    .dim("h", 1, 4)
    .dim("g", 1, 2)
    .dim("t", 1, 8)
    .dim("p", 1, 8)
    .arg(
        "q",
        ["b".into(), "h".into(), "t".into(), axis()],
        Dist::default(),
    )
    .arg(
        "k",
        ["b".into(), "g".into(), "t".into(), axis()],
        Dist::default(),
    )
    .arg("cos", ["b".into(), "t".into(), axis()], Dist::default())
    .arg("sin", ["b".into(), "t".into(), axis()], Dist::default())
    .grad(GradSpec::default());
    declared(layer, "rope", snapshots)
}

/// `LlamaRMSNorm`, as the example ports it; `error` is a relative error put on every output (a
/// port made less accurate).
fn rms_port(i: &PortInputs, error: f64) -> Result<golden::Outputs, String> {
    let run = || -> candle_core::Result<Tensor> {
        let x = i.tensor(0);
        let weight = i.var_builder().get(i.dim("d"), "weight")?;
        let variance = x.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = x.broadcast_div(&(variance + 1e-6)?.sqrt()?)?;
        normed.broadcast_mul(&weight)? * (1.0 + error)
    };
    run().into_outputs()
}

/// `LlamaMLP`: `down(act(gate(x)) * up(x))`; the example's port has SiLU, the wrong one GELU.
fn mlp_port(i: &PortInputs, gelu: bool) -> Result<golden::Outputs, String> {
    let run = || -> candle_core::Result<Tensor> {
        let (hidden, intermediate) = (4 * i.dim("k"), 6 * i.dim("k"));
        let vb = i.var_builder();
        let gate = linear_no_bias(hidden, intermediate, vb.pp("gate_proj"))?;
        let up = linear_no_bias(hidden, intermediate, vb.pp("up_proj"))?;
        let down = linear_no_bias(intermediate, hidden, vb.pp("down_proj"))?;
        let x = i.tensor(0);
        let g = gate.forward(x)?;
        let act = if gelu { g.gelu_erf()? } else { g.silu()? };
        down.forward(&(act * up.forward(x)?)?)
    };
    run().into_outputs()
}

/// `apply_rotary_pos_emb(q, k, cos, sin)` with `rotate_half`.
fn rope_port(i: &PortInputs) -> Result<golden::Outputs, String> {
    let run = || -> candle_core::Result<(Tensor, Tensor)> {
        let rotate_half = |x: &Tensor| -> candle_core::Result<Tensor> {
            let half = x.dim(D::Minus1)? / 2;
            let (x1, x2) = (
                x.narrow(D::Minus1, 0, half)?,
                x.narrow(D::Minus1, half, half)?,
            );
            Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
        };
        let (cos, sin) = (i.tensor(2).unsqueeze(1)?, i.tensor(3).unsqueeze(1)?);
        let embed = |x: &Tensor| -> candle_core::Result<Tensor> {
            x.broadcast_mul(&cos)? + rotate_half(x)?.broadcast_mul(&sin)?
        };
        Ok((embed(i.tensor(0))?, embed(i.tensor(1))?))
    };
    run().into_outputs()
}

/// The snapshot file insta keeps (its header, then the text), as a committed one is.
fn write_snapshot(dir: &Path, report: &Report) {
    let text = report.snapshot().expect("the declared cases ran");
    std::fs::write(
        dir.join(format!("{}.snap", report.snapshot_name())),
        format!("---\nsource: src/x.rs\n---\n{text}"),
    )
    .unwrap();
}

/// A copy of the store `name` in which transformers' recorded version is `version`.
fn with_transformers(store: &Path, version: &str) {
    use golden::internal::answers::store;
    use golden::internal::python::wire;
    let bytes = std::fs::read(store).unwrap();
    let mut body = &bytes[20..];
    let mut frame = wire::read_frame(&mut body).unwrap();
    frame.header["recorded_with"]["packages"]["transformers"] = version.into();
    std::fs::write(store, store::seal(&wire::encode(&frame))).unwrap();
}

/// Move the example crate's results of the last checks into `to` (as the results folder of a run).
fn take_results(to: &Path) {
    let from = golden::internal::describe::env::target_dir()
        .unwrap()
        .join("golden/results/port_llama");
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::rename(&from, to).unwrap();
}

struct Runs {
    dir: PathBuf,
    base_snapshots: PathBuf,
    base_results: PathBuf,
    head_results: PathBuf,
    /// Per check, the base's and the head's snapshot texts (passing checks).
    texts: Vec<(String, String, Option<String>)>,
}

/// The two runs. Each is a replay of the example's committed stores (the MLP's wrong port's
/// diagnosis runs the reference where torch is installed).
fn runs() -> Runs {
    let dir = std::env::temp_dir().join(format!("golden-pr-summary-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (base, head) = (dir.join("base/snapshots"), dir.join("head/snapshots"));
    for side in [&base, &head] {
        std::fs::create_dir_all(side).unwrap();
        for check in [
            "norm__rms_norm",
            "mlp__llama_mlp",
            "rope__apply_rotary_pos_emb",
            "rope__apply_rotary_pos_emb__gradients",
        ] {
            std::fs::copy(
                format!("{EXAMPLE}/snapshots/{check}.golden"),
                side.join(format!("{check}.golden")),
            )
            .unwrap();
        }
    }
    with_transformers(&base.join("rope__apply_rotary_pos_emb.golden"), "5.22.0");
    // The layers are the example's: the same description as its committed snapshots.
    for (layer, check) in [
        (rms_norm(&base), "norm__rms_norm"),
        (llama_mlp(&base), "mlp__llama_mlp"),
        (rope(&base), "rope__apply_rotary_pos_emb"),
    ] {
        let committed =
            std::fs::read_to_string(format!("{EXAMPLE}/snapshots/{check}.snap")).unwrap();
        let description = layer.description(32, 0);
        assert!(
            committed.contains(&description),
            "the layer written here is not the example's `{check}`:\n{description}\n---\n{committed}"
        );
    }
    let replay = |l: Layer| l.mode(Mode::Replay);
    let pass = |r: Result<Report, golden::Failure>| r.unwrap_or_else(|f| panic!("{f}"));
    let mut texts = Vec::new();

    // The base.
    let base_reports = [
        pass(golden::check(&replay(rms_norm(&base)), &|i| {
            rms_port(i, 0.0)
        })),
        pass(golden::check(&replay(llama_mlp(&base)), &|i| {
            mlp_port(i, false)
        })),
        pass(golden::check(&replay(rope(&base)), &rope_port)),
        pass(golden::check_gradients(&replay(rope(&base)), &rope_port)),
    ];
    for r in &base_reports {
        write_snapshot(&base, r);
    }
    let base_results = dir.join("base-results/port_llama");
    take_results(&base_results);

    // The head.
    let head_reports = [
        pass(golden::check(&replay(rms_norm(&head)), &|i| {
            rms_port(i, 2e-6)
        })),
        pass(golden::check(&replay(rope(&head)), &rope_port)),
        pass(golden::check_gradients(&replay(rope(&head)), &rope_port)),
    ];
    let wrong = golden::check(&replay(llama_mlp(&head)), &|i| mlp_port(i, true))
        .expect_err("GELU where Llama has SiLU must fail");
    assert!(wrong.to_string().contains("does not match"), "{wrong}");
    // The author accepted the head's snapshots (`cargo insta accept`) and committed them.
    for r in &head_reports {
        write_snapshot(&head, r);
    }
    let head_results = dir.join("head-results/port_llama");
    take_results(&head_results);
    for b in &base_reports {
        let h = head_reports
            .iter()
            .find(|h| h.snapshot_name() == b.snapshot_name());
        texts.push((
            b.snapshot_name(),
            b.snapshot().unwrap(),
            h.map(|h| h.snapshot().unwrap()),
        ));
    }
    Runs {
        dir,
        base_snapshots: base,
        base_results,
        head_results,
        texts,
    }
}

/// The line of `text` with `label` under the leaf group `group`.
fn figure_line<'a>(text: &'a str, group: &str, label: &str) -> &'a str {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(group));
    lines
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` under `{group}` in:\n{text}"))
}

/// `R` of `R× allowed` in a figure line.
fn ratio(line: &str) -> f64 {
    golden::internal::report::snapshot::figures_of(line)
        .and_then(|f| f.ratio)
        .unwrap_or_else(|| panic!("no ratio in {line}"))
}

/// Every table of a markdown text as pulldown-cmark reads it (GitHub's tables extension): per
/// table, its header cells and its rows' cells (as text).
fn tables(markdown: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
    let mut out = Vec::new();
    let mut head: Vec<String> = Vec::new();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut row: Vec<String> = Vec::new();
    let mut cell: Option<String> = None;
    let mut in_head = false;
    for event in Parser::new_ext(markdown, Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Table(_)) => {
                head.clear();
                rows.clear();
            }
            Event::Start(Tag::TableHead) => in_head = true,
            Event::End(TagEnd::TableHead) => {
                in_head = false;
                head = std::mem::take(&mut row);
            }
            Event::Start(Tag::TableRow) => row.clear(),
            Event::End(TagEnd::TableRow) => rows.push(std::mem::take(&mut row)),
            Event::Start(Tag::TableCell) => cell = Some(String::new()),
            Event::End(TagEnd::TableCell) => row.push(cell.take().unwrap_or_default()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(c) = cell.as_mut() {
                    c.push_str(&t);
                }
            }
            Event::End(TagEnd::Table) => {
                out.push((std::mem::take(&mut head), std::mem::take(&mut rows)));
            }
            _ => {}
        }
        let _ = in_head;
    }
    out
}

/// Every table is whole: each row has the header's cells.
fn assert_tables_whole(markdown: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let tables = tables(markdown);
    for (head, rows) in &tables {
        assert!(!head.is_empty());
        for row in rows {
            assert_eq!(row.len(), head.len(), "a broken row {row:?} under {head:?}");
        }
    }
    tables
}

#[test]
fn a_reviewer_reads_each_change_with_its_factor_in_markdown_that_renders() {
    let runs = runs();
    let summary = Summary::build(&runs.head_results, Some(&runs.base_snapshots)).unwrap();
    let markdown = summary.markdown(GITHUB_LIMIT);
    let target = golden::internal::describe::env::target_dir()
        .unwrap()
        .join("golden");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("pr-summary.md"), &markdown).unwrap();
    println!("{markdown}");
    assert!(markdown.chars().count() < GITHUB_LIMIT);
    assert!(
        markdown.starts_with("### ❌ golden: 3 of 4 checks passed, 1 failed"),
        "{markdown}"
    );

    let tables = assert_tables_whole(&markdown);
    let find = |header: &str| {
        tables
            .iter()
            .find(|(h, _)| {
                h.first().map(String::as_str) == Some("check") && h.contains(&header.to_string())
            })
            .unwrap_or_else(|| panic!("no table with `{header}` in:\n{markdown}"))
    };

    // The failure: its check, layer, case, headline and cause.
    let (_, failed) = find("likely cause");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let row = &failed[0];
    assert!(row[0].starts_with("mlp__llama_mlp"), "{row:?}");
    assert_eq!(row[1], "llama_mlp");
    assert!(
        row[2].contains("dims b=") && row[2].contains("k="),
        "the case: {row:?}"
    );
    assert!(
        row[3].contains("golden: `llama_mlp` does not match its reference")
            || row[3].contains("golden: llama_mlp does not match its reference"),
        "{row:?}"
    );
    assert!(
        row[4].contains("silu") || row[4].contains("SiLU") || row[4].contains("gelu"),
        "the likely cause names the activation: {row:?}"
    );

    // What changed against the base, worst first.
    let (_, changed) = find("factor");
    let base_rms = &runs.texts.iter().find(|t| t.0 == "norm__rms_norm").unwrap();
    let (before, after) = (
        figure_line(&base_rms.1, "out f32", "max |port - ref|: "),
        figure_line(
            base_rms.2.as_deref().unwrap(),
            "out f32",
            "max |port - ref|: ",
        ),
    );
    let factor = ratio(after) / ratio(before);
    assert!(
        ratio(after) < 1.0 && factor > 4.0,
        "the planted inaccuracy must move the figure beyond the comparator's factor and stay \
         inside the tolerance: {before} → {after}"
    );
    let rms = changed
        .iter()
        .find(|r| r[0] == "norm__rms_norm")
        .unwrap_or_else(|| panic!("rms_norm's move is not listed:\n{markdown}"));
    assert_eq!(rms[1], "f32 / out f32 / max |port - ref|");
    assert_eq!(
        rms[2],
        before.trim().trim_start_matches("max |port - ref|: ")
    );
    assert_eq!(
        rms[3],
        after.trim().trim_start_matches("max |port - ref|: ")
    );
    assert_eq!(
        rms[4],
        format!(
            "{}× worse",
            golden::internal::report::snapshot::figure(factor)
        )
    );
    // The first change listed is the worst one.
    assert_eq!(changed[0][0], "norm__rms_norm", "{changed:?}");
    let rope: Vec<&Vec<String>> = changed
        .iter()
        .filter(|r| r[0] == "rope__apply_rotary_pos_emb")
        .collect();
    assert!(
        rope.iter()
            .any(|r| r[1] == "recorded with transformers" && r[2] == "5.22.0" && r[3] == "5.23.0"),
        "{rope:?}"
    );
    assert!(
        rope.iter()
            .any(|r| r[1] == "golden store re-recorded (sha256)" && r[2] != r[3]),
        "{rope:?}"
    );
    // The unchanged check, in the collapsed table.
    assert!(markdown.contains("<details><summary>1 unchanged check</summary>"));
    let (_, rest) = tables
        .iter()
        .find(|(h, _)| h == &["check", "layer", "worst / allowed"])
        .unwrap_or_else(|| panic!("no table of the rest in:\n{markdown}"));
    assert!(
        rest.iter()
            .any(|r| r[0] == "rope__apply_rotary_pos_emb__gradients"),
        "{rest:?}"
    );

    // The base given as a results folder of its run says the same changes.
    let from_results = Summary::build(&runs.head_results, Some(&runs.base_results)).unwrap();
    let again = from_results.markdown(GITHUB_LIMIT);
    let again_tables = assert_tables_whole(&again);
    let changes = |t: &[(Vec<String>, Vec<Vec<String>>)]| {
        t.iter()
            .find(|(h, _)| h.contains(&"factor".to_string()))
            .map(|(_, rows)| rows.clone())
            .unwrap()
    };
    assert_eq!(changes(&again_tables), changes(&tables));
    let json = from_results.json();
    assert_eq!(json["failed"], 1);
    assert_eq!(json["passed"], 3);
    std::fs::remove_dir_all(&runs.dir).unwrap();
}

#[test]
fn thousands_of_failures_are_cut_to_github_s_limit_with_a_count_never_a_broken_table() {
    let dir = std::env::temp_dir().join(format!("golden-pr-many-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let results = dir.join("results/port_llama");
    std::fs::create_dir_all(&results).unwrap();
    for i in 0..3000 {
        let doc = serde_json::json!({
            "run": "many",
            "written_ms": 1,
            "check": format!("layers__layer_{i:04}"),
            "layer": format!("layer_{i:04}"),
            "status": "fail",
            "headline": format!("golden: `layer_{i:04}` does not match its reference `pkg.Layer` (f32) | a pipe <b>and</b> html"),
            "likely_cause": "the port matches the reference with gelu (tanh) instead of gelu — fix: use `gelu_erf`",
            "case": "b=1,t=2:declared:0x5a99:f32",
            "dtype": "f32",
            "leaves": [{"leaf": "out", "worst_ratio": 12.5}],
        });
        std::fs::write(
            results.join(format!("layers__layer_{i:04}.json")),
            doc.to_string(),
        )
        .unwrap();
    }
    let summary = Summary::build(&results, None).unwrap();
    let markdown = summary.markdown(GITHUB_LIMIT);
    assert!(
        markdown.chars().count() < GITHUB_LIMIT,
        "{}",
        markdown.len()
    );
    let tables = assert_tables_whole(&markdown);
    assert_eq!(tables.len(), 1);
    let shown = tables[0].1.len();
    let left = 3000 - shown;
    assert!(shown > 10 && left > 0, "{shown}");
    assert!(
        markdown.contains(&format!("and {left} more failed checks")),
        "{}",
        &markdown[markdown.len() - 400..]
    );
    // A pipe in a headline stays in its cell; HTML is text.
    assert!(
        tables[0].1[0][3].contains("| a pipe <b>and</b> html"),
        "{:?}",
        tables[0].1[0]
    );
    assert_eq!(summary.json()["entries"].as_array().unwrap().len(), 3000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_book_shows_the_recipe_the_example_crate_runs() {
    let chapter = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/src/snapshots.md"
    ))
    .unwrap();
    let workflow =
        std::fs::read_to_string(format!("{EXAMPLE}/.github/workflows/golden.yml")).unwrap();
    assert!(
        chapter.contains(&format!("```yaml\n{}```", workflow)),
        "the book's Pull requests section (docs/src/snapshots.md) must show examples/port-llama/.github/workflows/golden.yml \
         as it is (CI runs that file)"
    );
}
