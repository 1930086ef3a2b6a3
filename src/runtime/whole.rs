//! Whole-method lowering: a method's delegates and the CPU ops an export leaves between them
//! (`index_put`, `add.Scalar`, `where`, `copy_` in the stock LLM exports) become one IR graph, so
//! one IR executor runs a whole call: on the GPU one recording and one submit per call, with the
//! KV caches (the method's mutable buffers) resident as State tensors.
//!
//! Method values map to IR tensors as they are written (a value written twice gets a new tensor,
//! so later readers see the new one); a planned tensor that an instruction reads before any writes
//! it carries data from the previous call, so it becomes a State. A method this cannot lower (an
//! operator without a lowering here, control flow, a delegate format without an IR front end)
//! keeps the per-delegate path; the error says why, for `inspect`.

use super::BackendRegistry;
use crate::ir::{self, DType, Int, Io, Node, OpKind, Role, SymId, SymOp, TensorId};
use crate::pte::{EValue, ExecutionPlan, Instruction, NamedData, TensorData};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy)]
enum Bound {
    Tensor(TensorId),
    Sym(SymId),
}

/// Operators that return their result in their last argument, which is also their out tensor
/// (`out`, then the returned value: the same one) for the `.out` kernels.
const LOWERED: &[&str] = &[
    "aten::add.Scalar_out",
    "aten::sub.Scalar_out",
    "aten::mul.Scalar_out",
    "aten::div.Scalar_out",
    "aten::eq.Scalar_out",
    "aten::ne.Scalar_out",
    "aten::lt.Scalar_out",
    "aten::le.Scalar_out",
    "aten::gt.Scalar_out",
    "aten::ge.Scalar_out",
    "aten::logical_and.out",
    "aten::logical_or.out",
    "aten::where.self_out",
    "aten::index_put.out",
    "aten::mean.out",
    "aten::cat.out",
    "aten::embedding.out",
    "quantized_decomposed::embedding_byte.out",
    "quantized_decomposed::embedding_byte.dtype_out",
    "aten::full_like.out",
    "aten::slice_copy.Tensor_out",
    "aten::select_copy.int_out",
    "aten::slice_scatter.out",
    "aten::permute_copy.out",
    "aten::unsqueeze_copy.out",
    "aten::copy.out",
    "dim_order_ops::_to_dim_order_copy.out",
    "llama::custom_sdpa.out",
    "llama::update_cache.out",
    "aten::arange.start_out",
    "aten::scalar_tensor.out",
    "aten::_softmax.out",
    "aten::rsqrt.out",
    "aten::sigmoid.out",
    "aten::logical_not.out",
    "aten::add.out",
    "aten::sub.out",
    "aten::mul.out",
    "aten::div.out",
    "aten::eq.Tensor_out",
    "aten::ne.Tensor_out",
    "aten::lt.Tensor_out",
    "aten::le.Tensor_out",
    "aten::gt.Tensor_out",
    "aten::ge.Tensor_out",
    "aten::squeeze_copy.dims_out",
    "aten::expand_copy.out",
    "aten::any.out",
    "quantized_decomposed::embedding_4bit.out",
    "quantized_decomposed::embedding_4bit.dtype_out",
];

/// Host-integer operators and views: one returned value, no out tensor.
const RETURNS_ONE: &[&str] = &[
    "aten::sym_size.int",
    "aten::_local_scalar_dense",
    "executorch_prim::add.Scalar",
    "executorch_prim::sub.Scalar",
    "executorch_prim::mul.Scalar",
    "executorch_prim::floordiv.Scalar",
    "executorch_prim::floordiv.int",
    "executorch_prim::mod.Scalar",
    "executorch_prim::mod.int",
    "executorch_prim::sym_max.Scalar",
    "executorch_prim::sym_min.Scalar",
    "executorch_prim::et_view.default",
];

/// Which values a top-level operator reads (tensor-list members included) and which it writes,
/// for the operators `Lowerer::kernel` lowers.
fn kernel_io(plan: &ExecutionPlan, key: &str, args: &[usize]) -> Option<(Vec<usize>, Vec<usize>)> {
    let n = args.len();
    let writes: Vec<usize> = if key == "aten::copy_" {
        // copy_(self, src, non_blocking) -> self: self is overwritten, not read.
        return Some((vec![*args.get(1)?], vec![args[0], *args.get(3)?]));
    } else if RETURNS_ONE.contains(&key) && n >= 2 {
        vec![n - 1]
    } else if LOWERED.contains(&key) && n >= 3 {
        vec![n - 2, n - 1]
    } else {
        return None;
    };
    let mut reads = Vec::new();
    for &a in &args[..n - writes.len()] {
        reads.push(a);
        match plan.values.get(a) {
            Some(EValue::TensorList(l)) => reads.extend(l),
            Some(EValue::OptionalTensorList(l)) => reads.extend(l.iter().flatten()),
            _ => {}
        }
    }
    let writes = writes.iter().map(|&i| args[i]).collect();
    Some((reads, writes))
}

fn norm_dim(d: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let n = if d < 0 { d + r } else { d };
    if (0..r).contains(&n) {
        Ok(n as usize)
    } else {
        Err(format!("dim {d} is out of range for rank {rank}"))
    }
}

struct Lowerer<'a> {
    plan: &'a ExecutionPlan,
    g: ir::Graph,
    bound: Vec<Option<Bound>>,
    /// Method values that persist across calls (read before written), as State tensors.
    state: Vec<Option<TensorId>>,
    /// Tensors that share another's storage (an in-place cache write's output and its cache).
    root: HashMap<TensorId, TensorId>,
    /// Per value, the instructions that read it.
    readers: Vec<Vec<usize>>,
    /// Tensors that are one element of a method input (`select_copy` of the input positions),
    /// so `_local_scalar_dense` reads them on the host: (input, element).
    input_element: HashMap<TensorId, (TensorId, usize)>,
    /// Tensors that are a run of a 1-D input's elements (`slice_copy` of `input_pos` with constant
    /// bounds): (input, first element, length).
    input_run: HashMap<TensorId, (TensorId, usize, usize)>,
}

