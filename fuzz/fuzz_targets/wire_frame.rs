//! The worker's frames: any bytes on the pipe give a frame or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = golden::python::wire::read_frame(&mut &data[..]);
    let _ = golden::python::wire::decode_body(bytes::Bytes::copy_from_slice(data));
});
