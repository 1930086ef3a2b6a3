//! The CPU executor for IR graphs: the reference every GPU kernel is tested against. Floats
//! compute in f32 (the GPU reference path), integers in i64.

use super::infer::{infer_shapes, InputValue, Plan};
use super::*;
use crate::runtime::kernels::{
    bcast_strides, broadcast_indices, expand, next_index, strided_copy, strides,
};
use crate::runtime::tensor::{from_f32, from_i64, to_f32, to_i64};
use crate::runtime::HostTensor;
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

/// A tensor value during a call.
#[derive(Debug, Clone)]
enum Val {
    F(Vec<f32>),
    I(Vec<i64>),
}

/// The element types values are read as.
trait Elem: Copy + 'static {
    /// `v`'s elements where it holds this type.
    fn of(v: &Val) -> Option<&[Self]>;
    /// `v`'s elements converted to this type.
    fn convert(v: &Val) -> Vec<Self>;
}

impl Elem for f32 {
    fn of(v: &Val) -> Option<&[f32]> {
        match v {
            Val::F(f) => Some(f),
            Val::I(_) => None,
        }
    }
    fn convert(v: &Val) -> Vec<f32> {
        v.f()
    }
}

impl Elem for i64 {
    fn of(v: &Val) -> Option<&[i64]> {
        match v {
            Val::I(i) => Some(i),
            Val::F(_) => None,
        }
    }
    fn convert(v: &Val) -> Vec<i64> {
        v.i()
    }
}

/// A value as read by an op: shared with the call's table (no copy) where it already holds the
/// requested element type (`read` checked that), converted otherwise.
enum Read<T> {
    Shared(Arc<Val>),
    Owned(Vec<T>),
}

impl<T: Elem> Read<T> {
    fn new(v: Arc<Val>) -> Self {
        match T::of(&v) {
            Some(_) => Read::Shared(v),
            None => Read::Owned(T::convert(&v)),
        }
    }

    /// The values as a vector of their own (a copy when shared).
    fn into_vec(self) -> Vec<T> {
        match self {
            Read::Owned(v) => v,
            Read::Shared(_) => self.to_vec(),
        }
    }
}

impl<T: Elem> std::ops::Deref for Read<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Read::Shared(a) => T::of(a).unwrap_or_default(),
            Read::Owned(v) => v,
        }
    }
}

impl<'a, T: Elem> IntoIterator for &'a Read<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Reads of a shared value: `get(..)?.f()` borrows the stored values instead of copying them.
trait ReadVal {
    fn f(self) -> Read<f32>;
    fn i(self) -> Read<i64>;
}

impl ReadVal for Arc<Val> {
    fn f(self) -> Read<f32> {
        Read::new(self)
    }
    fn i(self) -> Read<i64> {
        Read::new(self)
    }
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

/// An output of a CPU call, its value shared with the executor's last call.
pub struct CpuOutput {
    pub dtype: DType,
    pub sizes: Vec<usize>,
    val: Arc<Val>,
}

impl CpuOutput {
    /// The output's bytes: lent where the value is stored in the output's own dtype (f32,
    /// i64), encoded otherwise.
    pub fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        let n: usize = self.sizes.iter().product();
        match (&*self.val, self.dtype) {
            (Val::F(f), DType::F32) if f.len() >= n => bytemuck::cast_slice(&f[..n]).into(),
            (Val::I(i), DType::I64) if i.len() >= n => bytemuck::cast_slice(&i[..n]).into(),
            (v, dtype) => {
                let mut data = encode(dtype, v);
                data.truncate(n * dtype.size());
                data.into()
            }
        }
    }

    pub fn into_host(self) -> HostTensor {
        HostTensor {
            data: self.bytes().into_owned(),
            dtype: self.dtype,
            sizes: self.sizes,
        }
    }
}

/// Runs an IR graph on the CPU; State tensors (KV caches) persist across calls.
pub struct CpuExecutor {
    graph: Graph,
    states: Vec<Option<Arc<Val>>>,
    /// Decoded constants, cached on first use.
    consts: Vec<Option<Arc<Val>>>,
    /// Constants read as f32 on every call (quantization scales and biases), decoded once.
    shared: Vec<Option<F32s>>,
    /// Per 4-bit weight (by its packed tensor), each row's zero-point term of the qd8 linear:
    /// the same for every call, and most of a decode mat-vec's time when summed per call.
    ksums: Vec<Option<Arc<Vec<f32>>>>,
}

/// A group-quantized weight checked against its linear's shape: 4-bit rows pack two values a
/// byte; `groups` scales and biases per row.
struct QuantWeight<'a> {
    raw: &'a [u8],
    scales: F32s,
    biases: F32s,
    four: bool,
    row_bytes: usize,
    groups: usize,
}

impl QuantWeight<'_> {
    /// Output channel `j`'s packed values and its groups' scales and biases.
    fn row(&self, j: usize) -> (&[u8], &[f32], &[f32]) {
        let (r, g) = (self.row_bytes, self.groups);
        (
            &self.raw[j * r..(j + 1) * r],
            &self.scales[j * g..],
            &self.biases[j * g..],
        )
    }
}

/// f32 values shared across calls: a view of an aligned f32 constant (no copy of a large
/// table's scales) or a decoded copy.
#[derive(Clone)]
enum F32s {
    Decoded(Arc<Vec<f32>>),
    View(Blob),
}

impl std::ops::Deref for F32s {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            F32s::Decoded(v) => v,
            // Only built after `try_cast_slice` succeeded on these very bytes.
            F32s::View(b) => bytemuck::cast_slice(b),
        }
    }
}

pub type Result<T> = std::result::Result<T, IrError>;