/// Lowers `plan` into one IR graph, or says why it cannot.
pub fn lower_method(
    plan: &ExecutionPlan,
    named: &NamedData,
    backends: &BackendRegistry,
) -> Result<ir::Graph, String> {
    if plan.delegates.is_empty() {
        return Err("the method has no delegates".into());
    }
    let mut subs = Vec::with_capacity(plan.delegates.len());
    for (k, d) in plan.delegates.iter().enumerate() {
        let lowered = backends
            .get(&d.id)
            .and_then(|b| b.lower(d, named))
            .ok_or_else(|| format!("delegate {k}: backend `{}` has no IR front end", d.id))?;
        subs.push(lowered.map_err(|e| format!("delegate {k} ({}): {e}", d.id))?);
    }

    // Reads and writes of every instruction, checked before building anything.
    let nv = plan.values.len();
    let mut io = Vec::with_capacity(plan.instructions.len());
    for (i, ins) in plan.instructions.iter().enumerate() {
        io.push(match ins {
            Instruction::Delegate { delegate, args } => {
                let sub = subs
                    .get(*delegate)
                    .ok_or_else(|| format!("instruction {i}: no delegate {delegate}"))?;
                let n_in = sub.inputs.len();
                if args.len() != n_in + sub.outputs.len() + sub.sym_outputs.len() {
                    return Err(format!(
                        "instruction {i}: delegate {delegate} has {} arguments for {n_in} inputs and {} outputs",
                        args.len(),
                        sub.outputs.len() + sub.sym_outputs.len()
                    ));
                }
                (args[..n_in].to_vec(), args[n_in..].to_vec())
            }
            Instruction::Kernel { op, args } => {
                let key = plan
                    .operators
                    .get(*op)
                    .map(|o| o.key())
                    .ok_or_else(|| format!("instruction {i}: no operator {op}"))?;
                kernel_io(plan, &key, args)
                    .ok_or_else(|| format!("operator `{key}` has no IR lowering"))?
            }
            Instruction::Free { .. } => (vec![], vec![]),
            Instruction::Move { .. } | Instruction::JumpFalse { .. } => {
                return Err(format!("instruction {i}: control flow"))
            }
        });
    }
    let mut readers = vec![Vec::new(); nv];
    let mut written = vec![false; nv];
    let mut persists = vec![false; nv];
    for &v in &plan.inputs {
        if v < nv {
            written[v] = true;
        }
    }
    for (i, (reads, writes)) in io.iter().enumerate() {
        for &v in reads {
            let r = readers
                .get_mut(v)
                .ok_or_else(|| format!("instruction {i}: value {v} does not exist"))?;
            r.push(i);
            if !written[v] {
                if let Some(EValue::Tensor(t)) = plan.values.get(v) {
                    persists[v] = matches!(t.data, TensorData::Planned { .. });
                }
            }
        }
        for &v in writes {
            *written
                .get_mut(v)
                .ok_or_else(|| format!("instruction {i}: value {v} does not exist"))? = true;
        }
    }

    let mut lw = Lowerer {
        plan,
        g: ir::Graph::default(),
        bound: vec![None; nv],
        state: vec![None; nv],
        root: HashMap::new(),
        readers,
        input_element: HashMap::new(),
        input_run: HashMap::new(),
    };
    for (k, &v) in plan.inputs.iter().enumerate() {
        let b = match plan.values.get(v) {
            Some(EValue::Tensor(t)) => {
                let dtype = value_dtype(t.dtype, v)?;
                let id =
                    lw.g.add_tensor(format!("input {k}"), dtype, t.sizes.clone(), Role::Input(k));
                lw.g.inputs.push(Io::Tensor(id));
                Bound::Tensor(id)
            }
            Some(EValue::Int(_)) => {
                let s = lw.g.add_sym(format!("input {k}"));
                lw.g.inputs.push(Io::Sym(s));
                Bound::Sym(s)
            }
            Some(e) => return Err(format!("input {k} is a {}", e.kind())),
            None => return Err(format!("input {k}: value {v} does not exist")),
        };
        lw.bound[v] = Some(b);
    }
    for v in (0..nv).filter(|&v| persists[v]) {
        let Some(EValue::Tensor(t)) = plan.values.get(v) else {
            continue;
        };
        let initial = match &t.data {
            TensorData::Planned { initial, .. } => initial.clone(),
            _ => None,
        };
        let id = lw.g.add_tensor(
            t.fqn.clone().unwrap_or_else(|| format!("buffer %{v}")),
            value_dtype(t.dtype, v)?,
            t.sizes.clone(),
            Role::State(initial),
        );
        lw.state[v] = Some(id);
        lw.bound[v] = Some(Bound::Tensor(id));
    }

    for (i, ins) in plan.instructions.iter().enumerate() {
        let at = |e: String| format!("instruction {i}: {e}");
        match ins {
            Instruction::Delegate { delegate, args } => {
                lw.inline(*delegate, &subs[*delegate], args).map_err(at)?
            }
            Instruction::Kernel { op, args } => {
                let key = plan.operators[*op].key();
                lw.kernel(i, &key, args)
                    .map_err(|e| at(format!("`{key}`: {e}")))?
            }
            _ => {}
        }
    }
    for (k, &v) in plan.outputs.iter().enumerate() {
        let t = lw.tensor(v).map_err(|e| format!("output {k}: {e}"))?;
        let t = lw.as_value_dtype(v, t)?;
        lw.g.outputs.push(t);
    }
    // Delegate boundaries split clusters (an RMSNorm's `+ eps` is a CPU op between two
    // delegates in the stock export): the joined graph fuses them.
    ir::passes::optimize(&mut lw.g);
    ir::passes::finish(&mut lw.g);
    lw.g.validate().map_err(|e| e.to_string())?;
    Ok(lw.g)
}

fn value_dtype(s: crate::pte::ScalarType, v: usize) -> Result<DType, String> {
    DType::from_scalar(s).ok_or_else(|| format!("value {v}: tensors of type {s} are not supported"))
}

fn both_int(a: DType, b: DType) -> bool {
    let int = |d: DType| !d.is_float() && d != DType::Bool;
    int(a) && int(b)
}

