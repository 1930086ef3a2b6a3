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

/// Which arguments of a top-level operator it reads and which it writes.
fn kernel_io(key: &str, args: &[usize]) -> Option<(Vec<usize>, Vec<usize>)> {
    // Out-variant kernels list the out tensor, then the returned value (the same one).
    let (reads, writes): (&[usize], &[usize]) = match key {
        "aten::add.Scalar_out" | "aten::sub.Scalar_out" => (&[0], &[3, 4]),
        "aten::mul.Scalar_out" | "aten::div.Scalar_out" => (&[0], &[2, 3]),
        "aten::where.self_out" => (&[0, 1, 2], &[3, 4]),
        "aten::index_put.out" => (&[0, 2], &[4, 5]),
        "aten::copy_" => (&[1], &[0, 3]),
        _ => return None,
    };
    let get =
        |p: &[usize]| -> Option<Vec<usize>> { p.iter().map(|&i| args.get(i).copied()).collect() };
    Some((get(reads)?, get(writes)?))
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
                kernel_io(&key, args)
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
            _ => Err("no IR lowering".into()),
        }
    }
}
