//! Sample summaries: median, p90, p99, min, max of a set of timings.

use std::time::Duration;

/// A summary of `n` timings, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Median (the mean of the two middle samples when `n` is even).
    pub median_us: f64,
    /// 90th percentile (nearest rank).
    pub p90_us: f64,
    /// 99th percentile (nearest rank; the slowest sample below 100 samples).
    pub p99_us: f64,
    /// Fastest sample.
    pub min_us: f64,
    /// Slowest sample.
    pub max_us: f64,
}

impl Summary {
    /// Summarizes `samples`; `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        Summary::of_us(&mut us)
    }

    /// Summarizes samples given in microseconds (sorts them).
    pub fn of_us(us: &mut [f64]) -> Option<Summary> {
        if us.is_empty() {
            return None;
        }
        us.sort_by(f64::total_cmp);
        let n = us.len();
        let median = if n % 2 == 1 {
            us[n / 2]
        } else {
            (us[n / 2 - 1] + us[n / 2]) / 2.0
        };
        // Nearest rank: the smallest sample with at least P% at or below it.
        let rank = |p: f64| ((p * n as f64).ceil() as usize).clamp(1, n);
        Some(Summary {
            n,
            median_us: median,
            p90_us: us[rank(0.9) - 1],
            p99_us: us[rank(0.99) - 1],
            min_us: us[0],
            max_us: us[n - 1],
        })
    }

    /// Throughput of `bytes` at the median time, GB/s (10^9 bytes per second).
    pub fn gbps(&self, bytes: u64) -> f64 {
        gbps_us(bytes, self.median_us)
    }
}

/// GB/s (10^9 bytes per second) of `bytes` moved in `us` microseconds.
pub fn gbps_us(bytes: u64, us: f64) -> f64 {
    if us <= 0.0 {
        return f64::INFINITY;
    }
    bytes as f64 / us / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_p90_min_max() {
        let d: Vec<Duration> = (1..=10).map(|i| Duration::from_micros(i * 10)).collect();
        let s = Summary::of(&d).unwrap();
        assert_eq!(s.n, 10);
        assert!((s.median_us - 55.0).abs() < 1e-9);
        assert!((s.p90_us - 90.0).abs() < 1e-9);
        assert!((s.min_us - 10.0).abs() < 1e-9);
        assert!((s.max_us - 100.0).abs() < 1e-9);
        let one = Summary::of(&[Duration::from_micros(7)]).unwrap();
        assert_eq!((one.median_us, one.p90_us), (7.0, 7.0));
        assert!(Summary::of(&[]).is_none());
        // p99 by nearest rank: the 99th of 100 samples, the slowest of 10.
        assert!((s.p99_us - 100.0).abs() < 1e-9);
        let mut hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(Summary::of_us(&mut hundred).unwrap().p99_us, 99.0);
        assert!((gbps_us(1_000_000, 1000.0) - 1.0).abs() < 1e-9);
    }
}
