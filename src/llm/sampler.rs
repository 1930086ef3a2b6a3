//! Picking the next token from logits: repetition penalty, then greedy (temperature 0) or
//! temperature → top-k → top-p → min-p → a draw from the renormalised survivors, the order
//! Hugging Face's `generate` applies them in. One seeded RNG serves a whole generation so a seed
//! reproduces it exactly.

use super::{LlmError, Result};
use crate::runtime::candidates::Draw;
use crate::runtime::Candidates;
use std::cmp::Ordering;

/// How to pick tokens. Defaults are Gemma 4's `generation_config.json` (temperature 1.0,
/// top-k 64, top-p 0.95).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 turns it off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p; 1 turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one; 0 turns it off.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens; 1 turns it off.
    pub repetition_penalty: f32,
    /// How many of the most recent context tokens the penalty looks at (0: all of them).
    pub repetition_window: usize,
    /// Seed of the generation's RNG; `None` draws one from the OS once per generation.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 64,
            top_p: 0.95,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_window: 64,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Argmax decoding, no penalty: deterministic output for tests and goldens.
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            ..SamplingParams::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(LlmError::Sampling(m));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition_penalty
            ));
        }
        Ok(())
    }
}

/// PCG-XSH-RR 64/32 (O'Neill 2014): small, fast, and good enough for sampling; seeded through
/// SplitMix64 so nearby seeds give unrelated streams.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
    inc: u64,
}

impl Rng {
    const MUL: u64 = 6364136223846793005;

    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        let mut splitmix = || {
            sm = sm.wrapping_add(0x9E3779B97F4A7C15);
            let mut z = sm;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
            z ^ (z >> 31)
        };
        let state = splitmix();
        let inc = splitmix() | 1;
        let mut rng = Rng { state: 0, inc };
        rng.next_u32();
        rng.state = rng.state.wrapping_add(state);
        rng.next_u32();
        rng
    }

    /// A seed from the OS's hash randomisation: no clock, different every process and call.
    pub fn os_seed() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        h.finish()
    }

    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(Self::MUL).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        let rot = (old >> 59) as u32;
        xorshifted.rotate_right(rot)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        let hi = (self.next_u32() >> 5) as u64; // 27 bits
        let lo = (self.next_u32() >> 6) as u64; // 26 bits
        ((hi << 26) | lo) as f64 / (1u64 << 53) as f64
    }
}

