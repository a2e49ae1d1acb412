//! Golden stores: any file gives a store or an error. The input is also sealed with a valid
//! checksum, so that the fuzzer reaches the decoding behind it.
#![no_main]

use golden::internal::answers::store::{seal, Store};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = Store::decode(Path::new("fuzz.golden"), data.to_vec());
    let _ = Store::decode(Path::new("fuzz.golden"), seal(data));
});
