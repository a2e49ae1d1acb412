//! The worker's frames: any bytes on the pipe give a frame or an error, never a panic. Frames whose
//! tensors are in shared memory are resolved against a stand-in arena of 4 KiB named `golden-1-1`
//! (`zoo/tests/fuzz_corpus.rs` replays the corpus the same way): the decoder must never ask it for
//! bytes outside the size the frame declares.
#![no_main]

use libfuzzer_sys::fuzz_target;

const ARENA: [u8; 4096] = [7; 4096];

fuzz_target!(|data: &[u8]| {
    let _ = golden::internal::python::wire::read_frame(&mut &data[..]);
    let _ = golden::internal::python::wire::decode_body(bytes::Bytes::copy_from_slice(data));
    if let Ok(raw) = golden::internal::python::wire::read_raw_frame(&mut &data[..]) {
        let _ = raw.resolve(|shm, offset, len| {
            let size = shm["size"].as_u64().expect("checked by the decoder");
            let end = offset.checked_add(len as u64).expect("checked by the decoder");
            assert!(end <= size, "asked for {offset}+{len} of an arena of {size}");
            if shm["name"] != "golden-1-1" || end > ARENA.len() as u64 {
                return Err("not the stand-in arena".into());
            }
            Ok(bytes::Bytes::copy_from_slice(&ARENA[offset as usize..end as usize]))
        });
    }
});
