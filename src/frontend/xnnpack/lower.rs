//! Lowers a parsed `XnnGraph` into the IR. Each XNNPACK node kind maps to IR ops in one match arm;
//! quantized filters are re-expressed in the IR's canonical quantized form at load (derived
//! constants), and a dynamic int8 `Convert` is folded into the fully-connected node it feeds.
//! Nothing here knows which model the graph came from: the parser (`super::parse`) supplies a
//! validated graph, the executors downstream run the result.

use super::{
    Concatenate, Datatype, FullyConnected, NodeKind, OutputMinMax, QuantParams, StaticConstantPad,
    StaticSlice, XNode, XValue, XnnGraph,
};
use crate::ir::{
    ActQuant, BinaryOp, DType, Graph, Int, Io, Node, OpKind, Role, SymOp, TensorId, UnaryOp, Weight,
};
use crate::pte::{Blob, Bytes};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// XNNPACK's `XNN_FLAG_TRANSPOSE_WEIGHTS` (fully connected) and `XNN_FLAG_TRANSPOSE_B` (batch
/// matrix multiply): the second operand is stored `[K, N]` instead of `[N, K]`.
const FLAG_TRANSPOSE_WEIGHTS: u32 = 1;
/// `XNN_FLAG_KEEP_DIMS` (global average pooling).
const FLAG_KEEP_DIMS: u32 = 0x40;

fn owned(bytes: Vec<u8>) -> Blob {
    Blob::whole(Arc::new(Bytes::Owned(bytes)))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The IR dtype of a dense XNNPACK value, or None for quantized ones.
fn dtype(d: Datatype) -> Option<DType> {
    match d {
        Datatype::Fp32 => Some(DType::F32),
        Datatype::Fp16 => Some(DType::F16),
        Datatype::Bf16 => Some(DType::BF16),
        Datatype::Int32 => Some(DType::I32),
        _ => None,
    }
}

/// Node kinds with a lowering; the rest are reported together before anything is lowered.
fn supported(k: &NodeKind) -> bool {
    use NodeKind::*;
    !matches!(
        k,
        Conv2d(_)
            | DepthwiseConv2d(_)
            | ConvTranspose2d(_)
            | AvgPooling2d(_)
            | MaxPooling2d(_)
            | ArgMaxPooling2d(_)
            | StaticResizeBilinear2d(_)
            | ScaledDotProductAttention(_)
    )
}

struct Lower<'a> {
    x: &'a XnnGraph,
    g: Graph,
    /// XNNPACK value id → IR tensor, for every dense value.
    map: BTreeMap<u32, TensorId>,
    /// qdint8 value id → the fp32 value its `Convert` quantizes.
    dynamic: BTreeMap<u32, u32>,
    /// Quantized filter value id → its IR weight tensors, built on first use.
    filters: BTreeMap<u32, (Weight, Vec<TensorId>)>,
    /// Tensors that hold a value when the node being lowered runs.
    defined: BTreeSet<TensorId>,
}

