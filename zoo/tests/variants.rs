//! Every known variant shipped in `reference_py/zoo_ref/variants.py`, demonstrated on a
//! deliberately wrong port (`tests/common/variant_ports.rs`): golden must report that the port
//! matches exactly that variant. Live only: variants are evaluated by the Python worker.

mod common;

use common::variant_ports::{self, VariantPort};
use golden::internal::describe::env::Mode;

/// The port must fail and be recognised as its variant, the best fit of those that match.
/// (Close variants can fit the same case: eps 1e-6 and 1e-12 on unit-variance inputs.) The
/// mutation diagnosis, which knows nothing of the variants, names the same mistake beside it.
fn expect_variant(wrong: VariantPort) {
    let name = wrong.variant;
    let expected = variant_ports::expected_mutation(wrong.layer.name());
    let failure = common::must_fail(
        &wrong.layer.mode(Mode::Live),
        variant_ports::callable(&wrong.port),
    );
    let msg = failure.to_string();
    let c = failure.case_failure().unwrap_or_else(|| panic!("{msg}"));
    let found: Vec<&str> = c.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(found.first(), Some(&name), "{msg}");
    assert!(
        msg.contains(&format!(
            "the port matches `{name}`, a known variant of the reference"
        )),
        "{msg}"
    );
    if let Some((cause, site)) = expected {
        assert!(
            c.mutations
                .iter()
                .any(|m| m.mutation.what.contains(cause) && m.mutation.site.contains(site)),
            "the mutation diagnosis does not name `{cause}` at {site}:\n{msg}"
        );
    }
}

#[test]
fn gelu_tanh_for_erf() {
    expect_variant(variant_ports::gelu_tanh_for_erf());
}

#[test]
fn gelu_erf_for_tanh() {
    expect_variant(variant_ports::gelu_erf_for_tanh());
}

#[test]
fn silu_without_the_x() {
    expect_variant(variant_ports::silu_without_the_x());
}

#[test]
fn gelu_for_silu() {
    expect_variant(variant_ports::gelu_for_silu());
}

#[test]
fn softmax_over_dim_0() {
    expect_variant(variant_ports::softmax_over_dim_0());
}

#[test]
fn softmax_over_dim_1() {
    expect_variant(variant_ports::softmax_over_dim_1());
}

#[test]
fn softmax_over_dim_2_of_four() {
    expect_variant(variant_ports::softmax_over_dim_2_of_four());
}

#[test]
fn log_softmax_for_softmax() {
    expect_variant(variant_ports::log_softmax_for_softmax());
}

#[test]
fn layer_norm_eps_1e3() {
    expect_variant(variant_ports::layer_norm_eps_1e3());
}

#[test]
fn layer_norm_eps_1e6() {
    expect_variant(variant_ports::layer_norm_eps_1e6());
}

#[test]
fn layer_norm_eps_1e12() {
    expect_variant(variant_ports::layer_norm_eps_1e12());
}

#[test]
fn layer_norm_unbiased_variance() {
    expect_variant(variant_ports::layer_norm_unbiased_variance());
}

#[test]
fn layer_norm_eps_outside_the_sqrt() {
    expect_variant(variant_ports::layer_norm_eps_outside_the_sqrt());
}

#[test]
fn rms_norm_eps_1e5() {
    expect_variant(variant_ports::rms_norm_eps_1e5());
}

#[test]
fn rms_norm_that_subtracts_the_mean() {
    expect_variant(variant_ports::rms_norm_that_subtracts_the_mean());
}

#[test]
fn rms_norm_with_one_plus_weight() {
    expect_variant(variant_ports::rms_norm_with_one_plus_weight());
}

#[test]
fn linear_without_bias() {
    expect_variant(variant_ports::linear_without_bias());
}

#[test]
fn linear_with_an_untransposed_weight() {
    expect_variant(variant_ports::linear_with_an_untransposed_weight());
}

#[test]
fn embedding_scaled_by_sqrt_d() {
    expect_variant(variant_ports::embedding_scaled_by_sqrt_d());
}

#[test]
fn conv1d_without_bias() {
    expect_variant(variant_ports::conv1d_without_bias());
}

#[test]
fn conv1d_with_a_flipped_kernel() {
    expect_variant(variant_ports::conv1d_with_a_flipped_kernel());
}

#[test]
fn conv1d_without_padding() {
    expect_variant(variant_ports::conv1d_without_padding());
}

#[test]
fn conv1d_without_stride() {
    expect_variant(variant_ports::conv1d_without_stride());
}

#[test]
fn attention_scaled_by_one_over_d() {
    expect_variant(variant_ports::attention_scaled_by_one_over_d());
}

#[test]
fn attention_without_the_causal_mask() {
    expect_variant(variant_ports::attention_without_the_causal_mask());
}

#[test]
fn attention_without_the_scale() {
    expect_variant(variant_ports::attention_without_the_scale());
}

#[test]
fn mlp_with_gelu_tanh() {
    expect_variant(variant_ports::mlp_with_gelu_tanh());
}

#[test]
fn mlp_without_biases() {
    expect_variant(variant_ports::mlp_without_biases());
}

#[test]
fn block_in_post_norm_order() {
    expect_variant(variant_ports::block_in_post_norm_order());
}

#[test]
fn block_with_gelu_tanh_in_its_mlp() {
    expect_variant(variant_ports::block_with_gelu_tanh_in_its_mlp());
}

#[test]
fn block_without_the_causal_mask() {
    expect_variant(variant_ports::block_without_the_causal_mask());
}
