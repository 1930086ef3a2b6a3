//! Gathers from big tables on the host. An embedding reads a row a token; on the GPU its whole
//! table would be resident (E2B's per-layer table is 1.2 GB with its scales, its token table
//! 0.25 GB), while on the host the mapped file serves the rows asked for, a few pages each. The
//! executor runs these gathers, and the small ops that compute their ids from the inputs, before
//! each call, and hands their rows to the GPU graph as inputs of its own.

use crate::ir::cpu::{dequant_row, CpuExecutor};
use crate::ir::{DType, Graph, InputValue, Io, Node, OpKind, Role, TensorId, Weight};
use crate::pte::Blob;
use crate::runtime::tensor::to_f32;

/// Tables this large or larger stay on the host unless `ContextOptions` says otherwise.
pub(crate) const DEFAULT_MIN_BYTES: u64 = 64 << 20;

/// The bytes of each table (with its scales and biases) a GPU executor would gather on the
/// host with the default threshold, for `pteria inspect`.
pub fn host_gathered_tables(g: &Graph) -> Vec<usize> {
    let mut g = g.clone();
    match split(&mut g, DEFAULT_MIN_BYTES) {
        Ok(Some(h)) => h
            .gathers
            .iter()
            .map(|gt| {
                // Biases made from the scales take no memory unless something reads them.
                let held = gt.tensors.iter().filter(|(b, _)| b.neg8_of().is_none());
                held.map(|(b, _)| b.len()).sum()
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Constants up to this size may feed the ops that compute ids on the host.
const SMALL_CONSTANT: usize = 64 << 10;
/// Ops computing ids on the host write at most this many elements (token ids do).
const SMALL_OUTPUT: usize = 1 << 16;

/// One table gathered on the host.
struct Gather {
    weight: Weight,
    /// The table, then (quantized) its scales and biases.
    tensors: Vec<(Blob, DType)>,
    rows: usize,
    cols: usize,
    /// Which output of the ids graph holds its ids.
    ids: usize,
    /// Its biases are -8 · its f32 scales (`Blob::neg8`): formed per row, never made whole.
    derived: bool,
}

/// A gather's rows: their shape (the ids' and the row length) and f32 bytes.
pub(crate) type Rows = (Vec<usize>, Vec<u8>);

/// The gathers a GPU graph left to the host, and what computes their ids.
pub(crate) struct HostGathers {
    /// The GPU graph's inputs, the ops computing the ids from them, and the ids as outputs.
    ids: CpuExecutor,
    gathers: Vec<Gather>,
}

/// Takes out of `g` every embedding whose table is at least `min_bytes`, read by nothing else,
/// with ids the host can compute from the inputs; each one's rows become a new input of `g`.
pub(crate) fn split(g: &mut Graph, min_bytes: u64) -> Result<Option<HostGathers>, String> {
    let nt = g.tensors.len();
    let mut readers = vec![0usize; nt];
    for op in g.ops() {
        for &t in &op.inputs {
            readers[t] += 1;
        }
    }
    // Tensors the host knows before a call, and the ops that make them.
    let mut host: Vec<bool> = g
        .tensors
        .iter()
        .map(|t| match &t.role {
            Role::Input(_) => true,
            Role::Constant(_) => t.max_bytes() <= SMALL_CONSTANT,
            _ => false,
        })
        .collect();
    let mut maker = vec![None; nt];
    for (n, node) in g.nodes.iter().enumerate() {
        let Node::Op(op) = node else { continue };
        let small = op.outputs.iter().all(|&o| {
            g.tensors[o].max_numel() <= SMALL_OUTPUT
                && matches!(g.tensors[o].role, Role::Activation)
        });
        let cheap = !matches!(
            op.kind,
            OpKind::Embedding { .. } | OpKind::Linear { .. } | OpKind::CacheUpdate { .. }
        );
        if small && cheap && op.inputs.iter().all(|&t| host[t]) {
            for &o in &op.outputs {
                host[o] = true;
                maker[o] = Some(n);
            }
        }
    }
    let constant = |t: TensorId| match &g.tensors[t].role {
        Role::Constant(b) => Some((b.clone(), g.tensors[t].dtype)),
        _ => None,
    };
    let mut picked = Vec::new();
    for (n, node) in g.nodes.iter().enumerate() {
        let Node::Op(op) = node else { continue };
        let OpKind::Embedding { weight } = op.kind else {
            continue;
        };
        let wc = weight.tensor_count();
        let (Some(&ids), Some(&out)) = (op.inputs.get(wc), op.outputs.first()) else {
            continue;
        };
        let table = &g.tensors[op.inputs[0]];
        let (rows, cols) = match (weight, &table.max_shape[..]) {
            (Weight::Q4 { .. }, &[r, c2]) => (r, c2 * 2),
            (_, &[r, c]) => (r, c),
            _ => continue,
        };
        let tensors: Option<Vec<_>> = op.inputs[..wc].iter().map(|&t| constant(t)).collect();
        let dtypes_ok = match weight {
            Weight::F32 => table.dtype.is_float(),
            Weight::Q4 { .. } | Weight::Q8 { .. } => table.dtype.size() == 1,
        };
        if (table.max_bytes() as u64) < min_bytes
            || !host[ids]
            || g.tensors[out].dtype != DType::F32
            || g.tensors[out].max_shape[..] != [&g.tensors[ids].max_shape[..], &[cols]].concat()
            || !dtypes_ok
            || op.inputs[..wc].iter().any(|&t| readers[t] != 1)
            || op.inputs[1..wc].iter().any(|&t| {
                let def = &g.tensors[t];
                let group = match weight {
                    Weight::Q4 { group } | Weight::Q8 { group } => group,
                    Weight::F32 => 1,
                };
                // Scales and biases [rows, cols / group], as rows index them.
                !def.dtype.is_float() || group == 0 || def.max_numel() != rows * (cols / group)
            })
        {
            continue;
        }
        let Some(tensors) = tensors else { continue };
        picked.push((n, out, ids, weight, tensors, rows, cols));
    }
    if picked.is_empty() {
        return Ok(None);
    }

    // The ids graph: the inputs, the ops their ids need, the ids as outputs.
    let mut keep = vec![false; g.nodes.len()];
    let mut stack: Vec<TensorId> = picked.iter().map(|p| p.2).collect();
    while let Some(t) = stack.pop() {
        if let Some(n) = maker[t] {
            if !keep[n] {
                keep[n] = true;
                if let Node::Op(op) = &g.nodes[n] {
                    stack.extend(op.inputs.iter().copied());
                }
            }
        }
    }
    let mut outs: Vec<TensorId> = Vec::new();
    for p in &picked {
        if !outs.contains(&p.2) {
            outs.push(p.2);
        }
    }
    let Some(h) = ids_graph(g, &keep, &outs) else {
        return Ok(None);
    };
    let ids = CpuExecutor::new(h).map_err(|e| format!("host gathers: {e}"))?;

    // The GPU graph: each gather's rows an input; the ops only they needed go.
    let mut gathers = Vec::new();
    let mut gone = vec![false; g.nodes.len()];
    for (n, out, id_t, weight, tensors, rows, cols) in picked {
        gone[n] = true;
        let k = g.inputs.len();
        g.inputs.push(Io::Tensor(out));
        g.tensors[out].role = Role::Input(k);
        let ids = outs.iter().position(|&t| t == id_t).unwrap_or(0);
        let derived = tensors.len() == 3
            && tensors[1].1 == DType::F32
            && tensors[2]
                .0
                .neg8_of()
                .is_some_and(|s| s.same_as(&tensors[1].0));
        gathers.push(Gather {
            weight,
            tensors,
            rows,
            cols,
            ids,
            derived,
        });
    }
    loop {
        let mut read = vec![false; nt];
        for &o in &g.outputs {
            read[o] = true;
        }
        for (n, node) in g.nodes.iter().enumerate() {
            match node {
                Node::Op(op) if !gone[n] => op.inputs.iter().for_each(|&t| read[t] = true),
                Node::Sym(
                    crate::ir::SymOp::Size { tensor, .. }
                    | crate::ir::SymOp::ReadInput { tensor, .. },
                ) => read[*tensor] = true,
                _ => {}
            }
        }
        let mut more = false;
        for (n, node) in g.nodes.iter().enumerate() {
            if let Node::Op(op) = node {
                if keep[n] && !gone[n] && op.outputs.iter().all(|&o| !read[o]) {
                    gone[n] = true;
                    more = true;
                }
            }
        }
        if !more {
            break;
        }
    }
    let mut n = 0;
    g.nodes.retain(|_| {
        n += 1;
        !gone[n - 1]
    });
    Ok(Some(HostGathers { ids, gathers }))
}

/// Only what computing `outs` from the inputs takes: the inputs, the `keep` ops, the symbols
/// they read and what makes those, each tensor renumbered (a copy of the whole graph made every
/// call infer thousands of shapes: 0.6-1.3 ms a decode step). `None` where a symbol they read
/// is the size of a tensor the GPU makes.
fn ids_graph(g: &Graph, keep: &[bool], outs: &[TensorId]) -> Option<Graph> {
    use crate::ir::{Int, SymOp};
    let sym_out = |s: &SymOp| match s {
        SymOp::Size { out, .. } | SymOp::ReadInput { out, .. } | SymOp::Arith { out, .. } => *out,
    };
    // The symbols the kept ops read, and every symbol those are made from.
    let mut want = vec![false; g.sym_names.len()];
    let mark = |i: Int, want: &mut Vec<bool>| {
        if let Int::Sym(s) = i {
            want[s] = true;
        }
    };
    for (n, node) in g.nodes.iter().enumerate() {
        if let (true, Node::Op(op)) = (keep[n], node) {
            for i in op.kind.ints() {
                mark(i, &mut want);
            }
        }
    }
    let mut syms = vec![false; g.nodes.len()];
    for (n, node) in g.nodes.iter().enumerate().rev() {
        if let Node::Sym(s) = node {
            if want[sym_out(s)] {
                syms[n] = true;
                if let SymOp::Arith { a, b, .. } = s {
                    mark(*a, &mut want);
                    mark(*b, &mut want);
                }
            }
        }
    }
    let mut made = vec![false; g.tensors.len()];
    for (n, node) in g.nodes.iter().enumerate() {
        if let (true, Node::Op(op)) = (keep[n], node) {
            op.outputs.iter().for_each(|&t| made[t] = true);
        }
    }
    let mut id = vec![usize::MAX; g.tensors.len()];
    let mut h = Graph {
        sym_names: g.sym_names.clone(),
        ..Graph::default()
    };
    let mut map = |t: TensorId, h: &mut Graph| {
        if id[t] == usize::MAX {
            id[t] = h.tensors.len();
            h.tensors.push(g.tensors[t].clone());
        }
        id[t]
    };
    h.inputs = g
        .inputs
        .iter()
        .map(|io| match *io {
            Io::Tensor(t) => Io::Tensor(map(t, &mut h)),
            Io::Sym(s) => Io::Sym(s),
        })
        .collect();
    for (n, node) in g.nodes.iter().enumerate() {
        match node {
            Node::Op(op) if keep[n] => {
                let mut op = op.clone();
                op.inputs = op.inputs.iter().map(|&t| map(t, &mut h)).collect();
                op.outputs = op.outputs.iter().map(|&t| map(t, &mut h)).collect();
                h.nodes.push(Node::Op(op));
            }
            Node::Sym(s) if syms[n] => {
                if let SymOp::Size { tensor, .. } | SymOp::ReadInput { tensor, .. } = s {
                    let known =
                        matches!(g.tensors[*tensor].role, Role::Input(_) | Role::Constant(_))
                            || made[*tensor];
                    if !known {
                        return None;
                    }
                }
                let mut s = s.clone();
                if let SymOp::Size { tensor, .. } | SymOp::ReadInput { tensor, .. } = &mut s {
                    *tensor = map(*tensor, &mut h);
                }
                h.nodes.push(Node::Sym(s));
            }
            _ => {}
        }
    }
    h.outputs = outs.iter().map(|&t| map(t, &mut h)).collect();
    Some(h)
}

impl HostGathers {
    /// Each gather's rows for a call's inputs, as (shape, f32 bytes), in the order `split`
    /// added them as inputs.
    pub(crate) fn run(&mut self, inputs: &[InputValue]) -> Result<Vec<Rows>, String> {
        let ids = self
            .ids
            .run(inputs)
            .map_err(|e| format!("host gathers: {e}"))?;
        let mut out = Vec::with_capacity(self.gathers.len());
        for gt in &self.gathers {
            let t = &ids[gt.ids];
            let list = t.to_i64().map_err(|e| format!("host gathers: ids: {e}"))?;
            if let Some(id) = list.iter().find(|&&id| id < 0 || id as usize >= gt.rows) {
                return Err(format!("token id {id} outside the {}-row table", gt.rows));
            }
            let row = gt.cols * 4;
            let mut bytes = vec![0u8; list.len() * row];
            let fill = |ids: &[i64], out: &mut [u8]| {
                for (&id, o) in ids.iter().zip(out.chunks_exact_mut(row)) {
                    gt.row_into(id as usize, o);
                }
            };
            // A prompt's rows on every core (128 rows of E2B's two tables took 8-13 ms on one).
            let threads = crate::ir::cpu::threads().min(list.len() / 16).max(1);
            if threads == 1 {
                fill(&list, &mut bytes);
            } else {
                let per = list.len().div_ceil(threads);
                std::thread::scope(|scope| {
                    for (ids, out) in list.chunks(per).zip(bytes.chunks_mut(per * row)) {
                        scope.spawn(move || fill(ids, out));
                    }
                });
            }
            let mut shape = t.sizes.clone();
            shape.push(gt.cols);
            out.push((shape, bytes));
        }
        Ok(out)
    }
}

impl Gather {
    /// Row `r` into `out` as f32 bytes, dequantized as the CPU executor's embedding does
    /// (`ir::cpu::dequant_row`: with a division per element, two rows of a decode step took
    /// 60-100 µs on the H100's host); derived biases are formed from the row's scales.
    fn row_into(&self, r: usize, out: &mut [u8]) {
        let (table, dt) = &self.tensors[0];
        let cols = self.cols;
        let (group, four) = match self.weight {
            Weight::F32 => {
                let es = dt.size();
                let row = to_f32(*dt, &table[r * cols * es..(r + 1) * cols * es]);
                return put(out, row.iter().copied());
            }
            Weight::Q4 { group } => (group, true),
            Weight::Q8 { group } => (group, false),
        };
        let groups = cols / group;
        let part = |(b, dt): &(Blob, DType)| {
            let es = dt.size();
            to_f32(*dt, &b[r * groups * es..(r + 1) * groups * es]).into_owned()
        };
        let scales = part(&self.tensors[1]);
        let biases = match self.derived {
            true => scales.iter().map(|s| -8.0 * s).collect(),
            false => part(&self.tensors[2]),
        };
        let bytes = if four { cols / 2 } else { cols };
        let q = &table[r * bytes..(r + 1) * bytes];
        put(out, dequant_row(four, group, q, &scales, &biases));
    }
}

/// Writes f32 values as little-endian bytes.
fn put(out: &mut [u8], vals: impl Iterator<Item = f32>) {
    for (o, v) in out.chunks_exact_mut(4).zip(vals) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pte::Bytes;
    use std::sync::Arc;

    /// A 4-bit embedding of `rows` × 2048 read at a 4-id input: 1 KiB a row, 64 scales a row.
    fn embedding(rows: usize) -> Graph {
        let mut g = Graph::default();
        let blob = |n: usize| Blob::whole(Arc::new(Bytes::Owned(vec![0; n])));
        let ids = g.add_tensor("ids", DType::I64, vec![1, 4], Role::Input(0));
        g.inputs.push(Io::Tensor(ids));
        let scales = blob(rows * 64 * 4);
        let w = g.add_tensor(
            "w",
            DType::U8,
            vec![rows, 1024],
            Role::Constant(blob(rows * 1024)),
        );
        let s = g.add_tensor(
            "s",
            DType::F32,
            vec![rows, 64],
            Role::Constant(scales.clone()),
        );
        let b = g.add_tensor(
            "b",
            DType::F32,
            vec![rows, 64],
            Role::Constant(Blob::neg8(scales)),
        );
        let y = g.add_tensor("y", DType::F32, vec![1, 4, 2048], Role::Activation);
        let weight = Weight::Q4 { group: 32 };
        g.op(OpKind::Embedding { weight }, vec![w, s, b, ids], vec![y]);
        g.outputs.push(y);
        g
    }

    /// `inspect`'s count: a table of 64 MiB stays on the host, with its scales (its derived
    /// biases hold nothing); one a row smaller stays on the GPU.
    #[test]
    fn tables_from_64_mib_are_gathered_on_the_host() {
        assert_eq!(
            host_gathered_tables(&embedding(1 << 16)),
            vec![(64 + 16) << 20]
        );
        assert!(host_gathered_tables(&embedding((1 << 16) - 1)).is_empty());
    }
}
