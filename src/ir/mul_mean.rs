//! `MulMean` on the CPU: the mean of a broadcast product without the products' tensor, in the
//! bits of `Binary(Mul)` then `Mean` (each product rounded to f32, summed in f32 in index
//! order, the sum divided by the count). The demo export's attention is this pair twice a
//! layer; its products are 72 MiB a layer in a 32-token prompt.

use crate::runtime::kernels::{bcast_strides, next_index};

/// Products a thread takes at least (spawning costs more than this many below it).
const PAR_MIN: usize = 1 << 17;

/// `mean(a * b, dims)` as a row-major tensor of the kept dims: `a` (shape `ash`) and `b`
/// (shape `bsh`) broadcast to `full`; `dims` ascending, each `< full.len()`.
pub(crate) fn mul_mean(
    (a, ash): (&[f32], &[usize]),
    (b, bsh): (&[f32], &[usize]),
    full: &[usize],
    dims: &[usize],
) -> Vec<f32> {
    let r = full.len();
    match dims {
        [d] if r >= 2 && *d == r - 1 => match shared_rows(ash, bsh, full) {
            Some(plan) => by_shared_rows((a, b), full, plan),
            None => by_dots((a, ash), (b, bsh), full),
        },
        [d] if r >= 2 => by_rows((a, ash), (b, bsh), full, *d),
        _ => walk((a, ash), (b, bsh), full, dims),
    }
}

/// How `by_shared_rows` reads a mean over the last dim of `one` (broadcast along the next
/// dim, `vd`) times `many` (whose rows run along `vd`): q·k, one query row against every
/// cache row of its head.
struct SharedRows {
    /// Whether `one` is `a` (else `b`).
    one_is_a: bool,
    /// Sizes and (one, many) strides of the kept dims before `vd` along which `many` moves
    /// (the kv heads), then of those along which it does not (query heads of a group, queries).
    outer: (Vec<usize>, Vec<usize>, Vec<usize>),
    inner: (Vec<usize>, Vec<usize>),
    /// `many`'s stride along `vd`.
    row: usize,
}

/// A `SharedRows` plan if the operands fit one: both contiguous along the last dim, exactly one
/// of them broadcast along `vd`, and every kept dim along which `many` moves before every one
/// along which it does not (so each thread's outputs are whole rows, in runs).
fn shared_rows(ash: &[usize], bsh: &[usize], full: &[usize]) -> Option<SharedRows> {
    let r = full.len();
    let (sa, sb) = (bcast_strides(ash, full), bcast_strides(bsh, full));
    if sa[r - 1] != 1 || sb[r - 1] != 1 || full[r - 2] < 8 {
        return None;
    }
    let (one_is_a, so, sm) = match (sa[r - 2], sb[r - 2]) {
        (0, m) if m != 0 => (true, &sa, &sb),
        (m, 0) if m != 0 => (false, &sb, &sa),
        _ => return None,
    };
    let dims: Vec<usize> = (0..r - 2).filter(|&d| full[d] > 1).collect();
    let split = dims.iter().position(|&d| sm[d] == 0).unwrap_or(dims.len());
    if dims[split..].iter().any(|&d| sm[d] != 0) {
        return None;
    }
    let pick = |ds: &[usize], v: &[usize]| ds.iter().map(|&d| v[d]).collect::<Vec<_>>();
    let (od, id) = (&dims[..split], &dims[split..]);
    Some(SharedRows {
        one_is_a,
        outer: (pick(od, full), pick(od, so), pick(od, sm)),
        inner: (pick(id, full), pick(id, so)),
        row: sm[r - 2],
    })
}

