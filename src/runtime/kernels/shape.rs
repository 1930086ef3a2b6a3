//! Layout kernels: views, permutes, slices, concatenation, gathers and scatters. They move bytes
//! without looking at values, so one implementation serves every dtype.

use super::{
    bcast_strides, broadcast_indices, broadcast_shape, norm_dim, strided_copy, strides, KernelCtx,
    KernelFn, KernelResult,
};
use crate::runtime::tensor::{DType, Tensor, TensorIn};
use crate::runtime::Value;

pub const KERNELS: &[(&str, KernelFn)] = &[
    ("aten::view_copy.out", view_copy),
    ("aten::_unsafe_view.out", view_copy),
    ("aten::reshape.out", view_copy),
    ("executorch_prim::et_view.default", et_view),
    ("aten::permute_copy.out", permute_copy),
    ("aten::transpose_copy.int_out", transpose_copy),
    ("aten::t_copy.out", t_copy),
    ("aten::unsqueeze_copy.out", unsqueeze_copy),
    ("aten::squeeze_copy.dims_out", squeeze_copy_dims),
    ("aten::squeeze_copy.dim_out", squeeze_copy_dims),
    ("aten::expand_copy.out", expand_copy),
    ("aten::repeat.out", repeat),
    ("aten::cat.out", cat),
    ("aten::stack.out", stack),
    ("aten::slice_copy.Tensor_out", slice_copy),
    ("aten::select_copy.int_out", select_copy),
    ("aten::slice_scatter.out", slice_scatter),
    ("aten::index_select.out", index_select),
    ("aten::embedding.out", embedding),
    ("quantized_decomposed::embedding_byte.out", embedding_byte),
    (
        "quantized_decomposed::embedding_byte.dtype_out",
        embedding_byte,
    ),
    ("quantized_decomposed::embedding_4bit.out", embedding_4bit),
    (
        "quantized_decomposed::embedding_4bit.dtype_out",
        embedding_4bit,
    ),
    ("aten::index.Tensor_out", index_tensor),
    ("aten::index_put.out", index_put),
    ("aten::index_copy.out", index_copy),
    ("aten::copy.out", copy_out),
    ("aten::copy_", copy_inplace),
    ("aten::clone.out", clone),
    ("aten::alias_copy.out", clone),
    ("aten::_to_copy.out", clone),
    ("dim_order_ops::_to_dim_order_copy.out", to_dim_order_copy),
    ("dim_order_ops::_clone_dim_order.out", to_dim_order_copy),
    ("aten::split_with_sizes_copy.out", split_with_sizes_copy),
    ("aten::split_copy.Tensor_out", split_copy),
];

fn esz(t: &TensorIn) -> usize {
    t.dtype.size()
}

/// Elements `idx` of `src` (each `esz` bytes), copied a run of consecutive indices at a time:
/// slices of KV caches are long runs, and one copy per element was most of their time.
fn gather(src: &[u8], esz: usize, idx: impl Iterator<Item = usize>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut run: Option<(usize, usize)> = None;
    for i in idx {
        run = match run {
            Some((start, len)) if start + len == i => Some((start, len + 1)),
            Some((start, len)) => {
                out.extend_from_slice(&src[start * esz..(start + len) * esz]);
                Some((i, 1))
            }
            None => Some((i, 1)),
        };
    }
    if let Some((start, len)) = run {
        out.extend_from_slice(&src[start * esz..(start + len) * esz]);
    }
    out
}

/// Writes `src` reshaped to `sizes` (same element count) into the out argument.
fn write_reshaped(k: &mut KernelCtx, o: usize, src: &TensorIn, sizes: &[usize]) -> KernelResult {
    let mut t = src.clone();
    t.sizes = sizes.to_vec();
    if t.numel() != src.numel() {
        return Err(format!("cannot view shape {:?} as {sizes:?}", src.sizes));
    }
    k.write_like(
        o,
        &TensorIn::owned(src.dtype, sizes.to_vec(), src.bytes().to_vec()),
    )
}

/// Resolves a view size list with at most one -1.
fn view_sizes(req: &[i64], numel: usize) -> Result<Vec<usize>, String> {
    let mut infer = None;
    let mut known = 1usize;
    let mut out = Vec::with_capacity(req.len());
    for (i, &d) in req.iter().enumerate() {
        if d == -1 {
            if infer.replace(i).is_some() {
                return Err(format!("view size {req:?} has more than one -1"));
            }
            out.push(0);
        } else if d < 0 {
            return Err(format!("view size {req:?} has a negative dim"));
        } else {
            known = known.checked_mul(d as usize).ok_or("view size overflows")?;
            out.push(d as usize);
        }
    }
    if let Some(i) = infer {
        if known == 0 || numel % known != 0 {
            return Err(format!("cannot infer -1 in {req:?} for {numel} elements"));
        }
        out[i] = numel / known;
    } else if known != numel {
        return Err(format!("view size {req:?} does not match {numel} elements"));
    }
    Ok(out)
}