/// Scales the logits of tokens in `history` as CTRL (Keskar et al. 2019) and HF do: a positive
/// logit is divided by the penalty, a negative one multiplied, so both move toward unlikely.
/// Each distinct token is penalised once however often it occurs.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = std::collections::HashSet::new();
    for &t in history {
        if !seen.insert(t) {
            continue;
        }
        if let Some(l) = logits.get_mut(t as usize) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// Samples tokens with one RNG for its whole life.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    scratch: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(Rng::os_seed);
        Ok(Sampler {
            params,
            seed,
            rng: Rng::new(seed),
            scratch: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (reported so a generation drawn with an OS seed can be replayed).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The logits after the repetition penalty: `logits` itself where it changes nothing (a
    /// copy of a 262144-token vocabulary's logits is 1 MB a token).
    fn penalised<'a>(&'a mut self, logits: &'a [f32], history: &[u32]) -> &'a [f32] {
        if self.params.repetition_penalty == 1.0 || history.is_empty() {
            return logits;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(logits);
        let window = match self.params.repetition_window {
            0 => history,
            n => &history[history.len().saturating_sub(n)..],
        };
        apply_repetition_penalty(&mut self.scratch, window, self.params.repetition_penalty);
        &self.scratch
    }

    /// The tokens a non-greedy draw chooses among, most likely first, with their probabilities
    /// (summing to 1). With temperature 0 it is the single argmax token.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Result<Vec<(u32, f64)>> {
        let p = self.params.clone();
        let l = self.penalised(logits, history);
        if p.temperature == 0.0 {
            return Ok(vec![(argmax(l)?, 1.0)]);
        }
        candidates(l, &p)
    }

    /// Picks the next token.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if self.params.temperature == 0.0 {
            let l = self.penalised(logits, history);
            return argmax(l);
        }
        let dist = self.distribution(logits, history)?;
        Ok(self.draw(&dist))
    }

    /// The k whose candidates (`runtime::candidates`: every logit at or above a threshold
    /// that k of them reach) decide this sampler's next pick exactly, or `None` where it needs
    /// the whole row: a repetition penalty changes the history's logits, and a draw without
    /// top-k may pick any token.
    pub fn candidates_wanted(&self) -> Option<usize> {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            return None;
        }
        if p.temperature == 0.0 {
            return Some(1);
        }
        (p.top_k > 0).then_some(p.top_k)
    }

    /// Whether every pick is the first largest logit (temperature 0, no penalty), which a device
    /// makes exactly (`Candidates::first`).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature == 0.0 && self.params.repetition_penalty == 1.0
    }

    /// The draw a device makes for the pick `ahead` picks from now, as this sampler would
    /// from its top-k candidates (each sampled pick takes one uniform number from the RNG, in
    /// order); `None` where the pick is greedy or needs the row (a penalty, no top-k).
    pub fn draw_ahead(&self, ahead: usize) -> Option<Draw> {
        let p = &self.params;
        if p.temperature == 0.0 || p.repetition_penalty != 1.0 || p.top_k == 0 {
            return None;
        }
        let mut rng = self.rng.clone();
        for _ in 0..ahead {
            rng.next_f64();
        }
        Some(Draw {
            temperature: p.temperature,
            top_p: p.top_p,
            min_p: p.min_p,
            u: rng.next_f64(),
        })
    }

    /// Picks the next token from a row's candidates: the token `sample` picks from the whole
    /// row, with the same draw from the RNG. `None`, drawing nothing, where they cannot decide
    /// it (gathered for a smaller k, overflowed, or none at all: the caller then samples the
    /// row, which also says why it has no finite logit).
    pub fn sample_candidates(&mut self, c: &Candidates) -> Result<Option<u32>> {
        let Some(k) = self.candidates_wanted() else {
            return Ok(None);
        };
        if !c.complete() || c.k < k {
            return Ok(None);
        }
        if self.params.temperature == 0.0 {
            // argmax's pick: the largest (signed zeros equal), then the first.
            let best = c
                .pairs
                .iter()
                .fold(f32::NEG_INFINITY, |m, p| if p.1 > m { p.1 } else { m });
            let first = c.pairs.iter().filter(|p| p.1 == best).map(|p| p.0).min();
            return Ok(first);
        }
        let mut top = c.pairs.clone();
        if top.len() > k {
            top.select_nth_unstable_by(k - 1, ranks_before);
            top.truncate(k);
        }
        let t = self.params.temperature as f64;
        let dist = finish(
            top.into_iter().map(|(i, x)| (i, x as f64 / t)).collect(),
            &self.params,
        )?;
        Ok(Some(self.draw(&dist)))
    }

    /// A token of `dist` (most likely first, summing to 1) by one uniform draw.
    fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        let u = self.rng.next_f64();
        let mut acc = 0.0;
        for &(id, prob) in dist {
            acc += prob;
            if u < acc {
                return id;
            }
        }
        // Rounding left the sum a hair under 1 and u above it: the last survivor.
        dist.last().map(|d| d.0).unwrap_or(0)
    }
}

/// Logits the position scans below test at once (argmax's first maximum, top-k's runs in a
/// block): one vectorised test, then a look inside only where it hit.
const LANES: usize = 16;

/// Independent maxima `max_of` keeps in SIMD registers (one running maximum is a chain of
/// dependent compares: greedy picks over a 262144-token vocabulary took 0.34-0.47 ms with it on
/// this project's build machine, copy included; 16 lanes of `f32::max` 38-40 µs without the
/// copy, these 64 by a select 20 µs).
const MAX_LANES: usize = 64;