/// A mean over the last dim for a `SharedRows` pair: eight of `many`'s rows are interleaved
/// once into an L1-sized buffer and then serve every `one` row that pairs with them, each as
/// eight sums side by side (one vector a product index), each sum in index order.
fn by_shared_rows((a, b): (&[f32], &[f32]), full: &[usize], p: SharedRows) -> Vec<f32> {
    let r = full.len();
    let (n, m) = (full[r - 1], full[r - 2]);
    let (one, many) = if p.one_is_a { (a, b) } else { (b, a) };
    let (os, oo, om) = &p.outer;
    let (is, io) = &p.inner;
    let (n_outer, n_inner): (usize, usize) = (os.iter().product(), is.iter().product());
    let mut out = vec![0f32; n_outer * n_inner * m];
    if out.is_empty() {
        return out;
    }
    // Inner rows [lo, hi) of every outer block, into `rows` (one chunk per outer block).
    let run = |lo: usize, rows: Vec<&mut [f32]>| {
        let mut buf = vec![0f32; 8 * n];
        let (mut oidx, mut ooff) = (vec![0usize; os.len()], [0usize, 0]);
        for block in rows {
            for l0 in (0..m).step_by(8) {
                let w = (m - l0).min(8);
                for k in 0..w {
                    let row = &many[ooff[1] + (l0 + k) * p.row..][..n];
                    for (j, &x) in row.iter().enumerate() {
                        buf[j * 8 + k] = x;
                    }
                }
                let (mut iidx, mut ioff) = (vec![0usize; is.len()], [0usize]);
                let mut at = 0;
                for i in 0..n_inner {
                    if i >= lo {
                        let x = &one[ooff[0] + ioff[0]..][..n];
                        let mut s = [0f32; 8];
                        for (&x, ys) in x.iter().zip(buf.chunks_exact(8)) {
                            for (sk, &y) in s.iter_mut().zip(ys) {
                                // x · y is y · x bit for bit.
                                *sk += x * y;
                            }
                        }
                        let dst = &mut block[at * m + l0..][..w];
                        dst.iter_mut().zip(s).for_each(|(o, s)| *o = s / n as f32);
                        at += 1;
                        if at * m == block.len() {
                            break;
                        }
                    }
                    next_index(&mut iidx, is, &[io], &mut ioff);
                }
            }
            next_index(&mut oidx, os, &[oo, om], &mut ooff);
        }
    };
    let nt = (n_outer * n_inner * m * n / PAR_MIN)
        .clamp(1, super::cpu::threads())
        .min(n_inner);
    let per = n_inner.div_ceil(nt);
    let mut parts: Vec<Vec<&mut [f32]>> = (0..nt).map(|_| Vec::new()).collect();
    for block in out.chunks_mut(n_inner * m) {
        for (t, c) in block.chunks_mut(per * m).enumerate() {
            parts[t].push(c);
        }
    }
    if nt <= 1 {
        run(0, parts.pop().unwrap_or_default());
    } else {
        std::thread::scope(|s| {
            for (t, rows) in parts.into_iter().enumerate() {
                let run = &run;
                s.spawn(move || run(t * per, rows));
            }
        });
    }
    out
}

/// A mean over the last dim as dot products, eight outputs side by side (their sums do not
/// wait on one another), each output's products in order: where `by_shared_rows` does not fit.
fn by_dots((a, ash): (&[f32], &[usize]), (b, bsh): (&[f32], &[usize]), full: &[usize]) -> Vec<f32> {
    let r = full.len();
    let (sa, sb) = (bcast_strides(ash, full), bcast_strides(bsh, full));
    let n = full[r - 1];
    let (os, oa, ob) = (&full[..r - 1], &sa[..r - 1], &sb[..r - 1]);
    let n_out: usize = os.iter().product();
    let mut out = Vec::with_capacity(n_out);
    let (mut idx, mut offs) = (vec![0usize; r - 1], [0usize, 0]);
    let (ra, rb) = (sa[r - 1], sb[r - 1]);
    let mut at = Vec::with_capacity(8);
    for c in 0..n_out.div_ceil(8) {
        at.clear();
        for _ in 0..(n_out - c * 8).min(8) {
            at.push(offs);
            next_index(&mut idx, os, &[oa, ob], &mut offs);
        }
        let mut s = [0f32; 8];
        if at.len() == 8 && ra == 1 && rb == 1 {
            let rows: [(&[f32], &[f32]); 8] =
                std::array::from_fn(|k| (&a[at[k][0]..][..n], &b[at[k][1]..][..n]));
            for j in 0..n {
                for (sk, (x, y)) in s.iter_mut().zip(&rows) {
                    *sk += x[j] * y[j];
                }
            }
        } else {
            for j in 0..n {
                for (sk, o) in s.iter_mut().zip(&at) {
                    *sk += a[o[0] + j * ra] * b[o[1] + j * rb];
                }
            }
        }
        out.extend(s[..at.len()].iter().map(|&x| x / n as f32));
    }
    out
}

/// Any dims: each output walks its reduced index in row-major order.
fn walk(
    (a, ash): (&[f32], &[usize]),
    (b, bsh): (&[f32], &[usize]),
    full: &[usize],
    dims: &[usize],
) -> Vec<f32> {
    let (sa, sb) = (bcast_strides(ash, full), bcast_strides(bsh, full));
    let kept: Vec<usize> = (0..full.len()).filter(|d| !dims.contains(d)).collect();
    let pick = |ds: &[usize], v: &[usize]| ds.iter().map(|&d| v[d]).collect::<Vec<_>>();
    let (ks, ka, kb) = (pick(&kept, full), pick(&kept, &sa), pick(&kept, &sb));
    let (rs, ra, rb) = (pick(dims, full), pick(dims, &sa), pick(dims, &sb));
    let n_out: usize = ks.iter().product();
    let n_red: usize = rs.iter().product();
    let mut out = Vec::with_capacity(n_out);
    let (mut kidx, mut koffs) = (vec![0; ks.len()], [0usize, 0]);
    for _ in 0..n_out {
        let (mut ridx, mut roffs) = (vec![0; rs.len()], koffs);
        let mut s = 0f32;
        for _ in 0..n_red {
            s += a[roffs[0]] * b[roffs[1]];
            next_index(&mut ridx, &rs, &[&ra, &rb], &mut roffs);
        }
        out.push(s / n_red as f32);
        next_index(&mut kidx, &ks, &[&ka, &kb], &mut koffs);
    }
    out
}