fn view_copy(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let sizes = view_sizes(&k.int_list(1)?, a.numel())?;
    let o = k.last();
    write_reshaped(k, o, &a, &sizes)
}

/// `et_view(self, size) -> out`: the output aliases the input's memory with a new shape.
fn et_view(k: &mut KernelCtx) -> KernelResult {
    let src: Tensor = k.meta(0)?.clone();
    let sizes = view_sizes(&k.int_list(1)?, src.numel())?;
    let out_id = k.id(k.last())?;
    let dtype = k.meta_of(out_id)?.dtype;
    if dtype != src.dtype {
        return Err(format!(
            "et_view from {} to {}",
            src.dtype.name(),
            dtype.name()
        ));
    }
    let view = Tensor {
        sizes,
        max_bytes: src.max_bytes,
        ..src
    };
    k.mem.values[out_id] = Value::Tensor(view);
    Ok(())
}

/// A row-major tensor of `sizes` (elements `esz` bytes) permuted by `perm` (validated): copied by
/// strides, a run of the innermost dim at a time where it stays innermost.
fn permute_bytes(sizes: &[usize], src: &[u8], esz: usize, perm: &[usize]) -> (Vec<usize>, Vec<u8>) {
    let out: Vec<usize> = perm.iter().map(|&p| sizes[p]).collect();
    let st = strides(sizes);
    let out_st: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    (out.clone(), strided_bytes(src, esz, &out, &out_st))
}

/// `strided_copy` of elements `esz` bytes wide.
fn strided_bytes(src: &[u8], esz: usize, out: &[usize], out_st: &[usize]) -> Vec<u8> {
    fn typed<const E: usize>(src: &[u8], out: &[usize], st: &[usize]) -> Vec<u8> {
        let s: &[[u8; E]] = bytemuck::cast_slice(&src[..src.len() / E * E]);
        strided_copy(s, out, st).into_flattened()
    }
    match esz {
        1 => typed::<1>(src, out, out_st),
        2 => typed::<2>(src, out, out_st),
        4 => typed::<4>(src, out, out_st),
        8 => typed::<8>(src, out, out_st),
        _ => {
            let idx: Vec<usize> = strided_copy(
                &(0..src.len() / esz.max(1)).collect::<Vec<_>>(),
                out,
                out_st,
            );
            gather(src, esz, idx.into_iter())
        }
    }
}

/// Argument 0 permuted by `perm` into the out argument, read where it lies.
fn permute_into(k: &mut KernelCtx, perm: Vec<usize>) -> KernelResult {
    let (dtype, sizes, bytes) = {
        let (a, ab) = k.input_ref(0)?;
        let mut seen = vec![false; a.sizes.len()];
        if perm.len() != a.sizes.len()
            || perm
                .iter()
                .any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
        {
            return Err(format!(
                "{perm:?} is not a permutation of rank {}",
                a.sizes.len()
            ));
        }
        let (sizes, bytes) = permute_bytes(&a.sizes, ab, a.dtype.size(), &perm);
        (a.dtype, sizes, bytes)
    };
    let o = k.last();
    k.write_like(o, &TensorIn::owned(dtype, sizes, bytes))
}

fn permute_copy(k: &mut KernelCtx) -> KernelResult {
    let r = k.meta(0)?.sizes.len();
    let perm = k
        .int_list(1)?
        .into_iter()
        .map(|d| norm_dim(d, r))
        .collect::<Result<Vec<_>, _>>()?;
    permute_into(k, perm)
}

fn transpose_copy(k: &mut KernelCtx) -> KernelResult {
    let r = k.meta(0)?.sizes.len();
    let (d0, d1) = (norm_dim(k.int(1)?, r)?, norm_dim(k.int(2)?, r)?);
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(d0, d1);
    permute_into(k, perm)
}

fn t_copy(k: &mut KernelCtx) -> KernelResult {
    let r = k.meta(0)?.sizes.len();
    permute_into(k, (0..r).rev().collect())
}

fn unsqueeze_copy(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let d = norm_dim(k.int(1)?, a.sizes.len() + 1)?;
    let mut sizes = a.sizes.clone();
    sizes.insert(d, 1);
    let o = k.last();
    write_reshaped(k, o, &a, &sizes)
}

fn squeeze_copy_dims(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let r = a.sizes.len();
    let dims = k
        .int_list(1)?
        .into_iter()
        .map(|d| norm_dim(d, r))
        .collect::<Result<Vec<_>, _>>()?;
    let sizes: Vec<usize> = a
        .sizes
        .iter()
        .enumerate()
        .filter(|(i, &s)| !(s == 1 && dims.contains(i)))
        .map(|(_, &s)| s)
        .collect();
    let o = k.last();
    write_reshaped(k, o, &a, &sizes)
}

fn expand_copy(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let req = k.int_list(1)?;
    if req.len() < a.sizes.len() {
        return Err(format!("cannot expand {:?} to {req:?}", a.sizes));
    }
    let off = req.len() - a.sizes.len();
    let mut sizes = Vec::with_capacity(req.len());
    for (i, &r) in req.iter().enumerate() {
        let cur = if i >= off { a.sizes[i - off] } else { 1 };
        sizes.push(if r == -1 { cur } else { r.max(0) as usize });
    }
    let o = k.last();
    k.write_like(o, &broadcast_to(a, &sizes)?)
}