impl CpuExecutor {
    pub fn new(graph: Graph) -> Result<Self> {
        crate::runtime::tune_allocator();
        graph.validate()?;
        let n = graph.tensors.len();
        let states = graph
            .tensors
            .iter()
            .map(|t| match &t.role {
                Role::State(Some(b)) => Some(Arc::new(decode(t.dtype, &b[..t.max_bytes()]))),
                Role::State(None) => Some(Arc::new(if t.dtype.is_float() {
                    Val::F(vec![0.0; t.max_numel()])
                } else {
                    Val::I(vec![0; t.max_numel()])
                })),
                _ => None,
            })
            .collect();
        Ok(CpuExecutor {
            graph,
            states,
            consts: vec![None; n],
            shared: vec![None; n],
            ksums: vec![None; n],
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Runs one call; returns the graph outputs.
    pub fn run(&mut self, inputs: &[InputValue]) -> Result<Vec<HostTensor>> {
        Ok(self
            .run_shared(inputs)?
            .into_iter()
            .map(CpuOutput::into_host)
            .collect())
    }

    /// `run` with the outputs' values shared rather than encoded into new buffers: a caller
    /// that copies them elsewhere anyway (a delegate writing the method's memory) copies once.
    pub fn run_shared(&mut self, inputs: &[InputValue]) -> Result<Vec<CpuOutput>> {
        let plan = infer_shapes(&self.graph, inputs)?;
        let mut vals: Vec<Option<Arc<Val>>> = vec![None; self.graph.tensors.len()];
        for (io, v) in self.graph.inputs.iter().zip(inputs) {
            if let (Io::Tensor(t), InputValue::Tensor { data, .. }) = (io, v) {
                vals[*t] = Some(Arc::new(decode(self.graph.tensors[*t].dtype, data)));
            }
        }
        // Lent out for the call (ops read tensors, never nodes) so the list is not copied.
        let nodes = std::mem::take(&mut self.graph.nodes);
        let ran = nodes.iter().enumerate().try_for_each(|(n, node)| {
            let Node::Op(op) = node else { return Ok(()) };
            self.exec(op, &plan, &mut vals)
                .map_err(|msg| IrError::Node {
                    node: n,
                    op: op.kind.label(),
                    msg,
                })
        });
        self.graph.nodes = nodes;
        ran?;
        let outs = self.graph.outputs.clone();
        outs.iter()
            .map(|&t| {
                Ok(CpuOutput {
                    val: self.get(t, &vals).map_err(IrError::Invalid)?,
                    dtype: self.graph.tensors[t].dtype,
                    sizes: plan.shapes[t].clone(),
                })
            })
            .collect()
    }

    /// RMS norm of an op's input 0 over rows of `d`, weighted by input 1 when `weighted`: the
    /// norm part of `RmsNorm`, `RmsNormChain` and `RmsNormRope`.
    fn normed(
        &mut self,
        op: &Op,
        weighted: bool,
        d: usize,
        eps: f32,
        vals: &[Option<Arc<Val>>],
    ) -> std::result::Result<Vec<f32>, String> {
        let x = self.get(op.inputs[0], vals)?.f();
        let w = match weighted {
            true => Some(self.get(op.inputs[1], vals)?.f()),
            false => None,
        };
        Ok(rms_norm(&x, w.as_deref(), d, eps))
    }

    fn get(
        &mut self,
        t: TensorId,
        vals: &[Option<Arc<Val>>],
    ) -> std::result::Result<Arc<Val>, String> {
        if let Some(v) = &vals[t] {
            return Ok(v.clone());
        }
        if let Some(s) = &self.states[t] {
            return Ok(s.clone());
        }
        let def = &self.graph.tensors[t];
        if let Role::Constant(b) = &def.role {
            if self.consts[t].is_none() {
                self.consts[t] = Some(Arc::new(decode(def.dtype, &b[..def.max_bytes()])));
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

    fn set(&mut self, t: TensorId, v: Arc<Val>, vals: &mut [Option<Arc<Val>>]) {
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
        vals: &mut [Option<Arc<Val>>],
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
                    Val::I(x.i().iter().map(|&v| unary_i(*u, v)).collect())
                } else {
                    Val::F(x.f().iter().map(|&v| unary_f(*u, v)).collect())
                }
            }
            OpKind::Binary(b) => {
                let (x, y) = (self.get(op.inputs[0], vals)?, self.get(op.inputs[1], vals)?);
                let (xs, ys) = (sh(op.inputs[0]), sh(op.inputs[1]));
                binary(*b, (x.view(), &xs), (y.view(), &ys), &out_shape, out_float)
            }
            OpKind::BinaryScalar {
                op: b,
                scalar,
                scalar_first,
            } => {
                let x = self.get(op.inputs[0], vals)?;
                let xs = sh(op.inputs[0]);
                let s = if *scalar == scalar.trunc() && matches!(*x, Val::I(_)) && !out_float {
                    Val::I(vec![*scalar as i64])
                } else {
                    Val::F(vec![*scalar as f32])
                };
                let (x, s) = ((x.view(), &xs[..]), (s.view(), &[][..]));
                match *scalar_first {
                    true => binary(*b, s, x, &out_shape, out_float),
                    false => binary(*b, x, s, &out_shape, out_float),
                }
            }
            OpKind::Where => {
                let c = self.get(op.inputs[0], vals)?.i();
                let c = expand(&c, &sh(op.inputs[0]), &out_shape);
                let (a, b) = (self.get(op.inputs[1], vals)?, self.get(op.inputs[2], vals)?);
                let (sa, sb) = (sh(op.inputs[1]), sh(op.inputs[2]));
                if out_float {
                    let (a, b) = (a.f(), b.f());
                    let (a, b) = (expand(&a, &sa, &out_shape), expand(&b, &sb, &out_shape));
                    Val::F(pick(&c, &a, &b))
                } else {
                    let (a, b) = (a.i(), b.i());
                    let (a, b) = (expand(&a, &sa, &out_shape), expand(&b, &sb, &out_shape));
                    Val::I(pick(&c, &a, &b))
                }
            }
            OpKind::ElementwiseChain { steps } => {
                let reads = op
                    .inputs
                    .iter()
                    .map(|&t| Ok(self.get(t, vals)?.f()))
                    .collect::<std::result::Result<Vec<_>, String>>()?;
                let ins: Vec<Cow<[f32]>> = (reads.iter().zip(&op.inputs))
                    .map(|(v, &t)| expand(v, &sh(t), &out_shape))
                    .collect();
                chain(steps, &ins)?
            }
            OpKind::RmsNormChain {
                eps,
                weighted,
                norm_input,
                steps,
            } => {
                let d = *out_shape.last().ok_or("rms_norm of a scalar")?;
                let normed = self.normed(op, *weighted, d, *eps, vals)?;
                let rest = &op.inputs[1 + *weighted as usize..];
                let reads = rest
                    .iter()
                    .map(|&t| Ok(self.get(t, vals)?.f()))
                    .collect::<std::result::Result<Vec<_>, String>>()?;
                let mut ins: Vec<Cow<[f32]>> = (reads.iter().zip(rest))
                    .map(|(v, &t)| expand(v, &sh(t), &out_shape))
                    .collect();
                if *norm_input > ins.len() {
                    return Err("norm input out of range".into());
                }
                ins.insert(*norm_input, Cow::Owned(normed));
                chain(steps, &ins)?
            }
            OpKind::Clamp { min, max } => {
                let x = self.get(op.inputs[0], vals)?;
                let (lo, hi) = (
                    min.unwrap_or(f64::NEG_INFINITY),
                    max.unwrap_or(f64::INFINITY),
                );
                match &*x {
                    Val::F(v) => {
                        Val::F(v.iter().map(|e| e.max(lo as f32).min(hi as f32)).collect())
                    }
                    Val::I(v) => {
                        Val::I(v.iter().map(|&e| (e as f64).clamp(lo, hi) as i64).collect())
                    }
                }
            }
            OpKind::Cast | OpKind::Copy => {
                let x = self.get(op.inputs[0], vals)?;
                if out_float {
                    Val::F(x.f().into_vec())
                } else if self.graph.tensors[out].dtype == DType::Bool {
                    Val::I(x.f().iter().map(|&v| (v != 0.0) as i64).collect())
                } else {
                    Val::I(x.i().into_vec())
                }
            }
            OpKind::RmsNorm { eps } => {
                let d = *out_shape.last().ok_or("rms_norm of a scalar")?;
                Val::F(self.normed(op, op.inputs.len() > 1, d, *eps, vals)?)
            }
            OpKind::Linear {
                weight,
                act_quant,
                has_bias,
            } => {
                let x_shape = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?.f();
                let k = *x_shape.last().ok_or("linear of a scalar")?;
                let n = *out_shape.last().unwrap();
                let m = x.len() / k.max(1);
                let ws = &op.inputs[1..1 + weight.tensor_count()];
                // XNNPACK's qd8 GEMMs sum int8 × int4/int8 products exactly per block: float
                // dot products of the dequantized values round differently, and over a deep
                // model those last-bit differences flip later activation roundings.
                let qd8 = matches!(act_quant, ActQuant::Xnnpack)
                    && matches!(weight, Weight::Q4 { .. } | Weight::Q8 { .. });
                if qd8 && k > 0 {
                    let mut xi = vec![0i32; x.len()];
                    let params: Vec<(f32, i32)> = x
                        .chunks(k)
                        .zip(xi.chunks_mut(k))
                        .map(|(row, q)| {
                            let (inv, zp) = quant_row_xnnpack(row, q);
                            // XNNPACK multiplies the stored int8 values, zero point included.
                            q.iter_mut().for_each(|v| *v += zp);
                            (inv, zp)
                        })
                        .collect();
                    let mut y = self.linear_qd8(*weight, ws, &xi, &params, [m, k, n], vals)?;
                    if *has_bias {
                        let b = self.get(op.inputs[1 + weight.tensor_count()], vals)?.f();
                        for row in y.chunks_mut(n) {
                            row.iter_mut().zip(&b).for_each(|(v, bv)| *v += bv);
                        }
                    }
                    return self.finish(out, Val::F(y), vals);
                }
                let x = match act_quant {
                    ActQuant::None => x,
                    ActQuant::Torchao | ActQuant::Xnnpack => {
                        let mut x = x.into_vec();
                        for row in x.chunks_mut(k.max(1)) {
                            match act_quant {
                                ActQuant::Torchao => quant_dequant_row(row),
                                _ => quant_dequant_row_xnnpack(row),
                            }
                        }
                        Read::Owned(x)
                    }
                };
                let mut y = self.linear(*weight, ws, &x, [m, k, n], vals)?;
                if *has_bias {
                    let b = self.get(op.inputs[1 + weight.tensor_count()], vals)?.f();
                    for row in y.chunks_mut(n) {
                        row.iter_mut().zip(&b).for_each(|(v, bv)| *v += bv);
                    }
                }
                Val::F(y)
            }
            OpKind::MatMul { transpose_b } => {
                let (as_, mut bs) = (sh(op.inputs[0]), sh(op.inputs[1]));
                let (a, mut b) = (
                    self.get(op.inputs[0], vals)?.f(),
                    self.get(op.inputs[1], vals)?.f(),
                );
                if *transpose_b {
                    // Transposed first, so the sums run as for a transposed copy of b.
                    let r = bs.len();
                    let mut st = strides(&bs);
                    st.swap(r - 2, r - 1);
                    bs.swap(r - 2, r - 1);
                    b = Read::Owned(strided_copy(&b, &bs, &st));
                }
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
                let mut y = x.into_vec();
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
            OpKind::MulMean { dims, .. } => {
                let (a, b) = (self.get(op.inputs[0], vals)?, self.get(op.inputs[1], vals)?);
                let (ash, bsh) = (sh(op.inputs[0]), sh(op.inputs[1]));
                let full = super::infer::broadcast(&ash, &bsh)?;
                let (a, b) = (a.f(), b.f());
                Val::F(super::mul_mean::mul_mean(
                    (&a, &ash),
                    (&b, &bsh),
                    &full,
                    dims,
                ))
            }
            OpKind::Rope {
                style,
                rotary,
                seq_dim,
                start,
            } => {
                let x = self.get(op.inputs[0], vals)?.f();
                let (cos, sin) = (
                    self.get(op.inputs[1], vals)?.f(),
                    self.get(op.inputs[2], vals)?.f(),
                );
                let at = Rotary {
                    style: *style,
                    rotary: *rotary,
                    seq_dim: *seq_dim,
                    start: start.eval(syms),
                };
                Val::F(rope(&x, &sh(op.inputs[0]), &cos, &sin, at)?)
            }
            OpKind::RmsNormRope {
                eps,
                weighted,
                style,
                rotary,
                seq_dim,
                start,
            } => {
                let t = 1 + *weighted as usize;
                let (cos, sin) = (
                    self.get(op.inputs[t], vals)?.f(),
                    self.get(op.inputs[t + 1], vals)?.f(),
                );
                let xs = sh(op.inputs[0]);
                let d = *xs.last().ok_or("rms_norm of a scalar")?;
                let at = Rotary {
                    style: *style,
                    rotary: *rotary,
                    seq_dim: *seq_dim,
                    start: start.eval(syms),
                };
                let normed = self.normed(op, *weighted, d, *eps, vals)?;
                Val::F(rope(&normed, &xs, &cos, &sin, at)?)
            }
            OpKind::Sdpa {
                layout,
                scale,
                causal,
                window,
                softcap,
                start,
                all_rows,
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
                    mask: mask.as_ref().map(|(m, s)| (&m[..], s.as_slice())),
                    scale: *scale,
                    causal: *causal,
                    window: *window,
                    softcap: *softcap,
                    start: start.eval(syms),
                    all_rows: *all_rows,
                })?)
            }
            OpKind::CacheUpdate { axis, start } => {
                let (cs, vs) = (sh(op.inputs[0]), sh(op.inputs[1]));
                let val = self.get(op.inputs[1], vals)?.f();
                let st = start.eval(syms);
                let outer: usize = cs[..*axis].iter().product();
                let inner: usize = cs[axis + 1..].iter().product();
                let (cl, vl) = (cs[*axis], vs[*axis]);
                if vs.len() != cs.len() {
                    return Err(format!("update of {vs:?} does not fit cache {cs:?}"));
                }
                // Destination row of each value row: indexed, or contiguous from `start`.
                let rows: Vec<usize> = match op.inputs.get(2) {
                    Some(&i) => {
                        let idx = self.get(i, vals)?.i();
                        if idx.len() != vl {
                            return Err(format!("{} indices for {vl} rows", idx.len()));
                        }
                        idx.iter()
                            .map(|&r| {
                                let r = if r < 0 { r + cl as i64 } else { r };
                                (0..cl as i64)
                                    .contains(&r)
                                    .then_some(r as usize)
                                    .ok_or_else(|| {
                                        format!("index {r} is outside a cache of {cl} rows")
                                    })
                            })
                            .collect::<std::result::Result<_, String>>()?
                    }
                    None if st < 0 || st as usize + vl > cl => {
                        return Err(format!(
                            "update of {vs:?} at {st} does not fit cache {cs:?}"
                        ));
                    }
                    None => (st as usize..st as usize + vl).collect(),
                };
                // Written in place: the table's reference is dropped first, so `make_mut`
                // copies the cache only when an earlier output still holds it.
                let t = op.inputs[0];
                let mut cache = self.get(t, vals)?;
                if let Val::I(_) = &*cache {
                    cache = Arc::new(Val::F(Val::f(&cache)));
                }
                let state = self.states[t].is_some();
                match state {
                    true => self.states[t] = None,
                    false => vals[t] = None,
                }
                if let Val::F(c) = Arc::make_mut(&mut cache) {
                    for o in 0..outer {
                        for (r, &row) in rows.iter().enumerate() {
                            let d = (o * cl + row) * inner;
                            let s = (o * vl + r) * inner;
                            c[d..d + inner].copy_from_slice(&val[s..s + inner]);
                        }
                    }
                }
                match state {
                    true => self.states[t] = Some(cache.clone()),
                    false => vals[t] = Some(cache.clone()),
                }
                return self.finish_shared(out, cache, vals);
            }
            OpKind::Reshape { .. } => {
                let x = self.get(op.inputs[0], vals)?;
                return self.finish_shared(out, x, vals);
            }
            OpKind::Permute { perm } => {
                let xs = sh(op.inputs[0]);
                let x = self.get(op.inputs[0], vals)?;
                let st = strides(&xs);
                let out: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
                let ost: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
                strided(&x, &out, &ost)
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
                let parts: Vec<(Arc<Val>, Vec<usize>)> = op
                    .inputs
                    .iter()
                    .map(|&t| Ok((self.get(t, vals)?, sh(t))))
                    .collect::<std::result::Result<_, String>>()?;
                let outer: usize = out_shape[..*dim].iter().product();
                let inner: usize = out_shape[dim + 1..].iter().product();
                let slabs: Vec<usize> = parts.iter().map(|(_, s)| s[*dim] * inner).collect();
                if out_float {
                    let fs: Vec<Vec<f32>> = parts.iter().map(|(v, _)| Val::f(v)).collect();
                    Val::F(interleave(&fs, &slabs, outer))
                } else {
                    let is: Vec<Vec<i64>> = parts.iter().map(|(v, _)| Val::i(v)).collect();
                    Val::I(interleave(&is, &slabs, outer))
                }
            }
            OpKind::Expand { .. } => {
                let x = self.get(op.inputs[0], vals)?;
                let ost = bcast_strides(&sh(op.inputs[0]), &out_shape);
                strided(&x, &out_shape, &ost)
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
        self.finish(out, result, vals)
    }

    fn finish(
        &mut self,
        out: TensorId,
        result: Val,
        vals: &mut [Option<Arc<Val>>],
    ) -> std::result::Result<(), String> {
        // Comparison results and integer outputs normalise through the output dtype.
        let result = match (&result, self.graph.tensors[out].dtype) {
            (Val::F(f), dt) if !dt.is_float() => Val::I(f.iter().map(|&x| x as i64).collect()),
            _ => result,
        };
        self.set(out, Arc::new(result), vals);
        Ok(())
    }

    /// `finish` for a value shared with its input (a reshape's, an updated cache's).
    fn finish_shared(
        &mut self,
        out: TensorId,
        v: Arc<Val>,
        vals: &mut [Option<Arc<Val>>],
    ) -> std::result::Result<(), String> {
        if matches!(*v, Val::F(_)) && !self.graph.tensors[out].dtype.is_float() {
            return self.finish(out, Val::clone(&v), vals);
        }
        self.set(out, v, vals);
        Ok(())
    }

    /// A constant's values as f32, decoded on first use and shared across calls.
    fn shared_f32(
        &mut self,
        t: TensorId,
        vals: &[Option<Arc<Val>>],
    ) -> std::result::Result<F32s, String> {
        if let Some(v) = &self.shared[t] {
            return Ok(v.clone());
        }
        let def = &self.graph.tensors[t];
        if let (Role::Constant(b), DType::F32) = (&def.role, def.dtype) {
            let b = b.slice(0..def.max_bytes()).map_err(|e| e.to_string())?;
            if bytemuck::try_cast_slice::<u8, f32>(&b).is_ok() {
                let v = F32s::View(b);
                self.shared[t] = Some(v.clone());
                return Ok(v);
            }
        }
        let v = F32s::Decoded(Arc::new(self.get(t, vals)?.f().into_vec()));
        if matches!(self.graph.tensors[t].role, Role::Constant(_)) {
            self.shared[t] = Some(v.clone());
            // The shared copy replaces the per-op one.
            self.consts[t] = None;
        }
        Ok(v)
    }

    /// A group-quantized weight's operands `ts` = [packed weight, scales, biases], checked to
    /// cover `[n, k]` in whole groups of `group`.
    fn quant_weight(
        &mut self,
        w: Weight,
        group: usize,
        ts: &[TensorId],
        [k, n]: [usize; 2],
        vals: &[Option<Arc<Val>>],
    ) -> std::result::Result<QuantWeight<'_>, String> {
        let (scales, biases) = (self.shared_f32(ts[1], vals)?, self.shared_f32(ts[2], vals)?);
        let raw = self.raw_const(ts[0])?;
        let four = matches!(w, Weight::Q4 { .. });
        let row_bytes = if four { k / 2 } else { k };
        if group == 0 || k % group != 0 || (four && k % 2 != 0) {
            return Err(format!(
                "K = {k} is not a whole number of groups of {group}"
            ));
        }
        let groups = k / group;
        if raw.len() < n * row_bytes {
            return Err(format!("packed weight is smaller than [{n}, {k}]"));
        }
        if scales.len() < n * groups || biases.len() < n * groups {
            return Err(format!(
                "scales or biases hold fewer than [{n}, {groups}] values"
            ));
        }
        Ok(QuantWeight {
            raw,
            scales,
            biases,
            four,
            row_bytes,
            groups,
        })
    }

    /// `x [m, k] · Wᵀ` for a weight of `n` rows. Quantized weights are dequantized one row at a
    /// time (exactly `scale * q + bias`, as `dequant_row`), never as a whole matrix, and the
    /// rows are split across threads.
    fn linear(
        &mut self,
        w: Weight,
        ts: &[TensorId],
        x: &[f32],
        [m, k, n]: [usize; 3],
        vals: &[Option<Arc<Val>>],
    ) -> std::result::Result<Vec<f32>, String> {
        let short = |what: &str| format!("{what} is smaller than [{n}, {k}]");
        match w {
            Weight::F32 => {
                let computed = match self.graph.tensors[ts[0]].role {
                    Role::Constant(_) => None,
                    _ => Some(self.get(ts[0], vals)?.f()),
                };
                let def = &self.graph.tensors[ts[0]];
                let wf: Cow<[f32]> = match (&computed, &def.role) {
                    (Some(v), _) => Cow::Borrowed(v),
                    (None, Role::Constant(b)) => to_f32(def.dtype, &b[..def.max_bytes()]),
                    (None, _) => return Err("weight has no data".into()),
                };
                if wf.len() < n * k {
                    return Err(short("weight"));
                }
                Ok(by_weight_rows([m, k, n], |j, out, _| {
                    let row = &wf[j * k..(j + 1) * k];
                    for (o, xr) in out.iter_mut().zip(x.chunks_exact(k)) {
                        *o = dot(xr, row);
                    }
                }))
            }
            Weight::Q4 { group } | Weight::Q8 { group } => {
                let qw = self.quant_weight(w, group, ts, [k, n], vals)?;
                Ok(by_weight_rows([m, k, n], |j, out, buf| {
                    let (q, s, b) = qw.row(j);
                    if qw.four {
                        dequant_q4(q, s, b, group, buf);
                    } else {
                        for (c, (v, &byte)) in buf.iter_mut().zip(q).enumerate() {
                            *v = s[c / group] * byte as i8 as f32 + b[c / group];
                        }
                    }
                    for (o, xr) in out.iter_mut().zip(x.chunks_exact(k)) {
                        *o = dot(xr, buf);
                    }
                }))
            }
        }
    }

    /// `linear` for XNNPACK-quantized activations, in the arithmetic of XNNPACK's blockwise
    /// 4-bit GEMM as ExecuTorch runs it on x86 with AVX512-VNNI (`qdu8-f32-qb4w`, the
    /// `qd8-f32-qb4w-gemm-*-avx512vnni[gfni]` microkernels with `xnn_pack_qs8_qb4w_gemm_goi_w`
    /// packing). `xq` holds each row's stored int8 values (zero point included) and `params` its
    /// (dequantization scale `inv`, zero point `zp`). A deep 8da4w model needs every bit: a
    /// last-bit difference flips a later activation rounding, a whole quantization step.
    ///
    /// 4-bit weights, per output channel j (`w[c] = nibble - 8` in -8..=7, `s[g]` the block's
    /// scale, already bf16-valued; all float ops f32, round to nearest even):
    /// ```text
    /// // packing, once per channel: K in chunks of 16 consecutive columns, in order
    /// ksum = 0.0
    /// for each chunk c (block g = c*16 / group):
    ///     ksum = ksum - (f32(Σ_{i in c} w[i]) * s[g])   // product exact, one rounding (the sub)
    /// // per row: activations unsigned, u[i] = stored[i] + 128 in 0..=255, zpu = zp + 128
    /// y = ksum * f32(zpu)                                 // rounded multiply
    /// for g in 0..K/group:
    ///     acc = Σ_{i in block g} u[i] * w[i]              // exact integer
    ///     y = fma(f32(acc), s[g], y)                      // fused: ONE rounding
    /// y = y * inv                                         // rounded multiply
    /// y = y + bias[j]                                     // the caller, when the linear has one
    /// ```
    /// The qb4w kernels take unsigned activations (`vpdpbusd`), so the zero point is `zp + 128`;
    /// they store the 4-bit weights as `w << 4` and the scales as `s / 16`, which changes no
    /// rounding. With bf16 scales a group-32 block's `acc · s` is exact, so fusing (and the +128)
    /// only shows from group 64 on (tests/xnnpack_linear.rs has both). A weight bias other than
    /// `-8 · scale` (not produced by the XNNPACK front end) adds
    /// `(bias + 8·s[g]) · Σ (u - zpu)` per block before the final scale.
    ///
    /// 8-bit weights keep the older per-block arithmetic (signed activations, `ksum` per block,
    /// unfused), which is not proven against XNNPACK's qc8w kernels.
    fn linear_qd8(
        &mut self,
        w: Weight,
        ts: &[TensorId],
        xq: &[i32],
        params: &[(f32, i32)],
        [m, k, n]: [usize; 3],
        vals: &[Option<Arc<Val>>],
    ) -> std::result::Result<Vec<f32>, String> {
        let (Weight::Q4 { group } | Weight::Q8 { group }) = w else {
            return Err("an integer linear needs a quantized weight".into());
        };
        // Taken out while `qw` borrows the executor; put back below.
        let ksums = self.ksums[ts[0]].take();
        let qw = self.quant_weight(w, group, ts, [k, n], vals)?;
        let four = qw.four;
        // Symmetric weights (`bias = -zero * scale`, zero = 8 for 4 bits) take the zero out
        // in integers; any remaining bias multiplies the row's dequantized sum.
        let zero: i16 = if four { 8 } else { 0 };
        if four && group % 32 == 0 && k > 0 {
            let ks = match &ksums {
                Some(ks) if ks.len() == n => ks.clone(),
                _ => Arc::new(q4_ksums(&qw, [k, n], group)),
            };
            let y = linear_q4_pairs(&qw, xq, params, [m, k, n], group, &ks);
            // Constant scales only: computed ones could change between calls.
            let constant = ts
                .iter()
                .all(|&t| matches!(self.graph.tensors[t].role, Role::Constant(_)));
            self.ksums[ts[0]] = constant.then_some(ks);
            return Ok(y);
        }
        // 4-bit: the kernels' unsigned activations; 8-bit: the stored signed ones.
        let shift = if four { 128 } else { 0 };
        // 16-bit operands (|x| <= 255, |w| <= 128): products summed in i32 as SSE2's pmaddwd
        // does, so the dot products vectorise on any x86-64.
        let xu: Vec<i16> = xq.iter().map(|&v| (v + shift) as i16).collect();
        // The packing sums 16 columns at a time (kr = 8, two nibble planes).
        let chunk = if four && group % 16 == 0 { 16 } else { group };
        Ok(by_weight_rows([m, k, n], |j, out, _| {
            let (q, s, b) = qw.row(j);
            let mut wq = [0i16; 2048];
            let wq = if k <= 2048 {
                &mut wq[..k]
            } else {
                &mut vec![0i16; k][..]
            };
            if four {
                for (pair, &b) in wq.chunks_exact_mut(2).zip(q) {
                    pair[0] = (b & 0xF) as i16 - zero;
                    pair[1] = (b >> 4) as i16 - zero;
                }
                if k % 2 == 1 {
                    wq[k - 1] = (q[k / 2] & 0xF) as i16 - zero;
                }
            } else {
                wq.iter_mut().zip(q).for_each(|(v, &b)| *v = b as i8 as i16);
            }
            let mut ksum = 0f32;
            for (c, wc) in wq.chunks_exact(chunk).enumerate() {
                ksum -= wc.iter().map(|&v| v as i32).sum::<i32>() as f32 * s[c * chunk / group];
            }
            for (o, (xr, &(inv, zp))) in out.iter_mut().zip(xu.chunks_exact(k).zip(params)) {
                let zp = zp + shift;
                let mut y = ksum * zp as f32;
                let mut rest_sum = 0f32;
                for (g, (xg, wg)) in xr
                    .chunks_exact(group)
                    .zip(wq.chunks_exact(group))
                    .enumerate()
                {
                    let acc: i32 = xg.iter().zip(wg).map(|(&a, &b)| a as i32 * b as i32).sum();
                    y = if four {
                        (acc as f32).mul_add(s[g], y)
                    } else {
                        y + acc as f32 * s[g]
                    };
                    let rest = b[g] + zero as f32 * s[g];
                    if rest != 0.0 {
                        rest_sum += rest * xg.iter().map(|&v| v as i32 - zp).sum::<i32>() as f32;
                    }
                }
                *o = (y + rest_sum) * inv;
            }
        }))
    }

    fn dequant_row(
        &mut self,
        w: Weight,
        ts: &[TensorId],
        r: usize,
        cols: usize,
        vals: &[Option<Arc<Val>>],
    ) -> std::result::Result<Vec<f32>, String> {
        match w {
            Weight::F32 => {
                let t = self.get(ts[0], vals)?.f();
                Ok(t[r * cols..(r + 1) * cols].to_vec())
            }
            Weight::Q4 { group } | Weight::Q8 { group } => {
                let scales = self.shared_f32(ts[1], vals)?;
                let biases = self.shared_f32(ts[2], vals)?;
                let groups = cols / group;
                let four = matches!(w, Weight::Q4 { .. });
                let bytes = if four { cols / 2 } else { cols };
                let raw = self.raw_const(ts[0])?;
                let gs = r * groups..(r + 1) * groups;
                Ok(dequant_row(
                    four,
                    group,
                    &raw[r * bytes..(r + 1) * bytes],
                    &scales[gs.clone()],
                    &biases[gs],
                )
                .collect())
            }
        }
    }
}

/// One row of a quantized table (4-bit: two a byte, low nibble first; 8-bit: signed) as
/// s · q + b with its groups' scales and biases (s · (q - 8) where b = -8·s); a group at a time, so no element divides by the
/// group size. The CPU executor's embeddings and the GPU executor's host gathers read rows so.
pub(crate) fn dequant_row<'a>(
    four: bool,
    group: usize,
    q: &'a [u8],
    scales: &'a [f32],
    biases: &'a [f32],
) -> impl Iterator<Item = f32> + 'a {
    scales
        .iter()
        .zip(biases)
        .enumerate()
        .flat_map(move |(g, (&s, &b))| {
            // A symmetric 4-bit group (b = -8·s) as s · (q - 8): one rounding, as ExecuTorch's
            // embedding_4bit and the exports' own dequantization compute it.
            let zero = if four && b == -8.0 * s { 8.0 } else { 0.0 };
            (g * group..(g + 1) * group).map(move |c| {
                let n = if four {
                    let v = q[c / 2];
                    (if c % 2 == 0 { v & 0xF } else { v >> 4 }) as f32
                } else {
                    q[c] as i8 as f32
                };
                if zero != 0.0 {
                    s * (n - zero)
                } else {
                    s * n + b
                }
            })
        })
}

