//! The golden store: record, replay with no Python, and every way a store can be unusable.

mod common;

use candle_core::Module;
use common::Scratch;
use golden::internal::answers::store::{self, Store};
use golden::internal::describe::env::Mode;
use golden::{Dist, Failure, IntoOutputs, Layer, PortInputs};

fn gelu(scratch: &Scratch) -> Layer {
    Layer::function("gelu", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
        .declared_at(scratch.declared)
}

fn right(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu_erf().into_outputs()
}

fn tanh_port(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu().into_outputs()
}

fn fails(layer: &Layer, port: &golden::Port<'_>) -> Failure {
    golden::check(layer, port).expect_err("must fail")
}

#[test]
fn a_recorded_check_replays_to_the_same_report() {
    let scratch = Scratch::new("record_replay");
    let live =
        golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let stored = Store::load(&scratch.store(&gelu(&scratch)))
        .unwrap()
        .expect("recorded");
    assert_eq!(stored.len(), 32);
    let replay =
        golden::check(&gelu(&scratch).mode(Mode::Replay), &right).unwrap_or_else(|f| panic!("{f}"));
    assert!(replay.source.starts_with("replay ("), "{}", replay.source);
    assert_eq!(replay.snapshot(), live.snapshot());
}

#[test]
fn a_changed_port_fails_in_replay_as_it_does_live() {
    let scratch = Scratch::new("changed_port");
    // Recorded with the right port: only the generated cases are in the store.
    golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let live = fails(&gelu(&scratch).mode(Mode::Live), &tanh_port);
    let replay = fails(&gelu(&scratch).mode(Mode::Replay), &tanh_port);
    for f in [&live, &replay] {
        assert!(
            f.to_string()
                .contains("does not match its reference `zoo_ref.gelu`"),
            "{f}"
        );
    }
    // Both find the same first failing case; live then shrinks further than the store allows.
    assert_eq!(
        live.shrunk_from.as_ref().unwrap().0,
        replay.shrunk_from.as_ref().unwrap().0
    );
    assert!(
        replay
            .to_string()
            .contains("replay shrinks only through recorded cases"),
        "{replay}"
    );
}

#[test]
fn recorded_with_the_failing_port_replay_reproduces_the_failure_exactly() {
    let scratch = Scratch::new("failing_record");
    // Record mode evaluates shrink candidates live and keeps them too.
    let recorded = fails(&gelu(&scratch).mode(Mode::Record), &tanh_port);
    let replay = fails(&gelu(&scratch).mode(Mode::Replay), &tanh_port);
    assert_eq!(recorded.case, replay.case);
    // The same message, but that known variants need Python: live names the one the port
    // matches, the replay says it could not evaluate them.
    let (live, replayed) = (recorded.to_string(), replay.to_string());
    let without = |m: &str, drop: &str| {
        m.lines()
            .filter(|l| !l.contains(drop))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        live.contains("the port matches `gelu(approximate='tanh')`"),
        "{live}"
    );
    assert!(
        replayed.contains("evaluated live only; this was a replay"),
        "{replayed}"
    );
    // The record run saved its first failing case, which the replay runs first, and says so.
    assert!(
        replayed.contains("the first failing case was saved by an earlier failure of this check"),
        "{replayed}"
    );
    assert_eq!(
        without(&live, "a known variant"),
        without(
            &without(&replayed, "evaluated live only"),
            "saved by an earlier failure"
        )
    );
}

#[test]
fn module_form_replays_the_recorded_state_dict() {
    let scratch = Scratch::new("module");
    let linear = |mode| {
        Layer::module("linear", "torch.nn.Linear")
            .init("in_features", 8usize)
            .init("out_features", 4usize)
            .dim("b", 1, 3)
            .arg("x", ["b".into(), golden::DimExpr::Lit(8)], Dist::default())
            .declared_at(scratch.declared)
            .mode(mode)
    };
    let port = |i: &PortInputs| {
        candle_nn::linear(8, 4, i.var_builder())
            .and_then(|l| l.forward(i.tensor(0)))
            .into_outputs()
    };
    golden::check(&linear(Mode::Record), &port).unwrap_or_else(|f| panic!("{f}"));
    golden::check(&linear(Mode::Replay), &port).unwrap_or_else(|f| panic!("{f}"));
    // The state_dict itself comes from the store: a forgotten bias is still caught in replay.
    let no_bias = |i: &PortInputs| {
        candle_nn::linear_no_bias(8, 4, i.var_builder())
            .and_then(|l| l.forward(i.tensor(0)))
            .into_outputs()
    };
    let msg = fails(&linear(Mode::Replay), &no_bias).to_string();
    assert!(
        msg.contains("`bias` [4], which the port never reads"),
        "{msg}"
    );
}

#[test]
fn replay_without_a_store_says_how_to_record_one() {
    let scratch = Scratch::new("no_store");
    let msg = fails(&gelu(&scratch).mode(Mode::Replay), &right).to_string();
    assert!(msg.contains("there is no golden store at"), "{msg}");
    assert!(
        msg.contains("GOLDEN_MODE=record cargo test -p golden-zoo"),
        "{msg}"
    );
}

#[test]
fn a_store_recorded_for_other_dims_is_out_of_date() {
    let scratch = Scratch::new("stale_description");
    golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let changed = gelu(&scratch).mode(Mode::Replay).dim("n", 1, 32);
    let msg = fails(&changed, &right).to_string();
    assert!(msg.contains("is out of date: it was recorded for `dims: b in 1..=4, n in 1..=64`, the check now says `dims: b in 1..=4, n in 1..=32`"), "{msg}");
    assert!(msg.contains("GOLDEN_MODE=record"), "{msg}");
}

#[test]
fn a_store_missing_a_generated_case_is_out_of_date() {
    let scratch = Scratch::new("stale_entry");
    golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let path = scratch.store(&gelu(&scratch));
    let stored = Store::load(&path).unwrap().unwrap();
    let mut entries = stored.entries().to_vec();
    entries.remove(5);
    store::save(
        &path,
        &stored.description,
        &stored.params,
        stored.provenance.as_ref(),
        &entries,
        usize::MAX,
        0,
    )
    .unwrap();
    let msg = fails(&gelu(&scratch).mode(Mode::Replay), &right).to_string();
    assert!(
        msg.contains("has no outputs for a case this check generates"),
        "{msg}"
    );
    assert!(msg.contains("it is out of date"), "{msg}");
}

#[test]
fn a_corrupt_store_is_an_error_never_a_pass() {
    let scratch = Scratch::new("corrupt");
    golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let path = scratch.store(&gelu(&scratch));
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let msg = fails(&gelu(&scratch).mode(Mode::Replay), &right).to_string();
    assert!(
        msg.contains("is corrupt (checksum mismatch: truncated or modified)"),
        "{msg}"
    );
    // Auto mode does not fall back to a corrupt store either: it is live here, and says nothing
    // false about the store.
    golden::check(&gelu(&scratch).mode(Mode::Auto), &right).unwrap_or_else(|f| panic!("{f}"));
}

/// Write the snapshot a live run of `layer` makes (what a user commits after recording), so that
/// a replay has the store's digest to check against.
fn commit_live_snapshot(layer: &Layer) -> String {
    let live =
        golden::check(&layer.clone().mode(Mode::Live), &right).unwrap_or_else(|f| panic!("{f}"));
    let text = live.snapshot().expect("a live run compares every case");
    let declared = layer.declared().unwrap();
    let path =
        std::path::Path::new(declared.snapshot_dir).join(format!("{}.snap", live.snapshot_name()));
    std::fs::create_dir_all(declared.snapshot_dir).unwrap();
    std::fs::write(
        &path,
        format!(
            "---\nsource: {}\n---\n{}\n",
            declared.source_file,
            text.trim_end()
        ),
    )
    .unwrap();
    text
}

#[test]
fn a_partial_store_replays_what_it_holds_and_skips_the_snapshot() {
    let scratch = Scratch::new("partial");
    golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let path = scratch.store(&gelu(&scratch));
    let stored = Store::load(&path).unwrap().unwrap();
    let (kept, _) = store::save(
        &path,
        &stored.description,
        &stored.params,
        stored.provenance.as_ref(),
        stored.entries(),
        10_000,
        0,
    )
    .unwrap();
    assert!(kept > 0 && kept < 32, "{kept}");
    commit_live_snapshot(&gelu(&scratch));
    let replay =
        golden::check(&gelu(&scratch).mode(Mode::Replay), &right).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(replay.runs[0].cases.len(), kept);
    assert_eq!(replay.runs[0].skipped, 32 - kept);
    assert!(replay.snapshot().is_none());
    assert!(replay
        .snapshot_skipped()
        .unwrap()
        .contains("holds only some of the cases"));
}

/// The store's frame, its header edited by `edit`, sealed again (an edit its checksum cannot see).
fn edit_header(path: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let bytes = std::fs::read(path).unwrap();
    let mut frame = golden::internal::python::wire::read_frame(&mut &bytes[20..]).unwrap();
    edit(&mut frame.header);
    std::fs::write(
        path,
        store::seal(&golden::internal::python::wire::encode(&frame)),
    )
    .unwrap();
}

/// Every expected value of a store's entries set to zero, and the store saved again with `limit`.
fn zero_outputs(path: &std::path::Path, limit: usize) -> usize {
    let stored = Store::load(path).unwrap().unwrap();
    let mut entries = stored.entries().to_vec();
    for e in &mut entries {
        for (_, t) in &mut e.outputs.expected {
            *t = golden::HostTensor::from_floats(t.shape.clone(), &vec![0.0; t.numel()], t.dtype);
        }
    }
    store::save(
        path,
        &stored.description,
        &stored.params,
        stored.provenance.as_ref(),
        &entries,
        limit,
        0,
    )
    .unwrap()
    .0
}

/// A store whose header says it is partial skipped the snapshot, and with it the SHA-256 line that
/// makes stores tamper-evident (#21 item 1): a store edited to zeros, one entry dropped, marked
/// "kept 31 of 32" and sealed again passed a port returning zeros; so did a store of no entries.
/// The header is inside the data it vouches for: a partial store must be consistent with the
/// size bound it records, hold at least one case, and match the digest its snapshot records.
#[test]
fn a_partial_store_is_trusted_only_as_far_as_its_snapshot_s_digest() {
    let scratch = Scratch::new("partial_tampered");
    golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let path = scratch.store(&gelu(&scratch));
    let pristine = std::fs::read(&path).unwrap();
    commit_live_snapshot(&gelu(&scratch));

    // Zeros, the last entry dropped, "kept 31 of 32" far below the 4 MiB bound.
    zero_outputs(&path, usize::MAX);
    edit_header(&path, |h| {
        h["entries"].as_array_mut().unwrap().pop();
        h["cases"] = serde_json::json!({"kept": 31, "evaluated": 32});
    });
    let msg = fails(&gelu(&scratch).mode(Mode::Replay), &zeros).to_string();
    assert!(
        msg.contains("says it is partial (31 of 32 cases kept)") && msg.contains("record it again"),
        "{msg}"
    );

    // No entries at all.
    std::fs::write(&path, &pristine).unwrap();
    edit_header(&path, |h| {
        h["entries"] = serde_json::json!([]);
        h["cases"] = serde_json::json!({"kept": 0, "evaluated": 8});
    });
    let msg = fails(&gelu(&scratch).mode(Mode::Replay), &zeros).to_string();
    assert!(msg.contains("holds no case"), "{msg}");

    // A partial store consistent with its bound, edited to zeros and saved at the same bound:
    // its header is fine, its digest is not the snapshot's.
    std::fs::write(&path, &pristine).unwrap();
    let kept = zero_outputs(&path, 10_000);
    assert!(kept > 0 && kept < 32, "{kept}");
    let msg = fails(&gelu(&scratch).mode(Mode::Replay), &zeros).to_string();
    assert!(
        msg.contains("its snapshot records another store") && msg.contains("sha256"),
        "{msg}"
    );
    // The untampered partial store with the snapshot made beside it (the reviewed change) replays.
    std::fs::write(&path, &pristine).unwrap();
    let stored = Store::load(&path).unwrap().unwrap();
    store::save(
        &path,
        &stored.description,
        &[],
        None,
        stored.entries(),
        10_000,
        0,
    )
    .unwrap();
    commit_live_snapshot(&gelu(&scratch));
    golden::check(&gelu(&scratch).mode(Mode::Replay), &right).unwrap_or_else(|f| panic!("{f}"));
}

fn zeros(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).zeros_like().into_outputs()
}