impl Lowerer<'_> {
    fn info(&self, v: usize) -> Result<&crate::pte::TensorInfo, String> {
        match self.plan.values.get(v) {
            Some(EValue::Tensor(t)) => Ok(t),
            Some(e) => Err(format!("value {v} is a {}, expected a tensor", e.kind())),
            None => Err(format!("value {v} does not exist")),
        }
    }

    /// The IR tensor holding value `v` now.
    fn tensor(&mut self, v: usize) -> Result<TensorId, String> {
        match self.bound.get(v).copied().flatten() {
            Some(Bound::Tensor(t)) => return Ok(t),
            Some(Bound::Sym(_)) => return Err(format!("value {v} is an integer, not a tensor")),
            None => {}
        }
        let info = self.info(v)?;
        match &info.data {
            TensorData::Constant(b) => {
                let (dtype, shape, blob) =
                    (value_dtype(info.dtype, v)?, info.sizes.clone(), b.clone());
                let id =
                    self.g
                        .add_tensor(format!("constant %{v}"), dtype, shape, Role::Constant(blob));
                self.bound[v] = Some(Bound::Tensor(id));
                Ok(id)
            }
            _ => Err(format!("value {v} is read before anything writes it")),
        }
    }

    /// The host symbol holding integer value `v`.
    fn sym(&mut self, v: usize) -> Result<SymId, String> {
        match self.bound.get(v).copied().flatten() {
            Some(Bound::Sym(s)) => return Ok(s),
            Some(Bound::Tensor(t)) => {
                // A one-element method input read as an integer.
                if matches!(self.g.tensors[t].role, Role::Input(_))
                    && self.g.tensors[t].max_numel() == 1
                {
                    let s = self.g.add_sym(format!("%{v}"));
                    self.g.nodes.push(Node::Sym(SymOp::ReadInput {
                        out: s,
                        tensor: t,
                        index: 0,
                    }));
                    return Ok(s);
                }
                return Err(format!(
                    "value {v} is a tensor computed in the graph, used as a host integer"
                ));
            }
            None => {}
        }
        match self.plan.values.get(v) {
            Some(EValue::Int(i)) => {
                let s = self.g.add_sym(format!("%{v}"));
                self.g.nodes.push(Node::Sym(SymOp::Arith {
                    out: s,
                    op: ir::SymArith::Add,
                    a: Int::Lit(*i),
                    b: Int::Lit(0),
                }));
                self.bound[v] = Some(Bound::Sym(s));
                Ok(s)
            }
            Some(e) => Err(format!("value {v} is a {}, expected an integer", e.kind())),
            None => Err(format!("value {v} does not exist")),
        }
    }

    fn root(&self, t: TensorId) -> TensorId {
        self.root.get(&t).copied().unwrap_or(t)
    }

    fn new_tensor(&mut self, name: String, dtype: DType, shape: Vec<usize>) -> TensorId {
        self.g.add_tensor(name, dtype, shape, Role::Activation)
    }

    /// `t` converted to value `v`'s declared dtype where the two differ as numbers (integer
    /// widths are not converted: both executors hold every integer at one width).
    fn as_value_dtype(&mut self, v: usize, t: TensorId) -> Result<TensorId, String> {
        let want = value_dtype(self.info(v)?.dtype, v)?;
        let have = self.g.tensors[t].dtype;
        if want == have || both_int(want, have) {
            return Ok(t);
        }
        let shape = self.g.tensors[t].max_shape.clone();
        let c = self.new_tensor(format!("%{v} as {}", want.name()), want, shape);
        self.g.op(OpKind::Cast, vec![t], vec![c]);
        Ok(c)
    }

    /// Makes `t` the value of `v`: a persistent value is written in place (a copy into its
    /// State, unless `t` already shares its storage).
    fn write(&mut self, v: usize, t: TensorId) -> Result<(), String> {
        let t = self.as_value_dtype(v, t)?;
        match self.state.get(v).copied().flatten() {
            Some(s) if self.root(t) == s => {}
            Some(s) => {
                if self.g.tensors[t].max_shape != self.g.tensors[s].max_shape {
                    return Err(format!(
                        "a {:?} value is written into buffer %{v} of {:?}",
                        self.g.tensors[t].max_shape, self.g.tensors[s].max_shape
                    ));
                }
                self.g.op(OpKind::Copy, vec![t], vec![s]);
            }
            None => self.bound[v] = Some(Bound::Tensor(t)),
        }
        Ok(())
    }

    fn inline(&mut self, d: usize, sub: &ir::Graph, args: &[usize]) -> Result<(), String> {
        let n_in = sub.inputs.len();
        let mut tmap: Vec<Option<TensorId>> = vec![None; sub.tensors.len()];
        let mut smap: Vec<Option<SymId>> = vec![None; sub.sym_names.len()];
        for (k, io) in sub.inputs.iter().enumerate() {
            let v = args[k];
            match *io {
                Io::Tensor(t) => {
                    let outer = self.tensor(v)?;
                    let want = &sub.tensors[t];
                    let have = self.g.tensors[outer].clone();
                    let mut x = outer;
                    if want.dtype != have.dtype && !both_int(want.dtype, have.dtype) {
                        let c = self.new_tensor(
                            format!("d{d}/{} as {}", want.name, want.dtype.name()),
                            want.dtype,
                            have.max_shape.clone(),
                        );
                        self.g.op(OpKind::Cast, vec![x], vec![c]);
                        x = c;
                    }
                    // A one-element argument fits a one-element input of any rank.
                    if want.max_numel() == 1
                        && have.max_numel() == 1
                        && want.max_shape != have.max_shape
                    {
                        let r = self.new_tensor(
                            format!("d{d}/{}", want.name),
                            self.g.tensors[x].dtype,
                            want.max_shape.clone(),
                        );
                        let shape = want.max_shape.iter().map(|&n| Int::Lit(n as i64)).collect();
                        self.g.op(OpKind::Reshape { shape }, vec![x], vec![r]);
                        x = r;
                    }
                    tmap[t] = Some(x);
                }
                Io::Sym(s) => smap[s] = Some(self.sym(v)?),
            }
        }
        for (t, def) in sub.tensors.iter().enumerate() {
            if tmap[t].is_none() {
                let mut def = def.clone();
                if matches!(def.role, Role::Input(_)) {
                    return Err(format!(
                        "delegate {d}: input tensor {t} is not a graph input"
                    ));
                }
                def.name = format!("d{d}/{}", def.name);
                self.g.tensors.push(def);
                tmap[t] = Some(self.g.tensors.len() - 1);
            }
        }
        for (s, name) in sub.sym_names.iter().enumerate() {
            if smap[s].is_none() {
                smap[s] = Some(self.g.add_sym(format!("d{d}/{name}")));
            }
        }
        let tm = |t: TensorId| tmap[t].unwrap_or(t);
        let sm = |s: SymId| smap[s].unwrap_or(s);
        for node in &sub.nodes {
            self.g.nodes.push(match node {
                Node::Op(o) => {
                    let mut kind = o.kind.clone();
                    kind.map_syms(sm);
                    Node::Op(ir::Op {
                        kind,
                        inputs: o.inputs.iter().map(|&t| tm(t)).collect(),
                        outputs: o.outputs.iter().map(|&t| tm(t)).collect(),
                    })
                }
                Node::Sym(s) => Node::Sym(match *s {
                    SymOp::Size { out, tensor, dim } => SymOp::Size {
                        out: sm(out),
                        tensor: tm(tensor),
                        dim,
                    },
                    SymOp::ReadInput { out, tensor, index } => {
                        let outer = tm(tensor);
                        if !matches!(self.g.tensors[outer].role, Role::Input(_)) {
                            return Err(format!(
                                "delegate {d} reads a host integer from a tensor the graph computes"
                            ));
                        }
                        SymOp::ReadInput {
                            out: sm(out),
                            tensor: outer,
                            index,
                        }
                    }
                    SymOp::Arith { out, op, a, b } => {
                        let mi = |i: Int| match i {
                            Int::Sym(s) => Int::Sym(sm(s)),
                            l => l,
                        };
                        SymOp::Arith {
                            out: sm(out),
                            op,
                            a: mi(a),
                            b: mi(b),
                        }
                    }
                }),
            });
        }
        let outs = &args[n_in..];
        let sym_pos: Vec<usize> = sub.sym_outputs.iter().map(|&(k, _)| k).collect();
        for &(k, s) in &sub.sym_outputs {
            let v = *outs.get(k).ok_or("symbol output out of range")?;
            self.bound[v] = Some(Bound::Sym(sm(s)));
        }
        let tensor_outs = (0..outs.len()).filter(|k| !sym_pos.contains(k));
        for (&t, k) in sub.outputs.iter().zip(tensor_outs) {
            self.write(outs[k], tm(t))?;
        }
        Ok(())
    }

    /// Integer argument `v`: a host symbol where something computes it, else its literal.
    fn int(&mut self, v: usize) -> Result<Int, String> {
        match self.bound.get(v).copied().flatten() {
            Some(Bound::Sym(s)) => Ok(Int::Sym(s)),
            Some(Bound::Tensor(_)) => Ok(Int::Sym(self.sym(v)?)),
            None => match self.plan.values.get(v) {
                Some(EValue::Int(i)) => Ok(Int::Lit(*i)),
                Some(e) => Err(format!(
                    "argument %{v} is a {}, expected an integer",
                    e.kind()
                )),
                None => Err(format!("value {v} does not exist")),
            },
        }
    }

    /// An optional integer argument (`None` for a null value).
    fn opt_int(&mut self, v: usize) -> Result<Option<Int>, String> {
        match self.plan.values.get(v) {
            Some(EValue::Null) => Ok(None),
            _ => self.int(v).map(Some),
        }
    }

    /// An integer the program fixes (a dim, a step), not one computed per call.
    fn lit(&mut self, v: usize) -> Result<i64, String> {
        match self.int(v)? {
            Int::Lit(i) => Ok(i),
            Int::Sym(_) => Err(format!(
                "argument %{v} varies per call where a constant is needed"
            )),
        }
    }

    fn int_list(&mut self, v: usize) -> Result<Vec<Int>, String> {
        match self.plan.values.get(v) {
            Some(EValue::IntList(l)) => l.clone().into_iter().map(|m| self.int(m)).collect(),
            Some(e) => Err(format!(
                "argument %{v} is a {}, expected an int list",
                e.kind()
            )),
            None => Err(format!("value {v} does not exist")),
        }
    }

    fn lit_list(&mut self, v: usize) -> Result<Vec<i64>, String> {
        self.int_list(v)?
            .into_iter()
            .map(|i| match i {
                Int::Lit(i) => Ok(i),
                Int::Sym(_) => Err(format!(
                    "list %{v} varies per call where constants are needed"
                )),
            })
            .collect()
    }

    /// Each dim of `t` as this call's size (a host symbol: the tensor may be dynamic).
    fn sizes(&mut self, t: TensorId) -> Vec<Int> {
        (0..self.g.tensors[t].max_shape.len())
            .map(|dim| {
                let s = self
                    .g
                    .add_sym(format!("size {dim} of {}", self.g.tensors[t].name));
                self.g.nodes.push(Node::Sym(SymOp::Size {
                    out: s,
                    tensor: t,
                    dim,
                }));
                Int::Sym(s)
            })
            .collect()
    }

    /// `t` as `dtype` (a cast where they differ as numbers).
    fn cast_to(&mut self, t: TensorId, dtype: DType, name: String) -> TensorId {
        let have = self.g.tensors[t].dtype;
        if have == dtype || both_int(have, dtype) {
            return t;
        }
        let shape = self.g.tensors[t].max_shape.clone();
        let c = self.new_tensor(name, dtype, shape);
        self.g.op(OpKind::Cast, vec![t], vec![c]);
        c
    }

    /// An f32 constant made at load time (quantization parameters converted to the IR's form).
    fn f32_constant(&mut self, name: String, shape: Vec<usize>, v: &[f32]) -> TensorId {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let blob = crate::pte::Blob::whole(std::sync::Arc::new(crate::pte::Bytes::Owned(bytes)));
        self.g
            .add_tensor(name, DType::F32, shape, Role::Constant(blob))
    }

    /// Writes `t` to the value named by out-variant argument `out` and its returned value `ret`.
    fn write_out(&mut self, out: usize, ret: usize, t: TensorId) -> Result<(), String> {
        self.write(out, t)?;
        if ret != out {
            self.bound[ret] = self.bound[out];
        }
        Ok(())
    }

    /// The scales and biases (`w = s·u + b` for stored value u, b = -s·(offset + zp)) of a quantized
    /// embedding's `scales [V] or [V, G]` and `zero_points?` arguments (1 and 2), and G.
    fn embedding_qparams(
        &self,
        args: &[usize],
        rows: usize,
        cols: usize,
        offset: f32,
    ) -> Result<(Vec<f32>, Vec<f32>, usize), String> {
        let const_f32 = |v: usize| -> Result<(Vec<usize>, Vec<f32>), String> {
            let t = self.info(v)?;
            let TensorData::Constant(b) = &t.data else {
                return Err(format!("quantization parameter %{v} is not a constant"));
            };
            let vals = crate::runtime::tensor::to_f64(value_dtype(t.dtype, v)?, b);
            Ok((
                t.sizes.clone(),
                vals.into_iter().map(|x| x as f32).collect(),
            ))
        };
        let (ss, scales) = const_f32(args[1])?;
        let groups = match ss[..] {
            [r] if r == rows => 1,
            [r, g] if r == rows && g > 0 && cols % g == 0 => g,
            _ => return Err(format!("scales {ss:?} do not fit a [{rows}, {cols}] table")),
        };
        let zps = match self.plan.values.get(args[2]) {
            Some(EValue::Null) => vec![0.0; scales.len()],
            _ => const_f32(args[2])?.1,
        };
        if zps.len() != scales.len() {
            return Err("zero points and scales differ in size".into());
        }
        let biases = scales
            .iter()
            .zip(&zps)
            .map(|(s, z)| -s * (offset + z))
            .collect();
        Ok((scales, biases, groups))
    }

    /// `embedding_qparams`' results as f32 constants `[rows, groups]`.
    fn qparam_tensors(
        &mut self,
        sv: usize,
        rows: usize,
        groups: usize,
        scales: &[f32],
        biases: &[f32],
    ) -> (TensorId, TensorId) {
        (
            self.f32_constant(format!("%{sv} scales"), vec![rows, groups], scales),
            self.f32_constant(format!("%{sv} biases"), vec![rows, groups], biases),
        )
    }

    /// A quantized embedding's constant table (argument 0) of `dtype`: its info, bytes, and
    /// [rows, bytes a row].
    fn quantized_table(
        &self,
        args: &[usize],
        op: &str,
        dtype: DType,
    ) -> Result<(crate::pte::Blob, [usize; 2]), String> {
        let wv = args[0];
        let info = self.info(wv)?;
        let TensorData::Constant(blob) = &info.data else {
            return Err(format!("{op} weight is not a constant"));
        };
        let [rows, cols] = info.sizes[..] else {
            return Err(format!("{op} weight {:?} is not 2-D", info.sizes));
        };
        if value_dtype(info.dtype, wv)? != dtype {
            return Err(format!(
                "{op} table of {} ({} only)",
                info.dtype,
                dtype.name()
            ));
        }
        Ok((blob.clone(), [rows, cols]))
    }

    /// The IR embedding of table `w` (`cols` wide) with its qparams, by the indices (argument 5).
    fn quantized_embedding(
        &mut self,
        args: &[usize],
        w: TensorId,
        cols: usize,
        four: bool,
        offset: f32,
    ) -> Result<TensorId, String> {
        let rows = self.g.tensors[w].max_shape[0];
        let (scales, biases, groups) = self.embedding_qparams(args, rows, cols, offset)?;
        let (s, b) = self.qparam_tensors(args[1], rows, groups, &scales, &biases);
        let idx = self.tensor(args[5])?;
        let shape = [self.g.tensors[idx].max_shape.clone(), vec![cols]].concat();
        let o = self.new_tensor(format!("embedding %{}", args[0]), DType::F32, shape);
        let group = cols / groups;
        let weight = if four {
            ir::Weight::Q4 { group }
        } else {
            ir::Weight::Q8 { group }
        };
        self.g
            .op(OpKind::Embedding { weight }, vec![w, s, b, idx], vec![o]);
        Ok(o)
    }

    /// `embedding_byte(weight i8 [V, D], scales [V] or [V, G], zero_points?, qmin, qmax,
    /// indices [, dtype])` as the IR's 8-bit embedding (`w = s·q + b`, b = -s·zp).
    fn embedding_byte(&mut self, args: &[usize]) -> Result<TensorId, String> {
        let (_, [_, cols]) = self.quantized_table(args, "embedding_byte", DType::I8)?;
        let w = self.tensor(args[0])?;
        self.quantized_embedding(args, w, cols, false, 0.0)
    }

    /// `embedding_4bit(weight u8 [V, D/2], scales [V] or [V, G], zero_points?, qmin, qmax,
    /// indices [, dtype])` as the IR's 4-bit embedding: ExecuTorch packs column 2j in the high
    /// nibble, stored as q + 8; the IR reads 2j from the low nibble, so the nibbles swap at load,
    /// and w = s·(u - 8 - zp) gives b = -s·(8 + zp).
    fn embedding_4bit(&mut self, args: &[usize]) -> Result<TensorId, String> {
        let (blob, [rows, half]) = self.quantized_table(args, "embedding_4bit", DType::U8)?;
        let swapped: Vec<u8> = blob.iter().map(|b| b.rotate_left(4)).collect();
        let blob = crate::pte::Blob::whole(std::sync::Arc::new(crate::pte::Bytes::Owned(swapped)));
        let w = self.g.add_tensor(
            format!("%{} low nibble first", args[0]),
            DType::U8,
            vec![rows, half],
            Role::Constant(blob),
        );
        self.quantized_embedding(args, w, half * 2, true, 8.0)
    }

    /// `et_view(self, size) -> out`: the same elements in a new shape (sizes may be symbols).
    fn et_view(&mut self, args: &[usize]) -> Result<(), String> {
        let x = self.tensor(args[0])?;
        let shape = self.int_list(args[1])?;
        let o = {
            let info = self.info(args[2])?;
            let (dtype, max) = (value_dtype(info.dtype, args[2])?, info.sizes.clone());
            self.new_tensor(format!("%{}", args[2]), dtype, max)
        };
        if self.g.tensors[o].dtype != self.g.tensors[x].dtype {
            return Err("et_view changes the dtype".into());
        }
        self.g.op(OpKind::Reshape { shape }, vec![x], vec![o]);
        self.write(args[2], o)
    }

    /// Whether value `v` may be changed in place at instruction `i`: nothing reads it later but
    /// `copy_`s of `out` back into it, and the method does not return it.
    fn dead_after(&self, v: usize, i: usize, out: usize) -> bool {
        !self.plan.outputs.contains(&v)
            && self.readers[v].iter().all(|&r| {
                r <= i
                    || matches!(&self.plan.instructions[r], Instruction::Kernel { op, args }
                        if self.plan.operators[*op].key() == "aten::copy_"
                            && args.first() == Some(&v)
                            && args.get(1) == Some(&out))
            })
    }

    fn kernel(&mut self, i: usize, key: &str, args: &[usize]) -> Result<(), String> {
        let scalar = |v: usize| match self.plan.values.get(v) {
            Some(EValue::Double(x)) => Ok(*x),
            Some(EValue::Int(x)) => Ok(*x as f64),
            Some(EValue::Bool(b)) => Ok(*b as u8 as f64),
            _ => Err(format!("argument %{v} is not a constant scalar")),
        };
        let out_like = |lw: &mut Self, v: usize| -> Result<TensorId, String> {
            let info = lw.info(v)?;
            let (dtype, shape) = (value_dtype(info.dtype, v)?, info.sizes.clone());
            Ok(lw.new_tensor(format!("%{v}"), dtype, shape))
        };
        match key {
            "aten::add.Scalar_out" | "aten::sub.Scalar_out" => {
                let x = self.tensor(args[0])?;
                let s = scalar(args[1])? * scalar(args[2])?;
                let op = if key.contains("add") {
                    ir::BinaryOp::Add
                } else {
                    ir::BinaryOp::Sub
                };
                let o = out_like(self, args[3])?;
                self.g.op(
                    OpKind::BinaryScalar {
                        op,
                        scalar: s,
                        scalar_first: false,
                    },
                    vec![x],
                    vec![o],
                );
                self.write(args[3], o)
            }
            "aten::mul.Scalar_out" | "aten::div.Scalar_out" => {
                let x = self.tensor(args[0])?;
                let op = if key.contains("mul") {
                    ir::BinaryOp::Mul
                } else {
                    ir::BinaryOp::Div
                };
                let o = out_like(self, args[2])?;
                self.g.op(
                    OpKind::BinaryScalar {
                        op,
                        scalar: scalar(args[1])?,
                        scalar_first: false,
                    },
                    vec![x],
                    vec![o],
                );
                self.write(args[2], o)
            }
            "aten::where.self_out" => {
                let ins = [
                    self.tensor(args[0])?,
                    self.tensor(args[1])?,
                    self.tensor(args[2])?,
                ];
                let o = out_like(self, args[3])?;
                self.g.op(OpKind::Where, ins.to_vec(), vec![o]);
                self.write(args[3], o)
            }
            "aten::index_put.out" => {
                let (sv, out) = (args[0], args[4]);
                let indices = match self.plan.values.get(args[1]) {
                    Some(EValue::OptionalTensorList(l)) => l.clone(),
                    _ => return Err("indices are not an optional tensor list".into()),
                };
                if scalar(args[3])? != 0.0 {
                    return Err("accumulating index_put".into());
                }
                let given: Vec<(usize, usize)> = indices
                    .iter()
                    .enumerate()
                    .filter_map(|(a, v)| v.map(|v| (a, v)))
                    .collect();
                let [(axis, iv)] = given[..] else {
                    return Err("index_put with other than one index tensor".into());
                };
                let cache = self.tensor(sv)?;
                let value = self.tensor(args[2])?;
                let idx = self.tensor(iv)?;
                let (cs, vs) = (
                    self.g.tensors[cache].max_shape.clone(),
                    self.g.tensors[value].max_shape.clone(),
                );
                if vs.len() != cs.len()
                    || self.g.tensors[idx].max_shape.len() != 1
                    || self.g.tensors[idx].dtype.is_float()
                {
                    return Err(format!(
                        "index_put of {vs:?} into {cs:?} along dim {axis} (only whole rows by a 1-D index)"
                    ));
                }
                let value = if self.g.tensors[value].dtype != self.g.tensors[cache].dtype {
                    let c = self.new_tensor(
                        format!("%{} as cache", args[2]),
                        self.g.tensors[cache].dtype,
                        vs,
                    );
                    self.g.op(OpKind::Cast, vec![value], vec![c]);
                    c
                } else {
                    value
                };
                // In place when the old cache is dead afterwards (the stock KV cache: the
                // buffer is copied back from this output at the end of the method).
                let target = if self.dead_after(sv, i, out) {
                    cache
                } else {
                    let c = self.new_tensor(
                        format!("%{sv} copy"),
                        self.g.tensors[cache].dtype,
                        cs.clone(),
                    );
                    self.g.op(OpKind::Copy, vec![cache], vec![c]);
                    c
                };
                let o = out_like(self, out)?;
                self.g.tensors[o].max_shape = cs;
                self.g.op(
                    OpKind::CacheUpdate {
                        axis,
                        start: Int::Lit(0),
                    },
                    vec![target, value, idx],
                    vec![o],
                );
                let r = self.root(target);
                self.root.insert(o, r);
                self.write(out, o)
            }
            "aten::copy_" => {
                let (dst, src) = (args[0], self.tensor(args[1])?);
                let d = self.info(dst)?.sizes.clone();
                if self.g.tensors[src].max_shape != d {
                    return Err(format!(
                        "copy of {:?} into {d:?} (broadcasting copies are not lowered)",
                        self.g.tensors[src].max_shape
                    ));
                }
                if self.state[dst].is_some() {
                    self.write(dst, src)?;
                } else {
                    let o = out_like(self, dst)?;
                    self.g.op(OpKind::Copy, vec![src], vec![o]);
                    self.write(dst, o)?;
                }
                let now = self.bound[dst];
                if args[3] != dst {
                    self.bound[args[3]] = now;
                }
                Ok(())
            }
            "aten::eq.Scalar_out"
            | "aten::ne.Scalar_out"
            | "aten::lt.Scalar_out"
            | "aten::le.Scalar_out"
            | "aten::gt.Scalar_out"
            | "aten::ge.Scalar_out" => {
                use ir::BinaryOp::*;
                let op = match &key[6..8] {
                    "eq" => Eq,
                    "ne" => Ne,
                    "lt" => Lt,
                    "le" => Le,
                    "gt" => Gt,
                    _ => Ge,
                };
                let x = self.tensor(args[0])?;
                let o = out_like(self, args[2])?;
                self.g.op(
                    OpKind::BinaryScalar {
                        op,
                        scalar: scalar(args[1])?,
                        scalar_first: false,
                    },
                    vec![x],
                    vec![o],
                );
                self.write_out(args[2], args[3], o)
            }
            "aten::logical_and.out" | "aten::logical_or.out" => {
                let op = if key.contains("and") {
                    ir::BinaryOp::And
                } else {
                    ir::BinaryOp::Or
                };
                let (a, b) = (self.tensor(args[0])?, self.tensor(args[1])?);
                let o = out_like(self, args[2])?;
                self.g.op(OpKind::Binary(op), vec![a, b], vec![o]);
                self.write_out(args[2], args[3], o)
            }
            "aten::mean.out" => {
                // (self, dim?, keepdim, dtype?, out)
                let x = self.tensor(args[0])?;
                let rank = self.g.tensors[x].max_shape.len();
                let mut dims = match self.plan.values.get(args[1]) {
                    Some(EValue::Null) => vec![],
                    _ => self
                        .lit_list(args[1])?
                        .into_iter()
                        .map(|d| norm_dim(d, rank))
                        .collect::<Result<Vec<_>, _>>()?,
                };
                if dims.is_empty() {
                    dims = (0..rank).collect();
                }
                dims.sort_unstable();
                dims.dedup();
                let keepdim = scalar(args[2])? != 0.0;
                let o = out_like(self, args[4])?;
                let x = self.cast_to(x, self.g.tensors[o].dtype, format!("%{} as out", args[0]));
                self.g.op(OpKind::Mean { dims, keepdim }, vec![x], vec![o]);
                self.write_out(args[4], args[5], o)
            }
            "aten::cat.out" => {
                let members = match self.plan.values.get(args[0]) {
                    Some(EValue::TensorList(l)) => l.clone(),
                    _ => return Err("inputs are not a tensor list".into()),
                };
                let o = out_like(self, args[2])?;
                let dt = self.g.tensors[o].dtype;
                let mut ins = Vec::with_capacity(members.len());
                for m in members {
                    let t = self.tensor(m)?;
                    ins.push(self.cast_to(t, dt, format!("%{m} as out")));
                }
                let rank = self.g.tensors[o].max_shape.len();
                let dim = norm_dim(self.lit(args[1])?, rank)?;
                self.g.op(OpKind::Concat { dim }, ins, vec![o]);
                self.write_out(args[2], args[3], o)
            }
            "aten::embedding.out" => {
                // (weight, indices, padding_idx, scale_grad_by_freq, sparse, out)
                let (w, idx) = (self.tensor(args[0])?, self.tensor(args[1])?);
                if self.g.tensors[w].dtype != DType::F32 || self.g.tensors[w].max_shape.len() != 2 {
                    return Err("only 2-D f32 tables are lowered".into());
                }
                let o = out_like(self, args[5])?;
                self.g.op(
                    OpKind::Embedding {
                        weight: ir::Weight::F32,
                    },
                    vec![w, idx],
                    vec![o],
                );
                self.write_out(args[5], args[6], o)
            }
            "quantized_decomposed::embedding_byte.out"
            | "quantized_decomposed::embedding_byte.dtype_out"
            | "quantized_decomposed::embedding_4bit.out"
            | "quantized_decomposed::embedding_4bit.dtype_out" => {
                // The IR's embedding writes the out value itself (`write` converts its dtype).
                let n = args.len();
                let y = if key.contains("4bit") {
                    self.embedding_4bit(args)?
                } else {
                    self.embedding_byte(args)?
                };
                self.write_out(args[n - 2], args[n - 1], y)
            }
            "aten::full_like.out" => {
                // (self, fill_value, memory_format?, out)
                let x = self.tensor(args[0])?;
                let shape = self.sizes(x);
                let o = out_like(self, args[3])?;
                self.g.op(
                    OpKind::Full {
                        value: scalar(args[1])?,
                        shape,
                    },
                    vec![],
                    vec![o],
                );
                self.write_out(args[3], args[4], o)
            }
            "aten::slice_copy.Tensor_out" => {
                // (self, dim, start?, end?, step, out)
                let x = self.tensor(args[0])?;
                let dim = norm_dim(self.lit(args[1])?, self.g.tensors[x].max_shape.len())?;
                let start = self.opt_int(args[2])?.unwrap_or(Int::Lit(0));
                let end = self.opt_int(args[3])?.unwrap_or(Int::Lit(i64::MAX));
                let step = self.lit(args[4])?;
                let step = usize::try_from(step)
                    .ok()
                    .filter(|&s| s > 0)
                    .ok_or_else(|| format!("slice step {step} must be positive"))?;
                let o = out_like(self, args[5])?;
                if let (Role::Input(_), 1, Int::Lit(a), Int::Lit(b), 1) = (
                    &self.g.tensors[x].role,
                    self.g.tensors[x].max_shape.len(),
                    start,
                    end,
                    step,
                ) {
                    if let (Ok(a), Ok(b)) = (usize::try_from(a), usize::try_from(b)) {
                        if b > a {
                            self.input_run.insert(o, (x, a, b - a));
                        }
                    }
                }
                let kind = OpKind::Slice {
                    dim,
                    start,
                    end,
                    step,
                };
                self.g.op(kind, vec![x], vec![o]);
                self.write_out(args[5], args[6], o)
            }
            "aten::select_copy.int_out" => {
                // (self, dim, index, out)
                let x = self.tensor(args[0])?;
                let shape = self.g.tensors[x].max_shape.clone();
                let dim = norm_dim(self.lit(args[1])?, shape.len())?;
                let index = self.int(args[2])?;
                let o = out_like(self, args[3])?;
                self.g.op(OpKind::Select { dim, index }, vec![x], vec![o]);
                // One element of a constant run of an input's elements: the same, offset.
                if let (Some(&(input, first, n)), Int::Lit(i), 0) =
                    (self.input_run.get(&x), index, dim)
                {
                    let i = if i < 0 { i + n as i64 } else { i };
                    if (0..n as i64).contains(&i) {
                        self.input_element.insert(o, (input, first + i as usize));
                    }
                }
                // One element of an input (the start position of `input_pos`): readable on the
                // host, so `_local_scalar_dense` needs no readback.
                let others_one = shape.iter().enumerate().all(|(d, &n)| d == dim || n == 1);
                if let (Role::Input(_), Int::Lit(i), true) =
                    (&self.g.tensors[x].role, index, others_one)
                {
                    // -1 of a one-element input is its element 0 (a decode step's last position).
                    let i = if i == -1 && shape[dim] == 1 { 0 } else { i };
                    if let Ok(i) = usize::try_from(i) {
                        self.input_element.insert(o, (x, i));
                    }
                }
                self.write_out(args[3], args[4], o)
            }
            "aten::_local_scalar_dense" => {
                let x = self.tensor(args[0])?;
                let (tensor, index) = match self.input_element.get(&x) {
                    Some(&e) => e,
                    None if matches!(self.g.tensors[x].role, Role::Input(_))
                        && self.g.tensors[x].max_numel() == 1 =>
                    {
                        (x, 0)
                    }
                    None => {
                        return Err(
                            "reads a tensor the graph computes as a host number (not one element of an input)"
                                .into(),
                        )
                    }
                };
                if self.g.tensors[tensor].dtype.is_float() {
                    return Err("reads a float input as a host number".into());
                }
                let out = self.g.add_sym(format!("%{}", args[1]));
                self.g
                    .nodes
                    .push(Node::Sym(SymOp::ReadInput { out, tensor, index }));
                self.bound[args[1]] = Some(Bound::Sym(out));
                Ok(())
            }
            "aten::sym_size.int" => {
                let x = self.tensor(args[0])?;
                let dim = norm_dim(self.lit(args[1])?, self.g.tensors[x].max_shape.len())?;
                let out = self.g.add_sym(format!("%{}", args[2]));
                self.g.nodes.push(Node::Sym(SymOp::Size {
                    out,
                    tensor: x,
                    dim,
                }));
                self.bound[args[2]] = Some(Bound::Sym(out));
                Ok(())
            }
            k if k.starts_with("executorch_prim::") => {
                use ir::SymArith::*;
                let op = match k.split("::").nth(1).and_then(|n| n.split('.').next()) {
                    Some("add") => Add,
                    Some("sub") => Sub,
                    Some("mul") => Mul,
                    Some("floordiv") => FloorDiv,
                    Some("mod") => Mod,
                    Some("sym_max") => Max,
                    Some("sym_min") => Min,
                    _ if k == "executorch_prim::et_view.default" => return self.et_view(args),
                    _ => return Err("no IR lowering".into()),
                };
                let (a, b) = (self.int(args[0])?, self.int(args[1])?);
                let out = self.g.add_sym(format!("%{}", args[2]));
                self.g.nodes.push(Node::Sym(SymOp::Arith { out, op, a, b }));
                self.bound[args[2]] = Some(Bound::Sym(out));
                Ok(())
            }
            "aten::permute_copy.out" => {
                let x = self.tensor(args[0])?;
                let rank = self.g.tensors[x].max_shape.len();
                let perm = self
                    .lit_list(args[1])?
                    .into_iter()
                    .map(|d| norm_dim(d, rank))
                    .collect::<Result<Vec<_>, _>>()?;
                let o = out_like(self, args[2])?;
                self.g.op(OpKind::Permute { perm }, vec![x], vec![o]);
                self.write_out(args[2], args[3], o)
            }
            "aten::unsqueeze_copy.out" => {
                let x = self.tensor(args[0])?;
                let mut shape = self.sizes(x);
                let dim = norm_dim(self.lit(args[1])?, shape.len() + 1)?;
                shape.insert(dim, Int::Lit(1));
                let o = out_like(self, args[2])?;
                self.g.op(OpKind::Reshape { shape }, vec![x], vec![o]);
                self.write_out(args[2], args[3], o)
            }
            "aten::copy.out" => {
                // (self, src, non_blocking, out): src broadcast to self's shape, in out's dtype.
                let (x, src) = (self.tensor(args[0])?, self.tensor(args[1])?);
                let o = out_like(self, args[3])?;
                let src =
                    self.cast_to(src, self.g.tensors[o].dtype, format!("%{} as out", args[1]));
                if self.g.tensors[src].max_shape == self.g.tensors[x].max_shape {
                    self.g.op(OpKind::Copy, vec![src], vec![o]);
                } else {
                    let shape = self.sizes(x);
                    self.g.op(OpKind::Expand { shape }, vec![src], vec![o]);
                }
                self.write_out(args[3], args[4], o)
            }
            "dim_order_ops::_to_dim_order_copy.out" => {
                // (self, non_blocking, dim_order?, out)
                let x = self.tensor(args[0])?;
                if !matches!(self.plan.values.get(args[2]), Some(EValue::Null)) {
                    let order = self.lit_list(args[2])?;
                    if order.iter().enumerate().any(|(i, &d)| d != i as i64) {
                        return Err(format!("dim order {order:?} is not contiguous"));
                    }
                }
                let o = out_like(self, args[3])?;
                let kind = if self.g.tensors[x].dtype == self.g.tensors[o].dtype {
                    OpKind::Copy
                } else {
                    OpKind::Cast
                };
                self.g.op(kind, vec![x], vec![o]);
                self.write_out(args[3], args[4], o)
            }
            "aten::slice_scatter.out" => {
                // (self, src, dim, start?, end?, step, out): with step 1, a cache write at start.
                let (sv, out) = (args[0], args[6]);
                let cache = self.tensor(sv)?;
                let cs = self.g.tensors[cache].max_shape.clone();
                let axis = norm_dim(self.lit(args[2])?, cs.len())?;
                if self.lit(args[5])? != 1 {
                    return Err("slice_scatter with a step other than 1".into());
                }
                let start = self.opt_int(args[3])?.unwrap_or(Int::Lit(0));
                let src = self.tensor(args[1])?;
                let dt = self.g.tensors[cache].dtype;
                let src = self.cast_to(src, dt, format!("%{} as cache", args[1]));
                let target = if self.dead_after(sv, i, out) {
                    cache
                } else {
                    let c = self.new_tensor(format!("%{sv} copy"), dt, cs.clone());
                    self.g.op(OpKind::Copy, vec![cache], vec![c]);
                    c
                };
                let o = out_like(self, out)?;
                self.g.tensors[o].max_shape = cs;
                self.g.op(
                    OpKind::CacheUpdate { axis, start },
                    vec![target, src],
                    vec![o],
                );
                let r = self.root(target);
                self.root.insert(o, r);
                self.write_out(out, args[7], o)
            }
            "llama::custom_sdpa.out" => {
                // (q, k_cache, v_cache, start_pos, attn_mask?, dropout_p, is_causal, scale?, out)
                let mut ins = vec![
                    self.tensor(args[0])?,
                    self.tensor(args[1])?,
                    self.tensor(args[2])?,
                ];
                let start = self.int(args[3])?;
                if !matches!(self.plan.values.get(args[4]), Some(EValue::Null)) {
                    ins.push(self.tensor(args[4])?);
                }
                if scalar(args[5])? != 0.0 {
                    return Err("attention with dropout".into());
                }
                let causal = scalar(args[6])? != 0.0;
                let d = *self.g.tensors[ins[0]]
                    .max_shape
                    .last()
                    .ok_or("scalar query")?;
                let scale = match self.plan.values.get(args[7]) {
                    Some(EValue::Null) => None,
                    _ => Some(scalar(args[7])? as f32),
                };
                let o = out_like(self, args[8])?;
                let kind = OpKind::cached_sdpa(scale, d, causal, start);
                self.g.op(kind, ins, vec![o]);
                self.write_out(args[8], args[9], o)
            }
            "aten::rsqrt.out" | "aten::sigmoid.out" | "aten::logical_not.out" => {
                let op = match key {
                    "aten::rsqrt.out" => ir::UnaryOp::Rsqrt,
                    "aten::sigmoid.out" => ir::UnaryOp::Sigmoid,
                    _ => ir::UnaryOp::LogicalNot,
                };
                let x = self.tensor(args[0])?;
                let o = out_like(self, args[1])?;
                self.g.op(OpKind::Unary(op), vec![x], vec![o]);
                self.write_out(args[1], args[2], o)
            }
            "aten::add.out" | "aten::sub.out" | "aten::mul.out" | "aten::div.out" => {
                use ir::BinaryOp::*;
                let op = match &key[6..9] {
                    "add" => Add,
                    "sub" => Sub,
                    "mul" => Mul,
                    _ => Div,
                };
                let (a, mut b) = (self.tensor(args[0])?, self.tensor(args[1])?);
                let n = args.len();
                // add/sub(self, other, alpha): other scaled by alpha first.
                let alpha = if matches!(op, Add | Sub) {
                    scalar(args[2])?
                } else {
                    1.0
                };
                if alpha != 1.0 {
                    let bs = self.g.tensors[b].clone();
                    let c =
                        self.new_tensor(format!("%{} * alpha", args[1]), bs.dtype, bs.max_shape);
                    self.g.op(
                        OpKind::BinaryScalar {
                            op: Mul,
                            scalar: alpha,
                            scalar_first: false,
                        },
                        vec![b],
                        vec![c],
                    );
                    b = c;
                }
                let o = out_like(self, args[n - 2])?;
                self.g.op(OpKind::Binary(op), vec![a, b], vec![o]);
                self.write_out(args[n - 2], args[n - 1], o)
            }
            "aten::eq.Tensor_out"
            | "aten::ne.Tensor_out"
            | "aten::lt.Tensor_out"
            | "aten::le.Tensor_out"
            | "aten::gt.Tensor_out"
            | "aten::ge.Tensor_out" => {
                use ir::BinaryOp::*;
                let op = match &key[6..8] {
                    "eq" => Eq,
                    "ne" => Ne,
                    "lt" => Lt,
                    "le" => Le,
                    "gt" => Gt,
                    _ => Ge,
                };
                let (a, b) = (self.tensor(args[0])?, self.tensor(args[1])?);
                let o = out_like(self, args[2])?;
                self.g.op(OpKind::Binary(op), vec![a, b], vec![o]);
                self.write_out(args[2], args[3], o)
            }
            "aten::_softmax.out" => {
                // (self, dim, half_to_float, out): the IR's softmax is over the last dim.
                let x = self.tensor(args[0])?;
                let rank = self.g.tensors[x].max_shape.len();
                if norm_dim(self.lit(args[1])?, rank)? + 1 != rank {
                    return Err("softmax over other than the last dim".into());
                }
                let o = out_like(self, args[3])?;
                self.g.op(OpKind::Softmax, vec![x], vec![o]);
                self.write_out(args[3], args[4], o)
            }
            "aten::arange.start_out" => {
                // (start, end, step, out)
                let (start, end) = (self.int(args[0])?, self.int(args[1])?);
                let step = self.lit(args[2])?;
                if step == 0 {
                    return Err("arange step is zero".into());
                }
                let o = out_like(self, args[3])?;
                self.g
                    .op(OpKind::Arange { start, end, step }, vec![], vec![o]);
                self.write_out(args[3], args[4], o)
            }
            "aten::scalar_tensor.out" => {
                // (s, out): a 0-D tensor; a host integer becomes one by arange(s, s + 1).
                let o = out_like(self, args[1])?;
                match self.plan.values.get(args[0]) {
                    Some(EValue::Double(_) | EValue::Bool(_)) => self.g.op(
                        OpKind::Full {
                            value: scalar(args[0])?,
                            shape: vec![],
                        },
                        vec![],
                        vec![o],
                    ),
                    _ => match self.int(args[0])? {
                        Int::Lit(v) => self.g.op(
                            OpKind::Full {
                                value: v as f64,
                                shape: vec![],
                            },
                            vec![],
                            vec![o],
                        ),
                        start => {
                            let end = self.g.add_sym(format!("%{} + 1", args[0]));
                            self.g.nodes.push(Node::Sym(SymOp::Arith {
                                out: end,
                                op: ir::SymArith::Add,
                                a: start,
                                b: Int::Lit(1),
                            }));
                            let dt = self.g.tensors[o].dtype;
                            let r = self.new_tensor(format!("%{} as [1]", args[0]), dt, vec![1]);
                            let kind = OpKind::Arange {
                                start,
                                end: Int::Sym(end),
                                step: 1,
                            };
                            self.g.op(kind, vec![], vec![r]);
                            self.g
                                .op(OpKind::Reshape { shape: vec![] }, vec![r], vec![o]);
                        }
                    },
                }
                self.write_out(args[1], args[2], o)
            }
            "aten::squeeze_copy.dims_out" => {
                // (self, dims, out): dims of size 1 removed (others stay, as ATen does).
                let x = self.tensor(args[0])?;
                let max = self.g.tensors[x].max_shape.clone();
                let dims = self
                    .lit_list(args[1])?
                    .into_iter()
                    .map(|d| norm_dim(d, max.len()))
                    .collect::<Result<Vec<_>, _>>()?;
                let sizes = self.sizes(x);
                let shape = sizes
                    .into_iter()
                    .enumerate()
                    .filter(|&(d, _)| !(dims.contains(&d) && max[d] == 1))
                    .map(|(_, s)| s)
                    .collect();
                let o = out_like(self, args[2])?;
                self.g.op(OpKind::Reshape { shape }, vec![x], vec![o]);
                self.write_out(args[2], args[3], o)
            }
            "llama::update_cache.out" => {
                // (value [B, S, H, D], cache, start_pos, out): the cache written in place at
                // start_pos along dim 1; `out` is a placeholder nothing reads.
                let (value, cache) = (self.tensor(args[0])?, self.tensor(args[1])?);
                if !matches!(self.g.tensors[cache].role, Role::State(_)) {
                    return Err("update_cache of a tensor that is not a mutable buffer".into());
                }
                let start = self.int(args[2])?;
                let dt = self.g.tensors[cache].dtype;
                let value = self.cast_to(value, dt, format!("%{} as cache", args[0]));
                self.g.op(
                    OpKind::CacheUpdate { axis: 1, start },
                    vec![cache, value],
                    vec![cache],
                );
                Ok(())
            }
            "aten::expand_copy.out" => {
                // (self, size, implicit, out): -1 keeps that dim of self (aligned from the right).
                let x = self.tensor(args[0])?;
                let mut shape = self.int_list(args[1])?;
                let sizes = self.sizes(x);
                let off = shape
                    .len()
                    .checked_sub(sizes.len())
                    .ok_or("expand to fewer dims")?;
                for (d, s) in shape.iter_mut().enumerate() {
                    if *s == Int::Lit(-1) {
                        *s = *sizes.get(d.wrapping_sub(off)).ok_or("-1 for a new dim")?;
                    }
                }
                let o = out_like(self, args[3])?;
                self.g.op(OpKind::Expand { shape }, vec![x], vec![o]);
                self.write_out(args[3], args[4], o)
            }
            "aten::any.out" => {
                // (self, dim, keepdim, out): whether the dim holds a nonzero, as sum(x != 0) > 0.
                let x = self.tensor(args[0])?;
                let max = self.g.tensors[x].max_shape.clone();
                let dim = norm_dim(self.lit(args[1])?, max.len())?;
                let keepdim = scalar(args[2])? != 0.0;
                let ne = self.new_tensor(format!("%{} != 0", args[0]), DType::F32, max);
                let kind = OpKind::BinaryScalar {
                    op: ir::BinaryOp::Ne,
                    scalar: 0.0,
                    scalar_first: false,
                };
                let nz = self.new_tensor(
                    format!("%{} != 0", args[0]),
                    DType::Bool,
                    self.g.tensors[x].max_shape.clone(),
                );
                self.g.op(kind, vec![x], vec![nz]);
                self.g.op(OpKind::Cast, vec![nz], vec![ne]);
                let o = out_like(self, args[3])?;
                let sum_shape = self.g.tensors[o].max_shape.clone();
                let sum = self.new_tensor(format!("%{} count", args[0]), DType::F32, sum_shape);
                let dims = vec![dim];
                self.g
                    .op(OpKind::Sum { dims, keepdim }, vec![ne], vec![sum]);
                let kind = OpKind::BinaryScalar {
                    op: ir::BinaryOp::Gt,
                    scalar: 0.0,
                    scalar_first: false,
                };
                self.g.op(kind, vec![sum], vec![o]);
                self.write_out(args[3], args[4], o)
            }
            _ => Err("no IR lowering".into()),
        }
    }
}