/// The largest non-NaN value of `xs` (-inf where there is none). `x > m` is false for a NaN x,
/// and m is never NaN; the select is one SIMD max instruction, where `f32::max` (NaN-aware
/// both ways) takes three.
fn max_of(xs: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; MAX_LANES];
    let chunks = xs.chunks_exact(MAX_LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &x) in m.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let m = m
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    rest.iter().fold(m, |a, &b| if b > a { b } else { a })
}

/// Whether any of `xs` is above `floor` (NaN never is): compares or-ed together, which vectorise
/// with no horizontal step until the end.
fn beats(xs: &[f32], floor: f32) -> bool {
    xs.iter().fold(false, |hit, &x| hit | (x > floor))
}

/// The first index of the largest logit (as `torch.argmax`); NaN never wins.
pub fn argmax(logits: &[f32]) -> Result<u32> {
    // The maximum first, then its first position: both passes vectorise.
    let best = max_of(logits);
    let mut at = 0;
    for c in logits.chunks(LANES) {
        if c.iter().fold(false, |hit, &x| hit | (x == best)) {
            let i = c.iter().position(|&x| x == best).unwrap_or(0);
            return Ok((at + i) as u32);
        }
        at += c.len();
    }
    Err(LlmError::Sampling("the logits are empty or all NaN".into()))
}

/// Logits `top_k` checks against its floor at once (a block's maximum, vectorised).
const BLOCK: usize = 256;

/// The `k` most likely tokens of `logits` (NaN and -inf never), as `candidates` orders them:
/// larger logit first, ties by the lower id; in no particular order. One pass, which skips
/// every block none of whose logits beats the k-th best so far: a vocabulary of 262144 costs
/// about as much as reading it once, where sorting it all took a millisecond.
fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let better = ranks_before::<f32>;
    let cap = 2 * k.max(BLOCK);
    let mut kept: Vec<(u32, f32)> = Vec::with_capacity(cap + BLOCK);
    // Only a logit above the k-th best kept one can join: an equal one comes later, so its id
    // is higher, and it ranks below every kept logit of that value. -inf admits every logit
    // that is neither NaN nor -inf.
    let mut floor = f32::NEG_INFINITY;
    let mut at = 0;
    for c in logits.chunks(BLOCK) {
        if beats(c, floor) {
            // Runs of LANES first: a block that beats the floor mostly does so in one place.
            for (r, run) in c.chunks(LANES).enumerate() {
                if beats(run, floor) {
                    for (i, &x) in run.iter().enumerate() {
                        if x > floor {
                            kept.push(((at + r * LANES + i) as u32, x));
                        }
                    }
                }
            }
            if kept.len() >= cap {
                kept.select_nth_unstable_by(k - 1, better);
                kept.truncate(k);
                floor = kept[k - 1].1;
            }
        }
        at += c.len();
    }
    if kept.len() > k {
        kept.select_nth_unstable_by(k - 1, better);
        kept.truncate(k);
    }
    kept
}

/// The order of candidates: the larger logit first (signed zeros equal, so that a logit equal to
/// the k-th best and later never joins top-k, as its floor test says), then the lower id. Never
/// given NaN.
fn ranks_before<T: PartialOrd>(a: &(u32, T), b: &(u32, T)) -> Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

fn candidates(logits: &[f32], p: &SamplingParams) -> Result<Vec<(u32, f64)>> {
    let t = p.temperature as f64;
    // Dividing by t > 0 keeps the logits' order and makes no ties (two f32 quotients rounded
    // to f64 stay apart), so top-k may pick on the logits themselves.
    let c: Vec<(u32, f64)> = if p.top_k > 0 {
        top_k(logits, p.top_k)
            .into_iter()
            .map(|(i, x)| (i, x as f64 / t))
            .collect()
    } else {
        logits
            .iter()
            .enumerate()
            .filter(|(_, x)| !x.is_nan() && **x != f32::NEG_INFINITY)
            .map(|(i, &x)| (i as u32, x as f64 / t))
            .collect()
    };
    finish(c, p)
}

