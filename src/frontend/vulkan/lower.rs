//! Lowers a parsed `VkGraph` into the IR. Each Vulkan operator name maps to IR ops in one match
//! arm; packed weights are re-expressed in the IR's canonical quantized form at load (derived
//! constants), and KV-cache constants become persistent `State` tensors.

use super::schema::{OperatorCall, VkDataType, VkGraph, VkValue};
use crate::ir::{
    self, AttnLayout, BinaryOp, DType, Graph, Int, Io, OpKind, Role, RopeStyle, SymArith, SymOp,
    TensorId, UnaryOp, Weight,
};
use crate::pte::{Blob, Bytes};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What a Vulkan value became in the IR.
#[derive(Debug, Clone)]
enum Mapped {
    Tensor(TensorId),
    Sym(usize),
    Int(i64),
    Double(f64),
    Bool(bool),
    Str(String),
    IntList(Vec<i64>),
    List(Vec<usize>),
    Null,
}

fn dtype(d: VkDataType) -> Result<DType, String> {
    Ok(match d {
        VkDataType::Float32 | VkDataType::Float64 => DType::F32,
        VkDataType::Float16 => DType::F16,
        VkDataType::Int32 | VkDataType::Int64 => DType::I32,
        VkDataType::Int8 => DType::I8,
        VkDataType::Uint8 => DType::U8,
        VkDataType::Bool => DType::Bool,
        VkDataType::Unset => return Err("tensor with an unset data type".into()),
    })
}

fn owned(bytes: Vec<u8>) -> Blob {
    Blob::whole(Arc::new(Bytes::Owned(bytes)))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `et_vk` ops that serializers also write without their namespace (a plain OpOverload's
/// `__name__`), canonically spelled with it.
const ET_VK_BARE: &[&str] = &[
    "select_as_symint.default",
    "linear_q4gsw.default",
    "linear_dq8ca_q4gsw.default",
    "embedding_q4gsw.default",
    "apply_rotary_emb.default",
    "apply_rotary_emb_hf.default",
    "prepack.default",
];

/// Normalises the spellings exports use (`aten.x.default`, bare fused names, `et_vk.` prefixes):
/// the gemma fork's ops are canonically bare (as the fork registers them first), other `et_vk`
/// ops canonically namespaced.
fn canonical(name: &str) -> std::borrow::Cow<'_, str> {
    let n = name.strip_prefix("llama.").unwrap_or(name);
    if let Some(r) = n.strip_prefix("et_vk.").filter(|r| r.starts_with("gemma_")) {
        return r.into();
    }
    if ET_VK_BARE.contains(&n) {
        return format!("et_vk.{n}").into();
    }
    n.into()
}

struct Lower<'a> {
    vk: &'a VkGraph,
    g: Graph,
    map: Vec<Mapped>,
}

/// Every operator name in the chain that has no lowering, as spelled in the blob, sorted.
pub fn unsupported(vk: &VkGraph) -> Vec<String> {
    let names: BTreeSet<&str> = vk
        .chain
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| !supported(&canonical(n)))
        .collect();
    names.into_iter().map(String::from).collect()
}

/// Lowers the whole graph; an error lists every unsupported operator at once.
pub fn lower(vk: &VkGraph) -> Result<Graph, String> {
    let unsupported = unsupported(vk);
    if !unsupported.is_empty() {
        return Err(format!(
            "VulkanBackend operators not supported yet: {}",
            unsupported.join(", ")
        ));
    }
    let mut l = Lower {
        vk,
        g: Graph::default(),
        map: vec![Mapped::Null; vk.values.len()],
    };
    l.values()?;
    for (i, call) in vk.chain.iter().enumerate() {
        l.op(call)
            .map_err(|e| format!("VkGraph operator call {i} (`{}`): {e}", call.name))?;
    }
    for (k, &id) in vk.input_ids.iter().enumerate() {
        let io = match &l.map[id] {
            Mapped::Tensor(t) => {
                l.g.tensors[*t].role = Role::Input(k);
                Io::Tensor(*t)
            }
            Mapped::Sym(s) => Io::Sym(*s),
            _ => {
                return Err(format!(
                    "VkGraph input {k} is neither a tensor nor a SymInt"
                ))
            }
        };
        l.g.inputs.push(io);
    }
    for (k, &id) in vk.output_ids.iter().enumerate() {
        match l.map[id] {
            Mapped::Sym(s) => l.g.sym_outputs.push((k, s)),
            _ => l.g.outputs.push(l.tensor(id)?),
        }
    }
    Ok(l.g)
}

fn supported(n: &str) -> bool {
    matches!(
        n,
        "sym_size.int"
            | "add"
            | "sub"
            | "mul"
            | "floordiv"
            | "et_vk.select_as_symint.default"
            | "aten.embedding.default"
            | "aten.view_copy.default"
            | "aten._unsafe_view.default"
            | "aten.linear.default"
            | "aten.mm.default"
            | "aten.bmm.default"
            | "aten.matmul.default"
            | "et_vk.linear_q4gsw.default"
            | "et_vk.linear_dq8ca_q4gsw.default"
            | "torchao.choose_qparams_affine.default"
            | "sdpa_with_kv_cache.default"
            | "update_cache.default"
            | "custom_sdpa.default"
            | "aten.select_copy.int"
            | "aten.slice_copy.Tensor"
            | "aten.add.Tensor"
            | "aten.sub.Tensor"
            | "aten.mul.Tensor"
            | "aten.div.Tensor"
            | "aten.pow.Tensor_Scalar"
            | "aten.mean.dim"
            | "aten.rsqrt.default"
            | "aten.sqrt.default"
            | "aten.tanh.default"
            | "aten.neg.default"
            | "aten.cos.default"
            | "aten.sin.default"
            | "aten.exp.default"
            | "aten.sigmoid.default"
            | "aten.relu.default"
            | "aten.abs.default"
            | "aten.gelu.default"
            | "aten.permute_copy.default"
            | "aten.permute.default"
            | "aten.unsqueeze_copy.default"
            | "aten.squeeze_copy.dims"
            | "aten.clone.default"
            | "aten._to_copy.default"
            | "dim_order_ops._to_dim_order_copy.default"
            | "dim_order_ops._clone_dim_order.default"
            | "aten.cat.default"
            | "aten.expand_copy.default"
            | "aten._softmax.default"
            | "aten.where.self"
            | "aten.index_select.default"
            | "aten.clamp.default"
            | "et_vk.rms_norm.default"
            | "aten.rms_norm.default"
            | "et_vk.prepack.default"
            | "aten.arange.start_step"
            | "aten.eq.Tensor"
            | "aten.eq.Scalar"
            | "aten.sum.dim_IntList"
            | "et_vk.embedding_q4gsw.default"
            | "aten.full_like.default"
            | "aten.full.default"
            | "aten.ge.Scalar"
            | "aten.gt.Scalar"
            | "aten.le.Scalar"
            | "aten.lt.Scalar"
            | "aten.ne.Scalar"
            | "aten.ge.Tensor"
            | "aten.gt.Tensor"
            | "aten.le.Tensor"
            | "aten.lt.Tensor"
            | "aten.ne.Tensor"
            | "aten.logical_and.default"
            | "aten.logical_or.default"
            | "aten.logical_not.default"
            | "aten.bitwise_and.Tensor"
            | "aten.bitwise_or.Tensor"
            | "gemma_sdpa_with_kv_cache.default"
            | "gemma_custom_sdpa.default"
            | "et_vk.apply_rotary_emb.default"
            | "et_vk.apply_rotary_emb_hf.default"
    )
}

