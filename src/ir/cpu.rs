//! The CPU executor for IR graphs: the reference every GPU kernel is tested against. Floats
//! compute in f32 (the GPU reference path), integers in i64.

use super::infer::{infer_shapes, InputValue, Plan};
use super::*;
use crate::runtime::kernels::{broadcast_indices, strides};
use crate::runtime::tensor::{from_f32, from_i64, to_f32, to_i64};
use crate::runtime::HostTensor;

/// A tensor value during a call.
#[derive(Debug, Clone)]
enum Val {
    F(Vec<f32>),
    I(Vec<i64>),
}

impl Val {
    fn f(&self) -> Vec<f32> {
        match self {
            Val::F(v) => v.clone(),
            Val::I(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
    fn i(&self) -> Vec<i64> {
        match self {
            Val::I(v) => v.clone(),
            Val::F(v) => v.iter().map(|&x| x as i64).collect(),
        }
    }
}

fn decode(dtype: DType, bytes: &[u8]) -> Val {
    if dtype.is_float() {
        Val::F(to_f32(dtype, bytes).into_owned())
    } else {
        Val::I(to_i64(dtype, bytes))
    }
}

fn encode(dtype: DType, v: &Val) -> Vec<u8> {
    match v {
        Val::F(f) => from_f32(dtype, f),
        Val::I(i) => from_i64(dtype, i),
    }
}

/// Runs an IR graph on the CPU; State tensors (KV caches) persist across calls.
pub struct CpuExecutor {
    graph: Graph,
    states: Vec<Option<Val>>,
    /// Decoded constants, cached on first use.
    consts: Vec<Option<Val>>,
}

pub type Result<T> = std::result::Result<T, IrError>;

impl CpuExecutor {
    pub fn new(graph: Graph) -> Result<Self> {
        graph.validate()?;
        let n = graph.tensors.len();
        let states = graph
            .tensors
            .iter()
            .map(|t| match &t.role {
                Role::State(Some(b)) => Some(decode(t.dtype, &b[..t.max_bytes()])),
                Role::State(None) => Some(if t.dtype.is_float() {
                    Val::F(vec![0.0; t.max_numel()])
                } else {
                    Val::I(vec![0; t.max_numel()])
                }),
                _ => None,
            })
            .collect();
        Ok(CpuExecutor {
            graph,
            states,
            consts: vec![None; n],
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Runs one call; returns the graph outputs.
    pub fn run(&mut self, inputs: &[InputValue]) -> Result<Vec<HostTensor>> {
        let plan = infer_shapes(&self.graph, inputs)?;
        let mut vals: Vec<Option<Val>> = vec![None; self.graph.tensors.len()];
        for (io, v) in self.graph.inputs.iter().zip(inputs) {
            if let (Io::Tensor(t), InputValue::Tensor { data, .. }) = (io, v) {
                vals[*t] = Some(decode(self.graph.tensors[*t].dtype, data));
            }
        }
        let nodes = self.graph.nodes.clone();
        for (n, node) in nodes.iter().enumerate() {
            let Node::Op(op) = node else { continue };
            self.exec(op, &plan, &mut vals)
                .map_err(|msg| IrError::Node {
                    node: n,
                    op: op.kind.label(),
                    msg,
                })?;
        }
        let outs = self.graph.outputs.clone();
        outs.iter()
            .map(|&t| {
                let v = self.get(t, &vals).map_err(IrError::Invalid)?;
                let dtype = self.graph.tensors[t].dtype;
                let shape = plan.shapes[t].clone();
                let n: usize = shape.iter().product();
                let mut data = encode(dtype, &v);
                data.truncate(n * dtype.size());
                Ok(HostTensor {
                    dtype,
                    sizes: shape,
                    data,
                })
            })
            .collect()
    }

    fn get(&mut self, t: TensorId, vals: &[Option<Val>]) -> std::result::Result<Val, String> {
        if let Some(v) = &vals[t] {
            return Ok(v.clone());
        }
        if let Some(s) = &self.states[t] {
            return Ok(s.clone());
        }
        let def = &self.graph.tensors[t];
        if let Role::Constant(b) = &def.role {
            if self.consts[t].is_none() {
                self.consts[t] = Some(decode(def.dtype, &b[..def.max_bytes()]));
            }
            return Ok(self.consts[t].clone().unwrap());
        }
        Err(format!(
            "tensor {t} `{}` is read before it is written",
            def.name
        ))
    }

    fn raw_const(&self, t: TensorId) -> std::result::Result<&[u8], String> {
        match &self.graph.tensors[t].role {
            Role::Constant(b) => Ok(b),
            _ => Err(format!("tensor {t} must be a constant (packed weights)")),
        }
    }

    fn set(&mut self, t: TensorId, v: Val, vals: &mut [Option<Val>]) {
        if self.states[t].is_some() {
            self.states[t] = Some(v);
        } else {
            vals[t] = Some(v);
        }
    }

    fn exec(
        &mut self,
        op: &Op,
        plan: &Plan,
        vals: &mut [Option<Val>],
    ) -> std::result::Result<(), String> {
        let sh = |t: TensorId| plan.shapes[t].clone();
        let out = op.outputs[0];
        let out_shape = sh(out);
        let out_float = self.graph.tensors[out].dtype.is_float();
        let syms = &plan.syms;
        let result: Val = match &op.kind {
            OpKind::Unary(u) => {
                let x = self.get(op.inputs[0], vals)?;
                if !out_float
                    && matches!(
                        u,
                        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::LogicalNot | UnaryOp::Square
                    )
                {
                    Val::I(x.i().into_iter().map(|v| unary_i(*u, v)).collect())
                } else {
                    Val::F(x.f().into_iter().map(|v| unary_f(*u, v)).collect())
                }
            }
            OpKind::Binary(b) => {
                let (x, y) = (self.get(op.inputs[0], vals)?, self.get(op.inputs[1], vals)?);
                let (xi, yi) = (
                    broadcast_indices(&sh(op.inputs[0]), &out_shape),
                    broadcast_indices(&sh(op.inputs[1]), &out_shape),
                );
                binary(*b, &x, &y, &xi, &yi, out_float)
            }
            OpKind::BinaryScalar {
                op: b,
                scalar,
                scalar_first,
            } => {
                let x = self.get(op.inputs[0], vals)?;
                let n = out_shape.iter().product::<usize>();
                let s = if *scalar == scalar.trunc() && matches!(x, Val::I(_)) && !out_float {
                    Val::I(vec![*scalar as i64])
                } else {
                    Val::F(vec![*scalar as f32])
                };
                let xi: Vec<usize> = (0..n).collect();
                let si = vec![0usize; n];
                if *scalar_first {
                    binary(*b, &s, &x, &si, &xi, out_float)
                } else {
                    binary(*b, &x, &s, &xi, &si, out_float)
                }
            }
            OpKind::Where => {
                let c = self.get(op.inputs[0], vals)?.i();
                let (a, b) = (self.get(op.inputs[1], vals)?, self.get(op.inputs[2], vals)?);
                let ci = broadcast_indices(&sh(op.inputs[0]), &out_shape);
                let ai = broadcast_indices(&sh(op.inputs[1]), &out_shape);
                let bi = broadcast_indices(&sh(op.inputs[2]), &out_shape);
                if out_float {
                    let (a, b) = (a.f(), b.f());
                    Val::F(
                        (0..ci.len())
                            .map(|j| if c[ci[j]] != 0 { a[ai[j]] } else { b[bi[j]] })
                            .collect(),
                    )
                } else {
                    let (a, b) = (a.i(), b.i());
                    Val::I(
                        (0..ci.len())
                            .map(|j| if c[ci[j]] != 0 { a[ai[j]] } else { b[bi[j]] })
                            .collect(),
                    )
                }
            }
            OpKind::Clamp { min, max } => {
                let x = self.get(op.inputs[0], vals)?;
                let (lo, hi) = (
                    min.unwrap_or(f64::NEG_INFINITY),
                    max.unwrap_or(f64::INFINITY),
                );
                match x {
                    Val::F(v) => Val::F(
                        v.into_iter()
                            .map(|e| e.max(lo as f32).min(hi as f32))
                            .collect(),
                    ),
                    Val::I(v) => Val::I(
                        v.into_iter()
                            .map(|e| (e as f64).clamp(lo, hi) as i64)
                            .collect(),
                    ),
                }
            }
            OpKind::Cast | OpKind::Copy => {
                let x = self.get(op.inputs[0], vals)?;
                if out_float {
                    Val::F(x.f())
                } else if self.graph.tensors[out].dtype == DType::Bool {
                    Val::I(x.f().into_iter().map(|v| (v != 0.0) as i64).collect())
                } else {
                    Val::I(x.i())
                }
            }
            OpKind::RmsNorm { eps } => {
                let x = self.get(op.inputs[0], vals)?.f();
                let w = match op.inputs.get(1) {
                    Some(&t) => Some(self.get(t, vals)?.f()),
                    None => None,
                };
                let d = *out_shape.last().ok_or("rms_norm of a scalar")?;
                let mut y = vec![0f32; x.len()];
                for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
                    let ms: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
                    let r = 1.0 / (ms + eps).sqrt();
                    for (j, (yv, xv)) in yr.iter_mut().zip(xr).enumerate() {
                        *yv = xv * r * w.as_ref().map_or(1.0, |w| w[j]);
                    }
                }
                Val::F(y)
            }
            OpKind::Linear {
                weight,
                act_quant,
                has_bias,
            } => {
                let x_shape = sh(op.inputs[0]);
                let mut x = self.get(op.inputs[0], vals)?.f();
                let k = *x_shape.last().ok_or("linear of a scalar")?;
                let n = *out_shape.last().unwrap();
                let m = x.len() / k.max(1);
                if *act_quant {
                    for row in x.chunks_mut(k) {
                        quant_dequant_row(row);
                    }
                }
                let w = self.dequant(*weight, &op.inputs[1..1 + weight.tensor_count()], vals)?;
                let mut y = crate::runtime::kernels::matmul_f32(&x, &w, m, k, n, true);
                if *has_bias {
                    let b = self.get(op.inputs[1 + weight.tensor_count()], vals)?.f();
                    for row in y.chunks_mut(n) {
                        row.iter_mut().zip(&b).for_each(|(v, bv)| *v += bv);
                    }
                }
                Val::F(y)
            }
            OpKind::MatMul => {
                let (as_, bs) = (sh(op.inputs[0]), sh(op.inputs[1]));
                let (a, b) = (
                    self.get(op.inputs[0], vals)?.f(),
                    self.get(op.inputs[1], vals)?.f(),
                );
                let (m, k, n) = (as_[as_.len() - 2], as_[as_.len() - 1], bs[bs.len() - 1]);
                let batch_shape = &out_shape[..out_shape.len() - 2];
                let ab: Vec<usize> = as_[..as_.len() - 2].to_vec();
                let bb: Vec<usize> = bs[..bs.len() - 2].to_vec();
                let ai = broadcast_indices(&ab, batch_shape);
                let bi = broadcast_indices(&bb, batch_shape);
                let mut y = Vec::with_capacity(out_shape.iter().product());
                for j in 0..ai.len().max(1) {
                    let (pa, pb) = (
                        ai.get(j).copied().unwrap_or(0),
                        bi.get(j).copied().unwrap_or(0),
                    );
                    y.extend(crate::runtime::kernels::matmul_f32(
                        &a[pa * m * k..(pa + 1) * m * k],
                        &b[pb * k * n..(pb + 1) * k * n],
                        m,
                        k,
                        n,
                        false,
                    ));
                }
                Val::F(y)
            }
            OpKind::Embedding { weight } => {
                let wc = weight.tensor_count();
                let ids = self.get(op.inputs[wc], vals)?.i();
                let wshape = sh(op.inputs[0]);
                let rows = wshape[0];
                let cols = *out_shape.last().unwrap();
                let mut y = Vec::with_capacity(ids.len() * cols);
                for &id in &ids {
                    if id < 0 || id as usize >= rows {
                        return Err(format!("token id {id} outside the {rows}-row table"));
                    }
                    y.extend(self.dequant_row(
                        *weight,
                        &op.inputs[..wc],
                        id as usize,
                        cols,
                        vals,
                    )?);
                }
                Val::F(y)
            }
            OpKind::Softmax => {
                let x = self.get(op.inputs[0], vals)?.f();
                let d = *out_shape.last().ok_or("softmax of a scalar")?;
                let mut y = x.clone();
                for r in y.chunks_mut(d) {
                    let mx = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut s = 0.0;
                    for v in r.iter_mut() {
                        *v = (*v - mx).exp();
                        s += *v;
                    }
                    r.iter_mut().for_each(|v| *v /= s);
                }
                Val::F(y)
            }
            OpKind::Arange { start, step, .. } => {
                let a = start.eval(syms);
                let n: usize = out_shape.iter().product();
                let v: Vec<i64> = (0..n as i64).map(|i| a + i * step).collect();
                if out_float {
                    Val::F(v.iter().map(|&x| x as f32).collect())
                } else {
                    Val::I(v)
                }
            }
            OpKind::Mean { dims, .. } | OpKind::Sum { dims, .. } => {
                let is_mean = matches!(op.kind, OpKind::Mean { .. });
                let xs = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?.f();
                let st = strides(&xs);
                let kept: Vec<usize> = (0..xs.len()).filter(|d| !dims.contains(d)).collect();
                let nk: usize = kept.iter().map(|&d| xs[d]).product();
                let ng: usize = dims.iter().map(|&d| xs[d]).product();
                let mut y = vec![0f32; nk];
                for (ki, yv) in y.iter_mut().enumerate() {
                    let mut base = 0;
                    let mut rem = ki;
                    for &d in kept.iter().rev() {
                        base += (rem % xs[d]) * st[d];
                        rem /= xs[d];
                    }
                    let mut s = 0f32;
                    for gi in 0..ng {
                        let mut off = base;
                        let mut rem = gi;
                        for &d in dims.iter().rev() {
                            off += (rem % xs[d]) * st[d];
                            rem /= xs[d];
                        }
                        s += x[off];
                    }
                    *yv = if is_mean { s / ng as f32 } else { s };
                }
                Val::F(y)
            }
            OpKind::Rope {
                style,
                rotary,
                seq_dim,
                start,
            } => {
                let xs = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?.f();
                let (cos, sin) = (
                    self.get(op.inputs[1], vals)?.f(),
                    self.get(op.inputs[2], vals)?.f(),
                );
                let half = rotary / 2;
                let d = *xs.last().unwrap();
                let start = start.eval(syms);
                let st = strides(&xs);
                let mut y = x.clone();
                let rows = x.len() / d;
                for r in 0..rows {
                    let s_idx = (r * d / st[*seq_dim]) % xs[*seq_dim];
                    let pos = (start + s_idx as i64) as usize;
                    if (pos + 1) * half > cos.len() {
                        return Err(format!("position {pos} is past the rotary table"));
                    }
                    let (c, s) = (
                        &cos[pos * half..(pos + 1) * half],
                        &sin[pos * half..(pos + 1) * half],
                    );
                    let xr = &x[r * d..(r + 1) * d];
                    let yr = &mut y[r * d..(r + 1) * d];
                    for i in 0..half {
                        let (a, b) = match style {
                            RopeStyle::Half => (i, i + half),
                            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        };
                        yr[a] = xr[a] * c[i] - xr[b] * s[i];
                        yr[b] = xr[b] * c[i] + xr[a] * s[i];
                    }
                }
                Val::F(y)
            }
            OpKind::Sdpa {
                layout,
                scale,
                causal,
                window,
                softcap,
                start,
            } => {
                let (qs, ks) = (sh(op.inputs[0]), sh(op.inputs[1]));
                let q = self.get(op.inputs[0], vals)?.f();
                let k = self.get(op.inputs[1], vals)?.f();
                let v = self.get(op.inputs[2], vals)?.f();
                let mask = match op.inputs.get(3) {
                    Some(&t) => Some((self.get(t, vals)?.f(), sh(t))),
                    None => None,
                };
                Val::F(sdpa(&SdpaArgs {
                    layout: *layout,
                    q: &q,
                    k: &k,
                    v: &v,
                    q_shape: &qs,
                    kv_shape: &ks,
                    mask: mask.as_ref().map(|(m, s)| (m.as_slice(), s.as_slice())),
                    scale: *scale,
                    causal: *causal,
                    window: *window,
                    softcap: *softcap,
                    start: start.eval(syms),
                })?)
            }
            OpKind::CacheUpdate { axis, start } => {
                let (cs, vs) = (sh(op.inputs[0]), sh(op.inputs[1]));
                let mut cache = self.get(op.inputs[0], vals)?.f();
                let val = self.get(op.inputs[1], vals)?.f();
                let st = start.eval(syms);
                let outer: usize = cs[..*axis].iter().product();
                let inner: usize = cs[axis + 1..].iter().product();
                let (cl, vl) = (cs[*axis], vs[*axis]);
                if st < 0 || st as usize + vl > cl || vs.len() != cs.len() {
                    return Err(format!(
                        "update of {vs:?} at {st} does not fit cache {cs:?}"
                    ));
                }
                for o in 0..outer {
                    for r in 0..vl {
                        let d = (o * cl + st as usize + r) * inner;
                        let s = (o * vl + r) * inner;
                        cache[d..d + inner].copy_from_slice(&val[s..s + inner]);
                    }
                }
                let c = Val::F(cache);
                self.set(op.inputs[0], c.clone(), vals);
                c
            }
            OpKind::Reshape { .. } => self.get(op.inputs[0], vals)?,
            OpKind::Permute { perm } => {
                let xs = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?;
                let st = strides(&xs);
                let idx = permute_indices(&xs, &st, perm);
                gather(&x, &idx)
            }
            OpKind::Slice {
                dim, start, step, ..
            } => {
                let xs = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?;
                let n = xs[*dim] as i64;
                let fix = |v: i64| (if v < 0 { v + n } else { v }).clamp(0, n) as usize;
                let s0 = fix(start.eval(syms));
                let len = out_shape[*dim];
                let outer: usize = xs[..*dim].iter().product();
                let inner: usize = xs[dim + 1..].iter().product();
                let idx: Vec<usize> = (0..outer)
                    .flat_map(|o| {
                        (0..len).flat_map(move |j| {
                            (0..inner).map(move |i| (o * n as usize + s0 + j * step) * inner + i)
                        })
                    })
                    .collect();
                gather(&x, &idx)
            }
            OpKind::Select { dim, index } => {
                let xs = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?;
                let n = xs[*dim] as i64;
                let i = index.eval(syms);
                let i = if i < 0 { i + n } else { i } as usize;
                let outer: usize = xs[..*dim].iter().product();
                let inner: usize = xs[dim + 1..].iter().product();
                let idx: Vec<usize> = (0..outer)
                    .flat_map(|o| (0..inner).map(move |j| (o * n as usize + i) * inner + j))
                    .collect();
                gather(&x, &idx)
            }
            OpKind::Concat { dim } => {
                let parts: Vec<(Val, Vec<usize>)> = op
                    .inputs
                    .iter()
                    .map(|&t| Ok((self.get(t, vals)?, sh(t))))
                    .collect::<std::result::Result<_, String>>()?;
                let outer: usize = out_shape[..*dim].iter().product();
                let inner: usize = out_shape[dim + 1..].iter().product();
                if out_float {
                    let mut y = Vec::new();
                    let fs: Vec<Vec<f32>> = parts.iter().map(|(v, _)| v.f()).collect();
                    for o in 0..outer {
                        for ((_, s), f) in parts.iter().zip(&fs) {
                            let c = s[*dim] * inner;
                            y.extend_from_slice(&f[o * c..(o + 1) * c]);
                        }
                    }
                    Val::F(y)
                } else {
                    let mut y = Vec::new();
                    let is: Vec<Vec<i64>> = parts.iter().map(|(v, _)| v.i()).collect();
                    for o in 0..outer {
                        for ((_, s), f) in parts.iter().zip(&is) {
                            let c = s[*dim] * inner;
                            y.extend_from_slice(&f[o * c..(o + 1) * c]);
                        }
                    }
                    Val::I(y)
                }
            }
            OpKind::Expand { shape } => {
                let x = self.get(op.inputs[0], vals)?;
                gather(&x, &broadcast_indices(&sh(op.inputs[0]), shape))
            }
            OpKind::IndexSelect { dim } => {
                let xs = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?;
                let ix = self.get(op.inputs[1], vals)?.i();
                let n = xs[*dim];
                let outer: usize = xs[..*dim].iter().product();
                let inner: usize = xs[dim + 1..].iter().product();
                let mut idx = Vec::new();
                for o in 0..outer {
                    for &r in &ix {
                        if r < 0 || r as usize >= n {
                            return Err(format!("index {r} out of range for size {n}"));
                        }
                        idx.extend((0..inner).map(|i| (o * n + r as usize) * inner + i));
                    }
                }
                gather(&x, &idx)
            }
            OpKind::Full { value, .. } => {
                let n = out_shape.iter().product();
                if out_float {
                    Val::F(vec![*value as f32; n])
                } else {
                    Val::I(vec![*value as i64; n])
                }
            }
        };
        // Comparison results and integer outputs normalise through the output dtype.
        let result = match (&result, self.graph.tensors[out].dtype) {
            (Val::F(f), dt) if !dt.is_float() => Val::I(f.iter().map(|&x| x as i64).collect()),
            _ => result,
        };
        self.set(out, result, vals);
        Ok(())
    }

    /// Dequantized `[rows, cols]` weight matrix.
    fn dequant(
        &mut self,
        w: Weight,
        ts: &[TensorId],
        vals: &[Option<Val>],
    ) -> std::result::Result<Vec<f32>, String> {
        match w {
            Weight::F32 => Ok(self.get(ts[0], vals)?.f()),
            _ => {
                let rows = self.graph.tensors[ts[0]].max_shape[0];
                let cols = match w {
                    Weight::Q4 { .. } => self.graph.tensors[ts[0]].max_shape[1] * 2,
                    _ => self.graph.tensors[ts[0]].max_shape[1],
                };
                let mut out = Vec::with_capacity(rows * cols);
                for r in 0..rows {
                    out.extend(self.dequant_row(w, ts, r, cols, vals)?);
                }
                Ok(out)
            }
        }
    }

    fn dequant_row(
        &mut self,
        w: Weight,
        ts: &[TensorId],
        r: usize,
        cols: usize,
        vals: &[Option<Val>],
    ) -> std::result::Result<Vec<f32>, String> {
        match w {
            Weight::F32 => {
                let t = self.get(ts[0], vals)?.f();
                Ok(t[r * cols..(r + 1) * cols].to_vec())
            }
            Weight::Q4 { group } | Weight::Q8 { group } => {
                let scales = self.get(ts[1], vals)?.f();
                let biases = self.get(ts[2], vals)?.f();
                let groups = cols / group;
                let raw = self.raw_const(ts[0])?;
                let mut row = Vec::with_capacity(cols);
                for c in 0..cols {
                    let q = match w {
                        Weight::Q4 { .. } => {
                            let b = raw[r * cols / 2 + c / 2];
                            (if c % 2 == 0 { b & 0xF } else { b >> 4 }) as f32
                        }
                        _ => raw[r * cols + c] as i8 as f32,
                    };
                    let g = r * groups + c / group;
                    row.push(scales[g] * q + biases[g]);
                }
                Ok(row)
            }
        }
    }
}

/// torchao per-token asymmetric int8 dynamic quantization, then dequantization (the activation
/// path of 8da4w): scale = (max(x,0) - min(x,0)) / 255, zero = -128 - round(min/scale).
pub fn quant_dequant_row(row: &mut [f32]) {
    let mn = row.iter().copied().fold(0f32, f32::min);
    let mx = row.iter().copied().fold(0f32, f32::max);
    let scale = ((mx - mn) / 255.0).max(f32::EPSILON);
    let zp = (-128.0 - (mn / scale).round_ties_even()).clamp(-128.0, 127.0);
    for v in row.iter_mut() {
        let q = ((*v / scale).round_ties_even() + zp).clamp(-128.0, 127.0);
        *v = (q - zp) * scale;
    }
}

fn unary_f(u: UnaryOp, x: f32) -> f32 {
    use UnaryOp::*;
    match u {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Log => x.ln(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Tanh => x.tanh(),
        Sin => x.sin(),
        Cos => x.cos(),
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Silu => x / (1.0 + (-x).exp()),
        Gelu => {
            0.5 * x
                * (1.0 + crate::runtime::kernels::erf(x as f64 / std::f64::consts::SQRT_2) as f32)
        }
        GeluTanh => {
            let c = (2.0f32 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        Relu => x.max(0.0),
        Square => x * x,
        Reciprocal => 1.0 / x,
        Floor => x.floor(),
        Ceil => x.ceil(),
        LogicalNot => (x == 0.0) as i32 as f32,
    }
}

fn unary_i(u: UnaryOp, x: i64) -> i64 {
    match u {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Square => x.wrapping_mul(x),
        _ => (x == 0) as i64,
    }
}

fn binary(b: BinaryOp, x: &Val, y: &Val, xi: &[usize], yi: &[usize], out_float: bool) -> Val {
    use BinaryOp::*;
    let both_int = matches!((x, y), (Val::I(_), Val::I(_)));
    if both_int && (!out_float || b.is_comparison()) {
        let (x, y) = (x.i(), y.i());
        return Val::I(
            xi.iter()
                .zip(yi)
                .map(|(&i, &j)| {
                    let (p, q) = (x[i], y[j]);
                    match b {
                        Add => p.wrapping_add(q),
                        Sub => p.wrapping_sub(q),
                        Mul => p.wrapping_mul(q),
                        Div => {
                            if q == 0 {
                                0
                            } else {
                                p / q
                            }
                        }
                        Pow => p.wrapping_pow(q.max(0) as u32),
                        Max => p.max(q),
                        Min => p.min(q),
                        Eq => (p == q) as i64,
                        Ne => (p != q) as i64,
                        Lt => (p < q) as i64,
                        Le => (p <= q) as i64,
                        Gt => (p > q) as i64,
                        Ge => (p >= q) as i64,
                        And => (p != 0 && q != 0) as i64,
                        Or => (p != 0 || q != 0) as i64,
                    }
                })
                .collect(),
        );
    }
    let (x, y) = (x.f(), y.f());
    Val::F(
        xi.iter()
            .zip(yi)
            .map(|(&i, &j)| {
                let (p, q) = (x[i], y[j]);
                match b {
                    Add => p + q,
                    Sub => p - q,
                    Mul => p * q,
                    Div => p / q,
                    Pow => p.powf(q),
                    Max => p.max(q),
                    Min => p.min(q),
                    Eq => (p == q) as i32 as f32,
                    Ne => (p != q) as i32 as f32,
                    Lt => (p < q) as i32 as f32,
                    Le => (p <= q) as i32 as f32,
                    Gt => (p > q) as i32 as f32,
                    Ge => (p >= q) as i32 as f32,
                    And => (p != 0.0 && q != 0.0) as i32 as f32,
                    Or => (p != 0.0 || q != 0.0) as i32 as f32,
                }
            })
            .collect(),
    )
}

fn gather(x: &Val, idx: &[usize]) -> Val {
    match x {
        Val::F(v) => Val::F(idx.iter().map(|&i| v[i]).collect()),
        Val::I(v) => Val::I(idx.iter().map(|&i| v[i]).collect()),
    }
}

fn permute_indices(xs: &[usize], st: &[usize], perm: &[usize]) -> Vec<usize> {
    let out: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let n: usize = out.iter().product();
    let mut idx = vec![0usize; out.len()];
    let mut res = Vec::with_capacity(n);
    for _ in 0..n {
        res.push((0..out.len()).map(|d| idx[d] * st[perm[d]]).sum());
        for d in (0..out.len()).rev() {
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    res
}

pub struct SdpaArgs<'a> {
    pub layout: AttnLayout,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub q_shape: &'a [usize],
    pub kv_shape: &'a [usize],
    pub mask: Option<(&'a [f32], &'a [usize])>,
    pub scale: f32,
    pub causal: bool,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
    pub start: i64,
}

/// Reference attention over the first `start + S` cache rows, either layout, with GQA.
pub fn sdpa(a: &SdpaArgs) -> std::result::Result<Vec<f32>, String> {
    let (&[b, d1, d2, d], &[kb, k1, k2, kd]) = (a.q_shape, a.kv_shape) else {
        return Err(format!(
            "sdpa needs 4-D q and k, got {:?} / {:?}",
            a.q_shape, a.kv_shape
        ));
    };
    let ((s, hq), (cl, hkv)) = match a.layout {
        AttnLayout::Bshd => ((d1, d2), (k1, k2)),
        AttnLayout::Bhsd => ((d2, d1), (k2, k1)),
    };
    if kb != b || kd != d || hkv == 0 || hq % hkv != 0 {
        return Err(format!(
            "q {:?} does not fit k/v {:?}",
            a.q_shape, a.kv_shape
        ));
    }
    if a.start < 0 || a.start as usize + s > cl {
        return Err(format!(
            "positions {}..{} exceed the cache of {cl}",
            a.start,
            a.start + s as i64
        ));
    }
    let start = a.start as usize;
    let kv_len = start + s;
    let qi = |bb: usize, i: usize, h: usize| match a.layout {
        AttnLayout::Bshd => ((bb * s + i) * hq + h) * d,
        AttnLayout::Bhsd => ((bb * hq + h) * s + i) * d,
    };
    let ki = |bb: usize, j: usize, h: usize| match a.layout {
        AttnLayout::Bshd => ((bb * cl + j) * hkv + h) * d,
        AttnLayout::Bhsd => ((bb * hkv + h) * cl + j) * d,
    };
    if let Some((_, ms)) = a.mask {
        if ms.len() != 2 || ms[0] < s || ms[1] < kv_len {
            return Err(format!("mask {ms:?} is smaller than [{s}, {kv_len}]"));
        }
    }
    let group = hq / hkv;
    let mut out = vec![0f32; b * s * hq * d];
    let mut sc = vec![0f32; kv_len];
    for bb in 0..b {
        for i in 0..s {
            let p = start + i;
            for h in 0..hq {
                let kh = h / group;
                let qo = qi(bb, i, h);
                let qv = &a.q[qo..qo + d];
                let mut mx = f32::NEG_INFINITY;
                for (j, scv) in sc.iter_mut().enumerate() {
                    let visible = (!a.causal || j <= p) && a.window.is_none_or(|w| j + w > p);
                    if !visible {
                        *scv = f32::NEG_INFINITY;
                        continue;
                    }
                    let ko = ki(bb, j, kh);
                    let mut x: f32 = qv
                        .iter()
                        .zip(&a.k[ko..ko + d])
                        .map(|(x, y)| x * y)
                        .sum::<f32>()
                        * a.scale;
                    if let Some(cap) = a.softcap {
                        x = (x / cap).tanh() * cap;
                    }
                    if let Some((m, ms)) = a.mask {
                        x += m[i * ms[1] + j];
                    }
                    *scv = x;
                    mx = mx.max(x);
                }
                if mx == f32::NEG_INFINITY {
                    continue;
                }
                let mut sum = 0f32;
                for x in sc.iter_mut() {
                    *x = (*x - mx).exp();
                    sum += *x;
                }
                let o = &mut out[qo..qo + d];
                for (j, &w) in sc.iter().enumerate() {
                    if w == 0.0 {
                        continue;
                    }
                    let vo = ki(bb, j, kh);
                    for (ov, vv) in o.iter_mut().zip(&a.v[vo..vo + d]) {
                        *ov += w / sum * vv;
                    }
                }
            }
        }
    }
    Ok(out)
}
