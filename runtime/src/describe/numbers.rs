//! How numbers are written in messages, snapshots and descriptions: short, with as many
//! significant digits as it takes.

/// Format a number the way the reports do: short, with 4 significant digits.
pub fn num(x: f64) -> String {
    num_sig(x, 4)
}

/// Format two numbers with as many significant digits (4 to 9) as it takes to tell them apart.
pub fn num_pair(a: f64, b: f64) -> (String, String) {
    let mut sig = 4;
    while sig < 9 && a != b && num_sig(a, sig) == num_sig(b, sig) {
        sig += 1;
    }
    (num_sig(a, sig), num_sig(b, sig))
}

/// Format a number with `sig` significant digits, the reports' way.
pub fn num_sig(x: f64, sig: usize) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if (1e-3..1e5).contains(&a) {
        let decimals = (sig as i32 - 1 - a.log10().floor() as i32).max(0) as usize;
        let s = format!("{x:.decimals$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    } else {
        let s = format!("{x:.*e}", sig - 1);
        let (mantissa, exponent) = s.split_once('e').expect("exponent format");
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        format!("{mantissa}e{exponent}")
    }
}

/// A number of bytes, short: `512 B`, `3.5 KiB`, `74.51 GiB`.
pub fn bytes(n: u128) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", num(value), UNITS[unit])
}

/// A duration in seconds, short, in the unit that suits it: `850 ns`, `12.5 µs`, `3.2 ms`, `1.5 s`.
pub fn duration(seconds: f64) -> String {
    let a = seconds.abs();
    if !seconds.is_finite() {
        return format!("{seconds} s");
    }
    let (value, unit) = if a == 0.0 {
        (0.0, "s")
    } else if a < 1e-6 {
        (seconds * 1e9, "ns")
    } else if a < 1e-3 {
        (seconds * 1e6, "µs")
    } else if a < 1.0 {
        (seconds * 1e3, "ms")
    } else {
        (seconds, "s")
    };
    format!("{} {unit}", num_sig(value, 3))
}

/// A duration as a budget is written: whole seconds (`60 s`), or with a tenth (`1.5 s`).
pub fn budget(d: std::time::Duration) -> String {
    let secs = d.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0} s")
    } else {
        format!("{} s", num(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_the_unit_that_suits_them() {
        assert_eq!(duration(0.0), "0 s");
        assert_eq!(duration(8.5e-7), "850 ns");
        assert_eq!(duration(1.25e-5), "12.5 µs");
        assert_eq!(duration(0.0032), "3.2 ms");
        assert_eq!(duration(1.5), "1.5 s");
    }

    #[test]
    fn sizes_in_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3584), "3.5 KiB");
        assert_eq!(bytes(80_000_000_000), "74.51 GiB");
        assert_eq!(
            bytes(u128::MAX),
            format!("{} EiB", num(u128::MAX as f64 / 2f64.powi(60)))
        );
    }
}
