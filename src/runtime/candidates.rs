//! A row of logits reduced to the few that sampling can pick (`kernels/candidates.wgsl` makes
//! them on the GPU; [`candidates_of`] is the reference): every logit at or above a threshold
//! that at least `k` of them reach. A 262144-token row is 1 MB to read back and scan on the
//! host every token; its candidates are a few hundred pairs.
//!
//! The threshold is the k-th largest of the row's block maxima ([`BLOCK`] logits a block): k
//! blocks reach it, each with a logit at least that large, so the k best logits (by value, ties
//! by the lower id) are all at or above it, and so is every logit equal to the k-th. Top-k (and
//! the argmax, k = 1) over the candidates is then exactly top-k over the row.

/// Logits a block maximum covers: one GPU workgroup's share.
pub const BLOCK: usize = 1024;

/// Most candidates a call stores; past it they are counted only (`found`), and the caller
/// reads the whole row.
pub const CAPACITY: usize = 1024;

/// Most blocks a row may have (the GPU ranks their maxima in workgroup memory): rows of up to
/// 2M logits.
pub const MAX_BLOCKS: usize = 2048;

/// One row's candidates, in no particular order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    /// (token id, logit) pairs; never NaN or -inf.
    pub pairs: Vec<(u32, f32)>,
    /// How many logits reached the threshold: more than `pairs.len()` when they overflowed
    /// [`CAPACITY`].
    pub found: usize,
    /// The k they were gathered for.
    pub k: usize,
    /// For k = 1: the first position of the row's largest logit (NaN never wins), as
    /// [`first_max`] finds it over the whole row, so that it decides a greedy pick even where
    /// the pairs overflow; `None` where the row has nothing but NaN, or it was not asked for.
    pub first: Option<u32>,
    /// For a call asked to draw (`DevicePick::draw`): the token the device's draw picked, in f32
    /// arithmetic, for the host to check against its own; `None` where the candidates cannot
    /// decide it (overflowed, or none).
    pub drawn: Option<u32>,
}

/// How a decode step that is submitted before the host has read the one before picks its
/// token on the device (`Method::start_candidates`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DevicePick {
    /// The graph input the call's pick is copied into: the next step's token.
    pub feed: usize,
    /// This call's own value for `feed` is unused: the last call's pick is already there.
    pub fed: bool,
    /// A sampled pick (top-k of the candidates, temperature, top-p, min-p, then one uniform
    /// draw), or `None` for greedy (k = 1: `Candidates::first`).
    pub draw: Option<Draw>,
}

/// A sampled pick's settings (as `llm::sampler::SamplingParams` has them) and its uniform
/// number in [0, 1), which the host takes from its RNG ahead of time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub u: f64,
}

impl Candidates {
    /// Whether they hold every logit that reached the threshold, and at least one.
    pub fn complete(&self) -> bool {
        self.found == self.pairs.len() && self.found > 0
    }
}

/// The threshold for `k`: the k-th largest of `row`'s block maxima (NaN ignored), or -inf when
/// there are fewer than k blocks.
pub fn threshold(row: &[f32], k: usize) -> f32 {
    let mut maxima: Vec<f32> = row
        .chunks(BLOCK)
        .map(|b| {
            b.iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
        })
        .collect();
    if k == 0 || k > maxima.len() {
        return f32::NEG_INFINITY;
    }
    maxima.sort_unstable_by(|a, b| b.total_cmp(a));
    maxima[k - 1]
}

/// The reference: `row`'s candidates for `k`, in id order, stored up to [`CAPACITY`].
pub fn candidates_of(row: &[f32], k: usize) -> Candidates {
    let t = threshold(row, k);
    let all: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .filter(|(_, &x)| x >= t && x != f32::NEG_INFINITY)
        .map(|(i, &x)| (i as u32, x))
        .collect();
    let found = all.len();
    let mut pairs = all;
    pairs.truncate(CAPACITY);
    let first = if k == 1 { first_max(row) } else { None };
    Candidates {
        pairs,
        found,
        k,
        first,
        drawn: None,
    }
}

/// The first position of `row`'s largest value, NaN never winning (`torch.argmax` and the
/// sampler's greedy pick); `None` where every value is NaN. Signed zeros are equal.
pub fn first_max(row: &[f32]) -> Option<u32> {
    let best = row
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    row.iter().position(|&x| x == best).map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_k_best_are_always_among_the_candidates() {
        // Blocks whose maxima tie, a block of NaN, -inf and +inf, a short last block.
        let mut row: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919) % 1013) as f32 / 50.0)
            .collect();
        row[10..1034].fill(f32::NAN);
        row[2100] = f32::NEG_INFINITY;
        row[4999] = f32::INFINITY;
        for k in [1, 2, 3, 4, 5, 6] {
            let c = candidates_of(&row, k);
            let mut sorted: Vec<(u32, f32)> = row
                .iter()
                .enumerate()
                .filter(|(_, x)| !x.is_nan() && **x != f32::NEG_INFINITY)
                .map(|(i, &x)| (i as u32, x))
                .collect();
            sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if !c.complete() {
                // Overflowed: the caller reads the row.
                assert!(c.found > CAPACITY, "k {k}");
                continue;
            }
            for best in &sorted[..k.min(sorted.len())] {
                assert!(c.pairs.contains(best), "k {k}: {best:?} missing");
            }
            assert!(c.pairs.iter().all(|p| !p.1.is_nan()));
        }
        // 5 blocks: k = 6 admits every finite logit, more than the capacity holds.
        let c = candidates_of(&row, 6);
        assert_eq!(c.found, 5000 - 1024 - 1);
        assert_eq!(c.pairs.len(), CAPACITY);
        assert!(!c.complete());
        assert!(candidates_of(&row, 1).complete());
        assert_eq!(candidates_of(&row, 1).pairs, vec![(4999, f32::INFINITY)]);
        assert_eq!(candidates_of(&row, 1).first, Some(4999));
        assert_eq!(candidates_of(&row, 2).first, None);
    }

    #[test]
    fn first_max_takes_the_first_of_ties_and_skips_nan() {
        assert_eq!(first_max(&[f32::NAN, 1.0, 3.0, f32::NAN, 3.0]), Some(2));
        assert_eq!(first_max(&[-0.0, 0.0, f32::NAN]), Some(0));
        assert_eq!(first_max(&[f32::NAN, 0.0, -0.0]), Some(1));
        assert_eq!(first_max(&[f32::NAN, f32::NEG_INFINITY]), Some(1));
        assert_eq!(first_max(&[f32::NAN, f32::NAN]), None);
        assert_eq!(first_max(&[]), None);
    }

    #[test]
    fn rows_without_a_finite_logit_have_no_candidates() {
        let row = vec![f32::NAN; 3000];
        assert_eq!(threshold(&row, 1), f32::NEG_INFINITY);
        let c = candidates_of(&row, 1);
        assert_eq!((c.found, c.complete(), c.first), (0, false, None));
        let row = vec![f32::NEG_INFINITY; 10];
        assert!(!candidates_of(&row, 1).complete());
        assert_eq!(candidates_of(&row, 1).first, Some(0));
    }
}
