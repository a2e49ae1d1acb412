//! Time limits from the environment (`GOLDEN_TIMEOUT`, `GOLDEN_START_TIMEOUT`): a positive number of
//! seconds, or `0`/`inf` for no limit; anything else is an error naming the variable and the form.

use golden::internal::describe::env::parse_seconds;
use std::time::Duration;

#[test]
fn seconds_are_a_positive_number() {
    assert_eq!(parse_seconds("V", "60"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_seconds("V", " 2.5 "), Ok(Duration::from_millis(2500)));
    assert_eq!(parse_seconds("V", "1e-3"), Ok(Duration::from_millis(1)));
}

#[test]
fn zero_and_infinity_mean_no_limit() {
    for value in ["0", "0.0", "inf", "infinity", "+inf", "1e400"] {
        assert_eq!(parse_seconds("V", value), Ok(Duration::MAX), "{value}");
    }
}

#[test]
fn anything_else_names_the_variable_and_the_accepted_form() {
    for value in ["-1", "-0.5", "-inf", "nan", "NaN", "abc", "60s", ""] {
        let err = parse_seconds("GOLDEN_TIMEOUT", value).unwrap_err();
        assert!(
            err.starts_with(&format!("GOLDEN_TIMEOUT={value:?} is not a time limit"))
                && err.contains("positive number")
                && err.contains("0 or inf for no limit"),
            "{value}: {err}"
        );
    }
}