impl Lower<'_> {
    fn values(&mut self) -> Result<(), String> {
        // KV caches are constants in the blob that the attention ops update: make them State.
        let mut caches = BTreeSet::new();
        for c in &self.vk.chain {
            match &*canonical(&c.name) {
                "sdpa_with_kv_cache.default" | "gemma_sdpa_with_kv_cache.default" => {
                    caches.extend(c.args.get(3..5).into_iter().flatten().copied());
                }
                "gemma_custom_sdpa.default" => {
                    caches.extend(c.args.get(1..3).into_iter().flatten().copied());
                }
                "update_cache.default" => caches.extend(c.args.get(1).copied()),
                _ => {}
            }
        }
        // With `alias_buffer_mutations`, a cache update writes its result into the cache
        // constant itself: any constant an op writes is state too.
        for c in &self.vk.chain {
            if let Some(&o) = c.args.last() {
                if matches!(self.vk.values.get(o), Some(VkValue::Tensor(t)) if t.constant_id.is_some())
                {
                    caches.insert(o);
                }
            }
        }
        let prepacks: Vec<(usize, usize)> = self
            .vk
            .chain
            .iter()
            .filter(|c| canonical(&c.name) == "et_vk.prepack.default" && c.args.len() == 2)
            .map(|c| (c.args[0], c.args[1]))
            .collect();
        let written: BTreeSet<usize> = self
            .vk
            .chain
            .iter()
            .filter(|c| canonical(&c.name) != "et_vk.prepack.default")
            .filter_map(|c| c.args.last().copied())
            .collect();
        for (i, v) in self.vk.values.iter().enumerate() {
            self.map[i] = match v {
                VkValue::Null => Mapped::Null,
                VkValue::Int(x) => Mapped::Int(*x),
                VkValue::Double(x) => Mapped::Double(*x),
                VkValue::Bool(x) => Mapped::Bool(*x),
                VkValue::String(s) => Mapped::Str(s.clone()),
                VkValue::IntList(l) => Mapped::IntList(l.clone()),
                VkValue::ValueList(l) => Mapped::List(l.clone()),
                VkValue::DoubleList(_) | VkValue::BoolList(_) => Mapped::Null,
                VkValue::SymInt(_) => Mapped::Sym(self.g.add_sym(format!("v{i}"))),
                VkValue::Tensor(t) => {
                    let dt = dtype(t.datatype)?;
                    let role = match t.constant_id {
                        Some(c) => {
                            let data = self.vk.constants[c].data.clone();
                            if caches.contains(&i) {
                                Role::State(Some(self.convert_const(t.datatype, &data)))
                            } else {
                                Role::Constant(self.convert_const(t.datatype, &data))
                            }
                        }
                        None => Role::Activation,
                    };
                    Mapped::Tensor(self.g.add_tensor(format!("v{i}"), dt, t.dims.clone(), role))
                }
            };
        }
        self.share_kv_caches(&prepacks);
        for (src, dst) in prepacks {
            let s = self.tensor(src)?;
            if written.contains(&dst) {
                let d = self.tensor(dst)?;
                let init = match &self.g.tensors[s].role {
                    Role::Constant(b) | Role::State(Some(b)) => Some(b.clone()),
                    _ => return Err(format!("prepack of value {src}, which is not a constant")),
                };
                self.g.tensors[d].role = Role::State(init);
            } else {
                self.map[dst] = Mapped::Tensor(s);
            }
        }
        Ok(())
    }

    /// YOCO KV sharing: a `gemma_custom_sdpa` whose cache operand is not a cache some earlier op
    /// updated, but a constant with the same bytes and shape as one, reads that cache (the fork
    /// realizes one tensor per cache data pointer for these read-only consumers). The latest
    /// such donor wins: Gemma 4's KV-shared layers read the last sliding / global layer before
    /// them, and sliding and global caches differ in head dim.
    fn share_kv_caches(&mut self, prepacks: &[(usize, usize)]) {
        let origin = |id: usize| prepacks.iter().find(|p| p.1 == id).map_or(id, |p| p.0);
        // Key caches and value caches apart: their (zero) bytes are alike.
        let mut donors: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        for c in &self.vk.chain {
            match &*canonical(&c.name) {
                "sdpa_with_kv_cache.default" | "gemma_sdpa_with_kv_cache.default" => {
                    for (list, i) in donors.iter_mut().zip(3..5) {
                        list.extend(c.args.get(i).copied());
                    }
                }
                "gemma_custom_sdpa.default" => {
                    for (list, i) in donors.iter().zip(1..3) {
                        let Some(&id) = c.args.get(i) else { continue };
                        if list.contains(&id) {
                            continue;
                        }
                        let donor = list
                            .iter()
                            .rev()
                            .find(|&&d| self.same_constant(origin(d), origin(id)));
                        if let Some(&d) = donor {
                            self.map[id] = self.map[d].clone();
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Both values are constant tensors of one dtype and shape holding the same bytes.
    fn same_constant(&self, a: usize, b: usize) -> bool {
        let (Some(ta), Some(tb)) = (self.vk.tensor(a), self.vk.tensor(b)) else {
            return false;
        };
        let (Some(ca), Some(cb)) = (ta.constant_id, tb.constant_id) else {
            return false;
        };
        if ta.datatype != tb.datatype || ta.dims != tb.dims {
            return false;
        }
        let (ka, kb) = (&self.vk.constants[ca], &self.vk.constants[cb]);
        ca == cb
            || (ka.named_key.is_some() && ka.named_key == kb.named_key)
            || ka.data[..] == kb.data[..]
    }

    /// 64-bit constants narrow to 32 bits (as the Vulkan runtime does); the rest stay zero-copy.
    fn convert_const(&self, dt: VkDataType, data: &Blob) -> Blob {
        match dt {
            VkDataType::Float64 => owned(
                data.chunks_exact(8)
                    .flat_map(|c| (f64::from_le_bytes(c.try_into().unwrap()) as f32).to_le_bytes())
                    .collect(),
            ),
            VkDataType::Int64 => owned(
                data.chunks_exact(8)
                    .flat_map(|c| (i64::from_le_bytes(c.try_into().unwrap()) as i32).to_le_bytes())
                    .collect(),
            ),
            _ => data.clone(),
        }
    }

    fn tensor(&self, id: usize) -> Result<TensorId, String> {
        match self.map.get(id) {
            Some(Mapped::Tensor(t)) => Ok(*t),
            other => Err(format!("value {id} is {other:?}, expected a tensor")),
        }
    }

    fn opt_tensor(&self, id: usize) -> Result<Option<TensorId>, String> {
        match self.map.get(id) {
            Some(Mapped::Null) => Ok(None),
            _ => self.tensor(id).map(Some),
        }
    }

    fn int(&self, id: usize) -> Result<Int, String> {
        match self.map.get(id) {
            Some(Mapped::Int(v)) => Ok(Int::Lit(*v)),
            Some(Mapped::Sym(s)) => Ok(Int::Sym(*s)),
            Some(Mapped::Bool(b)) => Ok(Int::Lit(*b as i64)),
            other => Err(format!("value {id} is {other:?}, expected an integer")),
        }
    }

    fn lit(&self, id: usize) -> Result<i64, String> {
        match self.int(id)? {
            Int::Lit(v) => Ok(v),
            Int::Sym(_) => Err(format!("value {id} must be a constant integer")),
        }
    }

    fn double(&self, id: usize) -> Result<f64, String> {
        match self.map.get(id) {
            Some(Mapped::Double(v)) => Ok(*v),
            Some(Mapped::Int(v)) => Ok(*v as f64),
            Some(Mapped::Bool(b)) => Ok(*b as i64 as f64),
            other => Err(format!("value {id} is {other:?}, expected a number")),
        }
    }

    fn boolean(&self, id: usize) -> Result<bool, String> {
        match self.map.get(id) {
            Some(Mapped::Bool(b)) => Ok(*b),
            Some(Mapped::Int(v)) => Ok(*v != 0),
            other => Err(format!("value {id} is {other:?}, expected a bool")),
        }
    }

    /// A list of integers given as IntList or as ValueList of Int/SymInt values.
    fn ints(&self, id: usize) -> Result<Vec<Int>, String> {
        match self.map.get(id) {
            Some(Mapped::IntList(l)) => Ok(l.iter().map(|&v| Int::Lit(v)).collect()),
            Some(Mapped::List(l)) => l.iter().map(|&v| self.int(v)).collect(),
            Some(Mapped::Int(v)) => Ok(vec![Int::Lit(*v)]),
            other => Err(format!("value {id} is {other:?}, expected an integer list")),
        }
    }

    fn rank(&self, t: TensorId) -> usize {
        self.g.tensors[t].max_shape.len()
    }

    fn dim(&self, d: i64, rank: usize) -> Result<usize, String> {
        let r = rank.max(1) as i64;
        let x = if d < 0 { d + r } else { d };
        if !(0..r).contains(&x) {
            return Err(format!("dim {d} out of range for rank {rank}"));
        }
        Ok(x as usize)
    }

    /// A host symbol holding the current size of `t`'s dim `d`.
    fn size_sym(&mut self, t: TensorId, d: usize) -> Int {
        let s = self.g.add_sym(format!("size(t{t},{d})"));
        self.g.nodes.push(ir::Node::Sym(SymOp::Size {
            out: s,
            tensor: t,
            dim: d,
        }));
        Int::Sym(s)
    }

    fn out(&self, c: &OperatorCall) -> Result<TensorId, String> {
        self.tensor(*c.args.last().ok_or("no output")?)
    }

    fn arg(c: &OperatorCall, i: usize) -> Result<usize, String> {
        c.args
            .get(i)
            .copied()
            .ok_or_else(|| format!("missing argument {i}"))
    }

    fn unary(&mut self, c: &OperatorCall, u: UnaryOp) -> Result<(), String> {
        let (x, y) = (self.tensor(Self::arg(c, 0)?)?, self.out(c)?);
        self.g.op(OpKind::Unary(u), vec![x], vec![y]);
        Ok(())
    }

    /// `a ⊕ b` where b may be a tensor or a scalar value; `alpha` scales b for add/sub.
    fn binary(
        &mut self,
        c: &OperatorCall,
        op: BinaryOp,
        alpha_arg: Option<usize>,
    ) -> Result<(), String> {
        let a = self.tensor(Self::arg(c, 0)?)?;
        let y = self.out(c)?;
        let alpha = match alpha_arg {
            Some(i) if i + 1 < c.args.len() => self.double(c.args[i]).unwrap_or(1.0),
            _ => 1.0,
        };
        let b_id = Self::arg(c, 1)?;
        match &self.map[b_id] {
            Mapped::Tensor(b) => {
                let b = *b;
                if alpha != 1.0 {
                    let tmp = self.g.add_tensor(
                        "alpha",
                        self.g.tensors[b].dtype,
                        self.g.tensors[b].max_shape.clone(),
                        Role::Activation,
                    );
                    self.g.op(
                        OpKind::BinaryScalar {
                            op: BinaryOp::Mul,
                            scalar: alpha,
                            scalar_first: false,
                        },
                        vec![b],
                        vec![tmp],
                    );
                    self.g.op(OpKind::Binary(op), vec![a, tmp], vec![y]);
                } else {
                    self.g.op(OpKind::Binary(op), vec![a, b], vec![y]);
                }
            }
            _ => {
                let s = self.double(b_id)? * alpha;
                self.g.op(
                    OpKind::BinaryScalar {
                        op,
                        scalar: s,
                        scalar_first: false,
                    },
                    vec![a],
                    vec![y],
                );
            }
        }
        Ok(())
    }

    /// Reshape `x` to `shape` (which may hold symbols) into `y`.
    fn reshape(&mut self, x: TensorId, shape: Vec<Int>, y: TensorId) {
        self.g.op(OpKind::Reshape { shape }, vec![x], vec![y]);
    }

    /// Symbolic sizes of every dim of `x`, with 1s for static unit dims.
    fn dims_of(&mut self, x: TensorId) -> Vec<Int> {
        let max = self.g.tensors[x].max_shape.clone();
        (0..max.len())
            .map(|d| {
                if max[d] == 1 {
                    Int::Lit(1)
                } else {
                    self.size_sym(x, d)
                }
            })
            .collect()
    }

    /// `(q, k, v, k_cache, v_cache, start_pos, ..)`: writes k and v into their caches at
    /// `start_pos` (dim 1 of BSHD) and returns `[q, k_cache, v_cache]` and `start_pos` for the
    /// attention that follows.
    fn update_kv_caches(&mut self, c: &OperatorCall) -> Result<([TensorId; 3], Int), String> {
        let a = |i: usize| Self::arg(c, i);
        let (q, k, v) = (
            self.tensor(a(0)?)?,
            self.tensor(a(1)?)?,
            self.tensor(a(2)?)?,
        );
        let (kc, vc) = (self.tensor(a(3)?)?, self.tensor(a(4)?)?);
        let start = self.int(a(5)?)?;
        for (cache, new) in [(kc, k), (vc, v)] {
            self.g.op(
                OpKind::CacheUpdate { axis: 1, start },
                vec![cache, new],
                vec![cache],
            );
        }
        Ok(([q, kc, vc], start))
    }

    /// Attention over caches that already hold this step's keys and values, BSHD, the part
    /// `sdpa_with_kv_cache` and `custom_sdpa` share; `args` are the positions of their `mask?`,
    /// `is_causal` and `scale?` arguments. A null scale is `1/sqrt(head_dim)`.
    fn cached_sdpa(
        &mut self,
        c: &OperatorCall,
        [q, kc, vc]: [TensorId; 3],
        start: Int,
        args: [usize; 3],
    ) -> Result<(), String> {
        let [mi, ci, si] = args;
        let a = |i: usize| Self::arg(c, i);
        let mask = self.opt_tensor(a(mi)?)?;
        let causal = self.boolean(a(ci)?)?;
        let d = *self.g.tensors[q].max_shape.last().ok_or("scalar query")?;
        let scale = match self.map[a(si)?] {
            Mapped::Null => None,
            _ => Some(self.double(a(si)?)? as f32),
        };
        let y = self.out(c)?;
        let mut ins = vec![q, kc, vc];
        ins.extend(mask);
        let kind = OpKind::cached_sdpa(scale, d, causal, start);
        self.g.op(kind, ins, vec![y]);
        Ok(())
    }

    /// A 4-bit group-wise linear whose operands sit at `args` = [input, weights, scales, group,
    /// bias]; the bias argument exists only when the call has one more argument than its output.
    fn q4_linear(
        &mut self,
        c: &OperatorCall,
        args: [usize; 5],
        act_quant: ir::ActQuant,
    ) -> Result<(), String> {
        let [xi, wi, si, gi, bi] = args;
        let a = |i: usize| Self::arg(c, i);
        let x = self.tensor(a(xi)?)?;
        let group = self.lit(a(gi)?)? as usize;
        let ws = self.q4_weights(a(wi)?, a(si)?, group)?;
        let b = if c.args.len() > bi + 1 {
            self.opt_tensor(a(bi)?)?
        } else {
            None
        };
        let y = self.out(c)?;
        let mut ins = vec![x];
        ins.extend(ws);
        ins.extend(b);
        let kind = OpKind::Linear {
            weight: Weight::Q4 { group },
            act_quant,
            has_bias: b.is_some(),
        };
        self.g.op(kind, ins, vec![y]);
        Ok(())
    }

    /// q4gsw weights → canonical Q4: bytes as they are; scales `[K/g, Npad]` → `[N, K/g]`,
    /// biases `-8·scale` (the +8 offset of the stored nibbles).
    fn q4_weights(&mut self, w: usize, s: usize, group: usize) -> Result<[TensorId; 3], String> {
        let wt = self.tensor(w)?;
        let st = self.tensor(s)?;
        let (n, k2) = match self.g.tensors[wt].max_shape[..] {
            [n, k2] => (n, k2),
            ref d => return Err(format!("q4gsw weight dims {d:?} are not [N, K/2]")),
        };
        let k = k2 * 2;
        if group == 0 || k % group != 0 {
            return Err(format!("group size {group} does not divide K = {k}"));
        }
        let groups = k / group;
        let sdims = self.g.tensors[st].max_shape.clone();
        let (srows, scols) = match sdims[..] {
            [r, c] => (r, c),
            _ => return Err(format!("q4gsw scales dims {sdims:?} are not 2-D")),
        };
        if srows < groups || scols < n {
            return Err(format!("scales {sdims:?} do not cover [{groups}, {n}]"));
        }
        let Role::Constant(sb) = &self.g.tensors[st].role else {
            return Err("q4gsw scales are not constant".into());
        };
        let sv = crate::runtime::tensor::to_f32(self.g.tensors[st].dtype, sb);
        let mut scales = vec![0f32; n * groups];
        for gi in 0..groups {
            for row in 0..n {
                scales[row * groups + gi] = sv[gi * scols + row];
            }
        }
        let scales = owned(f32_bytes(&scales));
        let st2 = self.g.add_tensor(
            format!("v{s}.scales"),
            DType::F32,
            vec![n, groups],
            Role::Constant(scales.clone()),
        );
        // Symmetric: nibbles are q + 8.
        let bt = self.g.add_tensor(
            format!("v{s}.biases"),
            DType::F32,
            vec![n, groups],
            Role::Constant(Blob::neg8(scales)),
        );
        Ok([wt, st2, bt])
    }

    /// The output ValueList of a multi-output op, which must hold `n` tensors.
    fn out_list(&self, c: &OperatorCall, n: usize) -> Result<Vec<TensorId>, String> {
        let Some(Mapped::List(items)) = c.args.last().and_then(|&o| self.map.get(o)) else {
            return Err("output is not a value list".into());
        };
        if items.len() != n {
            return Err(format!("{} outputs, expected {n}", items.len()));
        }
        items.clone().iter().map(|&i| self.tensor(i)).collect()
    }

    /// One rotary embedding of x `[B, S, H, D]` (tables indexed by sequence position).
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &mut self,
        x: TensorId,
        y: TensorId,
        [cos, sin]: [TensorId; 2],
        style: RopeStyle,
        rotary: usize,
        start: Int,
        whole_head: bool,
    ) -> Result<(), String> {
        let xs = &self.g.tensors[x].max_shape;
        let d = match xs[..] {
            [_, _, _, d] => d,
            _ => return Err(format!("rotary input {xs:?} is not [B, S, H, D]")),
        };
        if rotary == 0 || rotary > d || (whole_head && rotary != d) {
            return Err(format!("rotary width {rotary} does not fit head dim {d}"));
        }
        let kind = OpKind::Rope {
            style,
            rotary,
            seq_dim: 1,
            start,
        };
        self.g.op(kind, vec![x, cos, sin], vec![y]);
        Ok(())
    }

    /// HF rotary tables `[P, R]` hold `cat(freqs, freqs)`: the IR's Rope takes the first half.
    /// Constant tables are checked to really repeat; computed ones are sliced.
    fn half_tables(&mut self, cos: usize, sin: usize) -> Result<(TensorId, TensorId), String> {
        let mut out = Vec::new();
        for id in [cos, sin] {
            let t = self.tensor(id)?;
            let def = self.g.tensors[t].clone();
            let [p, r] = def.max_shape[..] else {
                return Err(format!("rotary table {:?} is not [P, R]", def.max_shape));
            };
            if r % 2 != 0 {
                return Err(format!("rotary table width {r} is odd"));
            }
            let half = r / 2;
            let role = match &def.role {
                Role::Constant(b) => {
                    let v = crate::runtime::tensor::to_f32(def.dtype, b);
                    if v.len() < p * r {
                        return Err("rotary table constant is too short".into());
                    }
                    let mut h = Vec::with_capacity(p * half);
                    for row in v[..p * r].chunks_exact(r) {
                        if row[..half] != row[half..] {
                            return Err(
                                "apply_rotary_emb_hf table whose two halves differ (not rotate_half RoPE)"
                                    .into(),
                            );
                        }
                        h.extend_from_slice(&row[..half]);
                    }
                    Some(Role::Constant(owned(f32_bytes(&h))))
                }
                _ => None,
            };
            let dt = if role.is_some() {
                DType::F32
            } else {
                def.dtype
            };
            let is_const = role.is_some();
            let h = self.g.add_tensor(
                format!("v{id}.half"),
                dt,
                vec![p, half],
                role.unwrap_or(Role::Activation),
            );
            if !is_const {
                let kind = OpKind::Slice {
                    dim: 1,
                    start: Int::Lit(0),
                    end: Int::Lit(half as i64),
                    step: 1,
                };
                self.g.op(kind, vec![t], vec![h]);
            }
            out.push(h);
        }
        Ok((out[0], out[1]))
    }

    /// The gemma fork's attention core (`GemmaSDPA.cpp`): scale 1.0; with an additive mask
    /// `[1, 1, S, >= C]` the mask alone encodes causality and any sliding window, without one
    /// attention is causal. The fork adds its optional softcap *after* the mask (audio encoder
    /// only); the IR's Sdpa caps before masking, so a softcap is refused rather than changed.
    fn gemma_sdpa(
        &mut self,
        c: &OperatorCall,
        [q, kc, vc]: [TensorId; 3],
        start: Int,
        mask_arg: usize,
        causal_arg: usize,
        softcap_arg: Option<usize>,
    ) -> Result<(), String> {
        if let Some(i) = softcap_arg {
            let cap = self.double(c.args[i])?;
            if cap > 0.0 {
                return Err(format!(
                    "logit softcap {cap} applied after the mask (the fork's audio path) has no IR lowering"
                ));
            }
        }
        let mask = self.opt_tensor(mask_arg)?;
        let is_causal = match self.map.get(causal_arg) {
            Some(Mapped::Null) | None => None,
            _ => Some(self.boolean(causal_arg)?),
        };
        let mut ins = vec![q, kc, vc];
        if let Some(m) = mask {
            let ms = self.g.tensors[m].max_shape.clone();
            let [1, 1, s, w] = ms[..] else {
                return Err(format!(
                    "attention mask {ms:?} is not [1, 1, S, C] (per-head masks have no IR lowering)"
                ));
            };
            let rows = self.size_sym(m, 2);
            let m2 = self.g.add_tensor(
                "mask2d",
                self.g.tensors[m].dtype,
                vec![s, w],
                Role::Activation,
            );
            self.reshape(m, vec![rows, Int::Lit(w as i64)], m2);
            ins.push(m2);
        } else if is_causal == Some(false) {
            return Err("neither an attention mask nor is_causal".into());
        }
        let y = self.out(c)?;
        let kind = OpKind::Sdpa {
            layout: AttnLayout::Bshd,
            scale: 1.0,
            causal: mask.is_none(),
            window: None,
            softcap: None,
            start,
            all_rows: false,
        };
        self.g.op(kind, ins, vec![y]);
        Ok(())
    }

    /// embedding_q4gsw tables → canonical Q4. ExecuTorch's reference
    /// (`custom_ops_lib.embedding_q4gsw_impl`): element 2j is the low nibble minus 8 when
    /// `is_linear_weight` (the packing 4-bit linears use, so a tied LM head shares the bytes),
    /// else the high nibble minus 8; scales are `[V, D/group]`, one row per token. Linear
    /// packing and f32 scales stay zero-copy; only the biases (`-8·scale`) are derived.
    fn q4_embedding_weights(
        &mut self,
        w: usize,
        s: usize,
        group: usize,
        linear_packing: bool,
    ) -> Result<[TensorId; 3], String> {
        let (wt, st) = (self.tensor(w)?, self.tensor(s)?);
        let (v, d2) = match self.g.tensors[wt].max_shape[..] {
            [v, d2] => (v, d2),
            ref d => {
                return Err(format!(
                    "embedding_q4gsw weight dims {d:?} are not [V, D/2]"
                ))
            }
        };
        if self.g.tensors[wt].dtype != DType::U8 {
            return Err("embedding_q4gsw weight is not uint8".into());
        }
        let d = d2 * 2;
        if group == 0 || d % group != 0 {
            return Err(format!("group size {group} does not divide D = {d}"));
        }
        let groups = d / group;
        let sdims = self.g.tensors[st].max_shape.clone();
        let scols = match sdims[..] {
            [r, c] if r == v && c >= groups => c,
            [n] if groups == 1 && n == v => 1,
            _ => {
                return Err(format!(
                    "embedding_q4gsw scales {sdims:?} do not match [{v}, {groups}]"
                ))
            }
        };
        let (Role::Constant(wb), Role::Constant(sb)) =
            (&self.g.tensors[wt].role, &self.g.tensors[st].role)
        else {
            return Err("embedding_q4gsw weight or scales are not constant".into());
        };
        let (wb, sb) = (wb.clone(), sb.clone());
        let wb = if linear_packing {
            wb
        } else {
            // Swapping the nibbles turns the high-first packing into the linear one.
            owned(wb.iter().map(|b| b.rotate_left(4)).collect())
        };
        let sv = crate::runtime::tensor::to_f32(self.g.tensors[st].dtype, &sb);
        if sv.len() < v * scols {
            return Err(format!(
                "embedding_q4gsw scales hold fewer than {v}×{scols} values"
            ));
        }
        // Read in place where they are f32 `[V, groups]` already.
        let dense = scols == groups && self.g.tensors[st].dtype == DType::F32;
        let (st2, scales) = if dense {
            let n = v * groups * 4;
            let exact = sb.len() == n;
            (
                st,
                if exact {
                    sb
                } else {
                    sb.slice(0..n).map_err(|e| e.to_string())?
                },
            )
        } else {
            let scales: Vec<f32> = (0..v)
                .flat_map(|r| sv[r * scols..r * scols + groups].iter().copied())
                .collect();
            let scales = owned(f32_bytes(&scales));
            let t = self.g.add_tensor(
                format!("v{s}.scales"),
                DType::F32,
                vec![v, groups],
                Role::Constant(scales.clone()),
            );
            (t, scales)
        };
        let wt2 = if linear_packing {
            wt
        } else {
            self.g.add_tensor(
                format!("v{w}.linear_packed"),
                DType::U8,
                vec![v, d2],
                Role::Constant(wb),
            )
        };
        let bt = self.g.add_tensor(
            format!("v{s}.biases"),
            DType::F32,
            vec![v, groups],
            Role::Constant(Blob::neg8(scales)),
        );
        Ok([wt2, st2, bt])
    }

    fn op(&mut self, c: &OperatorCall) -> Result<(), String> {
        let a = |i: usize| Self::arg(c, i);
        match &*canonical(&c.name) {
            "sym_size.int" => {
                let t = self.tensor(a(0)?)?;
                let d = self.dim(self.lit(a(1)?)?, self.rank(t))?;
                let Mapped::Sym(out) = self.map[a(2)?] else {
                    return Err("sym_size output is not a SymInt".into());
                };
                self.g.nodes.push(ir::Node::Sym(SymOp::Size {
                    out,
                    tensor: t,
                    dim: d,
                }));
            }
            op @ ("add" | "sub" | "mul" | "floordiv") => {
                let (x, y) = (self.int(a(0)?)?, self.int(a(1)?)?);
                let Mapped::Sym(out) = self.map[a(2)?] else {
                    return Err("symbolic op output is not a SymInt".into());
                };
                let op = match op {
                    "add" => SymArith::Add,
                    "sub" => SymArith::Sub,
                    "mul" => SymArith::Mul,
                    _ => SymArith::FloorDiv,
                };
                self.g.nodes.push(ir::Node::Sym(SymOp::Arith {
                    out,
                    op,
                    a: x,
                    b: y,
                }));
            }
            "et_vk.select_as_symint.default" => {
                let t = self.tensor(a(0)?)?;
                let shape = self.g.tensors[t].max_shape.clone();
                let d = self.dim(self.lit(a(1)?)?, shape.len())?;
                let i = self.lit(a(2)?)?;
                if shape.iter().enumerate().any(|(j, &s)| j != d && s != 1) {
                    return Err(format!(
                        "select_as_symint on {shape:?} along dim {d} needs every other dim to be 1"
                    ));
                }
                if i < 0 {
                    return Err("negative select index".into());
                }
                let Mapped::Sym(out) = self.map[a(3)?] else {
                    return Err("output is not a SymInt".into());
                };
                self.g.nodes.push(ir::Node::Sym(SymOp::ReadInput {
                    out,
                    tensor: t,
                    index: i as usize,
                }));
            }
            "aten.embedding.default" => {
                let (w, idx, y) = (self.tensor(a(0)?)?, self.tensor(a(1)?)?, self.out(c)?);
                self.g.op(
                    OpKind::Embedding {
                        weight: Weight::F32,
                    },
                    vec![w, idx],
                    vec![y],
                );
            }
            "aten.view_copy.default" | "aten._unsafe_view.default" => {
                let x = self.tensor(a(0)?)?;
                let shape = self.ints(a(1)?)?;
                let y = self.out(c)?;
                self.reshape(x, shape, y);
            }
            "aten.linear.default" => {
                let (x, w) = (self.tensor(a(0)?)?, self.tensor(a(1)?)?);
                let b = self.opt_tensor(a(2)?)?;
                let y = self.out(c)?;
                let mut ins = vec![x, w];
                ins.extend(b);
                self.g.op(
                    OpKind::Linear {
                        weight: Weight::F32,
                        act_quant: ir::ActQuant::None,
                        has_bias: b.is_some(),
                    },
                    ins,
                    vec![y],
                );
            }
            "aten.mm.default" | "aten.bmm.default" | "aten.matmul.default" => {
                let (x, w, y) = (self.tensor(a(0)?)?, self.tensor(a(1)?)?, self.out(c)?);
                self.g
                    .op(OpKind::MatMul { transpose_b: false }, vec![x, w], vec![y]);
            }
            // (input, weights, weight_scales, group, bias?)
            "et_vk.linear_q4gsw.default" => {
                self.q4_linear(c, [0, 1, 2, 3, 4], ir::ActQuant::None)?
            }
            // (input, input_scales, input_zp, weights, weight_sums, weight_scales, group, bias?)
            "et_vk.linear_dq8ca_q4gsw.default" => {
                self.q4_linear(c, [0, 3, 5, 6, 7], ir::ActQuant::Torchao)?
            }
            // The per-row activation parameters are recomputed inside the dq8 linear.
            "torchao.choose_qparams_affine.default" => {}
            "sdpa_with_kv_cache.default" => {
                // (q, k, v, k_cache, v_cache, start_pos, seq_len, mask?, dropout, is_causal, scale?)
                let (qkv, start) = self.update_kv_caches(c)?;
                self.cached_sdpa(c, qkv, start, [7, 9, 10])?;
            }
            "update_cache.default" => {
                let (v, cache) = (self.tensor(a(0)?)?, self.tensor(a(1)?)?);
                let start = self.int(a(2)?)?;
                self.g.op(
                    OpKind::CacheUpdate { axis: 1, start },
                    vec![cache, v],
                    vec![cache],
                );
            }
            "custom_sdpa.default" => {
                // (q, k_cache, v_cache, start_pos, mask?, dropout, is_causal, scale?)
                let (q, kc, vc) = (
                    self.tensor(a(0)?)?,
                    self.tensor(a(1)?)?,
                    self.tensor(a(2)?)?,
                );
                let start = self.int(a(3)?)?;
                self.cached_sdpa(c, [q, kc, vc], start, [4, 6, 7])?;
            }
            "aten.select_copy.int" => {
                let x = self.tensor(a(0)?)?;
                let d = self.dim(self.lit(a(1)?)?, self.rank(x))?;
                let index = self.int(a(2)?)?;
                let y = self.out(c)?;
                self.g
                    .op(OpKind::Select { dim: d, index }, vec![x], vec![y]);
            }
            "aten.slice_copy.Tensor" => {
                let x = self.tensor(a(0)?)?;
                let d = self.dim(self.lit(a(1)?)?, self.rank(x))?;
                let start = match self.map[a(2)?] {
                    Mapped::Null => Int::Lit(0),
                    _ => self.int(a(2)?)?,
                };
                let end = match self.map[a(3)?] {
                    Mapped::Null => Int::Lit(i64::MAX),
                    _ => self.int(a(3)?)?,
                };
                let step = self.lit(a(4)?)?.max(1) as usize;
                let y = self.out(c)?;
                self.g.op(
                    OpKind::Slice {
                        dim: d,
                        start,
                        end,
                        step,
                    },
                    vec![x],
                    vec![y],
                );
            }
            "aten.add.Tensor" => self.binary(c, BinaryOp::Add, Some(2))?,
            "aten.sub.Tensor" => self.binary(c, BinaryOp::Sub, Some(2))?,
            "aten.mul.Tensor" => self.binary(c, BinaryOp::Mul, None)?,
            "aten.div.Tensor" => self.binary(c, BinaryOp::Div, None)?,
            "aten.pow.Tensor_Scalar" => self.binary(c, BinaryOp::Pow, None)?,
            // (self, dim: int[], keepdim)
            op @ ("aten.mean.dim" | "aten.sum.dim_IntList") => {
                let x = self.tensor(a(0)?)?;
                let r = self.rank(x);
                let mut dims = self
                    .ints(a(1)?)?
                    .into_iter()
                    .map(|d| match d {
                        Int::Lit(v) => self.dim(v, r),
                        Int::Sym(_) => Err("symbolic reduction dim".into()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                dims.sort_unstable();
                let keepdim = self.boolean(a(2)?)?;
                let y = self.out(c)?;
                let kind = if op == "aten.mean.dim" {
                    OpKind::Mean { dims, keepdim }
                } else {
                    OpKind::Sum { dims, keepdim }
                };
                self.g.op(kind, vec![x], vec![y]);
            }
            "aten.rsqrt.default" => self.unary(c, UnaryOp::Rsqrt)?,
            "aten.sqrt.default" => self.unary(c, UnaryOp::Sqrt)?,
            "aten.tanh.default" => self.unary(c, UnaryOp::Tanh)?,
            "aten.neg.default" => self.unary(c, UnaryOp::Neg)?,
            "aten.cos.default" => self.unary(c, UnaryOp::Cos)?,
            "aten.sin.default" => self.unary(c, UnaryOp::Sin)?,
            "aten.exp.default" => self.unary(c, UnaryOp::Exp)?,
            "aten.sigmoid.default" => self.unary(c, UnaryOp::Sigmoid)?,
            "aten.relu.default" => self.unary(c, UnaryOp::Relu)?,
            "aten.abs.default" => self.unary(c, UnaryOp::Abs)?,
            "aten.gelu.default" => {
                let tanh =
                    c.args.len() > 2 && matches!(&self.map[a(1)?], Mapped::Str(s) if s == "tanh");
                self.unary(
                    c,
                    if tanh {
                        UnaryOp::GeluTanh
                    } else {
                        UnaryOp::Gelu
                    },
                )?;
            }
            "aten.permute_copy.default" | "aten.permute.default" => {
                let x = self.tensor(a(0)?)?;
                let r = self.rank(x);
                let perm = self
                    .ints(a(1)?)?
                    .into_iter()
                    .map(|d| match d {
                        Int::Lit(v) => self.dim(v, r),
                        Int::Sym(_) => Err("symbolic permutation".into()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let y = self.out(c)?;
                self.g.op(OpKind::Permute { perm }, vec![x], vec![y]);
            }
            "aten.unsqueeze_copy.default" => {
                let x = self.tensor(a(0)?)?;
                let d = self.dim(self.lit(a(1)?)?, self.rank(x) + 1)?;
                let mut shape = self.dims_of(x);
                shape.insert(d, Int::Lit(1));
                let y = self.out(c)?;
                self.reshape(x, shape, y);
            }
            "aten.squeeze_copy.dims" => {
                let x = self.tensor(a(0)?)?;
                let r = self.rank(x);
                let dims: Vec<usize> = self
                    .ints(a(1)?)?
                    .into_iter()
                    .map(|d| match d {
                        Int::Lit(v) => self.dim(v, r),
                        Int::Sym(_) => Err("symbolic squeeze dim".into()),
                    })
                    .collect::<Result<_, _>>()?;
                let max = self.g.tensors[x].max_shape.clone();
                let full = self.dims_of(x);
                let shape = full
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !(dims.contains(i) && max[*i] == 1))
                    .map(|(_, s)| s)
                    .collect();
                let y = self.out(c)?;
                self.reshape(x, shape, y);
            }
            "aten.clone.default"
            | "aten._to_copy.default"
            | "dim_order_ops._to_dim_order_copy.default"
            | "dim_order_ops._clone_dim_order.default" => {
                let (x, y) = (self.tensor(a(0)?)?, self.out(c)?);
                let kind = if self.g.tensors[x].dtype == self.g.tensors[y].dtype {
                    OpKind::Copy
                } else {
                    OpKind::Cast
                };
                self.g.op(kind, vec![x], vec![y]);
            }
            "aten.cat.default" => {
                let Mapped::List(items) = self.map[a(0)?].clone() else {
                    return Err("cat input is not a list".into());
                };
                let ins = items
                    .iter()
                    .map(|&i| self.tensor(i))
                    .collect::<Result<Vec<_>, _>>()?;
                let r = ins.first().map_or(1, |&t| self.rank(t));
                let d = self.dim(self.lit(a(1)?)?, r)?;
                let y = self.out(c)?;
                self.g.op(OpKind::Concat { dim: d }, ins, vec![y]);
            }
            "aten.expand_copy.default" => {
                let x = self.tensor(a(0)?)?;
                let y = self.out(c)?;
                let req = self.ints(a(1)?)?;
                // A dynamic target expands to host-symbol sizes; -1 keeps x's size.
                let rank = self.rank(x);
                let off = req.len().checked_sub(rank).ok_or("expand to fewer dims")?;
                let mut shape = Vec::with_capacity(req.len());
                for (i, r) in req.iter().enumerate() {
                    shape.push(match r {
                        Int::Lit(-1) if i >= off => self.size_sym(x, i - off),
                        Int::Lit(v) if *v < 0 => return Err(format!("expand size {v}")),
                        other => *other,
                    });
                }
                self.g.op(OpKind::Expand { shape }, vec![x], vec![y]);
            }
            "aten._softmax.default" => {
                let x = self.tensor(a(0)?)?;
                let d = self.dim(self.lit(a(1)?)?, self.rank(x))?;
                if d + 1 != self.rank(x) {
                    return Err("softmax over a dim other than the last".into());
                }
                let y = self.out(c)?;
                self.g.op(OpKind::Softmax, vec![x], vec![y]);
            }
            "aten.where.self" => {
                let (cnd, x, z, y) = (
                    self.tensor(a(0)?)?,
                    self.tensor(a(1)?)?,
                    self.tensor(a(2)?)?,
                    self.out(c)?,
                );
                self.g.op(OpKind::Where, vec![cnd, x, z], vec![y]);
            }
            "aten.index_select.default" => {
                let x = self.tensor(a(0)?)?;
                let d = self.dim(self.lit(a(1)?)?, self.rank(x))?;
                let (idx, y) = (self.tensor(a(2)?)?, self.out(c)?);
                self.g
                    .op(OpKind::IndexSelect { dim: d }, vec![x, idx], vec![y]);
            }
            "aten.clamp.default" => {
                let x = self.tensor(a(0)?)?;
                let opt = |s: &Self, i: usize| -> Result<Option<f64>, String> {
                    match s.map[i] {
                        Mapped::Null => Ok(None),
                        _ => s.double(i).map(Some),
                    }
                };
                let (min, max) = (opt(self, a(1)?)?, opt(self, a(2)?)?);
                let y = self.out(c)?;
                self.g.op(OpKind::Clamp { min, max }, vec![x], vec![y]);
            }
            "et_vk.rms_norm.default" | "aten.rms_norm.default" => {
                // et_vk.rms_norm(x, weight, eps); aten.rms_norm(x, normalized_shape, weight?, eps?)
                let x = self.tensor(a(0)?)?;
                let (w, eps) = if c.name.contains("aten.") {
                    (
                        self.opt_tensor(a(2)?)?,
                        if c.args.len() > 4 {
                            self.double(a(3)?)?
                        } else {
                            1e-6
                        },
                    )
                } else {
                    (self.opt_tensor(a(1)?)?, self.double(a(2)?)?)
                };
                let y = self.out(c)?;
                let mut ins = vec![x];
                ins.extend(w);
                self.g.op(OpKind::RmsNorm { eps: eps as f32 }, ins, vec![y]);
            }
            // Resolved in `values`: prepack runs once at load, so its output is the constant
            // itself, or persistent state initialised from it when the graph writes it.
            "et_vk.prepack.default" => {}
            "aten.arange.start_step" => {
                let (start, end) = (self.int(a(0)?)?, self.int(a(1)?)?);
                let step = match self.map.get(a(2)?) {
                    Some(Mapped::Null) | None => 1,
                    _ => self.lit(a(2)?)?,
                };
                let y = self.out(c)?;
                self.g
                    .op(OpKind::Arange { start, end, step }, vec![], vec![y]);
            }
            "aten.eq.Tensor" | "aten.eq.Scalar" => self.binary(c, BinaryOp::Eq, None)?,
            "aten.ne.Tensor" | "aten.ne.Scalar" => self.binary(c, BinaryOp::Ne, None)?,
            "aten.ge.Tensor" | "aten.ge.Scalar" => self.binary(c, BinaryOp::Ge, None)?,
            "aten.gt.Tensor" | "aten.gt.Scalar" => self.binary(c, BinaryOp::Gt, None)?,
            "aten.le.Tensor" | "aten.le.Scalar" => self.binary(c, BinaryOp::Le, None)?,
            "aten.lt.Tensor" | "aten.lt.Scalar" => self.binary(c, BinaryOp::Lt, None)?,
            // Bool operands only (the partitioner admits no other dtype), where bitwise and
            // logical agree.
            "aten.logical_and.default" | "aten.bitwise_and.Tensor" => {
                self.binary(c, BinaryOp::And, None)?
            }
            "aten.logical_or.default" | "aten.bitwise_or.Tensor" => {
                self.binary(c, BinaryOp::Or, None)?
            }
            "aten.logical_not.default" => self.unary(c, UnaryOp::LogicalNot)?,
            "aten.full_like.default" => {
                // (self, fill_value, dtype?, layout?, device?, pin_memory?, memory_format?, out):
                // the output's dtype is already resolved in the output tensor.
                let x = self.tensor(a(0)?)?;
                let value = self.double(a(1)?)?;
                let shape = self.dims_of(x);
                let y = self.out(c)?;
                self.g.op(OpKind::Full { value, shape }, vec![], vec![y]);
            }
            "aten.full.default" => {
                // (size, fill_value, dtype?, layout?, device?, pin_memory?, out)
                let shape = self.ints(a(0)?)?;
                let value = self.double(a(1)?)?;
                let y = self.out(c)?;
                self.g.op(OpKind::Full { value, shape }, vec![], vec![y]);
            }
            "gemma_sdpa_with_kv_cache.default" => {
                // (q, k, v, key_cache, value_cache, start_pos, seq_len, attn_mask?, is_causal,
                //  [softcap], out): both caches updated at start_pos, then gemma attention.
                let softcap = (c.args.len() > 10).then_some(9);
                let (qkv, start) = self.update_kv_caches(c)?;
                self.gemma_sdpa(c, qkv, start, a(7)?, a(8)?, softcap)?;
            }
            "gemma_custom_sdpa.default" => {
                // (q, key_cache, value_cache, start_pos, seq_len, attn_mask?, is_causal,
                //  [softcap], out): read-only, the caches already hold this step's K/V.
                let q = self.tensor(a(0)?)?;
                let (kc, vc) = (self.tensor(a(1)?)?, self.tensor(a(2)?)?);
                let start = self.int(a(3)?)?;
                let softcap = (c.args.len() > 8).then_some(7);
                self.gemma_sdpa(c, [q, kc, vc], start, a(5)?, a(6)?, softcap)?;
            }
            "et_vk.apply_rotary_emb.default" => {
                // (xq, xk, freqs_cos [S, D/2], freqs_sin, out: (xq', xk')): Llama's pairwise
                // rotation of dims (2i, 2i+1) by tables already sliced to this call's positions.
                let (cos, sin) = (self.tensor(a(2)?)?, self.tensor(a(3)?)?);
                let cs = self.g.tensors[cos].max_shape.clone();
                let [_, half] = cs[..] else {
                    return Err(format!(
                        "apply_rotary_emb tables {cs:?} are not [S, D/2] (per-head tables have no IR lowering)"
                    ));
                };
                let xs = [self.tensor(a(0)?)?, self.tensor(a(1)?)?];
                for (x, y) in xs.into_iter().zip(self.out_list(c, 2)?) {
                    self.rope(
                        x,
                        y,
                        [cos, sin],
                        RopeStyle::Interleaved,
                        2 * half,
                        Int::Lit(0),
                        true,
                    )?;
                }
            }
            "et_vk.apply_rotary_emb_hf.default" => {
                // (xq, xk, freqs_cos [P, R], freqs_sin, start_pos, out: (xq', xk')): HF
                // rotate_half on the first R dims at rows start_pos.., the rest passed through.
                let start = self.int(a(4)?)?;
                let (cos, sin) = self.half_tables(a(2)?, a(3)?)?;
                let rotary = 2 * self.g.tensors[cos].max_shape[1];
                let xs = [self.tensor(a(0)?)?, self.tensor(a(1)?)?];
                for (x, y) in xs.into_iter().zip(self.out_list(c, 2)?) {
                    self.rope(x, y, [cos, sin], RopeStyle::Half, rotary, start, false)?;
                }
            }
            "et_vk.embedding_q4gsw.default" => {
                // (weight u8 [V, D/2], weight_scales [V, D/group], group_size, indices,
                // is_linear_weight=False) -> [..indices, D]
                let group = self.lit(a(2)?)?;
                let idx = self.tensor(a(3)?)?;
                let linear_packing = c.args.len() > 5 && self.boolean(a(4)?)?;
                let group = usize::try_from(group).map_err(|_| format!("group size {group}"))?;
                let [w, s, b] = self.q4_embedding_weights(a(0)?, a(1)?, group, linear_packing)?;
                let y = self.out(c)?;
                self.g.op(
                    OpKind::Embedding {
                        weight: Weight::Q4 { group },
                    },
                    vec![w, s, b, idx],
                    vec![y],
                );
            }
            other => return Err(format!("operator `{other}` has no lowering")),
        }
        Ok(())
    }
}
