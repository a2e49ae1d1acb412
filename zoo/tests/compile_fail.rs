//! The attribute's compile errors: each case in `tests/compile_fail/` has its expected diagnostics
//! in a `.stderr` file beside it (`TRYBUILD=overwrite cargo test --test compile_fail` rewrites them).

#[test]
fn attribute_errors_point_at_the_mistake() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
