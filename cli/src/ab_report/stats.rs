//! The statistics of a report: latency histograms read back from their
//! buckets, percentiles, and the seeded bootstrap that gives the
//! confidence intervals.

/// A latency histogram merged from `[value_ns, count]` pairs: distinct values
/// ascending with their cumulative counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    pub(super) values: Vec<u64>,
    pub(super) cumulative: Vec<u64>,
}

impl Histogram {
    /// Merges pairs from any number of histograms (any order, repeated
    /// values added, zero counts dropped).
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a [(u64, u64)]>) -> Self {
        let mut pairs: Vec<(u64, u64)> = parts
            .into_iter()
            .flatten()
            .copied()
            .filter(|&(_, c)| c > 0)
            .collect();
        pairs.sort_unstable_by_key(|&(v, _)| v);
        let mut h = Histogram::default();
        let mut total = 0u64;
        for (v, c) in pairs {
            total = total.saturating_add(c);
            if h.values.last() == Some(&v) {
                if let Some(last) = h.cumulative.last_mut() {
                    *last = total;
                }
            } else {
                h.values.push(v);
                h.cumulative.push(total);
            }
        }
        h
    }

    /// Number of samples.
    pub fn n(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// `(value, samples <= value)` per distinct value, ascending.
    pub fn cumulative(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.values
            .iter()
            .copied()
            .zip(self.cumulative.iter().copied())
    }

    /// The smallest value with at least `rank` samples at or below it
    /// (`rank` is clamped to `1..=n`); `None` when empty.
    pub fn value_at_rank(&self, rank: u64) -> Option<u64> {
        if self.n() == 0 {
            return None;
        }
        let rank = rank.clamp(1, self.n());
        let i = self.cumulative.partition_point(|&c| c < rank);
        self.values.get(i).copied()
    }

    /// Nearest-rank percentile, `per_mille` in `1..=1000` (p50 = 500): the
    /// value at rank `ceil(per_mille / 1000 * n)`; `None` when empty.
    pub fn percentile(&self, per_mille: u64) -> Option<u64> {
        self.value_at_rank(nearest_rank(self.n(), per_mille))
    }

    /// The inverse CDF at `u` in `(0, 1)`: the value at rank `ceil(u * n)`.
    pub(super) fn inverse_cdf(&self, u: f64) -> Option<u64> {
        self.value_at_rank((u * self.n() as f64).ceil() as u64)
    }
}

/// `ceil(per_mille / 1000 * n)`, at least 1, in integers.
pub(super) fn nearest_rank(n: u64, per_mille: u64) -> u64 {
    let r = (u128::from(n) * u128::from(per_mille)).div_ceil(1000);
    u64::try_from(r).unwrap_or(u64::MAX).max(1)
}

/// Nearest-rank percentile of unsorted values (sorts them).
pub(super) fn percentile_f64(values: &mut [f64], per_mille: u64) -> f64 {
    values.sort_by(f64::total_cmp);
    let r = nearest_rank(values.len() as u64, per_mille);
    values[(r - 1) as usize]
}

/// The seeded generator: splitmix64 plus the few distributions the
/// bootstrap needs.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    /// A stream for one statistic of one comparison.
    pub(super) fn stream(seed: u64, parts: &[&str]) -> Self {
        // FNV-1a over the parts, separated, then mixed with the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for p in parts {
            for b in p.bytes().chain([0xff]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        let mut r = Rng(seed ^ h);
        r.next_u64();
        r
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in the open interval (0, 1).
    pub(super) fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub(super) fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Gamma(shape, 1) for `shape >= 1` (Marsaglia and Tsang's squeeze).
    pub(super) fn gamma(&mut self, shape: f64) -> f64 {
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Beta(a, b) for `a, b >= 1`: the distribution of the `a`-th smallest
    /// of `a + b - 1` uniforms.
    pub(super) fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        x / (x + y)
    }

    /// Binomial(n, p), exactly: while `n` is large, the `a`-th smallest of
    /// the `n` uniforms (a beta draw) splits them into those below it
    /// (uniform under it) and those above (uniform over it); only the side
    /// `p` falls in is still undecided.
    pub(super) fn binomial(&mut self, n: u64, p: f64) -> u64 {
        /// Below this many trials, plain Bernoulli draws are cheaper.
        const DIRECT: u64 = 64;
        let (mut n, mut p, mut k) = (n, p, 0u64);
        while n > DIRECT {
            if p <= 0.0 {
                return k;
            }
            if p >= 1.0 {
                return k + n;
            }
            let a = 1 + n / 2;
            let b = n + 1 - a;
            let y = self.beta(a as f64, b as f64);
            if p < y {
                n = a - 1;
                p /= y;
            } else {
                k += a;
                n = b - 1;
                p = (p - y) / (1.0 - y);
            }
        }
        k + (0..n).filter(|_| self.uniform() < p).count() as u64
    }

    /// The nearest-rank percentile of `n` draws with replacement from `h`.
    pub(super) fn resampled_percentile(&mut self, h: &Histogram, per_mille: u64) -> Option<u64> {
        let n = h.n();
        let r = nearest_rank(n, per_mille);
        let u = self.beta(r as f64, (n - r + 1) as f64);
        h.inverse_cdf(u)
    }
}
