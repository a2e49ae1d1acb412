//! The fast generator every generated value comes from: xoshiro256++ seeded through splitmix64,
//! one stream per purpose (an argument's name, a parameter's, the padding of a batch) derived from
//! the case seed with FNV-1a. The same numbers on every platform.

use crate::describe::hash::fnv1a;

/// xoshiro256++ seeded through splitmix64: fast, and the same numbers on every platform.
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for one stream, e.g. `Rng::new(case_seed, "x")`.
    pub fn new(seed: u64, stream: &str) -> Self {
        let mut z = seed ^ fnv1a(stream.as_bytes());
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal pair (Box–Muller).
    pub(crate) fn normal_pair(&mut self) -> (f64, f64) {
        let u1 = 1.0 - self.unit(); // (0, 1]: ln is finite
        let u2 = self.unit();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f64::consts::TAU * u2;
        (r * theta.cos(), r * theta.sin())
    }

    /// `n` standard normal values.
    pub fn normals(&mut self, n: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(n + 1);
        while out.len() < n {
            let (a, b) = self.normal_pair();
            out.push(a);
            out.push(b);
        }
        out.truncate(n);
        out
    }
}
