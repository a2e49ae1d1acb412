//! How far one file may expand in memory: the read budget.
//!
//! A tensor file golden did not write may be small on disk and huge in memory: a deflated `.npz`
//! entry of zeros inflates a thousandfold, and a `.pt` can hold hundreds of stride-0 views of one
//! storage, each of which would be a copy. Every reader charges a file's [`Budget`] before it
//! allocates what the file's own bytes do not already hold — inflated zip entries, copies of
//! non-contiguous views, Fortran-order transposes, byte swaps, widened integers — so the total a
//! file expands to is bounded, whatever it claims. What is a slice of the file's bytes (an `.npy`'s
//! data, a stored zip entry, a contiguous view of a storage, a safetensors tensor) costs nothing.
//!
//! The default budget of a file is [`DEFAULT_MULTIPLE`] times its size, at least [`DEFAULT_FLOOR`]
//! and at most [`DEFAULT_CAP`]; a tool may set another one (the `golden` command line's
//! `--read-budget`, or `GOLDEN_READ_BUDGET`).

use std::fmt;

/// A file may expand to this many times its size by default…
pub const DEFAULT_MULTIPLE: u64 = 64;
/// …but at least this many bytes (256 MiB: a small compressed file of masks still reads)…
pub const DEFAULT_FLOOR: u64 = 256 << 20;
/// …and at most this many (16 GiB).
pub const DEFAULT_CAP: u64 = 16 << 30;

/// What reading one file may still allocate beyond the file's own bytes.
#[derive(Clone, Debug)]
pub struct Budget {
    limit: u64,
    used: u64,
    /// How the limit came about, for the error (`64 × the file's 3.0 MiB, at least 256 MiB`).
    origin: String,
    /// How to raise it, in the words of the tool that reads (`--read-budget SIZE`).
    raise: String,
}

/// A read that would go over its file's budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// What was being read (an entry of an archive, a tensor, a storage).
    pub entry: String,
    /// The total the file would have expanded to with it, in bytes.
    pub would_reach: u64,
    /// The budget, in bytes.
    pub limit: u64,
    /// How the budget was set.
    pub origin: String,
    /// How to raise it.
    pub raise: String,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} would expand the file to {} in memory, over its read budget of {} ({}); if you \
             trust the file, raise the budget with {} (at least {} MiB)",
            self.entry,
            size(self.would_reach),
            size(self.limit),
            self.origin,
            self.raise,
            self.would_reach.div_ceil(1 << 20),
        )
    }
}

impl std::error::Error for OverBudget {}

/// Why a file could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The bytes are not a file golden reads, and why.
    Unreadable(String),
    /// Reading it would go over its read budget.
    OverBudget(OverBudget),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Unreadable(why) => f.write_str(why),
            ReadError::OverBudget(over) => over.fmt(f),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<OverBudget> for ReadError {
    fn from(over: OverBudget) -> Self {
        ReadError::OverBudget(over)
    }
}

impl From<String> for ReadError {
    fn from(why: String) -> Self {
        ReadError::Unreadable(why)
    }
}

impl Budget {
    /// The default budget of a file of `file_len` bytes.
    pub fn for_file(file_len: u64) -> Budget {
        let limit = file_len
            .saturating_mul(DEFAULT_MULTIPLE)
            .clamp(DEFAULT_FLOOR, DEFAULT_CAP);
        Budget {
            limit,
            used: 0,
            origin: format!(
                "the default: {DEFAULT_MULTIPLE} × the file's {}, at least {} and at most {}",
                size(file_len),
                size(DEFAULT_FLOOR),
                size(DEFAULT_CAP)
            ),
            raise: "a larger read budget".into(),
        }
    }

    /// A budget of `limit` bytes, set as `origin` says (`--read-budget 4GiB`).
    pub fn fixed(limit: u64, origin: impl Into<String>) -> Budget {
        Budget {
            limit,
            used: 0,
            origin: origin.into(),
            raise: "a larger read budget".into(),
        }
    }