/// `linear_qd8` for 4-bit weights in groups of 32s, reading the packed bytes directly: each
/// byte's low nibble multiplies an even column of x, its high nibble the odd one after it,
/// both less the zero of 8. The same integer sums, so the same bits, without unpacking every
/// row first; a weight row's bytes are read once for up to `X_BLOCK` rows of x.
fn linear_q4_pairs(
    qw: &QuantWeight,
    xq: &[i32],
    params: &[(f32, i32)],
    [m, k, n]: [usize; 3],
    group: usize,
    ksums: &[f32],
) -> Vec<f32> {
    debug_assert!(group % 32 == 0 && k % group == 0);
    let (cols, gsum) = pair_columns(xq, k, group);
    let x = PairedX {
        cols: &cols,
        gsum: &gsum,
        params,
        k,
        group,
    };
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has both features, checked just above.
        return by_weight_rows([m, k, n], |j, out, _| unsafe {
            q4_pairs_row_avx2(&x, ksums[j], qw.row(j), out)
        });
    }
    by_weight_rows([m, k, n], |j, out, _| {
        q4_pairs_row_with(&x, ksums[j], qw.row(j), out, &Portable)
    })
}

/// Each row's zero-point term of `linear_q4_pairs`: minus its weights' sums over the packing's
/// chunks of 16 columns (`nibble - 8` each; kr = 8, two nibble planes), each times its group's
/// scale, summed in order.
fn q4_ksums(qw: &QuantWeight, [k, n]: [usize; 2], group: usize) -> Vec<f32> {
    by_weight_rows([1, k, n], |j, out, _| {
        let (q, s, _) = qw.row(j);
        out[0] = q4_row_ksum(&q[..k / 2], |g| s[g / group]);
    })
}

