//! Writes a few valid inputs of each target into fuzz/corpus/<target>/ to start from:
//! `cargo +nightly run --manifest-path fuzz/Cargo.toml --bin make_seeds`.

use golden::internal::python::wire::{encode, encode_parts, Frame};
use golden_files::HostTensor;
use serde_json::json;
use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let tensors = vec![
        HostTensor::from_f64(vec![2, 3], &[1.0, -2.0, 0.5, f64::NAN, 0.0, 1e30]),
        HostTensor::from_f64(vec![], &[4.0]),
    ];
    let frame = encode(&Frame {
        id: 7,
        header: json!({"op": "forward", "args": [{"$t": 0}, {"$t": 1}]}),
        tensors: tensors.clone(),
    });
    let store_frame = encode(&Frame {
        id: 0,
        header: json!({
            "golden_store": 1,
            "description": "layer: seed\n",
            "cases": {"kept": 1, "evaluated": 1},
            "entries": [{
                "key": "00000000000000ff", "dtype": "f32", "case": "n=3",
                "state_dict": [], "expected": [["out", {"$t": 0}]],
                "rounding": [["out", {"$t": 1}]],
            }],
        }),
        tensors: tensors.clone(),
    });
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    write("wire_frame", "seed_frame", &frame);
    // The same tensors, the first in the stand-in arena of the wire_frame target.
    let shared = Frame {
        id: 8,
        header: json!({
            "op": "echo",
            "$shm": {"pid": 1, "fd": 3, "name": "golden-1-1", "size": 4096},
        }),
        tensors: tensors.clone(),
    };
    write(
        "wire_frame",
        "seed_shared_frame",
        &encode_parts(&shared, &[Some(64), None]).concat(),
    );
    write("golden_store", "seed_sealed_frame", &store_frame);
    write(
        "golden_store",
        "seed_store",
        &golden::internal::answers::store::seal(&store_frame),
    );
    for (i, t) in tensors.iter().enumerate() {
        write("npy", &format!("seed_{i}"), &golden_files::npy::encode(t));
    }
}
