//! `.npy` files: any bytes give a tensor or an error, never a panic or an allocation beyond the
//! read budget (16 MiB, as the tensor_file target: Fortran order, big-endian data and narrow
//! integers are copies charged to it).
#![no_main]

use golden_files::Budget;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = golden_files::npy::decode(data);
    let mut budget = Budget::fixed(16 << 20, "the fuzz target's");
    let _ = golden_files::npy::decode_shared(bytes::Bytes::copy_from_slice(data), &mut budget);
});
