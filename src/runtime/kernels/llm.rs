//! ExecuTorch's LLM custom ops (`llama::*`): KV-cache updates and attention over the cache.
//! Layouts are BSHD: q `[B, S, Hq, D]`, caches `[B, max_ctx, Hkv, D]`.

use super::{KernelCtx, KernelFn, KernelResult};

pub const KERNELS: &[(&str, KernelFn)] = &[
    ("llama::custom_sdpa.out", custom_sdpa),
    ("llama::update_cache.out", update_cache),
    (
        "llama::update_cache_with_indices.out",
        update_cache_with_indices,
    ),
    ("llama::sdpa_with_kv_cache.out", sdpa_with_kv_cache),
];

/// Attention parameters shared by every SDPA form.
pub struct Sdpa<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub batch: usize,
    pub seq: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Rows of the caches (stride of the sequence axis).
    pub cache_len: usize,
    /// Absolute position of the first query.
    pub start_pos: usize,
    /// Keys attended: positions `[0, kv_len)`.
    pub kv_len: usize,
    pub causal: bool,
    /// Additive mask `[seq, mask_cols]` (row-major), applied to the first `kv_len` columns.
    pub mask: Option<(&'a [f32], usize)>,
    pub scale: f32,
}

/// Scaled dot-product attention over a BSHD cache with GQA; output `[B, S, Hq, D]`.
pub fn sdpa_bshd(p: &Sdpa) -> Vec<f32> {
    let (s, hq, hkv, d) = (p.seq, p.hq, p.hkv, p.d);
    let group = hq / hkv.max(1);
    let mut out = vec![0f32; p.batch * s * hq * d];
    let mut scores = vec![0f32; p.kv_len];
    for b in 0..p.batch {
        for i in 0..s {
            for h in 0..hq {
                let kh = h / group.max(1);
                let qo = ((b * s + i) * hq + h) * d;
                let qv = &p.q[qo..qo + d];
                let limit = if p.causal {
                    (p.start_pos + i + 1).min(p.kv_len)
                } else {
                    p.kv_len
                };
                let mut mx = f32::NEG_INFINITY;
                for (j, sc) in scores.iter_mut().enumerate() {
                    if j >= limit {
                        *sc = f32::NEG_INFINITY;
                        continue;
                    }
                    let ko = ((b * p.cache_len + j) * hkv + kh) * d;
                    let dot: f32 = qv.iter().zip(&p.k[ko..ko + d]).map(|(x, y)| x * y).sum();
                    let mut v = dot * p.scale;
                    if let Some((m, cols)) = p.mask {
                        v += m[i * cols + j];
                    }
                    *sc = v;
                    mx = mx.max(v);
                }
                let o = &mut out[qo..qo + d];
                if mx == f32::NEG_INFINITY {
                    continue;
                }
                let mut sum = 0f32;
                for sc in scores.iter_mut() {
                    *sc = (*sc - mx).exp();
                    sum += *sc;
                }
                for (j, &w) in scores.iter().enumerate() {
                    if w == 0.0 {
                        continue;
                    }
                    let vo = ((b * p.cache_len + j) * hkv + kh) * d;
                    let wv = w / sum;
                    for (ov, vv) in o.iter_mut().zip(&p.v[vo..vo + d]) {
                        *ov += wv * vv;
                    }
                }
            }
        }
    }
    out
}

fn dims4(s: &[usize], what: &str) -> Result<[usize; 4], String> {
    s.try_into()
        .map_err(|_| format!("{what} must be 4-D (BSHD), got {s:?}"))
}

// One argument position per schema slot: the three SDPA spellings place them differently.
#[allow(clippy::too_many_arguments)]
fn attend(
    k: &mut KernelCtx,
    q_arg: usize,
    kc_arg: usize,
    vc_arg: usize,
    pos_arg: usize,
    mask_arg: usize,
    causal_arg: usize,
    scale_arg: usize,
) -> KernelResult {
    let q = k.input(q_arg)?;
    let kc = k.input(kc_arg)?;
    let vc = k.input(vc_arg)?;
    let start = k.int(pos_arg)?;
    let [b, s, hq, d] = dims4(&q.sizes, "query")?;
    let [kb, cache_len, hkv, kd] = dims4(&kc.sizes, "key cache")?;
    if kc.sizes != vc.sizes || kb != b || kd != d || hkv == 0 || hq % hkv != 0 {
        return Err(format!(
            "query {:?} does not fit caches {:?}/{:?}",
            q.sizes, kc.sizes, vc.sizes
        ));
    }
    if start < 0 || start as usize + s > cache_len {
        return Err(format!(
            "positions {start}..{} exceed the cache of {cache_len}",
            start + s as i64
        ));
    }
    let start = start as usize;
    let kv_len = start + s;
    let mask = k.opt_input(mask_arg)?;
    let mask_vals = mask.as_ref().map(|m| m.f32().into_owned());
    let mask_ref = match (&mask, &mask_vals) {
        (Some(m), Some(v)) => {
            let [rows, cols] = m.sizes[..] else {
                return Err(format!("attention mask must be 2-D, got {:?}", m.sizes));
            };
            if rows < s || cols < kv_len {
                return Err(format!(
                    "attention mask {:?} is smaller than [{s}, {kv_len}]",
                    m.sizes
                ));
            }
            Some((&v[..], cols))
        }
        _ => None,
    };
    let causal = k.boolean(causal_arg)?;
    let scale = k
        .opt_double(scale_arg)?
        .map_or(1.0 / (d as f32).sqrt(), |x| x as f32);
    let (qv, kv, vv) = (q.f32(), kc.f32(), vc.f32());
    let out = sdpa_bshd(&Sdpa {
        q: &qv,
        k: &kv,
        v: &vv,
        batch: b,
        seq: s,
        hq,
        hkv,
        d,
        cache_len,
        start_pos: start,
        kv_len,
        causal,
        mask: mask_ref,
        scale,
    });
    let o = k.last();
    k.write_f32(o, &q.sizes.clone(), &out)
}