/// The digest line of a snapshot.
fn digest_line(snapshot: &str) -> &str {
    snapshot
        .lines()
        .find(|l| l.starts_with("golden store: sha256 "))
        .unwrap_or_else(|| panic!("no store digest in:\n{snapshot}"))
}

#[test]
fn a_tampered_store_shows_in_the_snapshot_and_fails_verify() {
    let scratch = Scratch::new("tampered");
    let recorded =
        golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    // An edit a checksum cannot catch: every expected value set to zero, the store sealed again.
    // A port that returns zeros now passes in replay...
    let path = scratch.store(&gelu(&scratch));
    let stored = Store::load(&path).unwrap().unwrap();
    let mut entries = stored.entries().to_vec();
    for e in &mut entries {
        for (_, t) in &mut e.outputs.expected {
            *t = golden::HostTensor::from_floats(t.shape.clone(), &vec![0.0; t.numel()], t.dtype);
        }
    }
    store::save(
        &path,
        &stored.description,
        &stored.params,
        stored.provenance.as_ref(),
        &entries,
        usize::MAX,
        0,
    )
    .unwrap();
    let tampered =
        golden::check(&gelu(&scratch).mode(Mode::Replay), &zeros).unwrap_or_else(|f| panic!("{f}"));
    // ...but its snapshot, reviewed in the pull request, records another store: the committed
    // snapshot fails to match (in CI insta writes nothing and fails).
    let (before, after) = (recorded.snapshot().unwrap(), tampered.snapshot().unwrap());
    assert_ne!(digest_line(&before), digest_line(&after));
    // And `verify` compares the store with the live reference.
    let msg = fails(&gelu(&scratch).mode(Mode::Verify), &right).to_string();
    assert!(
        msg.contains("disagrees with the live reference: leaf `out` is 0 in the store"),
        "{msg}"
    );
    assert!(msg.contains("GOLDEN_MODE=record"), "{msg}");
}