/// Lowers the whole graph; an error lists every unsupported node kind at once.
pub fn lower(x: &XnnGraph) -> Result<Graph, String> {
    let unsupported: BTreeSet<&str> = x
        .nodes
        .iter()
        .filter(|n| !supported(&n.kind))
        .map(|n| n.kind.name())
        .collect();
    if !unsupported.is_empty() {
        return Err(format!(
            "XNNPACK nodes not supported yet: {}",
            unsupported.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let mut l = Lower {
        x,
        g: Graph::default(),
        map: BTreeMap::new(),
        dynamic: BTreeMap::new(),
        filters: BTreeMap::new(),
        defined: BTreeSet::new(),
    };
    l.dynamic_quant()?;
    l.values()?;
    l.inputs()?;
    for (i, n) in x.nodes.iter().enumerate() {
        l.node(n)
            .map_err(|e| format!("xnodes[{i}] ({}): {e}", n.kind.name()))?;
    }
    l.outputs()?;
    Ok(l.g)
}

impl Lower<'_> {
    fn value(&self, id: u32) -> Result<&XValue, String> {
        self.x
            .value(id)
            .ok_or_else(|| format!("value {id} does not exist"))
    }

    /// Finds every per-token dynamically quantized value and checks that it is only ever the
    /// activation of a fully-connected node: those nodes take `act_quant`, and the `Convert`
    /// that produced the value disappears.
    fn dynamic_quant(&mut self) -> Result<(), String> {
        for n in &self.x.nodes {
            let NodeKind::Convert(c) = &n.kind else {
                continue;
            };
            let out = self.value(c.output_id)?;
            if !matches!(out.quant, Some(QuantParams::PerTokenDynamic(_))) {
                continue;
            }
            let src = self.value(c.input_id)?;
            if src.tensor.datatype != Datatype::Fp32 {
                return Err(format!(
                    "value {}: dynamic quantization of {} (only fp32 is supported)",
                    c.output_id,
                    src.tensor.datatype.name()
                ));
            }
            if out.tensor.external_id.is_some() {
                return Err(format!(
                    "value {}: a dynamically quantized value cannot be a delegate output",
                    c.output_id
                ));
            }
            if self.dynamic.insert(c.output_id, c.input_id).is_some() {
                return Err(format!(
                    "value {} is written by two Convert nodes",
                    c.output_id
                ));
            }
        }
        for n in &self.x.nodes {
            for (field, id) in n.kind.input_fields() {
                if !self.dynamic.contains_key(&id) {
                    continue;
                }
                let ok = matches!(&n.kind, NodeKind::FullyConnected(fc) if fc.input1_id == id && field == "input1_id");
                if !ok {
                    return Err(format!(
                        "value {id} (dynamically quantized int8) feeds {}.{field}; only fully-connected \
                         activations can be dynamically quantized",
                        n.kind.name()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Creates an IR tensor for every dense value; quantized filters wait for their node.
    fn values(&mut self) -> Result<(), String> {
        for v in &self.x.values {
            let t = &v.tensor;
            let Some(dt) = dtype(t.datatype) else {
                continue;
            };
            let role = match &t.data {
                Some(b) => Role::Constant(b.clone()),
                None => Role::Activation,
            };
            let constant = matches!(role, Role::Constant(_));
            let shape = t.dims.iter().map(|&d| d as usize).collect();
            let id = self.g.add_tensor(format!("v{}", t.id_out), dt, shape, role);
            if constant {
                self.defined.insert(id);
            }
            self.map.insert(t.id_out, id);
        }
        Ok(())
    }

    /// External values in the delegate call's argument order. ExecuTorch passes `args[k]` as the
    /// value whose `external_id` is k (`XNNExecutor::prepare_args`), inputs before outputs.
    fn externals(&self, flag_input: bool) -> Result<Vec<(u32, u32)>, String> {
        let ids = if flag_input {
            &self.x.input_ids
        } else {
            &self.x.output_ids
        };
        let mut ext = Vec::with_capacity(ids.len());
        for &id in ids {
            let v = self.value(id)?;
            let e = v
                .tensor
                .external_id
                .ok_or_else(|| format!("external value {id} has no external_id"))?;
            ext.push((e, id));
        }
        ext.sort_unstable();
        Ok(ext)
    }

    fn inputs(&mut self) -> Result<(), String> {
        for (k, (e, id)) in self.externals(true)?.into_iter().enumerate() {
            if e as usize != k {
                return Err(format!(
                    "external inputs have ids {:?}; the delegate call passes them as arguments 0..{}",
                    self.externals(true)?.iter().map(|p| p.0).collect::<Vec<_>>(),
                    self.x.input_ids.len()
                ));
            }
            let t = self.dense(id)?;
            if matches!(self.g.tensors[t].role, Role::Constant(_)) {
                return Err(format!("external input {id} is also a constant"));
            }
            self.g.tensors[t].role = Role::Input(k);
            self.g.inputs.push(Io::Tensor(t));
            self.defined.insert(t);
        }
        Ok(())
    }

    fn outputs(&mut self) -> Result<(), String> {
        let n_in = self.x.input_ids.len();
        for (j, (e, id)) in self.externals(false)?.into_iter().enumerate() {
            if e as usize != n_in + j {
                return Err(format!(
                    "external output {id} has external_id {e}; outputs must follow the {n_in} inputs in order"
                ));
            }
            let mut t = self.dense(id)?;
            self.check_defined(t, id)?;
            // An output must be a tensor the graph writes, so a passed-through input or a
            // constant is copied.
            if !matches!(self.g.tensors[t].role, Role::Activation) {
                let def = self.g.tensors[t].clone();
                let y = self.g.add_tensor(
                    format!("v{id}.out"),
                    def.dtype,
                    def.max_shape,
                    Role::Activation,
                );
                self.g.op(OpKind::Copy, vec![t], vec![y]);
                t = y;
            }
            if self.g.outputs.contains(&t) {
                return Err(format!("value {id} is listed as two outputs"));
            }
            self.g.outputs.push(t);
        }
        Ok(())
    }

    /// The IR tensor of a dense (non-quantized) value.
    fn dense(&self, id: u32) -> Result<TensorId, String> {
        if let Some(&t) = self.map.get(&id) {
            return Ok(t);
        }
        let v = self.value(id)?;
        Err(format!(
            "value {id} is {}{}, which this front end cannot use here",
            v.tensor.datatype.name(),
            v.quant
                .as_ref()
                .map(|q| format!(" ({})", q.name()))
                .unwrap_or_default()
        ))
    }

    fn check_defined(&self, t: TensorId, id: u32) -> Result<(), String> {
        if self.defined.contains(&t) {
            Ok(())
        } else {
            Err(format!("value {id} is read before any node writes it"))
        }
    }

    /// A dense value that must already hold data (input, constant or an earlier node's output).
    fn input(&self, id: u32) -> Result<TensorId, String> {
        let t = self.dense(id)?;
        self.check_defined(t, id)?;
        Ok(t)
    }

    /// A dense value a node writes; each is written once.
    fn output(&mut self, id: u32) -> Result<TensorId, String> {
        let t = self.dense(id)?;
        if !matches!(self.g.tensors[t].role, Role::Activation) || !self.defined.insert(t) {
            return Err(format!(
                "value {id} is written twice, or is an input or constant"
            ));
        }
        Ok(t)
    }

    fn rank(&self, t: TensorId) -> usize {
        self.g.tensors[t].max_shape.len()
    }

    fn temp(&mut self, like: TensorId, what: &str) -> TensorId {
        let d = &self.g.tensors[like];
        let (dt, shape) = (d.dtype, d.max_shape.clone());
        let name = format!("{}.{what}", d.name);
        self.g.add_tensor(name, dt, shape, Role::Activation)
    }

    /// Emits `kind` writing value `out`, followed by the node's fused output clamp if it has one.
    fn emit(
        &mut self,
        n: &XNode,
        kind: OpKind,
        ins: Vec<TensorId>,
        out: u32,
    ) -> Result<(), String> {
        let y = self.output(out)?;
        match clamp_of(n.output_min_max) {
            Some(c) => {
                let tmp = self.temp(y, "unclamped");
                self.g.op(kind, ins, vec![tmp]);
                self.g.op(c, vec![tmp], vec![y]);
            }
            None => self.g.op(kind, ins, vec![y]),
        }
        Ok(())
    }

    fn unary(&mut self, n: &XNode, u: &super::Unary, op: UnaryOp) -> Result<(), String> {
        let x = self.input(u.input_id)?;
        self.emit(n, OpKind::Unary(op), vec![x], u.output_id)
    }

    fn binary(&mut self, n: &XNode, b: &super::Binary, op: BinaryOp) -> Result<(), String> {
        let (x, y) = (self.input(b.input1_id)?, self.input(b.input2_id)?);
        self.emit(n, OpKind::Binary(op), vec![x, y], b.output_id)
    }

    /// `(max(x, 0), min(x, 0))`: the halves LeakyReLU, PReLU and ELU treat apart.
    fn split_sign(&mut self, x: TensorId) -> (TensorId, TensorId) {
        let pos = self.temp(x, "pos");
        let neg = self.temp(x, "neg");
        let clamp = |min, max| OpKind::Clamp { min, max };
        self.g.op(clamp(Some(0.0), None), vec![x], vec![pos]);
        self.g.op(clamp(None, Some(0.0)), vec![x], vec![neg]);
        (pos, neg)
    }

    /// `y = x op scalar`.
    fn scalar_op(&mut self, op: BinaryOp, scalar: f64, x: TensorId, y: TensorId) {
        let kind = OpKind::BinaryScalar {
            op,
            scalar,
            scalar_first: false,
        };
        self.g.op(kind, vec![x], vec![y]);
    }

    /// `max(x, 0) + slope · min(x, 0)`, the shared form of LeakyReLU and PReLU.
    fn leaky(
        &mut self,
        n: &XNode,
        x: TensorId,
        slope: Result<f32, TensorId>,
        out: u32,
    ) -> Result<(), String> {
        let (pos, neg) = self.split_sign(x);
        let scaled = self.temp(x, "scaled");
        match slope {
            Ok(s) => self.scalar_op(BinaryOp::Mul, s as f64, neg, scaled),
            Err(t) => self
                .g
                .op(OpKind::Binary(BinaryOp::Mul), vec![neg, t], vec![scaled]),
        }
        self.emit(n, OpKind::Binary(BinaryOp::Add), vec![pos, scaled], out)
    }

    /// A host symbol holding the current size of `t`'s dim `d`.
    fn size_sym(&mut self, t: TensorId, d: usize) -> Int {
        let s = self.g.add_sym(format!("size(t{t},{d})"));
        self.g.nodes.push(Node::Sym(SymOp::Size {
            out: s,
            tensor: t,
            dim: d,
        }));
        Int::Sym(s)
    }

    fn node(&mut self, n: &XNode) -> Result<(), String> {
        use NodeKind as K;
        match &n.kind {
            K::Add(b) => self.binary(n, b, BinaryOp::Add)?,
            K::Subtract(b) => self.binary(n, b, BinaryOp::Sub)?,
            K::Multiply(b) => self.binary(n, b, BinaryOp::Mul)?,
            K::Div(b) => self.binary(n, b, BinaryOp::Div)?,
            K::Maximum(b) => self.binary(n, b, BinaryOp::Max)?,
            K::Minimum(b) => self.binary(n, b, BinaryOp::Min)?,
            K::Prelu(b) => {
                let (x, slope) = (self.input(b.input1_id)?, self.input(b.input2_id)?);
                self.leaky(n, x, Err(slope), b.output_id)?;
            }
            K::Sigmoid(u) => self.unary(n, u, UnaryOp::Sigmoid)?,
            K::Floor(u) => self.unary(n, u, UnaryOp::Floor)?,
            K::Ceiling(u) => self.unary(n, u, UnaryOp::Ceil)?,
            K::SquareRoot(u) => self.unary(n, u, UnaryOp::Sqrt)?,
            K::ReciprocalSquareRoot(u) => self.unary(n, u, UnaryOp::Rsqrt)?,
            K::Negate(u) => self.unary(n, u, UnaryOp::Neg)?,
            K::Square(u) => self.unary(n, u, UnaryOp::Square)?,
            K::Abs(u) => self.unary(n, u, UnaryOp::Abs)?,
            K::Log(u) => self.unary(n, u, UnaryOp::Log)?,
            K::Exp(u) => self.unary(n, u, UnaryOp::Exp)?,
            K::Tanh(u) => self.unary(n, u, UnaryOp::Tanh)?,
            K::Sin(u) => self.unary(n, u, UnaryOp::Sin)?,
            K::Cos(u) => self.unary(n, u, UnaryOp::Cos)?,
            // XNNPACK's GELU is the exact (erf) form whatever `approximate` the model asked for;
            // the ExecuTorch partitioner does not look at it.
            K::Gelu(u) => self.unary(n, u, UnaryOp::Gelu)?,
            K::Hardswish(u) => {
                // x · clamp(x + 3, 0, 6) / 6
                let x = self.input(u.input_id)?;
                let (a, b, c) = (
                    self.temp(x, "plus3"),
                    self.temp(x, "relu6"),
                    self.temp(x, "gate"),
                );
                self.scalar_op(BinaryOp::Add, 3.0, x, a);
                self.g.op(
                    OpKind::Clamp {
                        min: Some(0.0),
                        max: Some(6.0),
                    },
                    vec![a],
                    vec![b],
                );
                self.scalar_op(BinaryOp::Div, 6.0, b, c);
                self.emit(n, OpKind::Binary(BinaryOp::Mul), vec![x, c], u.output_id)?;
            }
            K::LeakyRelu(r) => {
                let x = self.input(r.input_id)?;
                self.leaky(n, x, Ok(r.negative_slope), r.output_id)?;
            }
            K::Elu(e) => {
                // max(x, 0) + alpha · (exp(min(x, 0)) - 1)
                let x = self.input(e.input_id)?;
                let (pos, neg) = self.split_sign(x);
                let (ex, em1, sc) = (
                    self.temp(x, "exp"),
                    self.temp(x, "expm1"),
                    self.temp(x, "scaled"),
                );
                self.g.op(OpKind::Unary(UnaryOp::Exp), vec![neg], vec![ex]);
                self.scalar_op(BinaryOp::Sub, 1.0, ex, em1);
                self.scalar_op(BinaryOp::Mul, e.alpha as f64, em1, sc);
                self.emit(n, OpKind::Binary(BinaryOp::Add), vec![pos, sc], e.output_id)?;
            }
            K::Clamp(u) => {
                let x = self.input(u.input_id)?;
                let y = self.output(u.output_id)?;
                let kind = clamp_of(n.output_min_max).unwrap_or(OpKind::Copy);
                self.g.op(kind, vec![x], vec![y]);
            }
            K::Copy(u) => {
                let x = self.input(u.input_id)?;
                self.emit(n, OpKind::Copy, vec![x], u.output_id)?;
            }
            K::Convert(u) => {
                if self.dynamic.contains_key(&u.output_id) {
                    // Folded into the fully-connected nodes that read the quantized value.
                    return Ok(());
                }
                let x = self.input(u.input_id)?;
                let y = self.output(u.output_id)?;
                let (a, b) = (self.g.tensors[x].dtype, self.g.tensors[y].dtype);
                if !(a.is_float() && b.is_float()) {
                    return Err(format!(
                        "conversion from {} to {} is not supported",
                        a.name(),
                        b.name()
                    ));
                }
                self.g.op(OpKind::Cast, vec![x], vec![y]);
            }
            K::Softmax(u) => {
                let x = self.input(u.input_id)?;
                self.emit(n, OpKind::Softmax, vec![x], u.output_id)?;
            }
            K::GlobalAvgPooling2d(u) => {
                // NHWC: average over H and W.
                let x = self.input(u.input_id)?;
                if self.rank(x) != 4 {
                    return Err(format!(
                        "input {:?} is not 4-D NHWC",
                        self.g.tensors[x].max_shape
                    ));
                }
                let kind = OpKind::Mean {
                    dims: vec![1, 2],
                    keepdim: u.flags & FLAG_KEEP_DIMS != 0,
                };
                self.emit(n, kind, vec![x], u.output_id)?;
            }
            K::FullyConnected(fc) => self.fully_connected(n, fc)?,
            K::BatchMatrixMultiply(b) => {
                let (a, mut w) = (self.input(b.input1_id)?, self.input(b.input2_id)?);
                if self.rank(a) < 2 || self.rank(w) < 2 {
                    return Err("operands must have at least 2 dims".into());
                }
                if b.flags & FLAG_TRANSPOSE_WEIGHTS != 0 {
                    w = self.transposed(w);
                }
                self.emit(
                    n,
                    OpKind::MatMul { transpose_b: false },
                    vec![a, w],
                    b.output_id,
                )?;
            }
            K::StaticTranspose(t) => {
                let x = self.input(t.input_id)?;
                let r = self.rank(x);
                let perm: Vec<usize> = t.perm.iter().map(|&p| p as usize).collect();
                let mut seen = perm.clone();
                seen.sort_unstable();
                if seen != (0..r).collect::<Vec<_>>() {
                    return Err(format!("perm {perm:?} is not a permutation of {r} dims"));
                }
                self.emit(n, OpKind::Permute { perm }, vec![x], t.output_id)?;
            }
            K::StaticReshape(r) => {
                let x = self.input(r.input_id)?;
                // XNNPACK infers a 0 dimension; the IR spells that -1.
                if r.new_shape.iter().filter(|&&d| d == 0).count() > 1 {
                    return Err(format!(
                        "new_shape {:?} infers more than one dimension",
                        r.new_shape
                    ));
                }
                let shape = r
                    .new_shape
                    .iter()
                    .map(|&d| Int::Lit(if d == 0 { -1 } else { d as i64 }))
                    .collect();
                self.emit(n, OpKind::Reshape { shape }, vec![x], r.output_id)?;
            }
            K::StaticSlice(s) => self.slice(n, s)?,
            K::Concatenate2(c) | K::Concatenate3(c) | K::Concatenate4(c) | K::Concatenate5(c) => {
                self.concat(n, c)?
            }
            K::StaticConstantPad(p) => self.pad(n, p)?,
            K::Conv2d(_)
            | K::DepthwiseConv2d(_)
            | K::ConvTranspose2d(_)
            | K::AvgPooling2d(_)
            | K::MaxPooling2d(_)
            | K::ArgMaxPooling2d(_)
            | K::StaticResizeBilinear2d(_)
            | K::ScaledDotProductAttention(_) => return Err("has no lowering".into()),
        }
        Ok(())
    }

    /// `x` with its last two dims swapped.
    fn transposed(&mut self, x: TensorId) -> TensorId {
        let r = self.rank(x);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let mut shape = self.g.tensors[x].max_shape.clone();
        shape.swap(r - 2, r - 1);
        let t = self.temp(x, "t");
        self.g.tensors[t].max_shape = shape;
        self.g.op(OpKind::Permute { perm }, vec![x], vec![t]);
        t
    }

    fn fully_connected(&mut self, n: &XNode, fc: &FullyConnected) -> Result<(), String> {
        let (src, act_quant) = match self.dynamic.get(&fc.input1_id) {
            Some(&s) => (s, true),
            None => (fc.input1_id, false),
        };
        let x = self.input(src)?;
        let transposed = fc.flags & FLAG_TRANSPOSE_WEIGHTS != 0;
        let k = *self.g.tensors[x].max_shape.last().ok_or("scalar input")?;
        let bias = match fc.bias_id {
            Some(b) => Some(self.input(b)?),
            None => None,
        };
        let filter = self.value(fc.filter_id)?;
        let (weight, mut ins) = if filter.quant.is_some() {
            if transposed {
                return Err("quantized filters stored [K, N] (XNN_FLAG_TRANSPOSE_WEIGHTS) are not supported".into());
            }
            self.quantized_filter(fc.filter_id)?
        } else if filter.tensor.data.is_some() {
            (
                Weight::F32,
                vec![self.f32_filter(fc.filter_id, transposed)?],
            )
        } else {
            // A computed filter: a plain matrix product (`aten.mm` lowers this way).
            let mut w = self.input(fc.filter_id)?;
            if act_quant {
                return Err(
                    "a dynamically quantized input with a computed filter is not supported".into(),
                );
            }
            if self.rank(x) < 2 || self.rank(w) != 2 {
                return Err(
                    "a computed filter needs a 2-D filter and an input of at least 2 dims".into(),
                );
            }
            if !transposed {
                w = self.transposed(w);
            }
            let Some(b) = bias else {
                return self.emit(
                    n,
                    OpKind::MatMul { transpose_b: false },
                    vec![x, w],
                    fc.output_id,
                );
            };
            let mm = self.temp(self.dense(fc.output_id)?, "mm");
            self.g
                .op(OpKind::MatMul { transpose_b: false }, vec![x, w], vec![mm]);
            return self.emit(n, OpKind::Binary(BinaryOp::Add), vec![mm, b], fc.output_id);
        };
        let cols = match (weight, &self.g.tensors[ins[0]].max_shape[..]) {
            (Weight::Q4 { .. }, [_, c]) => c * 2,
            (_, [_, c]) => *c,
            (_, s) => return Err(format!("filter {s:?} is not 2-D")),
        };
        if cols != k {
            return Err(format!(
                "filter has K = {cols} but the input's last dim is {k}"
            ));
        }
        ins.insert(0, x);
        ins.extend(bias);
        let kind = OpKind::Linear {
            weight,
            // XNNPACK rounds its qd8 activations its own way (see `ActQuant::Xnnpack`).
            act_quant: if act_quant {
                ActQuant::Xnnpack
            } else {
                ActQuant::None
            },
            has_bias: bias.is_some(),
        };
        self.emit(n, kind, ins, fc.output_id)
    }

    /// A constant float filter as f32 `[N, K]`: zero-copy when it already is, else converted once.
    fn f32_filter(&mut self, id: u32, transposed: bool) -> Result<TensorId, String> {
        let t = self.dense(id)?;
        let def = self.g.tensors[t].clone();
        let [r, c] = def.max_shape[..] else {
            return Err(format!("filter {:?} is not 2-D", def.max_shape));
        };
        if def.dtype == DType::F32 && !transposed {
            return Ok(t);
        }
        let Role::Constant(b) = &def.role else {
            return Err("filter is not a constant".into());
        };
        if !def.dtype.is_float() {
            return Err(format!("{} filter", def.dtype.name()));
        }
        let v = crate::runtime::tensor::to_f32(def.dtype, b);
        let (n, k) = if transposed { (c, r) } else { (r, c) };
        let w: Vec<f32> = if transposed {
            (0..n)
                .flat_map(|i| (0..k).map(move |j| (i, j)))
                .map(|(i, j)| v[j * n + i])
                .collect()
        } else {
            v.into_owned()
        };
        Ok(self.g.add_tensor(
            format!("v{id}.f32"),
            DType::F32,
            vec![n, k],
            Role::Constant(owned(f32_bytes(&w))),
        ))
    }

    /// A quantized constant filter in the IR's canonical form: `(weight, [packed, scales, biases])`
    /// with scales and biases f32 `[N, K / group]` and `w = scale · q + bias`.
    fn quantized_filter(&mut self, id: u32) -> Result<(Weight, Vec<TensorId>), String> {
        if let Some(f) = self.filters.get(&id) {
            return Ok(f.clone());
        }
        let v = self.value(id)?;
        let t = &v.tensor;
        let Some(data) = t.data.clone() else {
            return Err(format!("quantized filter {id} is not a constant"));
        };
        let [n, k] = t.dims[..] else {
            return Err(format!(
                "quantized filter {id} has dims {:?}, expected [N, K]",
                t.dims
            ));
        };
        let (n, k) = (n as usize, k as usize);
        let name = format!("v{id}");
        let (weight, packed, scales, biases) = match (t.datatype, &v.quant) {
            // Blockwise int4, stored +8 (XNNCompiler defines qbint4 with zero point 8); bytes
            // already match the IR's layout (element 2j in the low nibble).
            (Datatype::Qbint4, Some(QuantParams::PerChannelGroup(p))) => {
                let group = p.group_size as usize;
                if p.channel_dim != 0 || group == 0 || k % group != 0 || k % 2 != 0 {
                    return Err(format!("qbint4 filter {id} [{n}, {k}] with group size {group} is not [N, K] in whole groups"));
                }
                let s = p.scales_f32();
                if s.len() != n * (k / group) {
                    return Err(format!(
                        "qbint4 filter {id}: {} scales for [{n}, {k}] in groups of {group}",
                        s.len()
                    ));
                }
                let b = s.iter().map(|s| -8.0 * s).collect();
                let packed = self.g.add_tensor(
                    name.clone(),
                    DType::U8,
                    vec![n, k / 2],
                    Role::Constant(data),
                );
                (Weight::Q4 { group }, packed, s, b)
            }
            (Datatype::Qcint4 | Datatype::Qcint8, Some(QuantParams::PerChannel(p))) => {
                let s = p.scales_f32();
                if p.channel_dim != 0 || s.len() != n {
                    return Err(format!(
                        "per-channel filter {id} [{n}, {k}]: {} scales along dim {}, expected {n} along dim 0",
                        s.len(),
                        p.channel_dim
                    ));
                }
                if t.datatype == Datatype::Qcint8 {
                    let packed = self.g.add_tensor(
                        name.clone(),
                        DType::I8,
                        vec![n, k],
                        Role::Constant(data),
                    );
                    (Weight::Q8 { group: k }, packed, s, vec![0.0; n])
                } else if k % 2 == 0 {
                    // qcint4 is stored +8 like qbint4 (zero point 8).
                    let b = s.iter().map(|s| -8.0 * s).collect();
                    let packed = self.g.add_tensor(
                        name.clone(),
                        DType::U8,
                        vec![n, k / 2],
                        Role::Constant(data),
                    );
                    (Weight::Q4 { group: k }, packed, s, b)
                } else {
                    // Odd K pads each packed row by a nibble, which the IR's 4-bit layout has no
                    // room for: widen to signed 8-bit instead.
                    let row = k.div_ceil(2);
                    let q: Vec<u8> = (0..n * k)
                        .map(|i| {
                            let byte = data[(i / k) * row + (i % k) / 2];
                            let nib = if (i % k) % 2 == 0 {
                                byte & 0xF
                            } else {
                                byte >> 4
                            };
                            (nib as i8 - 8) as u8
                        })
                        .collect();
                    let packed = self.g.add_tensor(
                        name.clone(),
                        DType::I8,
                        vec![n, k],
                        Role::Constant(owned(q)),
                    );
                    (Weight::Q8 { group: k }, packed, s, vec![0.0; n])
                }
            }
            (dt, q) => {
                return Err(format!(
                    "filter {id}: {}{} is not a supported weight format",
                    dt.name(),
                    q.as_ref()
                        .map(|q| format!(" with {}", q.name()))
                        .unwrap_or_default()
                ))
            }
        };
        let groups = scales.len() / n.max(1);
        let st = self.g.add_tensor(
            format!("{name}.scales"),
            DType::F32,
            vec![n, groups],
            Role::Constant(owned(f32_bytes(&scales))),
        );
        let bt = self.g.add_tensor(
            format!("{name}.biases"),
            DType::F32,
            vec![n, groups],
            Role::Constant(owned(f32_bytes(&biases))),
        );
        let out = (weight, vec![packed, st, bt]);
        self.filters.insert(id, out.clone());
        Ok(out)
    }

    /// `offsets`/`sizes` per dim; a size of 0 (or one reaching past the bound) takes the rest.
    fn slice(&mut self, n: &XNode, s: &StaticSlice) -> Result<(), String> {
        let mut x = self.input(s.input_id)?;
        let shape = self.g.tensors[x].max_shape.clone();
        if s.offsets.len() != shape.len() || s.sizes.len() != shape.len() {
            return Err(format!(
                "offsets {:?} / sizes {:?} do not match input {shape:?}",
                s.offsets, s.sizes
            ));
        }
        let cuts: Vec<(usize, i64, i64)> = (0..shape.len())
            .filter_map(|d| {
                let (o, z) = (s.offsets[d] as i64, s.sizes[d] as i64);
                let end = if z == 0 { i64::MAX } else { o + z };
                (o != 0 || end < shape[d] as i64).then_some((d, o, end))
            })
            .collect();
        let Some((&last, rest)) = cuts.split_last() else {
            return self.emit(n, OpKind::Copy, vec![x], s.output_id);
        };
        let slice = |(dim, o, end): (usize, i64, i64)| OpKind::Slice {
            dim,
            start: Int::Lit(o),
            end: Int::Lit(end),
            step: 1,
        };
        for &(d, o, end) in rest {
            let t = self.temp(x, "slice");
            self.g.tensors[t].max_shape[d] = (end.min(shape[d] as i64) - o).max(0) as usize;
            self.g.op(slice((d, o, end)), vec![x], vec![t]);
            x = t;
        }
        self.emit(n, slice(last), vec![x], s.output_id)
    }

    fn concat(&mut self, n: &XNode, c: &Concatenate) -> Result<(), String> {
        let ins = c
            .input_ids
            .iter()
            .map(|&i| self.input(i))
            .collect::<Result<Vec<_>, _>>()?;
        let r = ins.first().map_or(0, |&t| self.rank(t));
        let dim = c.axis as usize;
        if dim >= r || ins.iter().any(|&t| self.rank(t) != r) {
            return Err(format!("axis {dim} of rank-{r} inputs"));
        }
        self.emit(n, OpKind::Concat { dim }, ins, c.output_id)
    }

    /// Constant padding as concatenation with filled blocks, one dim at a time.
    fn pad(&mut self, n: &XNode, p: &StaticConstantPad) -> Result<(), String> {
        let mut x = self.input(p.input_id)?;
        let r = self.rank(x);
        if p.pre_paddings.len() != r || p.post_paddings.len() != r {
            return Err(format!(
                "{} / {} paddings for a rank-{r} input",
                p.pre_paddings.len(),
                p.post_paddings.len()
            ));
        }
        let dims: Vec<usize> = (0..r)
            .filter(|&d| p.pre_paddings[d] != 0 || p.post_paddings[d] != 0)
            .collect();
        if dims.is_empty() {
            return self.emit(n, OpKind::Copy, vec![x], p.output_id);
        }
        for (i, &d) in dims.iter().enumerate() {
            let mut parts = Vec::new();
            let mut bound = self.g.tensors[x].max_shape.clone();
            for (amount, before) in [(p.pre_paddings[d], true), (p.post_paddings[d], false)] {
                if amount == 0 {
                    continue;
                }
                let shape: Vec<Int> = (0..r)
                    .map(|j| {
                        if j == d {
                            Int::Lit(amount as i64)
                        } else {
                            self.size_sym(x, j)
                        }
                    })
                    .collect();
                let mut fshape = self.g.tensors[x].max_shape.clone();
                fshape[d] = amount as usize;
                let f = self.temp(x, "pad");
                self.g.tensors[f].max_shape = fshape;
                self.g.op(
                    OpKind::Full {
                        value: p.padding_value as f64,
                        shape,
                    },
                    vec![],
                    vec![f],
                );
                parts.push((before, f));
                bound[d] += amount as usize;
            }
            let mut ins: Vec<TensorId> = parts.iter().filter(|p| p.0).map(|p| p.1).collect();
            ins.push(x);
            ins.extend(parts.iter().filter(|p| !p.0).map(|p| p.1));
            if i + 1 == dims.len() {
                return self.emit(n, OpKind::Concat { dim: d }, ins, p.output_id);
            }
            let t = self.temp(x, "padded");
            self.g.tensors[t].max_shape = bound;
            self.g.op(OpKind::Concat { dim: d }, ins, vec![t]);
            x = t;
        }
        Ok(())
    }
}

/// The clamp an `OutputMinMax` asks for, or None when it is absent or unbounded.
fn clamp_of(m: Option<OutputMinMax>) -> Option<OpKind> {
    let m = m?;
    let min = (m.output_min > f32::NEG_INFINITY).then_some(m.output_min as f64);
    let max = (m.output_max < f32::INFINITY).then_some(m.output_max as f64);
    (min.is_some() || max.is_some()).then_some(OpKind::Clamp { min, max })
}

#[cfg(test)]
mod tests {
    use super::super::{
        Binary, PerChannelGroupQuant, PerChannelQuant, PerTokenDynamicQuant, StaticTranspose,
        TensorValue, Unary, XnnHeader,
    };
    use super::*;
    use crate::ir::cpu::CpuExecutor;
    use crate::ir::InputValue;

    fn header() -> XnnHeader {
        XnnHeader {
            length: 30,
            flatbuffer_offset: 32,
            flatbuffer_size: 0,
            constant_data_offset: 32,
            constant_data_size: 0,
        }
    }

    fn value(
        id: u32,
        datatype: Datatype,
        dims: &[u32],
        external: Option<(u32, u32)>,
        data: Option<Vec<u8>>,
    ) -> XValue {
        XValue {
            tensor: TensorValue {
                datatype,
                dims: dims.to_vec(),
                constant_buffer_idx: data.is_some() as u32,
                external_id: external.map(|e| e.0),
                flags: external.map_or(0, |e| e.1),
                id_out: id,
                data: data.map(owned),
            },
            quant: None,
        }
    }

    fn input(id: u32, ext: u32, dims: &[u32]) -> XValue {
        value(
            id,
            Datatype::Fp32,
            dims,
            Some((ext, super::super::FLAG_EXTERNAL_INPUT)),
            None,
        )
    }

    fn output(id: u32, ext: u32, dims: &[u32]) -> XValue {
        value(
            id,
            Datatype::Fp32,
            dims,
            Some((ext, super::super::FLAG_EXTERNAL_OUTPUT)),
            None,
        )
    }

    fn internal(id: u32, dims: &[u32]) -> XValue {
        value(id, Datatype::Fp32, dims, None, None)
    }

    /// A per-token dynamically quantized int8 value, as the 8da4w recipe makes a linear's input.
    fn dynamic_int8(id: u32, dims: &[u32]) -> XValue {
        let mut v = value(id, Datatype::Qdint8, dims, None, None);
        v.quant = Some(QuantParams::PerTokenDynamic(PerTokenDynamicQuant {
            num_nonbatch_dims: 1,
        }));
        v
    }

    /// The `Convert` that quantizes value `input` into `output`.
    fn quantize(input: u32, output: u32) -> XNode {
        node(NodeKind::Convert(Unary {
            input_id: input,
            output_id: output,
            flags: 0,
        }))
    }

    fn node(kind: NodeKind) -> XNode {
        XNode {
            kind,
            debug_handle: 0,
            output_min_max: None,
        }
    }

    fn graph(values: Vec<XValue>, nodes: Vec<XNode>) -> XnnGraph {
        let input_ids = values
            .iter()
            .filter(|v| v.tensor.is_external_input())
            .map(|v| v.id())
            .collect();
        let output_ids = values
            .iter()
            .filter(|v| v.tensor.is_external_output())
            .map(|v| v.id())
            .collect();
        let by_id = values
            .iter()
            .enumerate()
            .map(|(i, v)| (v.id(), i))
            .collect();
        XnnGraph {
            header: header(),
            version: String::new(),
            nodes,
            num_externs: values
                .iter()
                .filter(|v| v.tensor.external_id.is_some())
                .count() as u32,
            values,
            input_ids,
            output_ids,
            constant_data: Vec::new(),
            by_id,
        }
    }

    fn run(g: Graph, inputs: &[(&[usize], &[f32])]) -> Vec<Vec<f32>> {
        let bytes: Vec<Vec<u8>> = inputs.iter().map(|(_, v)| f32_bytes(v)).collect();
        let ins: Vec<InputValue> = inputs
            .iter()
            .zip(&bytes)
            .map(|((s, _), b)| InputValue::Tensor {
                shape: s.to_vec(),
                data: b,
            })
            .collect();
        let mut e = CpuExecutor::new(g).unwrap();
        e.run(&ins)
            .unwrap()
            .iter()
            .map(|t| crate::runtime::tensor::to_f32(t.dtype, &t.data).into_owned())
            .collect()
    }

    fn bf16(x: f32) -> [u8; 2] {
        ((x.to_bits() >> 16) as u16).to_le_bytes()
    }

    /// fp32 → qdint8 Convert, then FullyConnected on a qbint4 filter: one `linear[q4g32,dq8-xnn]`
    /// whose result is XNNPACK's per-row quant-dequant of x times `(nibble - 8) · scale`.
    #[test]
    fn dynamic_int8_convert_folds_into_a_blockwise_int4_linear() {
        let (n, k, group) = (3usize, 64usize, 32usize);
        let nibbles: Vec<u8> = (0..n * k).map(|i| ((i * 7 + 3) % 16) as u8).collect();
        let packed: Vec<u8> = nibbles.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
        let scales: Vec<f32> = (0..n * k / group).map(|i| 0.01 * (i + 1) as f32).collect();
        let mut filter = value(
            3,
            Datatype::Qbint4,
            &[n as u32, k as u32],
            None,
            Some(packed),
        );
        filter.quant = Some(QuantParams::PerChannelGroup(PerChannelGroupQuant {
            scale: Vec::new(),
            channel_dim: 0,
            group_size: group as i32,
            scale_bf16: Vec::new(),
            scale_buffer_idx: 2,
            num_scales: scales.len() as u32,
            scale_data: Some(owned(scales.iter().flat_map(|&s| bf16(s)).collect())),
        }));
        let qd = dynamic_int8(2, &[2, k as u32]);
        let x = graph(
            vec![
                input(1, 0, &[2, k as u32]),
                qd,
                filter,
                output(4, 1, &[2, n as u32]),
            ],
            vec![
                quantize(1, 2),
                node(NodeKind::FullyConnected(FullyConnected {
                    input1_id: 2,
                    filter_id: 3,
                    bias_id: None,
                    output_id: 4,
                    flags: 0,
                })),
            ],
        );
        let g = lower(&x).unwrap();
        assert_eq!(
            g.op_histogram().into_iter().collect::<Vec<_>>(),
            [("linear[q4g32,dq8-xnn]".to_string(), 1)]
        );

        let xs: Vec<f32> = (0..2 * k).map(|i| ((i as f32) * 0.37).sin()).collect();
        let got = run(g, &[(&[2, k], &xs)]);
        let mut want = Vec::new();
        for row in xs.chunks(k) {
            let mut r = row.to_vec();
            crate::ir::cpu::quant_dequant_row_xnnpack(&mut r);
            for o in 0..n {
                let w = |c: usize| {
                    (nibbles[o * k + c] as f32 - 8.0)
                        * f32::from_bits(
                            (u16::from_le_bytes(bf16(scales[o * 2 + c / group])) as u32) << 16,
                        )
                };
                want.push((0..k).map(|c| r[c] * w(c)).sum::<f32>());
            }
        }
        for (a, b) in got[0].iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    /// Per-channel int8 filters become `Weight::Q8` with one group per row and zero biases.
    #[test]
    fn per_channel_int8_filter_lowers_to_q8_with_row_scales() {
        let q: Vec<i8> = vec![1, -2, 3, -4, 5, -6];
        let mut filter = value(
            2,
            Datatype::Qcint8,
            &[2, 3],
            None,
            Some(q.iter().map(|&v| v as u8).collect()),
        );
        filter.quant = Some(QuantParams::PerChannel(PerChannelQuant {
            scale: vec![0.5, 0.25],
            channel_dim: 0,
            scale_buffer_idx: 0,
            num_scales: 2,
            scale_data: None,
        }));
        let bias = value(
            3,
            Datatype::Fp32,
            &[2],
            None,
            Some(f32_bytes(&[10.0, 20.0])),
        );
        let x = graph(
            vec![input(1, 0, &[1, 3]), filter, bias, output(4, 1, &[1, 2])],
            vec![node(NodeKind::FullyConnected(FullyConnected {
                input1_id: 1,
                filter_id: 2,
                bias_id: Some(3),
                output_id: 4,
                flags: 0,
            }))],
        );
        let g = lower(&x).unwrap();
        assert!(g.ops().any(|o| o.kind
            == OpKind::Linear {
                weight: Weight::Q8 { group: 3 },
                act_quant: ActQuant::None,
                has_bias: true
            }));
        let got = run(g, &[(&[1, 3], &[1.0, 1.0, 1.0])]);
        assert_eq!(got[0], [0.5 * 2.0 + 10.0, 0.25 * -5.0 + 20.0]);
    }

    /// The delegate passes `args[external_id]`, so graph inputs and outputs follow external ids
    /// rather than value ids or list order; a transposed fp32 filter is stored `[K, N]`.
    #[test]
    fn externals_follow_external_ids_and_transposed_filters_are_swapped() {
        let w = value(
            5,
            Datatype::Fp32,
            &[2, 3],
            None,
            Some(f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
        );
        let x = graph(
            vec![
                input(7, 1, &[1, 3]),
                input(8, 0, &[1, 2]),
                w,
                internal(9, &[1, 3]),
                output(4, 2, &[1, 3]),
            ],
            vec![
                node(NodeKind::FullyConnected(FullyConnected {
                    input1_id: 8,
                    filter_id: 5,
                    bias_id: None,
                    output_id: 9,
                    flags: FLAG_TRANSPOSE_WEIGHTS,
                })),
                node(NodeKind::Add(Binary {
                    input1_id: 9,
                    input2_id: 7,
                    output_id: 4,
                    flags: 0,
                })),
            ],
        );
        let got = run(
            lower(&x).unwrap(),
            &[(&[1, 2], &[1.0, 10.0]), (&[1, 3], &[0.5, 0.5, 0.5])],
        );
        assert_eq!(got[0], [41.5, 52.5, 63.5]);
    }

    #[test]
    fn output_min_max_clamps_the_node_result() {
        let mut add = node(NodeKind::Add(Binary {
            input1_id: 1,
            input2_id: 1,
            output_id: 2,
            flags: 0,
        }));
        add.output_min_max = Some(OutputMinMax {
            output_min: -1.0,
            output_max: 1.0,
        });
        let x = graph(vec![input(1, 0, &[3]), output(2, 1, &[3])], vec![add]);
        assert_eq!(
            run(lower(&x).unwrap(), &[(&[3], &[-3.0, 0.25, 3.0])])[0],
            [-1.0, 0.5, 1.0]
        );
    }

    #[test]
    fn unsupported_nodes_are_listed_together() {
        use super::super::{Conv, Pooling2d};
        let conv = Conv {
            padding_top: 0,
            padding_right: 0,
            padding_bottom: 0,
            padding_left: 0,
            kernel_height: 1,
            kernel_width: 1,
            subsampling_height: 1,
            subsampling_width: 1,
            dilation_height: 1,
            dilation_width: 1,
            group_input_channels: 1,
            group_output_channels: 1,
            groups: 1,
            adjustment_height: 0,
            adjustment_width: 0,
            input1_id: 1,
            filter_id: 1,
            bias_id: None,
            output_id: 2,
            flags: 0,
        };
        let pool = Pooling2d {
            padding_top: 0,
            padding_right: 0,
            padding_bottom: 0,
            padding_left: 0,
            pooling_height: 1,
            pooling_width: 1,
            stride_height: 1,
            stride_width: 1,
            dilation_height: 1,
            dilation_width: 1,
            input_id: 1,
            output_id: 2,
            flags: 0,
        };
        let x = graph(
            vec![input(1, 0, &[1, 1, 1, 1]), output(2, 1, &[1, 1, 1, 1])],
            vec![
                node(NodeKind::Conv2d(conv)),
                node(NodeKind::MaxPooling2d(pool.clone())),
                node(NodeKind::AvgPooling2d(pool)),
            ],
        );
        let err = lower(&x).unwrap_err();
        assert!(
            err.contains("XNNAvgPooling2d, XNNConv2d, XNNMaxPooling2d"),
            "{err}"
        );
    }

    #[test]
    fn dynamically_quantized_values_feeding_other_nodes_are_rejected() {
        let qd = dynamic_int8(2, &[1, 4]);
        let x = graph(
            vec![input(1, 0, &[1, 4]), qd, output(3, 1, &[4, 1])],
            vec![
                quantize(1, 2),
                node(NodeKind::StaticTranspose(StaticTranspose {
                    perm: vec![1, 0],
                    input_id: 2,
                    output_id: 3,
                    flags: 0,
                })),
            ],
        );
        let err = lower(&x).unwrap_err();
        assert!(err.contains("feeds XNNStaticTranspose.input_id"), "{err}");
    }

    #[test]
    fn reading_a_value_no_node_writes_is_an_error() {
        let x = graph(
            vec![input(1, 0, &[2]), internal(5, &[2]), output(2, 1, &[2])],
            vec![node(NodeKind::Add(Binary {
                input1_id: 1,
                input2_id: 5,
                output_id: 2,
                flags: 0,
            }))],
        );
        let err = lower(&x).unwrap_err();
        assert!(
            err.contains("value 5 is read before any node writes it"),
            "{err}"
        );
    }
}
