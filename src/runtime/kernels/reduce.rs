//! Reductions and softmax.

use super::{norm_dim, KernelCtx, KernelFn, KernelResult};
use crate::runtime::tensor::{DType, TensorIn};

pub const KERNELS: &[(&str, KernelFn)] = &[
    ("aten::mean.out", mean),
    ("aten::sum.IntList_out", sum),
    ("aten::amax.out", amax),
    ("aten::amin.out", amin),
    ("aten::argmax.out", argmax),
    ("aten::any.out", any_dim),
    ("aten::any.all_out", any_all),
    ("aten::any.dims_out", any_dims),
    ("aten::_softmax.out", softmax),
    ("aten::_log_softmax.out", log_softmax),
];

/// Reduces `a` over `dims` (all dims when empty): returns (kept-dims shape, groups of values).
fn reduce(
    a: &TensorIn,
    dims: &[i64],
    keepdim: bool,
    f: impl Fn(&[f64]) -> f64,
) -> Result<(Vec<usize>, Vec<f64>), String> {
    let r = a.sizes.len();
    let mut red = vec![false; r];
    if dims.is_empty() {
        red.iter_mut().for_each(|x| *x = true);
    }
    for &d in dims {
        red[norm_dim(d, r)?] = true;
    }
    let v = a.f64();
    let st = super::strides(&a.sizes);
    let kept: Vec<usize> = (0..r).filter(|&d| !red[d]).collect();
    let gone: Vec<usize> = (0..r).filter(|&d| red[d]).collect();
    let nk: usize = kept.iter().map(|&d| a.sizes[d]).product();
    let ng: usize = gone.iter().map(|&d| a.sizes[d]).product();
    let mut out = Vec::with_capacity(nk);
    let mut buf = Vec::with_capacity(ng);
    for ki in 0..nk {
        let mut base = 0;
        let mut rem = ki;
        for &d in kept.iter().rev() {
            base += (rem % a.sizes[d]) * st[d];
            rem /= a.sizes[d];
        }
        buf.clear();
        for gi in 0..ng {
            let mut off = base;
            let mut rem = gi;
            for &d in gone.iter().rev() {
                off += (rem % a.sizes[d]) * st[d];
                rem /= a.sizes[d];
            }
            buf.push(v[off]);
        }
        out.push(f(&buf));
    }
    let shape = (0..r)
        .filter_map(|d| {
            if red[d] {
                keepdim.then_some(1)
            } else {
                Some(a.sizes[d])
            }
        })
        .collect();
    Ok((shape, out))
}