/// One reduced dim `rd` before the last (p·v): each output row along the last dim, where both
/// operands' strides are 0 or 1, is accumulated as a vector, one reduced index after another
/// (so each element's sum keeps index order).
fn by_rows(
    (a, ash): (&[f32], &[usize]),
    (b, bsh): (&[f32], &[usize]),
    full: &[usize],
    rd: usize,
) -> Vec<f32> {
    let r = full.len();
    let vd = r - 1;
    debug_assert!(rd < vd);
    let (sa, sb) = (bcast_strides(ash, full), bcast_strides(bsh, full));
    let (n, m) = (full[rd], full[vd]);
    // The rows' own index: the kept dims but `vd`.
    let outer: Vec<usize> = (0..r).filter(|&d| d != rd && d != vd).collect();
    let os: Vec<usize> = outer.iter().map(|&d| full[d]).collect();
    let (oa, ob): (Vec<usize>, Vec<usize>) = outer.iter().map(|&d| (sa[d], sb[d])).unzip();
    let rows: usize = os.iter().product();
    let mut out = vec![0f32; rows * m];
    if out.is_empty() {
        return out;
    }
    let steps = [sa[rd], sb[rd], sa[vd], sb[vd]];
    let run = |first: usize, chunk: &mut [f32]| {
        // Row `first`'s index and offsets, then a walk.
        let mut idx = vec![0usize; os.len()];
        let mut offs = [0usize, 0];
        let mut rem = first;
        for d in (0..os.len()).rev() {
            idx[d] = rem % os[d];
            rem /= os[d];
            offs[0] += idx[d] * oa[d];
            offs[1] += idx[d] * ob[d];
        }
        for row in chunk.chunks_exact_mut(m) {
            accumulate(row, (a, b), offs, steps, n);
            next_index(&mut idx, &os, &[&oa, &ob], &mut offs);
        }
    };
    let nt = (rows * n * m / PAR_MIN).clamp(1, super::cpu::threads());
    super::cpu::by_threads(&mut out, m, nt, run);
    out
}