    /// How the error tells the user to raise the budget (`--read-budget SIZE or
    /// GOLDEN_READ_BUDGET`).
    pub fn raise_with(mut self, how: impl Into<String>) -> Budget {
        self.raise = how.into();
        self
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// What the file has expanded to so far, in bytes.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Whether `bytes` more would still fit.
    pub fn fits(&self, bytes: u64) -> bool {
        self.used
            .checked_add(bytes)
            .is_some_and(|total| total <= self.limit)
    }

    /// Account for `bytes` about to be allocated for `entry`, or refuse them. Call before
    /// allocating.
    pub fn charge(&mut self, entry: &str, bytes: u64) -> Result<(), OverBudget> {
        match self.used.checked_add(bytes) {
            Some(total) if total <= self.limit => {
                self.used = total;
                Ok(())
            }
            total => Err(OverBudget {
                entry: entry.to_string(),
                would_reach: total.unwrap_or(u64::MAX),
                limit: self.limit,
                origin: self.origin.clone(),
                raise: self.raise.clone(),
            }),
        }
    }

    /// Charge `elements × element_size` bytes, refusing a product that overflows.
    pub fn charge_elements(
        &mut self,
        entry: &str,
        elements: usize,
        element_size: usize,
    ) -> Result<(), OverBudget> {
        let bytes = (elements as u64).saturating_mul(element_size as u64);
        self.charge(entry, bytes)
    }
}

/// A byte count as people read it: `512 B`, `3.1 MiB`, `16 GiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    format!("{} {}", text.trim_end_matches(".0"), UNITS[unit])
}

/// Parse a size as a person writes it: `512MiB`, `4 GiB`, `1.5G`, `100kB`; a bare number is MiB
/// (as `GOLDEN_STORE_LIMIT` is). Binary units (`K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`, `TiB`)
/// are powers of 1024, decimal ones (`kB`, `MB`, `GB`, `TB`) of 1000; `B` is bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bad = || {
        format!(
            "`{text}` is not a size: write a number and a unit, such as 512MiB, 4GiB or 1.5GB (a \
             bare number is MiB)"
        )
    };
    let value: f64 = number.replace('_', "").parse().map_err(|_| bad())?;
    let scale: f64 = match unit.trim() {
        "" | "M" | "MiB" | "m" | "mib" | "MIB" => (1u64 << 20) as f64,
        "B" | "b" => 1.0,
        "K" | "KiB" | "k" | "kib" | "KIB" => 1024.0,
        "G" | "GiB" | "g" | "gib" | "GIB" => (1u64 << 30) as f64,
        "T" | "TiB" | "t" | "tib" | "TIB" => (1u64 << 40) as f64,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return Err(bad()),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(format!(
            "`{text}` is not a size golden can use: at least 1 byte and less than 16 EiB"
        ));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_multiple_of_the_file_between_a_floor_and_a_cap() {
        assert_eq!(Budget::for_file(0).limit(), DEFAULT_FLOOR);
        assert_eq!(Budget::for_file(3 << 20).limit(), DEFAULT_FLOOR);
        assert_eq!(Budget::for_file(10 << 20).limit(), 640 << 20);
        assert_eq!(Budget::for_file(1 << 30).limit(), DEFAULT_CAP);
        assert_eq!(Budget::for_file(u64::MAX).limit(), DEFAULT_CAP);
    }

    #[test]
    fn charges_add_up_and_the_refusal_says_what_and_how_much() {
        let mut b = Budget::fixed(100 << 20, "--read-budget 100MiB").raise_with("--read-budget");
        b.charge("`a.npy`", 60 << 20).unwrap();
        let e = b.charge("`b.npy`", 50 << 20).unwrap_err();
        assert_eq!(e.would_reach, 110 << 20);
        assert_eq!(b.used(), 60 << 20, "a refused charge is not counted");
        assert_eq!(
            e.to_string(),
            "`b.npy` would expand the file to 110 MiB in memory, over its read budget of 100 MiB \
             (--read-budget 100MiB); if you trust the file, raise the budget with --read-budget \
             (at least 110 MiB)"
        );
        assert!(b.charge("`c`", u64::MAX).is_err());
        assert!(b.charge_elements("`d`", usize::MAX, 8).is_err());
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4 GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("100"), Ok(100 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("64B"), Ok(64));
        for bad in ["", "lots", "-1GiB", "1 parsec", "0", "1e400"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(size(512), "512 B");
        assert_eq!(size(3 << 20), "3 MiB");
        assert_eq!(size((3 << 20) + (1 << 19)), "3.5 MiB");
        assert_eq!(size(16 << 30), "16 GiB");
    }
}