fn mean(k: &mut KernelCtx) -> KernelResult {
    let dims = k.int_list(1)?;
    let keep = k.boolean(2)?;
    // ExecuTorch's portable mean.out sums in the output type, in element order, then divides:
    // float32 inputs are summed in float32 that way (a more exact sum differs in the last bits,
    // and an 8da4w model's int8 activation rounding turns such bits into whole quantization steps).
    let f32_sum = k.input_ref(0)?.0.dtype == DType::F32;
    if f32_sum && dims.len() == 1 && k.out_dtype(k.last())? == DType::F32 {
        // One reduced dim (attention's dot products are means over 64 or 1024 elements): sum rows
        // in place, same order, reading the input where it lies (no copy, no float64 form).
        let (a, bytes) = k.input_ref(0)?;
        let r = a.sizes.len();
        let d = norm_dim(dims[0], r)?;
        let (outer, n): (usize, usize) = (a.sizes[..d].iter().product(), a.sizes[d]);
        let inner: usize = a.sizes[d + 1..].iter().product();
        let v = crate::runtime::tensor::to_f32(DType::F32, bytes);
        let mut out = vec![0f32; outer * inner];
        if inner == 1 && n > 0 {
            // Rows of contiguous values (attention's dot products): each row summed in order,
            // eight rows side by side so the additions do not wait on one another.
            let mut rows = out.chunks_exact_mut(8);
            for (c, acc) in rows.by_ref().enumerate() {
                let block = &v[c * 8 * n..][..8 * n];
                let mut s = [0f32; 8];
                for j in 0..n {
                    for (r, sr) in s.iter_mut().enumerate() {
                        *sr += block[r * n + j];
                    }
                }
                acc.iter_mut().zip(s).for_each(|(o, s)| *o = s / n as f32);
            }
            let done = outer - rows.into_remainder().len();
            for (o, acc) in out.iter_mut().enumerate().skip(done) {
                let s = v[o * n..(o + 1) * n].iter().fold(0f32, |s, &x| s + x);
                *acc = s / n as f32;
            }
        } else {
            for (o, acc) in out.chunks_mut(inner.max(1)).enumerate().take(outer) {
                for j in 0..n {
                    let row = &v[(o * n + j) * inner..][..inner];
                    acc.iter_mut().zip(row).for_each(|(s, &x)| *s += x);
                }
                acc.iter_mut().for_each(|s| *s /= n as f32);
            }
        }
        let mut shape = a.sizes.clone();
        if keep {
            shape[d] = 1;
        } else {
            shape.remove(d);
        }
        let o = k.last();
        return k.write_f32(o, &shape, &out);
    }
    let a = k.input(0)?;
    let (shape, v) = reduce(&a, &dims, keep, |g| {
        if f32_sum {
            let s = g.iter().fold(0f32, |acc, &x| acc + x as f32);
            (s / g.len() as f32) as f64
        } else {
            g.iter().sum::<f64>() / g.len() as f64
        }
    })?;
    let o = k.last();
    k.write_f64(o, &shape, &v)
}

fn sum(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let dims = k.int_list(1)?;
    let keep = k.boolean(2)?;
    let (shape, v) = reduce(&a, &dims, keep, |g| g.iter().sum())?;
    let o = k.last();
    k.write_f64(o, &shape, &v)
}

fn amax(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let dims = k.int_list(1)?;
    let keep = k.boolean(2)?;
    let (shape, v) = reduce(&a, &dims, keep, |g| {
        g.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    })?;
    let o = k.last();
    k.write_f64(o, &shape, &v)
}

fn amin(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let dims = k.int_list(1)?;
    let keep = k.boolean(2)?;
    let (shape, v) = reduce(&a, &dims, keep, |g| {
        g.iter().copied().fold(f64::INFINITY, f64::min)
    })?;
    let o = k.last();
    k.write_f64(o, &shape, &v)
}

fn argmax(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let dim = k.opt_int(1)?;
    let keep = k.boolean(2)?;
    let first_max = |g: &[f64]| {
        let mut best = 0;
        for (i, &x) in g.iter().enumerate() {
            if x > g[best] || (x.is_nan() && !g[best].is_nan()) {
                best = i;
            }
        }
        best as f64
    };
    let (shape, v) = match dim {
        Some(d) => reduce(&a, &[d], keep, first_max)?,
        None => {
            let flat = TensorIn::owned(a.dtype, vec![a.numel()], a.bytes().to_vec());
            reduce(&flat, &[0], false, first_max)?
        }
    };
    let o = k.last();
    k.write_i64(o, &shape, &v.iter().map(|&x| x as i64).collect::<Vec<_>>())
}

fn softmax_impl(k: &mut KernelCtx, log: bool) -> KernelResult {
    let a = k.input(0)?;
    let d = norm_dim(k.int(1)?, a.sizes.len())?;
    let v = a.f32();
    let outer: usize = a.sizes[..d].iter().product();
    let n = a.sizes.get(d).copied().unwrap_or(1);
    let inner: usize = a.sizes[(d + 1).min(a.sizes.len())..].iter().product();
    let mut out = vec![0f32; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let mx = (0..n).map(|j| v[at(j)]).fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = (0..n).map(|j| (v[at(j)] - mx).exp()).sum();
            for j in 0..n {
                out[at(j)] = if log {
                    v[at(j)] - mx - s.ln()
                } else {
                    (v[at(j)] - mx).exp() / s
                };
            }
        }
    }
    let o = k.last();
    k.write_f32(o, &a.sizes.clone(), &out)
}