fn repeat(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let reps: Vec<usize> = k
        .int_list(1)?
        .into_iter()
        .map(|r| r.max(0) as usize)
        .collect();
    if reps.len() < a.sizes.len() {
        return Err("repeat has fewer repeats than dims".into());
    }
    let off = reps.len() - a.sizes.len();
    let src_sizes: Vec<usize> = (0..reps.len())
        .map(|i| if i >= off { a.sizes[i - off] } else { 1 })
        .collect();
    let out_sizes: Vec<usize> = src_sizes.iter().zip(&reps).map(|(s, r)| s * r).collect();
    let st = strides(&src_sizes);
    let total: usize = out_sizes.iter().product();
    let mut idx = vec![0usize; out_sizes.len()];
    let mut pos = Vec::with_capacity(total);
    for _ in 0..total {
        pos.push(
            (0..idx.len())
                .map(|d| (idx[d] % src_sizes[d]) * st[d])
                .sum(),
        );
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let bytes = gather(a.bytes(), esz(&a), pos.into_iter());
    let o = k.last();
    k.write_like(o, &TensorIn::owned(a.dtype, out_sizes, bytes))
}

/// (outer, dim size, inner) split of a shape around `dim`.
fn split3(sizes: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer = sizes[..dim].iter().product();
    let inner = sizes[dim + 1..].iter().product();
    (outer, sizes[dim], inner)
}

fn cat_tensors(k: &mut KernelCtx, ins: Vec<TensorIn>, dim: i64, o: usize) -> KernelResult {
    // Legacy rule: 1-D empty tensors are skipped.
    let ins: Vec<TensorIn> = ins
        .into_iter()
        .filter(|t| !(t.sizes.len() == 1 && t.sizes[0] == 0))
        .collect();
    let Some(first) = ins.first() else {
        let dt = k.out_dtype(o)?;
        let _ = dt;
        return k.write(o, &[0], &[]);
    };
    let r = first.sizes.len();
    let d = norm_dim(dim, r)?;
    let out_dt = k.out_dtype(o)?;
    let mut sizes = first.sizes.clone();
    sizes[d] = 0;
    for t in &ins {
        if t.sizes.len() != r || (0..r).any(|i| i != d && t.sizes[i] != first.sizes[i]) {
            return Err(format!(
                "cat: shapes {:?} and {:?} differ off dim {d}",
                first.sizes, t.sizes
            ));
        }
        sizes[d] += t.sizes[d];
    }
    // Convert each input to the out dtype before interleaving.
    let conv: Vec<Vec<u8>> = ins
        .iter()
        .map(|t| {
            if t.dtype == out_dt {
                t.bytes().to_vec()
            } else if t.dtype.is_float() || out_dt.is_float() {
                crate::runtime::tensor::from_f64(out_dt, &t.f64())
            } else {
                crate::runtime::tensor::from_i64(out_dt, &t.i64())
            }
        })
        .collect();
    let e = out_dt.size();
    let (outer, _, inner) = split3(&sizes, d);
    let mut res = Vec::with_capacity(sizes.iter().product::<usize>() * e);
    for ob in 0..outer {
        for (t, b) in ins.iter().zip(&conv) {
            let chunk = t.sizes[d] * inner * e;
            res.extend_from_slice(&b[ob * chunk..(ob + 1) * chunk]);
        }
    }
    k.write(o, &sizes, &res)
}

fn cat(k: &mut KernelCtx) -> KernelResult {
    let ids = k.tensor_ids(0)?;
    let ins = ids
        .iter()
        .map(|&i| k.input_of(i))
        .collect::<Result<Vec<_>, _>>()?;
    let dim = k.int(1)?;
    let o = k.last();
    cat_tensors(k, ins, dim, o)
}

fn stack(k: &mut KernelCtx) -> KernelResult {
    let ids = k.tensor_ids(0)?;
    let dim = k.int(1)?;
    let mut ins = ids
        .iter()
        .map(|&i| k.input_of(i))
        .collect::<Result<Vec<_>, _>>()?;
    let r = ins.first().map_or(0, |t| t.sizes.len());
    let d = norm_dim(dim, r + 1)?;
    for t in &mut ins {
        t.sizes.insert(d, 1);
    }
    let o = k.last();
    cat_tensors(k, ins, d as i64, o)
}

/// Clamps slice bounds the way ATen does (negative wrap, then clamp to [0, size]).
fn slice_bounds(start: Option<i64>, end: Option<i64>, size: usize) -> (usize, usize) {
    let n = size as i64;
    let fix = |v: i64| {
        let v = if v < 0 { v + n } else { v };
        v.clamp(0, n) as usize
    };
    let s = fix(start.unwrap_or(0));
    let e = fix(end.unwrap_or(n));
    (s, e.max(s))
}

/// Elements `s, s + step, ..` (`len` of them) along dim `d` of a row-major tensor of `sizes`:
/// a strided view of it, copied by strides like a permute.
fn slice_bytes(sizes: &[usize], src: &[u8], esz: usize, [d, s, step, len]: [usize; 4]) -> Vec<u8> {
    let mut st = strides(sizes);
    let base = s * st[d] * esz;
    st[d] *= step;
    let mut out = sizes.to_vec();
    out[d] = len;
    strided_bytes(&src[base.min(src.len())..], esz, &out, &st)
}

fn slice_copy(k: &mut KernelCtx) -> KernelResult {
    // Read where it lies: the slices of a KV cache are a few rows of a megabyte or more.
    let (dtype, sizes, bytes) = {
        let (a, ab) = k.input_ref(0)?;
        let d = norm_dim(k.int(1)?, a.sizes.len())?;
        let (s, e) = slice_bounds(k.opt_int(2)?, k.opt_int(3)?, a.sizes[d]);
        let step = k.int(4)?;
        if step <= 0 {
            return Err(format!("slice step {step} must be positive"));
        }
        let step = step as usize;
        let len = (e - s).div_ceil(step);
        let bytes = slice_bytes(&a.sizes, ab, a.dtype.size(), [d, s, step, len]);
        let mut sizes = a.sizes.clone();
        sizes[d] = len;
        (a.dtype, sizes, bytes)
    };
    let o = k.last();
    k.write_like(o, &TensorIn::owned(dtype, sizes, bytes))
}

fn select_copy(k: &mut KernelCtx) -> KernelResult {
    let (dtype, sizes, bytes) = {
        let (a, ab) = k.input_ref(0)?;
        let d = norm_dim(k.int(1)?, a.sizes.len())?;
        let n = a.sizes[d] as i64;
        let mut i = k.int(2)?;
        if i < 0 {
            i += n;
        }
        if i < 0 || i >= n {
            return Err(format!(
                "select index {} out of range for size {n}",
                k.int(2)?
            ));
        }
        // A slice of one, without its dim.
        let bytes = slice_bytes(&a.sizes, ab, a.dtype.size(), [d, i as usize, 1, 1]);
        let mut sizes = a.sizes.clone();
        sizes.remove(d);
        (a.dtype, sizes, bytes)
    };
    let o = k.last();
    k.write_like(o, &TensorIn::owned(dtype, sizes, bytes))
}

/// Converts `src` to `dt` bytes.
fn bytes_as(src: &TensorIn, dt: crate::runtime::tensor::DType) -> Vec<u8> {
    if src.dtype == dt {
        src.bytes().to_vec()
    } else if src.dtype.is_float() || dt.is_float() {
        crate::runtime::tensor::from_f64(dt, &src.f64())
    } else {
        crate::runtime::tensor::from_i64(dt, &src.i64())
    }
}

/// `slice_scatter`'s arguments 1-5 checked against `self`'s shape: (dim, start, step, slice
/// length) and `src`.
fn scatter_args(
    k: &KernelCtx,
    a_sizes: &[usize],
) -> Result<(usize, usize, usize, usize, TensorIn), String> {
    let src = k.input(1)?;
    let d = norm_dim(k.int(2)?, a_sizes.len())?;
    let (s, e) = slice_bounds(k.opt_int(3)?, k.opt_int(4)?, a_sizes[d]);
    let step = k.int(5)?.max(1) as usize;
    let len = (e - s).div_ceil(step);
    let mut want = a_sizes.to_vec();
    want[d] = len;
    if src.sizes != want {
        return Err(format!(
            "slice_scatter: src {:?} does not fit slice {want:?}",
            src.sizes
        ));
    }
    Ok((d, s, step, len, src))
}

/// `src` (already in `out`'s dtype, `ee` bytes an element) written over the slice of `out`.
#[allow(clippy::too_many_arguments)]
fn scatter_rows(
    out: &mut [u8],
    sb: &[u8],
    sizes: &[usize],
    d: usize,
    s: usize,
    step: usize,
    len: usize,
    ee: usize,
) {
    let (outer, n, inner) = split3(sizes, d);
    let mut si = 0;
    for ob in 0..outer {
        for j in 0..len {
            let base = ((ob * n + s + j * step) * inner) * ee;
            out[base..base + inner * ee].copy_from_slice(&sb[si..si + inner * ee]);
            si += inner * ee;
        }
    }
}

fn slice_scatter(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let (d, s, step, len, src) = scatter_args(k, &a.sizes)?;
    let o = k.last();
    let dt = k.out_dtype(o)?;
    let mut out = bytes_as(&a, dt);
    scatter_rows(
        &mut out,
        &bytes_as(&src, dt),
        &a.sizes,
        d,
        s,
        step,
        len,
        dt.size(),
    );
    k.write(o, &a.sizes.clone(), &out)
}

/// `slice_scatter.out` whose result the method copies back into `self` and nothing else reads
/// `self` meanwhile (`runtime::scatter_in_place` checks): `src` goes into `self`'s slice where
/// it lies, and the out value becomes `self`, storage and all. A KV cache update without
/// copying the cache twice.
pub(crate) fn slice_scatter_in_place(k: &mut KernelCtx) -> KernelResult {
    let t = k.meta(0)?.clone();
    if !t.is_contiguous() {
        return Err(format!(
            "tensor with dim order {:?} is not supported",
            t.dim_order
        ));
    }
    let (d, s, step, len, src) = scatter_args(k, &t.sizes)?;
    let sb = bytes_as(&src, t.dtype);
    let dst = k.mem.bytes_mut(&t)?;
    scatter_rows(dst, &sb, &t.sizes, d, s, step, len, t.dtype.size());
    let o = k.id(k.last())?;
    k.mem.values[o] = Value::Tensor(t);
    Ok(())
}

fn check_index(i: i64, n: usize) -> Result<usize, String> {
    let j = if i < 0 { i + n as i64 } else { i };
    if j < 0 || j >= n as i64 {
        return Err(format!("index {i} is out of range for size {n}"));
    }
    Ok(j as usize)
}

fn index_select(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let d = norm_dim(k.int(1)?, a.sizes.len())?;
    let ix = k.input(2)?.i64();
    let (outer, n, inner) = split3(&a.sizes, d);
    let ix = ix
        .iter()
        .map(|&i| check_index(i, n))
        .collect::<Result<Vec<_>, _>>()?;
    let idx = (0..outer).flat_map(|ob| {
        ix.iter()
            .flat_map(move |&r| (0..inner).map(move |j| (ob * n + r) * inner + j))
    });
    let bytes = gather(a.bytes(), esz(&a), idx);
    let mut sizes = a.sizes.clone();
    sizes[d] = ix.len();
    let o = k.last();
    k.write_like(o, &TensorIn::owned(a.dtype, sizes, bytes))
}

fn embedding(k: &mut KernelCtx) -> KernelResult {
    let w = k.input(0)?;
    let ids = k.input(1)?;
    if w.sizes.len() != 2 {
        return Err(format!("embedding weight must be 2-D, got {:?}", w.sizes));
    }
    let (rows, dim) = (w.sizes[0], w.sizes[1]);
    let ix = ids
        .i64()
        .iter()
        .map(|&i| check_index(i, rows))
        .collect::<Result<Vec<_>, _>>()?;
    let idx = ix.iter().flat_map(|&r| (0..dim).map(move |j| r * dim + j));
    let bytes = gather(w.bytes(), esz(&w), idx);
    let mut sizes = ids.sizes.clone();
    sizes.push(dim);
    let o = k.last();
    k.write_like(o, &TensorIn::owned(w.dtype, sizes, bytes))
}

/// `quantized_decomposed::embedding_byte(weight, scales, zero_points?, qmin, qmax, indices
/// [, dtype])`: an int8/uint8 table row gather, dequantized as `(q - zp) * scale` with one scale
/// (and zero point) per row or per row and group (ExecuTorch `kernels/quantized/op_embedding.cpp`).
/// Unlike its neighbours it computes values; it lives beside `embedding` because it is one.
fn embedding_byte(k: &mut KernelCtx) -> KernelResult {
    quantized_embedding(k, 8)
}

/// `quantized_decomposed::embedding_4bit(...)`, the same with two 4-bit values per uint8 byte:
/// the high nibble is the even column, each stored as q + 8 (ExecuTorch `op_embedding4b.cpp`,
/// packed by the llama `EmbeddingQuantHandler`).
fn embedding_4bit(k: &mut KernelCtx) -> KernelResult {
    quantized_embedding(k, 4)
}

fn quantized_embedding(k: &mut KernelCtx, bits: usize) -> KernelResult {
    let op = if bits == 4 {
        "embedding_4bit"
    } else {
        "embedding_byte"
    };
    let w = k.input(0)?;
    let scales = k.input(1)?;
    let zps = k.opt_input(2)?;
    let ids = k.input(5)?;
    let byte_ok = match bits {
        4 => w.dtype == DType::U8,
        _ => matches!(w.dtype, DType::I8 | DType::U8),
    };
    if w.sizes.len() != 2 || !byte_ok {
        return Err(format!(
            "{op} weight must be 2-D {}, got {} {:?}",
            if bits == 4 { "uint8" } else { "int8/uint8" },
            w.dtype.name(),
            w.sizes
        ));
    }
    let per_byte = 8 / bits;
    let (rows, dim) = (w.sizes[0], w.sizes[1] * per_byte);
    let groups = match scales.sizes[..] {
        [r] if r == rows => 1,
        [r, g] if r == rows && g > 0 && dim % g == 0 => g,
        _ => {
            return Err(format!(
                "{op} scales {:?} do not fit weight {:?}",
                scales.sizes, w.sizes
            ))
        }
    };
    let s = scales.f32();
    let z: Option<Vec<f32>> = zps.map(|t| t.f32().into_owned());
    if z.as_ref().is_some_and(|z| z.len() != s.len()) {
        return Err(format!("{op} zero points and scales differ in size"));
    }
    // Only the looked-up rows are decoded (the table is the model's largest tensor).
    let (bytes, signed) = (w.bytes(), w.dtype == DType::I8);
    let value = |r: usize, j: usize| -> f32 {
        let b = bytes[r * w.sizes[1] + j / per_byte];
        match (bits, signed) {
            (4, _) if j % 2 == 0 => (b >> 4) as f32 - 8.0,
            (4, _) => (b & 0x0f) as f32 - 8.0,
            (_, true) => b as i8 as f32,
            _ => b as f32,
        }
    };
    let group = dim / groups;
    let mut out = Vec::with_capacity(ids.numel() * dim);
    for i in ids.i64() {
        let r = check_index(i, rows)?;
        for j in 0..dim {
            let g = r * groups + j / group;
            let zp = z.as_ref().map_or(0.0, |z| z[g]);
            out.push((value(r, j) - zp) * s[g]);
        }
    }
    let mut sizes = ids.sizes.clone();
    sizes.push(dim);
    let o = k.last();
    k.write_f32(o, &sizes, &out)
}

/// `index.Tensor(self, indices)`: advanced indexing with leading/interior index tensors.
fn index_tensor(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let ids = k.opt_tensor_ids(1)?;
    let (shape, offs) = advanced_index(k, &a.sizes, &ids)?;
    let bytes = gather(a.bytes(), esz(&a), offs.into_iter());
    let o = k.last();
    k.write_like(o, &TensorIn::owned(a.dtype, shape, bytes))
}

/// Computes the result shape and source element offsets of `self[indices]` where the indexed dims
/// are adjacent (the form exports produce); boolean masks are not supported.
#[allow(clippy::needless_range_loop)] // j indexes every per-dim index list at once
fn advanced_index(
    k: &KernelCtx,
    sizes: &[usize],
    ids: &[Option<usize>],
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let idx_t: Vec<Option<TensorIn>> = ids
        .iter()
        .map(|o| o.map(|i| k.input_of(i)).transpose())
        .collect::<Result<_, _>>()?;
    let dims: Vec<usize> = idx_t
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_some())
        .map(|(i, _)| i)
        .collect();
    if dims.is_empty() {
        return Err("index with no index tensors".into());
    }
    if dims.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err("index tensors on non-adjacent dims are not supported".into());
    }
    let mut bshape: Vec<usize> = vec![];
    for t in idx_t.iter().flatten() {
        if t.dtype == crate::runtime::tensor::DType::Bool {
            return Err("boolean mask indexing is not supported".into());
        }
        bshape = super::broadcast_shape(&bshape, &t.sizes)?;
    }
    let bn: usize = bshape.iter().product();
    let per_dim: Vec<Vec<usize>> = dims
        .iter()
        .map(|&d| {
            let t = idx_t[d].as_ref().unwrap();
            let v = t.i64();
            broadcast_indices(&t.sizes, &bshape)
                .iter()
                .map(|&j| check_index(v[j], sizes[d]))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let (d0, d1) = (dims[0], *dims.last().unwrap());
    let before = &sizes[..d0];
    let after = &sizes[d1 + 1..];
    let st = strides(sizes);
    let mut shape = before.to_vec();
    shape.extend_from_slice(&bshape);
    shape.extend_from_slice(after);
    let nb: usize = before.iter().product();
    let na: usize = after.iter().product();
    let mut offs = Vec::with_capacity(nb * bn * na);
    let bst = strides(before);
    let ast = strides(after);
    for ob in 0..nb {
        let base_b: usize = (0..before.len())
            .map(|i| (ob / bst[i]) % before[i] * st[i])
            .sum();
        for j in 0..bn {
            let base_i: usize = dims
                .iter()
                .enumerate()
                .map(|(q, &d)| per_dim[q][j] * st[d])
                .sum();
            for ia in 0..na {
                let base_a: usize = (0..after.len())
                    .map(|i| (ia / ast[i]) % after[i] * st[d1 + 1 + i])
                    .sum();
                offs.push(base_b + base_i + base_a);
            }
        }
    }
    Ok((shape, offs))
}

fn index_put(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let ids = k.opt_tensor_ids(1)?;
    let vals = k.input(2)?;
    let acc = k.boolean(3)?;
    let (shape, offs) = advanced_index(k, &a.sizes, &ids)?;
    let o = k.last();
    let dt = k.out_dtype(o)?;
    let vi = broadcast_indices(&vals.sizes, &shape);
    if dt.is_float() {
        let mut out = a.f64();
        let v = vals.f64();
        for (j, &off) in offs.iter().enumerate() {
            out[off] = if acc { out[off] + v[vi[j]] } else { v[vi[j]] };
        }
        k.write_f64(o, &a.sizes.clone(), &out)
    } else {
        let mut out = a.i64();
        let v = vals.i64();
        for (j, &off) in offs.iter().enumerate() {
            out[off] = if acc { out[off] + v[vi[j]] } else { v[vi[j]] };
        }
        k.write_i64(o, &a.sizes.clone(), &out)
    }
}

fn index_copy(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let d = norm_dim(k.int(1)?, a.sizes.len())?;
    let ix = k.input(2)?.i64();
    let src = k.input(3)?;
    let o = k.last();
    let dt = k.out_dtype(o)?;
    let e = dt.size();
    let mut out = bytes_as(&a, dt);
    let sb = bytes_as(&src, dt);
    let (outer, n, inner) = split3(&a.sizes, d);
    if src.sizes.len() != a.sizes.len() || src.sizes[d] != ix.len() {
        return Err(format!(
            "index_copy: source {:?} does not match {} indices",
            src.sizes,
            ix.len()
        ));
    }
    for ob in 0..outer {
        for (j, &r) in ix.iter().enumerate() {
            let r = check_index(r, n)?;
            let dst = ((ob * n + r) * inner) * e;
            let s = ((ob * ix.len() + j) * inner) * e;
            out[dst..dst + inner * e].copy_from_slice(&sb[s..s + inner * e]);
        }
    }
    k.write(o, &a.sizes.clone(), &out)
}

/// `t` broadcast to `shape` (NumPy rules), copied by strides; itself where the shape is its own.
fn broadcast_to(t: TensorIn, shape: &[usize]) -> Result<TensorIn, String> {
    if t.sizes == shape {
        return Ok(t);
    }
    if broadcast_shape(&t.sizes, shape)? != shape {
        return Err(format!(
            "a {:?} tensor does not broadcast to {shape:?}",
            t.sizes
        ));
    }
    let bytes = strided_bytes(t.bytes(), esz(&t), shape, &bcast_strides(&t.sizes, shape));
    Ok(TensorIn::owned(t.dtype, shape.to_vec(), bytes))
}

/// `copy(self, src, non_blocking) -> out`: src broadcast into self's shape.
fn copy_out(k: &mut KernelCtx) -> KernelResult {
    let a = k.meta(0)?.sizes.clone();
    let src = broadcast_to(k.input(1)?, &a)?;
    let o = k.last();
    k.write_like(o, &src)
}

/// `copy_(self, src, non_blocking) -> self`: writes src into self in place.
fn copy_inplace(k: &mut KernelCtx) -> KernelResult {
    let a = k.meta(0)?.sizes.clone();
    let src = broadcast_to(k.input(1)?, &a)?;
    k.write_like(0, &src)?;
    let (self_id, ret) = (k.id(0)?, k.id(k.last())?);
    if ret != self_id {
        let t = k.mem.values[self_id].clone();
        k.mem.values[ret] = t;
    }
    Ok(())
}

fn clone(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let o = k.last();
    k.write_like(o, &a)
}

/// `_to_dim_order_copy(self, non_blocking, dim_order) -> out`: only contiguous orders are supported.
fn to_dim_order_copy(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    if !k.is_none(2) {
        let order = k.int_list(2)?;
        if order.iter().enumerate().any(|(i, &d)| d != i as i64) {
            return Err(format!("dim order {order:?} is not supported"));
        }
    }
    let o = k.last();
    k.write_like(o, &a)
}

fn split_into(
    k: &mut KernelCtx,
    a: TensorIn,
    sizes: Vec<usize>,
    d: usize,
    outs: Vec<usize>,
) -> KernelResult {
    if sizes.iter().sum::<usize>() != a.sizes[d] || sizes.len() != outs.len() {
        return Err(format!(
            "split sizes {sizes:?} do not cover dim of size {}",
            a.sizes[d]
        ));
    }
    let (outer, n, inner) = split3(&a.sizes, d);
    let mut start = 0;
    for (len, out_id) in sizes.iter().zip(outs) {
        let st = start;
        let idx = (0..outer).flat_map(|ob| {
            (0..*len).flat_map(move |j| (0..inner).map(move |i| (ob * n + st + j) * inner + i))
        });
        let bytes = gather(a.bytes(), esz(&a), idx);
        let mut sh = a.sizes.clone();
        sh[d] = *len;
        let dt = k.meta_of(out_id)?.dtype;
        let t = TensorIn::owned(a.dtype, sh.clone(), bytes);
        k.write_id(out_id, &sh, &bytes_as(&t, dt))?;
        start += len;
    }
    Ok(())
}

fn split_with_sizes_copy(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let sizes: Vec<usize> = k
        .int_list(1)?
        .into_iter()
        .map(|s| s.max(0) as usize)
        .collect();
    let d = norm_dim(k.int(2)?, a.sizes.len())?;
    let outs = k.tensor_ids(3)?;
    split_into(k, a, sizes, d, outs)
}

fn split_copy(k: &mut KernelCtx) -> KernelResult {
    let a = k.input(0)?;
    let chunk = k.int(1)?.max(1) as usize;
    let d = norm_dim(k.int(2)?, a.sizes.len())?;
    let outs = k.tensor_ids(3)?;
    let n = a.sizes[d];
    let sizes: Vec<usize> = (0..n.div_ceil(chunk))
        .map(|i| chunk.min(n - i * chunk))
        .collect();
    split_into(k, a, sizes, d, outs)
}

#[cfg(test)]
mod tests {
    use super::{broadcast_indices, broadcast_to, gather, permute_bytes, slice_bytes, strides};
    use crate::runtime::tensor::{DType, TensorIn};

    /// Runs of consecutive indices are copied whole, and every element still lands where the
    /// indices put it: runs broken by jumps back, forward, repeats, and at either end.
    #[test]
    fn gather_copies_runs_and_keeps_every_element_in_place() {
        let esz = 3;
        let src: Vec<u8> = (0..60).collect();
        for idx in [
            vec![0, 1, 2, 5, 6, 9, 3, 4, 4, 19],
            vec![19],
            vec![],
            (0..20).collect(),
            (0..20).rev().collect(),
        ] {
            let want: Vec<u8> = idx
                .iter()
                .flat_map(|&i| src[i * esz..(i + 1) * esz].to_vec())
                .collect();
            assert_eq!(gather(&src, esz, idx.iter().copied()), want, "{idx:?}");
        }
    }

    /// Permutes copied by strides put every element where per-element indexing does, for each
    /// element width (the odd one gathered), including ones that keep the innermost dim.
    #[test]
    fn permutes_by_strides_match_per_element_indexing() {
        let sizes = [2, 3, 1, 4];
        for esz in [1, 2, 3, 4, 8] {
            let n: usize = sizes.iter().product();
            let src: Vec<u8> = (0..n * esz).map(|b| (b * 7 % 251) as u8).collect();
            for perm in [
                [0, 1, 2, 3],
                [3, 2, 1, 0],
                [1, 0, 2, 3],
                [0, 2, 1, 3],
                [2, 3, 0, 1],
            ] {
                let out: Vec<usize> = perm.iter().map(|&p| sizes[p]).collect();
                let (st, ost) = (strides(&sizes), strides(&out));
                let mut want = vec![0u8; n * esz];
                for i in 0..n {
                    // Output index i, dim by dim, read at the source's strides.
                    let from: usize = (0..4).map(|d| (i / ost[d] % out[d]) * st[perm[d]]).sum();
                    want[i * esz..(i + 1) * esz]
                        .copy_from_slice(&src[from * esz..(from + 1) * esz]);
                }
                let (got_sizes, got) = permute_bytes(&sizes, &src, esz, &perm);
                assert_eq!((got_sizes, got), (out, want), "esz {esz} perm {perm:?}");
            }
        }
    }

    /// Broadcasts by strides agree with `broadcast_indices`; a shape that does not broadcast is
    /// an error, not an out-of-range read.
    #[test]
    fn broadcasts_by_strides_match_the_index_form() {
        let bytes = |n: usize| {
            (0..n as u32)
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        for (from, to) in [
            (vec![3], vec![2, 3]),
            (vec![2, 1], vec![2, 4]),
            (vec![1, 3, 1], vec![2, 3, 5]),
            (vec![], vec![2, 2]),
            (vec![2, 3], vec![2, 3]),
        ] {
            let src = bytes(from.iter().product());
            let want: Vec<u8> = broadcast_indices(&from, &to)
                .into_iter()
                .flat_map(|i| src[i * 4..i * 4 + 4].to_vec())
                .collect();
            let got = broadcast_to(TensorIn::owned(DType::F32, from.clone(), src), &to).unwrap();
            assert_eq!(
                (got.sizes.clone(), got.bytes().to_vec()),
                (to, want),
                "{from:?}"
            );
        }
        for (from, to) in [(vec![3], vec![2, 4]), (vec![2, 3], vec![3])] {
            let t = TensorIn::owned(DType::F32, from.clone(), bytes(from.iter().product()));
            assert!(broadcast_to(t, &to).is_err(), "{from:?} -> {to:?}");
        }
    }

    /// Slices by strides (any step, any dim, empty ones, element widths with and without a
    /// typed copy) hold the elements per-element indexing picks.
    #[test]
    fn slices_by_strides_match_per_element_indexing() {
        let sizes = [3, 5, 4];
        let st = strides(&sizes);
        for esz in [1, 3, 4, 8] {
            let n: usize = sizes.iter().product();
            let src: Vec<u8> = (0..n * esz).map(|b| (b * 11 % 253) as u8).collect();
            for [d, s, step, len] in [
                [0, 1, 1, 2],
                [1, 0, 2, 3],
                [1, 4, 1, 1],
                [2, 1, 3, 1],
                [2, 0, 1, 4],
                [1, 5, 1, 0],
            ] {
                let mut out = sizes.to_vec();
                out[d] = len;
                let mut want = Vec::new();
                for i in 0..out[0] {
                    for j in 0..out[1] {
                        for l in 0..out[2] {
                            let mut idx = [i, j, l];
                            idx[d] = s + idx[d] * step;
                            let from: usize = (0..3).map(|x| idx[x] * st[x]).sum();
                            want.extend_from_slice(&src[from * esz..(from + 1) * esz]);
                        }
                    }
                }
                let got = slice_bytes(&sizes, &src, esz, [d, s, step, len]);
                assert_eq!(got, want, "esz {esz} slice {:?}", [d, s, step, len]);
            }
        }
    }
}
