//! `.npy` files: any bytes give a tensor or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = golden_files::npy::decode(data);
});