/// One row's ksum from its packed bytes; `scale(c)` is column c's group scale.
fn q4_row_ksum(q: &[u8], scale: impl Fn(usize) -> f32) -> f32 {
    const CHUNK: usize = 16;
    const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    let mut ksum = 0f32;
    for (c, bytes) in q.chunks_exact(CHUNK / 2).enumerate() {
        // A chunk's 8 bytes as one word: both nibble planes masked to bytes (30 at most
        // each), then the 8 bytes summed by one multiply into the top byte (240 at most, no
        // carries): a model's weights once at load, byte by byte most of a cold first call.
        let mut w = [0u8; 8];
        w.copy_from_slice(bytes);
        let v = u64::from_le_bytes(w);
        let b = (v & LOW) + ((v >> 4) & LOW);
        let nib = (b.wrapping_mul(0x0101_0101_0101_0101) >> 56) as i32;
        ksum -= (nib - 8 * CHUNK as i32) as f32 * scale(c * CHUNK);
    }
    ksum
}

/// XNNPACK's per-row ksums (Σ over each 16 columns, in order, of -(Σ w) · scale) of 4-bit
/// weights packed `[n, k / 2]` with f32 scales `[n, k / group]` (little-endian bytes), as the
/// qd8-f32-qb4w GEMM packs them: the GPU's decode mat-vec reads them instead of summing every
/// weight again each call. `None` where the sizes do not fit.
pub fn xnn_q4_ksums(
    packed: &[u8],
    scales: &[u8],
    [k, n]: [usize; 2],
    group: usize,
) -> Option<Vec<f32>> {
    let groups = k.checked_div(group)?;
    let fits = group % 16 == 0
        && k % group == 0
        && packed.len() >= n.checked_mul(k / 2)?
        && scales.len() >= n.checked_mul(groups)?.checked_mul(4)?;
    if !fits || n == 0 {
        return fits.then(Vec::new);
    }
    Some(by_weight_rows([1, k, n], |j, out, _| {
        let q = &packed[j * k / 2..(j + 1) * k / 2];
        let s = &scales[j * groups * 4..(j + 1) * groups * 4];
        out[0] = q4_row_ksum(q, |c| {
            let at = c / group * 4;
            f32::from_le_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]])
        });
    }))
}

/// Per row of x (`k` wide, quantized with its zero point; the kernels' unsigned bytes are
/// each value + 128): each 32 columns as their 16 even then their 16 odd ones, beside the 16
/// packed bytes whose low and high nibbles they meet; and each group's sum.
fn pair_columns(xq: &[i32], k: usize, group: usize) -> (Vec<u8>, Vec<i32>) {
    let rows = xq.len() / k;
    let mut cols = Vec::with_capacity(rows * k);
    let mut gsum = Vec::with_capacity(rows * (k / group));
    let u = |&v: &i32| (v + 128) as u8;
    for xr in xq.chunks_exact(k) {
        for c in xr.chunks_exact(32) {
            cols.extend(c.iter().step_by(2).map(u));
            cols.extend(c.iter().skip(1).step_by(2).map(u));
        }
        gsum.extend(
            xr.chunks_exact(group)
                .map(|g| g.iter().map(|&v| v + 128).sum::<i32>()),
        );
    }
    (cols, gsum)
}

/// x prepared for `linear_q4_pairs` (`pair_columns`).
struct PairedX<'a> {
    cols: &'a [u8],
    gsum: &'a [i32],
    params: &'a [(f32, i32)],
    k: usize,
    group: usize,
}

/// Rows of x a weight row's nibbles are unpacked for at once.
const X_BLOCK: usize = 4;

/// A group's integer dot products, Σ x[c] · (nibble[c] - 8), of one weight row's packed bytes
/// (16 per 32 columns) with `R` rows of x laid out by `pair_columns`.
trait GroupDot {
    fn dot<const R: usize>(&self, q: &[u8], xs: [&[u8]; R]) -> [i32; R];
}

/// Any CPU: the sums column by column.
struct Portable;

impl GroupDot for Portable {
    #[inline(always)]
    fn dot<const R: usize>(&self, q: &[u8], xs: [&[u8]; R]) -> [i32; R] {
        xs.map(|x| {
            q.chunks_exact(16)
                .zip(x.chunks_exact(32))
                .map(|(b, xc)| {
                    b.iter()
                        .zip(xc[..16].iter().zip(&xc[16..]))
                        .map(|(&v, (&e, &o))| {
                            e as i32 * ((v & 0xF) as i32 - 8) + o as i32 * ((v >> 4) as i32 - 8)
                        })
                        .sum::<i32>()
                })
                .sum()
        })
    }
}

/// AVX2: 16 packed bytes become 32 signed weights (low nibbles, then high ones, less 8) in one
/// register, once for all R rows of x; `vpmaddubsw` multiplies them with x's unsigned bytes
/// (pairs at most 2 · 255 · 8, no saturation) and `vpmaddwd` widens the pairs to 32 bits.
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl GroupDot for Avx2 {
    #[inline(always)]
    fn dot<const R: usize>(&self, q: &[u8], xs: [&[u8]; R]) -> [i32; R] {
        use std::arch::x86_64::*;
        debug_assert!(q.len() % 16 == 0 && xs.iter().all(|x| x.len() == 2 * q.len()));
        // SAFETY: an `Avx2` is only used where AVX2 was detected (`q4_pairs_row_avx2`); every
        // load is unaligned and within `q` (16 bytes at 16c) or an x row (32 bytes at 32c).
        unsafe {
            let low = _mm256_set1_epi8(0x0F);
            let eight = _mm256_set1_epi8(8);
            let ones = _mm256_set1_epi16(1);
            // The upper half's bytes shifted down a nibble: their high nibbles.
            let shifts = _mm256_setr_epi64x(0, 0, 4, 4);
            let mut acc = [_mm256_setzero_si256(); R];
            let weights = |c: usize| {
                let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.as_ptr().add(16 * c).cast()));
                _mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi64(b, shifts), low), eight)
            };
            let chunks = q.len() / 16;
            // Two chunks' pairs add in 16 bits (at most 4 · 255 · 8) before widening.
            for c in (0..chunks - chunks % 2).step_by(2) {
                let (w0, w1) = (weights(c), weights(c + 1));
                for (a, x) in acc.iter_mut().zip(&xs) {
                    let x0 = _mm256_loadu_si256(x.as_ptr().add(32 * c).cast());
                    let x1 = _mm256_loadu_si256(x.as_ptr().add(32 * c + 32).cast());
                    let pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(x0, w0),
                        _mm256_maddubs_epi16(x1, w1),
                    );
                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(pairs, ones));
                }
            }
            if chunks % 2 == 1 {
                let c = chunks - 1;
                let w = weights(c);
                for (a, x) in acc.iter_mut().zip(&xs) {
                    let xv = _mm256_loadu_si256(x.as_ptr().add(32 * c).cast());
                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, w), ones));
                }
            }
            if R == 4 {
                // Four rows' lanes summed together: three horizontal adds leave each row's
                // halves side by side, then the halves add.
                let h = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(acc[0], acc[1]),
                    _mm256_hadd_epi32(acc[2], acc[3]),
                );
                let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                let mut out = [0i32; R];
                _mm_storeu_si128(out.as_mut_ptr().cast(), s);
                return out;
            }
            acc.map(|a| {
                let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
                _mm_cvtsi128_si32(s)
            })
        }
    }
}