#[test]
fn verify_passes_a_store_that_matches_the_live_reference() {
    let scratch = Scratch::new("verified");
    golden::check(&gelu(&scratch).mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let verified =
        golden::check(&gelu(&scratch).mode(Mode::Verify), &right).unwrap_or_else(|f| panic!("{f}"));
    assert!(
        verified.source.starts_with("live, verifying"),
        "{}",
        verified.source
    );
}

#[test]
fn a_module_store_holds_the_parameter_list_not_every_case_s_parameters() {
    let scratch = Scratch::new("module_size");
    let layer = |mode| {
        Layer::module("mlp", "zoo_ref.MLP")
            .init("d_model", 64usize)
            .init("hidden", 128usize)
            .dim("b", 1, 2)
            .arg("x", ["b".into(), golden::DimExpr::Lit(64)], Dist::default())
            .dtypes(&[candle_core::DType::F32, candle_core::DType::BF16])
            .declared_at(scratch.declared)
            .mode(mode)
    };
    let port = |i: &PortInputs| {
        let vb = i.var_builder();
        let fc1 = candle_nn::linear(64, 128, vb.pp("fc1")).map_err(|e| e.to_string())?;
        let fc2 = candle_nn::linear(128, 64, vb.pp("fc2")).map_err(|e| e.to_string())?;
        fc1.forward(i.tensor(0))
            .and_then(|h| h.gelu_erf())
            .and_then(|h| fc2.forward(&h))
            .into_outputs()
    };
    golden::check(&layer(Mode::Record), &port).unwrap_or_else(|f| panic!("{f}"));
    let stored = Store::load(&scratch.store(&layer(Mode::Replay)))
        .unwrap()
        .unwrap();
    // 32 cases in two dtypes fit the 4 MiB bound (each case's 16k parameters would not).
    assert_eq!(stored.partial, None);
    assert_eq!(stored.len(), 64);
    assert!(stored
        .entries()
        .iter()
        .all(|e| e.outputs.state_dict.is_empty()));
    assert_eq!(stored.params.len(), 1, "one construction, one list");
    assert_eq!(stored.params[0].1.entries.len(), 4);
    golden::check(&layer(Mode::Replay), &port).unwrap_or_else(|f| panic!("{f}"));
}
