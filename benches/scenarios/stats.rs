//! Medians, percentiles and ratios: the only statistics the benchmark reports.

/// The median of `values` (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// `(min, max)` of `values`; `None` when empty.
pub fn min_max(values: &[f64]) -> Option<(f64, f64)> {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let min = v.iter().copied().reduce(f64::min)?;
    let max = v.iter().copied().reduce(f64::max)?;
    Some((min, max))
}

/// The `q` quantile (nearest rank) of latencies, in milliseconds; 0 when empty.
pub fn percentile_ms(sorted_micros: &[u64], q: f64) -> f64 {
    if sorted_micros.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted_micros.len() as f64).ceil() as usize;
    sorted_micros[rank.clamp(1, sorted_micros.len()) - 1] as f64 / 1000.0
}

/// Latency summary of one measurement.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Latency {
    /// Samples.
    pub count: usize,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
}

impl Latency {
    /// Summarises latencies given in microseconds (sorted here).
    pub fn of_micros(mut micros: Vec<u64>) -> Self {
        micros.sort_unstable();
        Latency {
            count: micros.len(),
            p50_ms: percentile_ms(&micros, 0.50),
            p90_ms: percentile_ms(&micros, 0.90),
            p99_ms: percentile_ms(&micros, 0.99),
            max_ms: micros.last().map_or(0.0, |m| *m as f64 / 1000.0),
        }
    }
}

/// `a / b`, or NaN when `b` is 0 (serialised as null).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

/// The median of the per-repetition ratios `a[i] / b[i]` (pairs measured back to back).
pub fn median_of_pair_ratios(a: &[f64], b: &[f64]) -> Option<f64> {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| ratio(*x, *y)).collect();
    median(&ratios)
}

/// A small, fast, seedable PRNG (SplitMix64): the load generators' choices must not cost more
/// than the requests, and must be reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]` (inclusive).
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo) as u64 + 1;
        lo + (self.next_u64() % span) as i64
    }
}