/// `q4_pairs_row_with` compiled for AVX2 and FMA: the groups' dot products by `Avx2`, and their
/// fused multiply-adds as one instruction (the baseline x86-64 build calls libm's `fmaf`). The
/// same integer sums and correctly rounded operations, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn q4_pairs_row_avx2(x: &PairedX, ksum: f32, row: (&[u8], &[f32], &[f32]), out: &mut [f32]) {
    q4_pairs_row_with(x, ksum, row, out, &Avx2)
}

/// One weight row of `linear_q4_pairs` for every row of x, `X_BLOCK` rows at a time.
#[inline(always)]
fn q4_pairs_row_with(
    x: &PairedX,
    ksum: f32,
    row: (&[u8], &[f32], &[f32]),
    out: &mut [f32],
    d: &impl GroupDot,
) {
    let mut r = 0;
    while r < out.len() {
        match out.len() - r {
            1 => q4_pairs_block::<1>(x, ksum, row, &mut out[r..], r, d),
            2 => q4_pairs_block::<2>(x, ksum, row, &mut out[r..], r, d),
            3 => q4_pairs_block::<3>(x, ksum, row, &mut out[r..], r, d),
            _ => q4_pairs_block::<X_BLOCK>(x, ksum, row, &mut out[r..], r, d),
        }
        r += X_BLOCK;
    }
}

/// Rows `r0..r0 + R` of x against one weight row: per row, y starts at the zero point's term,
/// each group's sum is fused in with its scale, in group order, and a stored bias beyond the
/// symmetric zero adds `(bias + 8·s) · Σ (u - zp)` per group before the row's scale.
#[inline(always)]
fn q4_pairs_block<const R: usize>(
    x: &PairedX,
    ksum: f32,
    (q, s, b): (&[u8], &[f32], &[f32]),
    out: &mut [f32],
    r0: usize,
    d: &impl GroupDot,
) {
    let PairedX {
        cols,
        gsum,
        params,
        k,
        group,
    } = *x;
    let groups = k / group;
    let zps: [i32; R] = std::array::from_fn(|i| params[r0 + i].1 + 128);
    let mut y = zps.map(|zp| ksum * zp as f32);
    let mut rest_sum = [0f32; R];
    for (g, qg) in q[..k / 2].chunks_exact(group / 2).enumerate() {
        let xs = std::array::from_fn(|i| &cols[(r0 + i) * k + g * group..][..group]);
        let acc = d.dot::<R>(qg, xs);
        let rest = b[g] + 8.0 * s[g];
        for i in 0..R {
            y[i] = (acc[i] as f32).mul_add(s[g], y[i]);
            if rest != 0.0 {
                rest_sum[i] += rest * (gsum[(r0 + i) * groups + g] - zps[i] * group as i32) as f32;
            }
        }
    }
    for i in 0..R {
        out[i] = (y[i] + rest_sum[i]) * params[r0 + i].0;
    }
}

/// Multiply-adds below which a linear runs on the calling thread: spawning costs more (the
/// demo model's 576-wide linears, 0.33 M each, ran on two threads at 1 << 17: decode 48-52 ms a
/// token, against 38-46 on one; the E2B-shaped program's decode the same either way).
const PAR_MIN_MACS: usize = 1 << 20;

/// Cores to spread work over, asked once: `available_parallelism` reads the cgroup's files on
/// Linux on every call, which was most of a decode step's host gathers (75-78 us a step on the
/// build machine, 18-35 once asked once).
pub(crate) fn threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `y [m, n]` where `f(j, y[.., j], scratch)` fills output column j (one weight row) for all m
/// rows of x; scratch is a k-long buffer private to the calling thread. Weight rows are split
/// into one contiguous range per thread (rayon's persistent pool measured the same: a demo
/// model step spends its time elsewhere).
fn by_weight_rows(
    [m, k, n]: [usize; 3],
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) -> Vec<f32> {
    if m == 0 || n == 0 {
        return Vec::new();
    }
    let mut yt = vec![0f32; n * m];
    let run = |j0: usize, cols: &mut [f32]| {
        let mut buf = vec![0f32; k];
        for (jj, col) in cols.chunks_mut(m).enumerate() {
            f(j0 + jj, col, &mut buf);
        }
    };
    let nt = if m * n * k < PAR_MIN_MACS {
        1
    } else {
        threads().min(n)
    };
    by_threads(&mut yt, m, nt, run);
    if m == 1 {
        return yt;
    }
    let mut y = vec![0f32; m * n];
    for (j, col) in yt.chunks_exact(m).enumerate() {
        for (i, v) in col.iter().enumerate() {
            y[i * n + j] = *v;
        }
    }
    y
}

/// `run(first, chunk)` over `out` split into `nt` runs of whole rows of `row` values (`first`
/// is the chunk's first row), one thread each; on the calling thread when `nt` is 1.
pub(crate) fn by_threads<T: Send>(
    out: &mut [T],
    row: usize,
    nt: usize,
    run: impl Fn(usize, &mut [T]) + Sync,
) {
    let rows = out.len().checked_div(row).unwrap_or(0);
    if nt <= 1 || rows <= 1 {
        return run(0, out);
    }
    let per = rows.div_ceil(nt);
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(per * row).enumerate() {
            let run = &run;
            s.spawn(move || run(t * per, chunk));
        }
    });
}

/// One 4-bit weight row: `out[c] = s[g] * q + b[g]` (g = c / group), element 2j in the low nibble.
fn dequant_q4(q: &[u8], s: &[f32], b: &[f32], group: usize, out: &mut [f32]) {
    if group % 2 == 0 {
        for (g, (o, bytes)) in out.chunks_mut(group).zip(q.chunks(group / 2)).enumerate() {
            let (sg, bg) = (s[g], b[g]);
            for (pair, &byte) in o.chunks_exact_mut(2).zip(bytes) {
                pair[0] = sg * (byte & 0xF) as f32 + bg;
                pair[1] = sg * (byte >> 4) as f32 + bg;
            }
        }
    } else {
        for (c, v) in out.iter_mut().enumerate() {
            let byte = q[c / 2];
            let nib = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
            *v = s[c / group] * nib as f32 + b[c / group];
        }
    }
}

/// A dot product in 16 independent lanes, which the compiler keeps in vector registers.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
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

/// XNNPACK's per-row dynamic int8 quantization (`xnn_f32_qd8_asymmetric_quantization_params`
/// and the f32→qs8 convert), then dequantization by `1 / multiplier` as its qd8 GEMMs do.
/// Rounding `x · (255 / range)` instead of torchao's `x / (range / 255)` decides ties
/// differently; ExecuTorch's XNNPACK runtime reproduces this bit for bit.
pub fn quant_dequant_row_xnnpack(row: &mut [f32]) {
    let mut q = vec![0i32; row.len()];
    let (inv, _) = quant_row_xnnpack(row, &mut q);
    for (v, &qi) in row.iter_mut().zip(&q) {
        *v = qi as f32 * inv;
    }
}

/// Where a rotary embedding rotates: `Rope`'s attributes, its start evaluated.
#[derive(Clone, Copy)]
struct Rotary {
    style: RopeStyle,
    rotary: usize,
    seq_dim: usize,
    start: i64,
}

/// `Rope` of x (shape `xs`) by cos/sin tables `[max_pos, rotary/2]`.
fn rope(
    x: &[f32],
    xs: &[usize],
    cos: &[f32],
    sin: &[f32],
    at: Rotary,
) -> std::result::Result<Vec<f32>, String> {
    let half = at.rotary / 2;
    let d = *xs.last().ok_or("rope of a scalar")?;
    let st = strides(xs);
    let mut y = x.to_vec();
    let rows = x.len() / d;
    for r in 0..rows {
        let s_idx = (r * d / st[at.seq_dim]) % xs[at.seq_dim];
        let pos = (at.start + s_idx as i64) as usize;
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
            let (a, b) = match at.style {
                RopeStyle::Half => (i, i + half),
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            };
            yr[a] = xr[a] * c[i] - xr[b] * s[i];
            yr[b] = xr[b] * c[i] + xr[a] * s[i];
        }
    }
    Ok(y)
}

/// `x * rsqrt(mean(x², -1) + eps) * w` over rows of `d`.
fn rms_norm(x: &[f32], w: Option<&[f32]>, d: usize, eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
        let ms: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for (j, (yv, xv)) in yr.iter_mut().zip(xr).enumerate() {
            *yv = xv * r * w.map_or(1.0, |w| w[j]);
        }
    }
    y
}

/// An element-wise chain over inputs already broadcast to the output's elements: `v = ins[0]`,
/// then each step as its own op computes it, so fusing changes no bit.
fn chain(steps: &[ChainStep], ins: &[Cow<[f32]>]) -> std::result::Result<Val, String> {
    let mut v = ins.first().ok_or("a chain without inputs")?.to_vec();
    let n = [v.len()];
    for st in steps {
        match *st {
            ChainStep::Unary(u) => v.iter_mut().for_each(|e| *e = unary_f(u, *e)),
            ChainStep::Binary {
                op: b,
                input,
                operand_first,
            } => {
                let w = (
                    Vs::F(ins.get(input).ok_or("chain operand out of range")?),
                    &n[..],
                );
                let x = (Vs::F(&v), &n[..]);
                let y = match operand_first {
                    true => binary(b, w, x, &n, true),
                    false => binary(b, x, w, &n, true),
                };
                v = match y {
                    Val::F(y) => y,
                    Val::I(y) => y.iter().map(|&e| e as f32).collect(),
                };
            }
            ChainStep::Scalar {
                op: b,
                scalar,
                scalar_first,
            } => {
                let sv = [scalar as f32];
                let (x, s) = ((Vs::F(&v), &n[..]), (Vs::F(&sv), &[][..]));
                let y = match scalar_first {
                    true => binary(b, s, x, &n, true),
                    false => binary(b, x, s, &n, true),
                };
                v = match y {
                    Val::F(y) => y,
                    Val::I(y) => y.iter().map(|&e| e as f32).collect(),
                };
            }
            ChainStep::Clamp { min, max } => {
                let (lo, hi) = (
                    min.unwrap_or(f64::NEG_INFINITY) as f32,
                    max.unwrap_or(f64::INFINITY) as f32,
                );
                v.iter_mut().for_each(|e| *e = e.max(lo).min(hi));
            }
        }
    }
    Ok(Val::F(v))
}