fn softmax(k: &mut KernelCtx) -> KernelResult {
    softmax_impl(k, false)
}

fn log_softmax(k: &mut KernelCtx) -> KernelResult {
    softmax_impl(k, true)
}

fn any_impl(k: &mut KernelCtx, dims: Vec<i64>, keep: bool) -> KernelResult {
    let a = k.input(0)?;
    let (shape, v) = reduce(&a, &dims, keep, |g| {
        g.iter().any(|&x| x != 0.0) as i64 as f64
    })?;
    let o = k.last();
    k.write_i64(o, &shape, &v.iter().map(|&x| x as i64).collect::<Vec<_>>())
}

/// `any(self, dim, keepdim)`.
fn any_dim(k: &mut KernelCtx) -> KernelResult {
    let dim = k.int(1)?;
    let keep = k.boolean(2)?;
    any_impl(k, vec![dim], keep)
}

/// `any(self)` over every element.
fn any_all(k: &mut KernelCtx) -> KernelResult {
    any_impl(k, vec![], false)
}

/// `any(self, dims?, keepdim)`.
fn any_dims(k: &mut KernelCtx) -> KernelResult {
    let dims = k.int_list(1)?;
    let keep = k.boolean(2)?;
    any_impl(k, dims, keep)
}

#[cfg(test)]
mod tests {
    use crate::runtime::kernels::{f32_tensor, lookup, KernelCtx};
    use crate::runtime::tensor::Storage;
    use crate::runtime::{Memory, Value};

    /// `aten::mean.out` of float32 over one dim sums each group in element order in float32
    /// and then divides, as ExecuTorch's portable kernel does: the last dim (rows summed eight
    /// at a time, with rows left over) and a leading dim, bit for bit.
    #[test]
    fn float32_mean_sums_in_element_order() {
        let (a, b, c) = (3usize, 7usize, 67usize);
        let xs: Vec<f32> = (0..a * b * c)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.013_7 + 1e-3 * i as f32)
            .collect();
        for (dim, out_sizes) in [(2i64, vec![a, b, 1]), (1, vec![a, 1, c])] {
            let out_n: usize = out_sizes.iter().product();
            let mut mem = Memory {
                values: vec![
                    f32_tensor(Storage::Input(0), vec![a, b, c]),
                    Value::Int(dim),
                    Value::IntList(vec![1]),
                    Value::Bool(true),
                    f32_tensor(
                        Storage::Arena {
                            arena: 0,
                            offset: 0,
                        },
                        out_sizes.clone(),
                    ),
                ],
                arenas: vec![vec![0u8; 4 * out_n]],
                inputs: vec![xs.iter().flat_map(|x| x.to_le_bytes()).collect()],
            };
            let kernel = lookup("aten::mean.out").expect("mean is registered");
            kernel(&mut KernelCtx::new(&mut mem, &[0, 2, 3, 4])).expect("mean runs");
            let got: Vec<f32> = mem.arenas[0]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let n = if dim == 2 { c } else { b };
            let want: Vec<f32> = (0..out_n)
                .map(|o| {
                    let (i, j) = if dim == 2 {
                        (o / b, o % b)
                    } else {
                        (o / c, o % c)
                    };
                    let at = |t: usize| match dim {
                        2 => xs[(i * b + j) * c + t],
                        _ => xs[(i * b + t) * c + j],
                    };
                    (0..n).fold(0f32, |s, t| s + at(t)) / n as f32
                })
                .collect();
            assert_eq!(got, want, "mean over dim {dim}");
            if dim == 2 {
                let f64_form: Vec<f32> = (0..a * b)
                    .map(|r| {
                        (xs[r * c..(r + 1) * c]
                            .iter()
                            .map(|&v| v as f64)
                            .sum::<f64>()
                            / c as f64) as f32
                    })
                    .collect();
                assert!(
                    got != f64_form,
                    "the inputs must tell the summation orders apart"
                );
            }
        }
    }
}