/// The draw's distribution over `c` (temperature applied; top-k's survivors, or every token):
/// sorted, softmax, then top-p and min-p.
fn finish(mut c: Vec<(u32, f64)>, p: &SamplingParams) -> Result<Vec<(u32, f64)>> {
    if c.is_empty() {
        return Err(LlmError::Sampling("no token has a finite logit".into()));
    }
    // Most likely first; ties broken by the lower id so the order (and the draw) is deterministic.
    c.sort_unstable_by(ranks_before::<f64>);
    if c[0].1 == f64::INFINITY {
        // A +inf logit takes all the mass (and with it every other +inf logit, equally).
        let n = c.iter().take_while(|x| x.1 == f64::INFINITY).count();
        c.truncate(n);
        let share = 1.0 / n as f64;
        return Ok(c.into_iter().map(|(i, _)| (i, share)).collect());
    }
    // Softmax over the survivors (the renormalisation after top-k).
    let max = c[0].1;
    let mut sum = 0.0;
    for x in c.iter_mut() {
        x.1 = (x.1 - max).exp();
        sum += x.1;
    }
    for x in c.iter_mut() {
        x.1 /= sum;
    }
    if p.top_p < 1.0 {
        // Keep tokens until the cumulative probability reaches top_p, the crossing one included.
        let mut acc = 0.0;
        let mut keep = c.len();
        for (k, x) in c.iter().enumerate() {
            acc += x.1;
            if acc >= p.top_p as f64 {
                keep = k + 1;
                break;
            }
        }
        c.truncate(keep);
    }
    if p.min_p > 0.0 {
        // Relative to the most likely token, so renormalising before or after does not matter.
        let threshold = c[0].1 * p.min_p as f64;
        c.retain(|x| x.1 >= threshold);
    }
    let sum: f64 = c.iter().map(|x| x.1).sum();
    for x in c.iter_mut() {
        x.1 /= sum;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible_and_seed_dependent() {
        let a: Vec<u32> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u32()).collect()
        };
        let b: Vec<u32> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u32()).collect()
        };
        let c: Vec<u32> = {
            let mut r = Rng::new(8);
            (0..8).map(|_| r.next_u32()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn uniform_draws_cover_the_unit_interval_evenly() {
        let mut r = Rng::new(1);
        let mut bins = [0usize; 10];
        let n = 100_000;
        for _ in 0..n {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u));
            bins[(u * 10.0) as usize] += 1;
        }
        // Each bin is Binomial(n, 0.1): sd = 94.9; 5 sd either side.
        for b in bins {
            assert!((b as f64 - 10_000.0).abs() < 475.0, "{bins:?}");
        }
    }

    /// The straightforward forms the fast paths replaced: every candidate collected, then
    /// top-k by selection; argmax by one running maximum.
    fn reference_candidates(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
        let t = p.temperature as f64;
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .filter(|(_, x)| !x.is_nan() && **x != f32::NEG_INFINITY)
            .map(|(i, &x)| (i as u32, x as f64 / t))
            .collect();
        let order = ranks_before::<f64>;
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, order);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(order);
        c
    }

    fn reference_argmax(logits: &[f32]) -> Option<u32> {
        let mut best: Option<(usize, f32)> = None;
        for (i, &x) in logits.iter().enumerate() {
            if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
                best = Some((i, x));
            }
        }
        best.map(|(i, _)| i as u32)
    }

    /// Logits with many ties (a few distinct values), signed zeros, NaN and infinities.
    fn awkward_logits(rng: &mut Rng, n: usize, specials: bool) -> Vec<f32> {
        (0..n)
            .map(|_| match rng.next_u32() % 40 {
                0 if specials => f32::NAN,
                1 if specials => f32::NEG_INFINITY,
                2 if specials && rng.next_u32() % 8 == 0 => f32::INFINITY,
                3 => -0.0,
                4 => 0.0,
                r if r < 20 => (rng.next_u32() % 7) as f32 - 3.0,
                _ => rng.next_f64() as f32 * 20.0 - 10.0,
            })
            .collect()
    }

    #[test]
    fn fast_top_k_and_argmax_match_the_straightforward_forms() {
        let mut rng = Rng::new(3);
        let mut checked = 0;
        for n in [1, 5, 16, 17, 255, 256, 257, 1000, 4099, 70000] {
            for specials in [false, true] {
                let logits = awkward_logits(&mut rng, n, specials);
                assert_eq!(argmax(&logits).ok(), reference_argmax(&logits), "n {n}");
                for k in [1, 2, 5, 64, 300, n.saturating_sub(1), n, n + 5] {
                    for (temperature, top_p, min_p) in [(1.0, 1.0, 0.0), (0.7, 0.9, 0.05)] {
                        let p = SamplingParams {
                            temperature,
                            top_k: k,
                            top_p: 1.0,
                            min_p: 0.0,
                            ..Default::default()
                        };
                        let want = reference_candidates(&logits, &p);
                        let mut got = match candidates(&logits, &p) {
                            Ok(_) if want.is_empty() => panic!("n {n} k {k}: candidates from none"),
                            Ok(c) => c,
                            Err(_) => {
                                assert!(want.is_empty(), "n {n} k {k}");
                                continue;
                            }
                        };
                        // `candidates` returns the renormalised survivors; compare their ids
                        // and order, then the probabilities against the reference's softmax.
                        let ids: Vec<u32> = got.iter().map(|c| c.0).collect();
                        let want_ids: Vec<u32> = if want[0].1 == f64::INFINITY {
                            want.iter()
                                .take_while(|c| c.1 == f64::INFINITY)
                                .map(|c| c.0)
                                .collect()
                        } else {
                            want.iter().map(|c| c.0).collect()
                        };
                        assert_eq!(ids, want_ids, "n {n} k {k} t {temperature}");
                        checked += 1;
                        // The same draw from the same logits with the other filters on.
                        let q = SamplingParams { top_p, min_p, ..p };
                        got = candidates(&logits, &q).unwrap();
                        assert!(got.len() <= want_ids.len());
                        assert!(got.iter().zip(&want_ids).all(|(g, w)| g.0 == *w));
                    }
                }
            }
        }
        assert!(checked > 200, "{checked} cases");
    }

    #[test]
    fn candidates_pick_what_the_whole_row_picks() {
        use crate::runtime::candidates::candidates_of;
        let mut rng = Rng::new(11);
        let (mut decided, mut undecided) = (0, 0);
        for n in [1, 5, 1000, 1025, 4099, 70000] {
            for specials in [false, true] {
                let logits = awkward_logits(&mut rng, n, specials);
                for (t, top_k, top_p) in
                    [(0.0, 0, 1.0), (1.0, 64, 0.95), (0.7, 3, 1.0), (1.3, 1, 1.0)]
                {
                    let p = SamplingParams {
                        temperature: t,
                        top_k,
                        top_p,
                        seed: Some(n as u64),
                        ..SamplingParams::default()
                    };
                    let mut row = Sampler::new(p.clone()).unwrap();
                    let mut cands = Sampler::new(p).unwrap();
                    let k = cands.candidates_wanted().unwrap();
                    let c = candidates_of(&logits, k);
                    for draw in 0..8 {
                        let want = row.sample(&logits, &[]);
                        match cands.sample_candidates(&c).unwrap() {
                            Some(got) => {
                                assert_eq!(Some(got), want.ok(), "n {n} k {k} t {t} draw {draw}");
                                decided += 1;
                            }
                            // Nothing drawn: the row decides, with the same RNG.
                            None => {
                                assert!(!c.complete());
                                assert_eq!(
                                    cands.sample(&logits, &[]).ok(),
                                    want.ok(),
                                    "n {n} k {k} t {t} draw {draw}"
                                );
                                undecided += 1;
                            }
                        }
                    }
                }
            }
        }
        // Gathered for a smaller k, or wanted with a penalty: the row decides.
        let logits = awkward_logits(&mut rng, 3000, false);
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(
            s.sample_candidates(&candidates_of(&logits, 8)).unwrap(),
            None
        );
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 1.1,
            ..SamplingParams::default()
        })
        .unwrap();
        assert_eq!(s.candidates_wanted(), None);
        assert_eq!(
            s.sample_candidates(&candidates_of(&logits, 64)).unwrap(),
            None
        );
        assert!(
            decided > 300 && undecided > 0,
            "{decided} decided, {undecided} not"
        );
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]).unwrap(), 1);
        assert!(argmax(&[f32::NAN]).is_err());
        assert!(argmax(&[]).is_err());
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]).unwrap(), 1);
        assert_eq!(argmax(&[-0.0, 0.0]).unwrap(), 0);
    }

    #[test]
    fn draw_ahead_peeks_the_uniform_numbers_picks_will_take() {
        let p = SamplingParams {
            seed: Some(17),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p.clone()).unwrap();
        let ahead: Vec<f64> = (0..3).map(|n| s.draw_ahead(n).unwrap().u).collect();
        // Each pick from a two-token distribution takes the next number: the draw says which.
        let mut taken = Vec::new();
        for _ in 0..3 {
            let u = s.rng.clone().next_f64();
            let tok = s.draw(&[(4, 0.5), (9, 0.5)]);
            assert_eq!(tok, if u < 0.5 { 4 } else { 9 });
            taken.push(u);
        }
        assert_eq!(ahead, taken);
        let d = Sampler::new(p).unwrap().draw_ahead(0).unwrap();
        assert_eq!((d.temperature, d.top_p, d.min_p), (1.0, 0.95, 0.0));
        // Greedy, a penalty, or no top-k: the device does not draw.
        for p in [
            SamplingParams::greedy(),
            SamplingParams {
                repetition_penalty: 1.1,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_k: 0,
                ..SamplingParams::default()
            },
        ] {
            assert!(Sampler::new(p).unwrap().draw_ahead(0).is_none());
        }
        assert!(Sampler::new(SamplingParams::greedy()).unwrap().is_greedy());
        assert!(!Sampler::new(SamplingParams::default()).unwrap().is_greedy());
    }

    #[test]
    fn argmax_is_the_first_max_the_gpu_reports() {
        // The GPU's greedy pick (`Candidates::first`) follows `candidates::first_max`; a greedy
        // decode trusts it where the candidates overflow, so the two must agree everywhere.
        let mut rng = Rng::new(5);
        let pool = [
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            -0.0,
            0.0,
            1.5,
            -2.0,
            1.5,
        ];
        for len in [1, 2, 3, 17, 64, 65, 300, 1025] {
            for _ in 0..200 {
                let row: Vec<f32> = (0..len)
                    .map(|_| pool[rng.next_u32() as usize % pool.len()])
                    .collect();
                let want = crate::runtime::candidates::first_max(&row);
                assert_eq!(argmax(&row).ok(), want, "{row:?}");
            }
        }
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        for p in [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                min_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p).is_err());
        }
    }

    #[test]
    fn positive_infinity_takes_all_the_mass() {
        let mut s = Sampler::new(SamplingParams {
            top_k: 0,
            top_p: 1.0,
            seed: Some(1),
            ..Default::default()
        })
        .unwrap();
        let d = s.distribution(&[0.0, f32::INFINITY, 1.0], &[]).unwrap();
        assert_eq!(d, vec![(1, 1.0)]);
    }
}