/// `where`: `a` where `c` is non-zero, else `b`, all of one shape.
fn pick<T: Copy>(c: &[i64], a: &[T], b: &[T]) -> Vec<T> {
    c.iter()
        .zip(a.iter().zip(b))
        .map(|(&c, (&a, &b))| if c != 0 { a } else { b })
        .collect()
}

/// XNNPACK's per-row dynamic int8 quantization: writes `q - zero_point` per element and
/// returns the dequantization scale `1 / multiplier` and the zero point.
pub fn quant_row_xnnpack(row: &[f32], out: &mut [i32]) -> (f32, i32) {
    let mn = row.iter().copied().fold(0f32, f32::min);
    let mx = row.iter().copied().fold(0f32, f32::max);
    let mul = if mn == mx { 1.0 } else { 255.0 / (mx - mn) };
    let (lo, hi) = (mn * mul, mx * mul);
    // The zero point comes from whichever end of the range it represents with less error.
    let zp = if (-128.0 + lo) + (127.0 + hi) > 0.0 {
        -128.0 - lo
    } else {
        127.0 - hi
    };
    let zp = zp.clamp(-128.0, 127.0).round_ties_even();
    for (o, v) in out.iter_mut().zip(row) {
        // (round(x·mul clamped to the int8 range less zp) + zp) - zp
        *o = (*v * mul).clamp(-128.0 - zp, 127.0 - zp).round_ties_even() as i32;
    }
    (1.0 / mul, zp as i32)
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

fn strided(x: &Val, out: &[usize], out_strides: &[usize]) -> Val {
    match x {
        Val::F(v) => Val::F(strided_copy(v, out, out_strides)),
        Val::I(v) => Val::I(strided_copy(v, out, out_strides)),
    }
}

/// A value's elements, borrowed.
#[derive(Clone, Copy)]
enum Vs<'a> {
    F(&'a [f32]),
    I(&'a [i64]),
}

impl Val {
    fn view(&self) -> Vs<'_> {
        match self {
            Val::F(v) => Vs::F(v),
            Val::I(v) => Vs::I(v),
        }
    }
}

impl<'a> Vs<'a> {
    fn f(self) -> Cow<'a, [f32]> {
        match self {
            Vs::F(v) => Cow::Borrowed(v),
            Vs::I(v) => Cow::Owned(v.iter().map(|&x| x as f32).collect()),
        }
    }
}

/// `out` and the operands' strides with neighbouring dims merged wherever every operand reads
/// them as one (both contiguous, or both broadcast), so runs of the innermost dim are long.
fn collapse(out: &[usize], sts: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut shape: Vec<usize> = Vec::new();
    let mut cst: Vec<Vec<usize>> = vec![Vec::new(); sts.len()];
    for d in (0..out.len()).rev() {
        if out[d] == 1 {
            continue;
        }
        match shape.last_mut() {
            // Dim d steps every operand by its inner run's whole extent: one longer run.
            Some(inner)
                if sts
                    .iter()
                    .zip(&cst)
                    .all(|(st, c)| Some(st[d]) == c.last().map(|&s| s * *inner)) =>
            {
                *inner *= out[d]
            }
            _ => {
                shape.push(out[d]);
                cst.iter_mut().zip(sts).for_each(|(c, st)| c.push(st[d]));
            }
        }
    }
    if shape.is_empty() {
        shape.push(1);
        cst.iter_mut().for_each(|c| c.push(0));
    }
    shape.reverse();
    cst.iter_mut().for_each(|c| c.reverse());
    (shape, cst)
}

/// `f` over `x` and `y` broadcast to `out`, walking runs of the (collapsed) innermost dim.
fn zip_bcast<A: Copy, B: Copy, R>(
    (x, xs): (&[A], &[usize]),
    (y, ys): (&[B], &[usize]),
    out: &[usize],
    f: impl Fn(A, B) -> R,
) -> Vec<R> {
    let n: usize = out.iter().product();
    let mut res = Vec::with_capacity(n);
    if n == 0 {
        return res;
    }
    let (shape, st) = collapse(out, &[bcast_strides(xs, out), bcast_strides(ys, out)]);
    let r = shape.len();
    let inner = shape[r - 1];
    let (xi, yi) = (st[0][r - 1], st[1][r - 1]);
    let mut idx = vec![0usize; r - 1];
    let (mut xo, mut yo) = (0usize, 0usize);
    for _ in 0..n / inner {
        match (xi, yi) {
            (1, 1) => res.extend(
                x[xo..xo + inner]
                    .iter()
                    .zip(&y[yo..yo + inner])
                    .map(|(&a, &b)| f(a, b)),
            ),
            (1, 0) => {
                let b = y[yo];
                res.extend(x[xo..xo + inner].iter().map(|&a| f(a, b)));
            }
            (0, 1) => {
                let a = x[xo];
                res.extend(y[yo..yo + inner].iter().map(|&b| f(a, b)));
            }
            _ => res.extend((0..inner).map(|i| f(x[xo + i * xi], y[yo + i * yi]))),
        }
        let mut offs = [xo, yo];
        next_index(&mut idx, &shape[..r - 1], &[&st[0], &st[1]], &mut offs);
        [xo, yo] = offs;
    }
    res
}

/// A binary op of `x` (shape `xs`) and `y` (shape `ys`) broadcast to `out`; each op's loop is
/// its own instance, so the common ones vectorise.
fn binary(
    b: BinaryOp,
    (x, xs): (Vs, &[usize]),
    (y, ys): (Vs, &[usize]),
    out: &[usize],
    out_float: bool,
) -> Val {
    use BinaryOp::*;
    if let (Vs::I(x), Vs::I(y)) = (x, y) {
        if !out_float || b.is_comparison() {
            macro_rules! z {
                ($f:expr) => {
                    zip_bcast((x, xs), (y, ys), out, $f)
                };
            }
            return Val::I(match b {
                Add => z!(|p, q| p.wrapping_add(q)),
                Sub => z!(|p, q| p.wrapping_sub(q)),
                Mul => z!(|p, q| p.wrapping_mul(q)),
                Div => z!(|p, q| if q == 0 { 0 } else { p.wrapping_div(q) }),
                Pow => z!(|p, q| p.wrapping_pow(q.max(0) as u32)),
                Max => z!(|p, q| p.max(q)),
                Min => z!(|p, q| p.min(q)),
                Eq => z!(|p, q| (p == q) as i64),
                Ne => z!(|p, q| (p != q) as i64),
                Lt => z!(|p, q| (p < q) as i64),
                Le => z!(|p, q| (p <= q) as i64),
                Gt => z!(|p, q| (p > q) as i64),
                Ge => z!(|p, q| (p >= q) as i64),
                And => z!(|p, q| (p != 0 && q != 0) as i64),
                Or => z!(|p, q| (p != 0 || q != 0) as i64),
            });
        }
    }
    let (x, y) = (x.f(), y.f());
    macro_rules! z {
        ($f:expr) => {
            zip_bcast((&x[..], xs), (&y[..], ys), out, $f)
        };
    }
    fn t(c: bool) -> f32 {
        c as i32 as f32
    }
    Val::F(match b {
        Add => z!(|p, q| p + q),
        Sub => z!(|p, q| p - q),
        Mul => z!(|p, q| p * q),
        Div => z!(|p, q| p / q),
        Pow => z!(|p, q| p.powf(q)),
        Max => z!(|p, q| p.max(q)),
        Min => z!(|p, q| p.min(q)),
        Eq => z!(|p, q| t(p == q)),
        Ne => z!(|p, q| t(p != q)),
        Lt => z!(|p, q| t(p < q)),
        Le => z!(|p, q| t(p <= q)),
        Gt => z!(|p, q| t(p > q)),
        Ge => z!(|p, q| t(p >= q)),
        And => z!(|p, q| t(p != 0.0 && q != 0.0)),
        Or => z!(|p, q| t(p != 0.0 || q != 0.0)),
    })
}

/// Concatenation's layout: each of the `outer` blocks takes each part's slab (`slabs[i]` values
/// of part `i`) in turn.
fn interleave<T: Copy>(parts: &[Vec<T>], slabs: &[usize], outer: usize) -> Vec<T> {
    let mut y = Vec::new();
    for o in 0..outer {
        for (x, &c) in parts.iter().zip(slabs) {
            y.extend_from_slice(&x[o * c..(o + 1) * c]);
        }
    }
    y
}

fn gather(x: &Val, idx: &[usize]) -> Val {
    match x {
        Val::F(v) => Val::F(idx.iter().map(|&i| v[i]).collect()),
        Val::I(v) => Val::I(idx.iter().map(|&i| v[i]).collect()),
    }
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
    pub all_rows: bool,
}

/// The rows and row stride of an attention mask `[.., rows, cols]` whose leading dims are 1.
pub fn mask_rows(shape: &[usize]) -> Option<(usize, usize)> {
    match shape {
        [lead @ .., rows, cols] if lead.iter().all(|&d| d == 1) => Some((*rows, *cols)),
        _ => None,
    }
}