/// `row[i] = Σ_j a[pa + j·ra + i·va] · b[pb + j·rb + i·vb] / n`, j in order, with `va`, `vb`
/// each 0 or 1; each form its own loop so it vectorises (Rust never fuses the multiply and
/// the add, so the bits are a product tensor's then a mean's).
fn accumulate(
    row: &mut [f32],
    (a, b): (&[f32], &[f32]),
    [pa, pb]: [usize; 2],
    [ra, rb, va, vb]: [usize; 4],
    n: usize,
) {
    let m = row.len();
    row.iter_mut().for_each(|x| *x = 0.0);
    for j in 0..n {
        let (ja, jb) = (pa + j * ra, pb + j * rb);
        match (va, vb) {
            (1, 1) => {
                let (x, y) = (&a[ja..ja + m], &b[jb..jb + m]);
                row.iter_mut()
                    .zip(x.iter().zip(y))
                    .for_each(|(s, (&x, &y))| *s += x * y);
            }
            (0, 1) => {
                let (x, y) = (a[ja], &b[jb..jb + m]);
                row.iter_mut().zip(y).for_each(|(s, &y)| *s += x * y);
            }
            (1, 0) => {
                let (x, y) = (&a[ja..ja + m], b[jb]);
                row.iter_mut().zip(x).for_each(|(s, &x)| *s += x * y);
            }
            _ => {
                let p = a[ja] * b[jb];
                row.iter_mut().for_each(|s| *s += p);
            }
        }
    }
    row.iter_mut().for_each(|s| *s /= n as f32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::kernels::strided_copy;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20001) as f32 / 1000.0 - 10.0
            })
            .collect()
    }

    /// Products into a tensor, then an in-order f32 mean per output: the unfused pair.
    fn reference(
        (a, ash): (&[f32], &[usize]),
        (b, bsh): (&[f32], &[usize]),
        full: &[usize],
        dims: &[usize],
    ) -> Vec<f32> {
        let prod: Vec<f32> = {
            let (ea, eb) = (
                strided_copy(a, full, &bcast_strides(ash, full)),
                strided_copy(b, full, &bcast_strides(bsh, full)),
            );
            ea.iter().zip(&eb).map(|(x, y)| x * y).collect()
        };
        let ones = vec![1usize; full.len()];
        let one = [1f32];
        walk((&prod, full), (&one, &ones), full, dims)
    }

    #[test]
    fn every_form_has_the_bits_of_products_then_a_mean() {
        // (a's shape, b's shape, reduced dims): the demo's q·k and p·v, transposed and
        // broadcast operands on either side, several and all dims, sizes off any vector width.
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[1, 3, 3, 5, 1, 64], &[1, 3, 1, 1, 37, 64], &[5]),
            (&[1, 3, 3, 5, 37, 1], &[1, 3, 1, 1, 37, 64], &[4]),
            (&[1, 3, 1, 1, 37, 64], &[1, 3, 3, 5, 1, 64], &[5]),
            (&[1, 5, 1, 64], &[4, 1, 37, 64], &[3]),
            (&[4, 1, 1, 64], &[1, 5, 37, 64], &[3]),
            (&[2, 1, 3, 8], &[2, 9, 1, 8], &[3]),
            (&[2, 7, 9], &[2, 7, 9], &[2]),
            (&[2, 7, 9], &[2, 7, 9], &[1]),
            (&[2, 7, 9], &[2, 7, 9], &[0]),
            (&[7, 1], &[1, 9], &[1]),
            (&[7, 1], &[1, 9], &[0]),
            (&[7, 9], &[9], &[0]),
            (&[1, 9], &[7, 1], &[1]),
            (&[4, 6, 5], &[6, 5], &[0, 2]),
            (&[4, 6, 5], &[4, 6, 5], &[0, 1, 2]),
            (&[300, 70], &[300, 70], &[1]),
            (&[3, 1, 1000], &[3, 40, 1000], &[2]),
        ];
        for (k, &(ash, bsh, dims)) in cases.iter().enumerate() {
            let full = crate::ir::infer::broadcast(ash, bsh).unwrap();
            let a = values(ash.iter().product(), 2 * k as u32);
            let b = values(bsh.iter().product(), 2 * k as u32 + 1);
            let want = reference((&a, ash), (&b, bsh), &full, dims);
            let mut forms = vec![mul_mean((&a, ash), (&b, bsh), &full, dims)];
            if dims.len() == 1 && full.len() >= 2 {
                // Every way a single dim can go, whichever `mul_mean` picks.
                if dims[0] < full.len() - 1 {
                    forms.push(by_rows((&a, ash), (&b, bsh), &full, dims[0]));
                } else {
                    forms.push(by_dots((&a, ash), (&b, bsh), &full));
                    if let Some(plan) = shared_rows(ash, bsh, &full) {
                        forms.push(by_shared_rows((&a, &b), &full, plan));
                    }
                }
            }
            for got in forms {
                let same = want.len() == got.len()
                    && want
                        .iter()
                        .zip(&got)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{ash:?} * {bsh:?} over {dims:?}: {want:?} vs {got:?}");
            }
        }
    }

    #[test]
    fn shared_rows_take_q_k_in_either_order_and_refuse_mixed_layouts() {
        let fits = |a: &[usize], b: &[usize]| {
            let full = crate::ir::infer::broadcast(a, b).unwrap();
            shared_rows(a, b, &full).map(|p| (p.one_is_a, p.outer.0, p.inner.0))
        };
        let (q, k) = ([1, 3, 3, 5, 1, 64], [1, 3, 1, 1, 37, 64]);
        assert_eq!(fits(&q, &k), Some((true, vec![3], vec![3, 5])));
        assert_eq!(fits(&k, &q), Some((false, vec![3], vec![3, 5])));
        // The cache's heads after the query's: rows of one thread would not be runs.
        assert_eq!(fits(&[4, 1, 1, 64], &[1, 5, 37, 64]), None);
        // Fewer than eight rows to share, or no operand broadcast along them.
        assert_eq!(fits(&[3, 1, 64], &[3, 7, 64]), None);
        assert_eq!(fits(&[3, 9, 64], &[3, 9, 64]), None);
    }

    #[test]
    fn empty_and_threaded_shapes_hold() {
        let full = [0usize, 4];
        assert!(mul_mean((&[], &full), (&[], &full), &full, &[1]).is_empty());
        // Large enough for several threads (where there are several cores).
        let (ash, bsh) = ([64usize, 1, 256], [1usize, 96, 256]);
        let a = values(64 * 256, 7);
        let b = values(96 * 256, 8);
        let full = [64, 96, 256];
        for dims in [[2usize], [1], [0]] {
            let want = reference((&a, &ash), (&b, &bsh), &full, &dims);
            let got = mul_mean((&a, &ash), (&b, &bsh), &full, &dims);
            assert!(want
                .iter()
                .zip(&got)
                .all(|(x, y)| x.to_bits() == y.to_bits()));
            assert_eq!(want.len(), got.len());
        }
    }
}