/// `custom_sdpa(q, k_cache, v_cache, start_pos, attn_mask?, dropout, is_causal, scale?)`.
fn custom_sdpa(k: &mut KernelCtx) -> KernelResult {
    attend(k, 0, 1, 2, 3, 4, 6, 7)
}

/// Writes `value[B, S, H, D]` into `cache[B, start..start+S, H, D]` in place.
fn write_rows(
    k: &mut KernelCtx,
    value_arg: usize,
    cache_arg: usize,
    rows: &[usize],
) -> KernelResult {
    let v = k.input(value_arg)?;
    let cache_t = k.meta(cache_arg)?.clone();
    let [b, s, h, d] = dims4(&v.sizes, "value")?;
    let [cb, cl, ch, cd] = dims4(&cache_t.sizes, "cache")?;
    if cb != b || ch != h || cd != d || rows.len() != s {
        return Err(format!(
            "value {:?} does not fit cache {:?}",
            v.sizes, cache_t.sizes
        ));
    }
    if v.dtype != cache_t.dtype {
        return Err(format!(
            "value is {} but the cache is {}",
            v.dtype.name(),
            cache_t.dtype.name()
        ));
    }
    let e = v.dtype.size();
    let row = h * d * e;
    let src = v.bytes().to_vec();
    let dst = k.mem.bytes_mut(&cache_t)?;
    for bi in 0..b {
        for (i, &r) in rows.iter().enumerate() {
            if r >= cl {
                return Err(format!("cache row {r} is outside a cache of {cl}"));
            }
            let so = (bi * s + i) * row;
            let dof = (bi * cl + r) * row;
            dst[dof..dof + row].copy_from_slice(&src[so..so + row]);
        }
    }
    Ok(())
}

/// `update_cache(value, cache, start_pos) -> dummy`.
fn update_cache(k: &mut KernelCtx) -> KernelResult {
    let start = k.int(2)?;
    let s = k.meta(0)?.sizes.get(1).copied().unwrap_or(0);
    if start < 0 {
        return Err(format!("negative start position {start}"));
    }
    let rows: Vec<usize> = (0..s).map(|i| start as usize + i).collect();
    write_rows(k, 0, 1, &rows)
}

/// `update_cache_with_indices(value, cache, start_pos, indices[B, S]) -> dummy` (batch 1).
fn update_cache_with_indices(k: &mut KernelCtx) -> KernelResult {
    let ix = k.input(3)?.i64();
    let rows = ix
        .iter()
        .map(|&i| usize::try_from(i).map_err(|_| format!("negative cache index {i}")))
        .collect::<Result<Vec<_>, _>>()?;
    write_rows(k, 0, 1, &rows)
}

/// `sdpa_with_kv_cache(q, k, v, k_cache, v_cache, start_pos, seq_len, mask?, dropout, causal, scale?)`.
fn sdpa_with_kv_cache(k: &mut KernelCtx) -> KernelResult {
    let start = k.int(5)?;
    let s = k.meta(1)?.sizes.get(1).copied().unwrap_or(0);
    if start < 0 {
        return Err(format!("negative start position {start}"));
    }
    let rows: Vec<usize> = (0..s).map(|i| start as usize + i).collect();
    write_rows(k, 1, 3, &rows)?;
    write_rows(k, 2, 4, &rows)?;
    attend(k, 0, 3, 4, 5, 7, 9, 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One query, two keys, no mask: softmax weights are computable by hand.
    #[test]
    fn sdpa_weights_values_by_softmax_of_scaled_scores() {
        let q = [1.0f32, 0.0];
        let k = [1.0f32, 0.0, 0.0, 1.0];
        let v = [10.0f32, 0.0, 0.0, 20.0];
        let out = sdpa_bshd(&Sdpa {
            q: &q,
            k: &k,
            v: &v,
            batch: 1,
            seq: 1,
            hq: 1,
            hkv: 1,
            d: 2,
            cache_len: 2,
            start_pos: 1,
            kv_len: 2,
            causal: true,
            mask: None,
            scale: 1.0,
        });
        let w0 = 1f32.exp() / (1f32.exp() + 1.0);
        assert!((out[0] - 10.0 * w0).abs() < 1e-5);
        assert!((out[1] - 20.0 * (1.0 - w0)).abs() < 1e-5);
    }

    #[test]
    fn causal_limit_hides_future_keys() {
        let q = [1.0f32, 1.0];
        let k = [1.0f32, 5.0];
        let v = [3.0f32, 7.0];
        // Query 0 at position 0 may only see key 0.
        let out = sdpa_bshd(&Sdpa {
            q: &q,
            k: &k,
            v: &v,
            batch: 1,
            seq: 2,
            hq: 1,
            hkv: 1,
            d: 1,
            cache_len: 2,
            start_pos: 0,
            kv_len: 2,
            causal: true,
            mask: None,
            scale: 1.0,
        });
        assert_eq!(out[0], 3.0);
        assert!(out[1] > 3.0 && out[1] < 7.0);
    }
}