/// Reference attention over the first `start + S` cache rows (or all of them with `all_rows`),
/// either layout, with GQA.
pub fn sdpa(a: &SdpaArgs) -> std::result::Result<Vec<f32>, String> {
    if a.q_shape.len() != 4 || a.kv_shape.len() != 4 {
        return Err(format!(
            "sdpa needs 4-D q and k, got {:?} / {:?}",
            a.q_shape, a.kv_shape
        ));
    }
    let Some(super::AttnDims {
        b,
        s,
        hq,
        d,
        cl,
        hkv,
    }) = a.layout.dims(a.q_shape, a.kv_shape)
    else {
        return Err(format!(
            "q {:?} does not fit k/v {:?}",
            a.q_shape, a.kv_shape
        ));
    };
    if a.start < 0 || (!a.all_rows && a.start as usize + s > cl) {
        return Err(format!(
            "positions {}..{} exceed the cache of {cl}",
            a.start,
            a.start + s as i64
        ));
    }
    let start = a.start as usize;
    let kv_len = if a.all_rows { cl } else { start + s };
    let qi = |bb: usize, i: usize, h: usize| match a.layout {
        AttnLayout::Bshd => ((bb * s + i) * hq + h) * d,
        AttnLayout::Bhsd => ((bb * hq + h) * s + i) * d,
    };
    let ki = |bb: usize, j: usize, h: usize| match a.layout {
        AttnLayout::Bshd => ((bb * cl + j) * hkv + h) * d,
        AttnLayout::Bhsd => ((bb * hkv + h) * cl + j) * d,
    };
    let mut mask_stride = 0;
    if let Some((_, ms)) = a.mask {
        match mask_rows(ms) {
            Some((rows, cols)) if rows >= s && cols >= kv_len => mask_stride = cols,
            _ => return Err(format!("mask {ms:?} is not [.., >= {s}, >= {kv_len}]")),
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
                    // A key the mask hides needs no dot product (its weight is 0 either way).
                    let hidden = a
                        .mask
                        .is_some_and(|(m, _)| m[i * mask_stride + j] == f32::NEG_INFINITY);
                    if !visible || hidden {
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
                    if let Some((m, _)) = a.mask {
                        x += m[i * mask_stride + j];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pte::{Blob, Bytes};

    fn blob(b: Vec<u8>) -> Role {
        Role::Constant(Blob::whole(Arc::new(Bytes::Owned(b))))
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A shared output's bytes are its shape's elements in its own dtype: lent (f32, i64) or
    /// encoded (narrower types), never the value's spare tail.
    #[test]
    fn shared_outputs_give_their_shapes_bytes() {
        let out = |dtype, sizes: Vec<usize>, val| CpuOutput {
            dtype,
            sizes,
            val: Arc::new(val),
        };
        let f = vec![1.5f32, -2.0, 3.25, 7.0, 9.0];
        let o = out(DType::F32, vec![2, 2], Val::F(f.clone()));
        assert!(matches!(o.bytes(), Cow::Borrowed(_)));
        assert_eq!(o.bytes().as_ref(), f32s(&f[..4]));
        let o = out(DType::F16, vec![3], Val::F(f.clone()));
        assert_eq!(o.bytes().as_ref(), from_f32(DType::F16, &f[..3]));
        let o = out(DType::I64, vec![2], Val::I(vec![5, -6, 7]));
        assert_eq!(o.into_host().data, from_i64(DType::I64, &[5, -6]));
        let o = out(DType::I32, vec![3], Val::I(vec![5, -6, 7]));
        assert_eq!(o.bytes().as_ref(), from_i64(DType::I32, &[5, -6, 7]));
        assert_eq!(o.bytes().len(), 12);
    }

    /// xorshift, so failures reproduce.
    fn rand(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// Offset in a row-major `src` of output element `k` of `out`, by NumPy broadcasting
    /// (dims aligned from the right, size-1 and missing dims repeat): one element at a time.
    fn naive_offset(src: &[usize], out: &[usize], mut k: usize) -> usize {
        let (mut off, mut stride) = (0, 1);
        for d in (0..out.len()).rev() {
            let i = k % out[d];
            k /= out[d];
            if let Some(j) = (d + src.len()).checked_sub(out.len()) {
                if src[j] != 1 {
                    off += i * stride;
                }
                stride *= src[j];
            }
        }
        off
    }

    fn int_bytes(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Runs one op of two or three inputs (given as dtype, shape, bytes) on the CPU executor.
    fn run_op(
        kind: OpKind,
        ins: &[(DType, Vec<usize>, Vec<u8>)],
        out: (DType, Vec<usize>),
    ) -> HostTensor {
        let mut g = Graph::default();
        let ts: Vec<TensorId> = ins
            .iter()
            .enumerate()
            .map(|(i, (dt, shape, _))| {
                g.add_tensor(format!("in{i}"), *dt, shape.clone(), Role::Input(i))
            })
            .collect();
        let y = g.add_tensor("y", out.0, out.1, Role::Activation);
        g.op(kind, ts.clone(), vec![y]);
        g.inputs.extend(ts.iter().map(|&t| Io::Tensor(t)));
        g.outputs.push(y);
        let inputs: Vec<InputValue> = ins
            .iter()
            .map(|(_, shape, data)| InputValue::Tensor {
                shape: shape.clone(),
                data,
            })
            .collect();
        let mut got = CpuExecutor::new(g).unwrap().run(&inputs).unwrap();
        got.remove(0)
    }

    /// Broadcast binary ops, walked by strides over merged dims, give every element what
    /// indexing each operand by the broadcasting rule gives: contiguous, repeated, middle and
    /// leading size-1 dims, both operands broadcast, float, integer and comparison forms.
    #[test]
    fn binary_ops_broadcast_as_indexing_each_element_does() {
        use BinaryOp::*;
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let shapes: [(&[usize], &[usize]); 9] = [
            (&[2, 3, 4], &[2, 3, 4]),
            (&[2, 3, 4], &[4]),
            (&[2, 3, 4], &[3, 1]),
            (&[1, 3, 1, 5], &[2, 1, 4, 1]),
            (&[1], &[3, 2]),
            (&[6, 1], &[1, 7]),
            (&[2, 1, 3], &[2, 5, 3]),
            (&[1, 3, 1, 1, 8, 4], &[1, 3, 3, 1, 1, 4]),
            (&[3, 1, 2, 1], &[3, 5, 2, 4]),
        ];
        for (xs, ys) in shapes {
            let r = xs.len().max(ys.len());
            let pad = |s: &[usize]| -> Vec<usize> {
                let mut v = vec![1; r - s.len()];
                v.extend_from_slice(s);
                v
            };
            let (px, py) = (pad(xs), pad(ys));
            let out: Vec<usize> = px.iter().zip(&py).map(|(a, b)| *a.max(b)).collect();
            let n: usize = out.iter().product();
            let x = rand(&mut seed, xs.iter().product());
            let mut y = rand(&mut seed, ys.iter().product());
            y.iter_mut().step_by(3).for_each(|v| *v = x[0]); // ties for the comparisons
            let xi: Vec<i64> = x.iter().map(|v| (v * 9.0) as i64).collect();
            let yi: Vec<i64> = y.iter().map(|v| (v * 5.0) as i64).collect();
            let at = |k: usize| (naive_offset(xs, &out, k), naive_offset(ys, &out, k));
            for (b, f) in [
                (Sub, (|p, q| p - q) as fn(f32, f32) -> f32),
                (Div, |p, q| p / q),
                (Max, |p, q| p.max(q)),
                (Le, |p, q| (p <= q) as i32 as f32),
            ] {
                let dt = if b.is_comparison() {
                    DType::Bool
                } else {
                    DType::F32
                };
                let got = run_op(
                    OpKind::Binary(b),
                    &[
                        (DType::F32, xs.to_vec(), f32s(&x)),
                        (DType::F32, ys.to_vec(), f32s(&y)),
                    ],
                    (dt, out.clone()),
                );
                assert_eq!(got.sizes, out, "{b:?} {xs:?} {ys:?}");
                let got = to_f32(dt, &got.data).into_owned();
                let want: Vec<f32> = (0..n).map(at).map(|(i, j)| f(x[i], y[j])).collect();
                assert_eq!(got, want, "{b:?} {xs:?} {ys:?}");
            }
            for (b, f) in [
                (Sub, (|p: i64, q: i64| p - q) as fn(i64, i64) -> i64),
                (Div, |p, q| if q == 0 { 0 } else { p / q }),
                (Gt, |p, q| (p > q) as i64),
            ] {
                let got = run_op(
                    OpKind::Binary(b),
                    &[
                        (DType::I64, xs.to_vec(), int_bytes(&xi)),
                        (DType::I64, ys.to_vec(), int_bytes(&yi)),
                    ],
                    (DType::I64, out.clone()),
                );
                let got = to_i64(DType::I64, &got.data);
                let want: Vec<i64> = (0..n).map(at).map(|(i, j)| f(xi[i], yi[j])).collect();
                assert_eq!(got, want, "{b:?} {xs:?} {ys:?}");
            }
            let c: Vec<i64> = x.iter().map(|&v| (v > 0.0) as i64).collect();
            let got = run_op(
                OpKind::Where,
                &[
                    (
                        DType::Bool,
                        xs.to_vec(),
                        c.iter().map(|&v| v as u8).collect(),
                    ),
                    (DType::F32, ys.to_vec(), f32s(&y)),
                    (DType::F32, vec![1], f32s(&[-7.5])),
                ],
                (DType::F32, out.clone()),
            );
            let want: Vec<f32> = (0..n)
                .map(at)
                .map(|(i, j)| if c[i] != 0 { y[j] } else { -7.5 })
                .collect();
            assert_eq!(
                to_f32(DType::F32, &got.data).into_owned(),
                want,
                "where {xs:?} {ys:?}"
            );
        }
    }

    /// Random packed 4-bit weights `[n, k]` with positive group scales and the symmetric biases
    /// (-8 · scale) the exports store.
    fn q4_symmetric(
        seed: &mut u64,
        [k, n]: [usize; 2],
        group: usize,
    ) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        let raw: Vec<u8> = rand(seed, n * k / 2)
            .iter()
            .map(|v| ((v + 1.0) * 127.9) as u8)
            .collect();
        let scales: Vec<f32> = rand(seed, n * (k / group))
            .iter()
            .map(|v| 0.01 + v.abs() * 0.05)
            .collect();
        let biases = scales.iter().map(|s| -8.0 * s).collect();
        (raw, scales, biases)
    }

    /// Runs one bias-free `Linear` of `x` `[m, k]` on the CPU executor; `operands` are its
    /// weight constants after `x` as (dtype, shape, bytes): `w`, or `w`, scales, biases.
    fn run_linear(
        weight: Weight,
        act_quant: ActQuant,
        x: &[f32],
        [m, k, n]: [usize; 3],
        operands: Vec<(DType, Vec<usize>, Vec<u8>)>,
    ) -> Vec<f32> {
        let mut g = Graph::default();
        let xt = g.add_tensor("x", DType::F32, vec![m, k], Role::Input(0));
        let mut ins = vec![xt];
        for ((dt, shape, bytes), name) in operands.into_iter().zip(["w", "s", "b"]) {
            ins.push(g.add_tensor(name, dt, shape, blob(bytes)));
        }
        let y = g.add_tensor("y", DType::F32, vec![m, n], Role::Activation);
        let kind = OpKind::Linear {
            weight,
            act_quant,
            has_bias: false,
        };
        g.op(kind, ins, vec![y]);
        g.inputs.push(Io::Tensor(xt));
        g.outputs.push(y);
        let xb = f32s(x);
        let got = CpuExecutor::new(g)
            .unwrap()
            .run(&[InputValue::Tensor {
                shape: vec![m, k],
                data: &xb,
            }])
            .unwrap();
        to_f32(DType::F32, &got[0].data).into_owned()
    }

    /// The row-at-a-time, multi-threaded linear agrees with dequantizing the whole matrix and
    /// multiplying it (the reference it replaced) on awkward sizes, both sides of the threading
    /// threshold, with and without activation quantization.
    #[test]
    fn linear_matches_whole_matrix_dequantization() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for (w, m, k, n) in [
            (Weight::Q4 { group: 32 }, 1, 96, 37),
            (Weight::Q4 { group: 32 }, 5, 64, 3),
            (Weight::Q4 { group: 6 }, 3, 30, 1500),
            (Weight::Q8 { group: 16 }, 7, 48, 1201),
            (Weight::Q8 { group: 48 }, 1, 48, 5),
            (Weight::F32, 2, 33, 2100),
        ] {
            for aq in [ActQuant::None, ActQuant::Torchao, ActQuant::Xnnpack] {
                let cols = match w {
                    Weight::Q4 { .. } => k / 2,
                    _ => k,
                };
                let groups = match w {
                    Weight::Q4 { group } | Weight::Q8 { group } => k / group,
                    Weight::F32 => 1,
                };
                let raw: Vec<u8> = rand(&mut seed, n * cols)
                    .iter()
                    .map(|v| (v * 127.0) as i8 as u8)
                    .collect();
                let scales: Vec<f32> = rand(&mut seed, n * groups)
                    .iter()
                    .map(|v| v.abs() * 0.1)
                    .collect();
                let biases = rand(&mut seed, n * groups);
                let wf = rand(&mut seed, n * k);
                let x = rand(&mut seed, m * k);
                let operands = if w == Weight::F32 {
                    vec![(DType::F32, vec![n, k], f32s(&wf))]
                } else {
                    let dt = if matches!(w, Weight::Q4 { .. }) {
                        DType::U8
                    } else {
                        DType::I8
                    };
                    vec![
                        (dt, vec![n, cols], raw.clone()),
                        (DType::F32, vec![n, groups], f32s(&scales)),
                        (DType::F32, vec![n, groups], f32s(&biases)),
                    ]
                };
                let got = run_linear(w, aq, &x, [m, k, n], operands);

                let mut xq = x.clone();
                for row in xq.chunks_mut(k) {
                    match aq {
                        ActQuant::None => {}
                        ActQuant::Torchao => quant_dequant_row(row),
                        ActQuant::Xnnpack => quant_dequant_row_xnnpack(row),
                    }
                }
                let wd: Vec<f32> = (0..n * k)
                    .map(|i| {
                        let (r, c) = (i / k, i % k);
                        let q = match w {
                            Weight::F32 => return wf[i],
                            Weight::Q4 { .. } => {
                                let b = raw[r * cols + c / 2];
                                (if c % 2 == 0 { b & 0xF } else { b >> 4 }) as f32
                            }
                            Weight::Q8 { .. } => raw[i] as i8 as f32,
                        };
                        let gi = r * groups + c * groups / k;
                        scales[gi] * q + biases[gi]
                    })
                    .collect();
                let want = crate::runtime::kernels::matmul_f32(&xq, &wd, m, k, n, true);
                let err: f32 = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f32>()
                    .sqrt();
                let norm: f32 = want.iter().map(|b| b * b).sum::<f32>().sqrt();
                assert!(
                    err <= 1e-6 * norm,
                    "{w:?} {aq:?} {m}x{k}x{n}: rel-L2 {}",
                    err / norm
                );
            }
        }
    }

    /// SmolLM2's 8da4w up projection shape (K = 576, group 32, symmetric int4): with XNNPACK's
    /// activation quantization the result is XNNPACK's exact per-group integer sums, scaled,
    /// to within float rounding of those few terms, which a float dot product of the
    /// dequantized values misses (its last bits flip later roundings in a deep model).
    #[test]
    fn xnnpack_linear_is_exact_up_to_the_rounding_of_its_float_terms() {
        let (m, k, n, group) = (3, 576, 256, 32);
        let groups = k / group;
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let (raw, scales, biases) = q4_symmetric(&mut seed, [k, n], group);
        let mut x = rand(&mut seed, m * k);
        x[7] = 40.0; // a massive activation, as real residual streams have
        let operands = vec![
            (DType::U8, vec![n, k / 2], raw.clone()),
            (DType::F32, vec![n, groups], f32s(&scales)),
            (DType::F32, vec![n, groups], f32s(&biases)),
        ];
        let got = run_linear(
            Weight::Q4 { group },
            ActQuant::Xnnpack,
            &x,
            [m, k, n],
            operands,
        );
        let mut worst = 0f64;
        for i in 0..m {
            let mut r = vec![0i32; k];
            let (inv, zp) = quant_row_xnnpack(&x[i * k..(i + 1) * k], &mut r);
            let (inv, zp) = (inv as f64, zp as i64);
            for j in 0..n {
                let (mut want, mut size, mut ksum) = (0f64, 0f64, 0f64);
                for gi in 0..groups {
                    let (mut acc, mut wsum) = (0i64, 0i64);
                    for c in gi * group..(gi + 1) * group {
                        let b = raw[j * k / 2 + c / 2];
                        let w = (if c % 2 == 0 { b & 0xF } else { b >> 4 }) as i64 - 8;
                        acc += r[c] as i64 * w;
                        wsum += w;
                    }
                    let s = scales[j * groups + gi] as f64;
                    want += s * acc as f64 * inv;
                    // The kernel's float terms: each group on the unsigned stored values
                    // (zero point + 128 included), and that share taken back out through ksum.
                    size += (s * (acc + (zp + 128) * wsum) as f64 * inv).abs();
                    ksum += s * wsum as f64;
                }
                size += (ksum * (zp + 128) as f64 * inv).abs();
                worst = worst.max((got[i * n + j] as f64 - want).abs() / size);
            }
        }
        // Float rounding of those terms only (bit-exactness against ExecuTorch itself is
        // tests/xnnpack_linear.rs).
        assert!(
            worst <= 2.0 * f32::EPSILON as f64,
            "error {worst:e} of the summed terms"
        );
    }

    /// The AVX2 group dot product (where the CPU has it) gives the portable form's sums, for
    /// every row count a block takes and odd and even chunk counts, at both operands' extremes.
    #[test]
    fn group_dot_forms_agree() {
        let mut seed = 7u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for chunks in [1usize, 2, 3, 8] {
            let mut q: Vec<u8> = (0..16 * chunks).map(|_| next() as u8).collect();
            q[0] = 0x00;
            q[1] = 0xFF;
            let xs: Vec<Vec<u8>> = (0..4)
                .map(|r| {
                    (0..32 * chunks)
                        .map(|i| if r == 0 && i < 3 { 255 } else { next() as u8 })
                        .collect()
                })
                .collect();
            let rows = |n: usize| -> Vec<&[u8]> { xs[..n].iter().map(|x| &x[..]).collect() };
            let want = Portable.dot::<4>(&q, rows(4).try_into().unwrap());
            assert_ne!(want, [0; 4]);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                assert_eq!(Avx2.dot::<4>(&q, rows(4).try_into().unwrap()), want);
                assert_eq!(Avx2.dot::<3>(&q, rows(3).try_into().unwrap()), want[..3]);
                assert_eq!(Avx2.dot::<1>(&q, rows(1).try_into().unwrap()), want[..1]);
            }
        }
    }

    /// The 4-bit linear that reads packed bytes in pairs (with and without AVX2/FMA) gives the
    /// bits of unpacking every weight and summing column by column, the form it replaced (and
    /// the one `tests/xnnpack_linear.rs` holds to ExecuTorch's own), with and without stored
    /// biases beyond the symmetric zero, on groups of 32 and 64 and several rows of x.
    #[test]
    fn paired_nibble_linear_keeps_the_unpacked_bits() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for (m, k, n, group, symmetric) in [
            (1, 576, 67, 64, true),
            (3, 576, 40, 32, true),
            (2, 192, 33, 32, false),
            // A block of four rows of x and the rest, group 128 as the E2B exports use.
            (7, 256, 19, 128, true),
            (5, 192, 9, 64, false),
            // Three chunks a group: a pair, then one alone.
            (4, 192, 11, 96, true),
        ] {
            let groups = k / group;
            let (raw, scales, mut biases) = q4_symmetric(&mut seed, [k, n], group);
            if !symmetric {
                biases.iter_mut().step_by(3).for_each(|b| *b += 0.02);
            }
            let x = rand(&mut seed, m * k);
            let mut xq = vec![0i32; m * k];
            let params: Vec<(f32, i32)> = x
                .chunks(k)
                .zip(xq.chunks_mut(k))
                .map(|(row, q)| {
                    let (inv, zp) = quant_row_xnnpack(row, q);
                    q.iter_mut().for_each(|v| *v += zp);
                    (inv, zp)
                })
                .collect();
            // The kernels' unsigned activations.
            let xu: Vec<i32> = xq.iter().map(|&v| v + 128).collect();
            let qw = QuantWeight {
                raw: &raw,
                scales: F32s::Decoded(Arc::new(scales.clone())),
                biases: F32s::Decoded(Arc::new(biases.clone())),
                four: true,
                row_bytes: k / 2,
                groups,
            };
            let chunk = 16;
            let ks = q4_ksums(&qw, [k, n], group);
            // The GPU's ksums at load, from the bytes: the same values.
            let sb: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(xnn_q4_ksums(&raw, &sb, [k, n], group), Some(ks.clone()));
            // Sizes that do not fit are refused, not read past.
            assert_eq!(xnn_q4_ksums(&raw[1..], &sb, [k, n], group), None);
            assert_eq!(xnn_q4_ksums(&raw, &sb[4..], [k, n], group), None);
            assert_eq!(xnn_q4_ksums(&raw, &sb, [k, usize::MAX], group), None);
            assert_eq!(xnn_q4_ksums(&raw, &sb, [k + 16, n], group), None);
            assert_eq!(xnn_q4_ksums(&raw, &sb, [k, n], 0), None);
            let got = linear_q4_pairs(&qw, &xq, &params, [m, k, n], group, &ks);
            // The unpacking form, element by element.
            let mut want = vec![0f32; m * n];
            for j in 0..n {
                let (q, s, b) = qw.row(j);
                let wq: Vec<i32> = (0..k)
                    .map(|c| {
                        (if c % 2 == 0 {
                            q[c / 2] & 0xF
                        } else {
                            q[c / 2] >> 4
                        }) as i32
                            - 8
                    })
                    .collect();
                let mut ksum = 0f32;
                for (c, wc) in wq.chunks_exact(chunk).enumerate() {
                    ksum -= wc.iter().sum::<i32>() as f32 * s[c * chunk / group];
                }
                for (i, &(inv, zp)) in params.iter().enumerate() {
                    let zp = zp + 128;
                    let xr = &xu[i * k..(i + 1) * k];
                    let (mut y, mut rest_sum) = (ksum * zp as f32, 0f32);
                    for (g, (xg, wg)) in xr
                        .chunks_exact(group)
                        .zip(wq.chunks_exact(group))
                        .enumerate()
                    {
                        let acc: i32 = xg.iter().zip(wg).map(|(&a, &w)| a * w).sum();
                        y = (acc as f32).mul_add(s[g], y);
                        let rest = b[g] + 8.0 * s[g];
                        if rest != 0.0 {
                            rest_sum += rest * xg.iter().map(|&v| v - zp).sum::<i32>() as f32;
                        }
                    }
                    want[i * n + j] = (y + rest_sum) * inv;
                }
            }
            assert_eq!(got, want, "m {m} k {k} n {n} group {group}");
            // The portable row kernel, whichever one `linear_q4_pairs` picked on this CPU.
            let (cols, gsum) = pair_columns(&xq, k, group);
            let px = PairedX {
                cols: &cols,
                gsum: &gsum,
                params: &params,
                k,
                group,
            };
            for j in 0..n {
                let mut col = vec![0f32; m];
                q4_pairs_row_with(&px, ks[j], qw.row(j), &mut col, &Portable);
                let want_col: Vec<f32> = (0..m).map(|i| want[i * n + j]).collect();
                assert_eq!(col, want_col, "portable row {j}");
            }
        }
    }

    /// 15 · 255 / 34 = 112.5: torchao's `x / (range / 255)` lands just under the tie and
    /// XNNPACK's `x · (255 / range)` on it (then to even), one level apart.
    #[test]
    fn xnnpack_and_torchao_round_a_tie_differently() {
        let row = [5.55f32, 0.74, -7.03];
        let (mut t, mut x) = (row, row);
        quant_dequant_row(&mut t);
        quant_dequant_row_xnnpack(&mut x);
        let (mn, mx) = (-7.03f32, 5.55f32);
        assert_eq!((t[0] / ((mx - mn) / 255.0)).round(), 112.0);
        assert_eq!((x[0] * (255.0 / (mx - mn))).round(), 113.0);
    }
}
