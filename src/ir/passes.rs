//! Load-time graph rewrites. Each pass keeps results identical (tests run graphs with and
//! without it) and reports how many rewrites it made.

use super::*;

/// How many ops read each tensor, plus graph outputs and state tensors counted as readers.
fn use_counts(g: &Graph) -> Vec<usize> {
    let mut n = vec![0usize; g.tensors.len()];
    for o in g.ops() {
        for &t in &o.inputs {
            n[t] += 1;
        }
    }
    for n2 in &g.nodes {
        if let Node::Sym(SymOp::Size { tensor, .. } | SymOp::ReadInput { tensor, .. }) = n2 {
            n[*tensor] += 1;
        }
    }
    for &t in &g.outputs {
        n[t] += 1;
    }
    for (i, t) in g.tensors.iter().enumerate() {
        if matches!(t.role, Role::State(_)) {
            n[i] += 1;
        }
    }
    n
}

/// The op (node index) that writes each tensor.
fn producers(g: &Graph) -> Vec<Option<usize>> {
    let mut p = vec![None; g.tensors.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if let Node::Op(o) = n {
            for &t in &o.outputs {
                p[t] = Some(i);
            }
        }
    }
    p
}

fn op_at(g: &Graph, i: usize) -> &Op {
    match &g.nodes[i] {
        Node::Op(o) => o,
        Node::Sym(_) => unreachable!("producers only index ops"),
    }
}

/// Fuses the decomposed RMSNorm cluster `x * rsqrt(mean(x^2, -1, keepdim) + eps) [* w]` (as
/// exports leave it: pow/mean/add/rsqrt/mul) into one `RmsNorm` op.
pub fn fuse_rms_norm(g: &mut Graph) -> usize {
    let mut fused = 0;
    loop {
        let uses = use_counts(g);
        let prod = producers(g);
        let mut found = None;
        'search: for (i, n) in g.nodes.iter().enumerate() {
            let Node::Op(mul) = n else { continue };
            if mul.kind != OpKind::Binary(BinaryOp::Mul) {
                continue;
            }
            // Either operand may be the rsqrt factor.
            for (xi, ri) in [(0, 1), (1, 0)] {
                let (x, r) = (mul.inputs[xi], mul.inputs[ri]);
                let Some(pr) = prod[r] else { continue };
                let rs = op_at(g, pr);
                if rs.kind != OpKind::Unary(UnaryOp::Rsqrt) || uses[r] != 1 {
                    continue;
                }
                let Some(pa) = prod[rs.inputs[0]] else {
                    continue;
                };
                let add = op_at(g, pa);
                let eps = match add.kind {
                    OpKind::BinaryScalar {
                        op: BinaryOp::Add,
                        scalar,
                        ..
                    } => scalar,
                    _ => continue,
                };
                if uses[add.outputs[0]] != 1 {
                    continue;
                }
                let Some(pm) = prod[add.inputs[0]] else {
                    continue;
                };
                let mean = op_at(g, pm);
                let rank = g.tensors[x].max_shape.len();
                match &mean.kind {
                    OpKind::Mean {
                        dims,
                        keepdim: true,
                    } if dims.as_slice() == [rank.saturating_sub(1)] => {}
                    _ => continue,
                }
                if uses[mean.outputs[0]] != 1 {
                    continue;
                }
                let Some(pp) = prod[mean.inputs[0]] else {
                    continue;
                };
                let sq = op_at(g, pp);
                let squares_x = match sq.kind {
                    OpKind::BinaryScalar {
                        op: BinaryOp::Pow,
                        scalar,
                        scalar_first: false,
                    } => scalar == 2.0,
                    OpKind::Unary(UnaryOp::Square) => true,
                    OpKind::Binary(BinaryOp::Mul) => sq.inputs[0] == sq.inputs[1],
                    _ => false,
                };
                if !squares_x || sq.inputs[0] != x || uses[sq.outputs[0]] != 1 {
                    continue;
                }
                found = Some((i, x, eps as f32, vec![pp, pm, pa, pr]));
                break 'search;
            }
        }
        let Some((i, x, eps, dead)) = found else {
            break;
        };
        let out = op_at(g, i).outputs[0];
        g.nodes[i] = Node::Op(Op {
            kind: OpKind::RmsNorm { eps },
            inputs: vec![x],
            outputs: vec![out],
        });
        let mut dead = dead;
        dead.sort_unstable_by(|a, b| b.cmp(a));
        for d in dead {
            g.nodes.remove(d);
        }
        fused += 1;
    }
    fused += absorb_norm_weight(g);
    fused
}

/// `RmsNorm(x) * w` with a constant 1-D `w` becomes `RmsNorm(x, w)`.
fn absorb_norm_weight(g: &mut Graph) -> usize {
    let mut n = 0;
    loop {
        let uses = use_counts(g);
        let prod = producers(g);
        let mut hit = None;
        for (i, node) in g.nodes.iter().enumerate() {
            let Node::Op(mul) = node else { continue };
            if mul.kind != OpKind::Binary(BinaryOp::Mul) {
                continue;
            }
            for (a, w) in [(0, 1), (1, 0)] {
                let (t, wt) = (mul.inputs[a], mul.inputs[w]);
                let Some(p) = prod[t] else { continue };
                let norm = op_at(g, p);
                let is_const_vec = matches!(g.tensors[wt].role, Role::Constant(_))
                    && g.tensors[wt].max_shape.len() == 1
                    && g.tensors[t].max_shape.last() == g.tensors[wt].max_shape.last();
                if matches!(norm.kind, OpKind::RmsNorm { .. })
                    && norm.inputs.len() == 1
                    && uses[t] == 1
                    && is_const_vec
                {
                    hit = Some((i, p, wt));
                }
            }
        }
        let Some((i, p, wt)) = hit else { break };
        let out = op_at(g, i).outputs[0];
        if let Node::Op(norm) = &mut g.nodes[p] {
            norm.inputs.push(wt);
            norm.outputs = vec![out];
        }
        g.nodes.remove(i);
        n += 1;
    }
    n
}

/// Follows reshapes back from `t` to the tensor they view.
fn through_reshapes(g: &Graph, prod: &[Option<usize>], mut t: TensorId) -> TensorId {
    while let Some(p) = prod[t] {
        let o = op_at(g, p);
        if !matches!(o.kind, OpKind::Reshape { .. }) {
            break;
        }
        t = o.inputs[0];
    }
    t
}

/// If `t` is `f(concat(m, m))` over the last dim with `f` = `unary` (through reshapes), `m`.
fn doubled_table(
    g: &Graph,
    prod: &[Option<usize>],
    t: TensorId,
    unary: UnaryOp,
) -> Option<TensorId> {
    let f = op_at(g, prod[through_reshapes(g, prod, t)]?);
    if f.kind != OpKind::Unary(unary) {
        return None;
    }
    let cat = op_at(g, prod[f.inputs[0]]?);
    let rank = g.tensors[cat.outputs[0]].max_shape.len();
    match (&cat.kind, cat.inputs.as_slice()) {
        (OpKind::Concat { dim }, &[a, b]) if a == b && *dim + 1 == rank => Some(a),
        _ => None,
    }
}

/// The rotate-half RoPE as exports decompose it, `x * cos + concat(-x[.., h:], x[.., :h]) * sin`
/// with `cos`/`sin` = `cos`/`sin` of `concat(m, m)` for a table `m` of `[S, h]` (one row per
/// position of this call) broadcast over the heads, becomes one `Rope` over the tables `cos(m)`,
/// `sin(m)` from position 0: eight dispatches per rotated tensor become one.
pub fn fuse_rotate_half(g: &mut Graph) -> usize {
    let mut n = 0;
    loop {
        let uses = use_counts(g);
        let prod = producers(g);
        let once = |t: TensorId| uses[t] == 1 && matches!(g.tensors[t].role, Role::Activation);
        let mut found = None;
        'search: for (i, node) in g.nodes.iter().enumerate() {
            let Node::Op(add) = node else { continue };
            if add.kind != OpKind::Binary(BinaryOp::Add) {
                continue;
            }
            for (ci, si) in [(0, 1), (1, 0)] {
                let (Some(pc), Some(ps)) = (prod[add.inputs[ci]], prod[add.inputs[si]]) else {
                    continue;
                };
                let (mc, ms) = (op_at(g, pc), op_at(g, ps));
                if mc.kind != OpKind::Binary(BinaryOp::Mul)
                    || ms.kind != OpKind::Binary(BinaryOp::Mul)
                    || !once(mc.outputs[0])
                    || !once(ms.outputs[0])
                {
                    continue;
                }
                for (xa, ca) in [(0, 1), (1, 0)] {
                    let (x, cos) = (mc.inputs[xa], mc.inputs[ca]);
                    let xs = &g.tensors[x].max_shape;
                    let r = xs.len();
                    if r < 2 || xs[r - 1] % 2 != 0 || g.tensors[x].dtype != DType::F32 {
                        continue;
                    }
                    let (d, h) = (xs[r - 1], xs[r - 1] / 2);
                    // cos and sin: [1, .., 1, S, D] views of tables of [S, h].
                    let table_view = |t: TensorId| {
                        let s = &g.tensors[t].max_shape;
                        s.len() >= 2
                            && s.len() <= r
                            && s[..s.len() - 2].iter().all(|&v| v == 1)
                            && s[s.len() - 2..] == xs[r - 2..]
                    };
                    let Some(m) = doubled_table(g, &prod, cos, UnaryOp::Cos) else {
                        continue;
                    };
                    if !table_view(cos) || g.tensors[m].max_shape != [xs[r - 2], h] {
                        continue;
                    }
                    for (ra, sa) in [(0, 1), (1, 0)] {
                        let (rot, sin) = (ms.inputs[ra], ms.inputs[sa]);
                        if !table_view(sin)
                            || doubled_table(g, &prod, sin, UnaryOp::Sin) != Some(m)
                            || !once(rot)
                        {
                            continue;
                        }
                        let Some(pcat) = prod[rot] else { continue };
                        let cat = op_at(g, pcat);
                        let [neg_t, lo_t] = cat.inputs[..] else {
                            continue;
                        };
                        if cat.kind != (OpKind::Concat { dim: r - 1 })
                            || !once(neg_t)
                            || !once(lo_t)
                        {
                            continue;
                        }
                        let (Some(pneg), Some(plo)) = (prod[neg_t], prod[lo_t]) else {
                            continue;
                        };
                        let neg = op_at(g, pneg);
                        let Some(phi) = prod[neg.inputs[0]] else {
                            continue;
                        };
                        let (lo, hi) = (op_at(g, plo), op_at(g, phi));
                        let is_slice = |o: &Op, a: i64, b: &dyn Fn(i64) -> bool| match o.kind {
                            OpKind::Slice {
                                dim,
                                start: Int::Lit(s0),
                                end: Int::Lit(e0),
                                step: 1,
                            } => dim == r - 1 && s0 == a && b(e0) && o.inputs[0] == x,
                            _ => false,
                        };
                        if neg.kind != OpKind::Unary(UnaryOp::Neg)
                            || !once(neg.inputs[0])
                            || !is_slice(lo, 0, &|e| e == h as i64)
                            || !is_slice(hi, h as i64, &|e| e >= d as i64)
                        {
                            continue;
                        }
                        found = Some((i, x, m, r - 2, vec![pc, ps, pcat, pneg, plo, phi]));
                        break 'search;
                    }
                }
            }
        }
        let Some((i, x, m, seq_dim, dead)) = found else {
            break;
        };
        let out = op_at(g, i).outputs[0];
        let d = g.tensors[x].max_shape[seq_dim + 1];
        let (ms, name) = (g.tensors[m].max_shape.clone(), g.tensors[m].name.clone());
        let mut tables = Vec::new();
        for (u, what) in [(UnaryOp::Cos, "cos"), (UnaryOp::Sin, "sin")] {
            let t = g.add_tensor(
                format!("{what} {name}"),
                DType::F32,
                ms.clone(),
                Role::Activation,
            );
            tables.push((u, t));
        }
        let rope = Node::Op(Op {
            kind: OpKind::Rope {
                style: RopeStyle::Half,
                rotary: d,
                seq_dim,
                start: Int::Lit(0),
            },
            inputs: vec![x, tables[0].1, tables[1].1],
            outputs: vec![out],
        });
        let mut new_nodes: Vec<Node> = tables
            .iter()
            .map(|&(u, t)| {
                Node::Op(Op {
                    kind: OpKind::Unary(u),
                    inputs: vec![m],
                    outputs: vec![t],
                })
            })
            .collect();
        new_nodes.push(rope);
        g.nodes.splice(i..=i, new_nodes);
        let mut dead = dead;
        dead.sort_unstable_by(|a, b| b.cmp(a));
        dead.dedup();
        for k in dead {
            g.nodes.remove(k);
        }
        n += 1;
    }
    n
}

/// Replaces `Copy` ops of activations by their input (a copy the graph never mutates is a no-op).
pub fn drop_noop_copies(g: &mut Graph) -> usize {
    let mut n = 0;
    // A copy that a cache update then writes into (or whose source one writes) is a snapshot;
    // so is one of an update's output (which aliases its cache) where that cache is updated
    // more than once.
    let mut written_in_place: std::collections::HashSet<TensorId> = g
        .ops()
        .filter(|o| matches!(o.kind, OpKind::CacheUpdate { .. }))
        .filter_map(|o| o.inputs.first().copied())
        .collect();
    let mut cache_of: Vec<TensorId> = (0..g.tensors.len()).collect();
    let mut updates = vec![0usize; g.tensors.len()];
    for o in g.ops() {
        if let (OpKind::CacheUpdate { .. }, Some(&c), Some(&out)) =
            (&o.kind, o.inputs.first(), o.outputs.first())
        {
            cache_of[out] = cache_of[c];
            updates[cache_of[c]] += 1;
        }
    }
    written_in_place.extend((0..g.tensors.len()).filter(|&t| updates[cache_of[t]] > 1));
    loop {
        let hit = g.nodes.iter().enumerate().find_map(|(i, node)| match node {
            Node::Op(o) if o.kind == OpKind::Copy => {
                let (src, dst) = (o.inputs[0], o.outputs[0]);
                let plain = |t: TensorId| matches!(g.tensors[t].role, Role::Activation);
                let same = g.tensors[src].dtype == g.tensors[dst].dtype;
                (plain(dst)
                    && same
                    && !g.outputs.contains(&dst)
                    && !written_in_place.contains(&src)
                    && !written_in_place.contains(&dst)
                    && !matches!(g.tensors[src].role, Role::State(_)))
                .then_some((i, src, dst))
            }
            _ => None,
        });
        let Some((i, src, dst)) = hit else { break };
        g.nodes.remove(i);
        rename(g, dst, src);
        n += 1;
    }
    n
}

/// An attention whose keys, values or mask are a cache's (mask's) first `end` rows, cut by a
/// `Slice` from 0 (ExecuTorch's XNNPACK LLM exports slice each cache to pos + S rows, then permute
/// it for `custom_sdpa`), reads them uncut: `Sdpa` reads only the first start + S rows (or mask
/// columns) anyway, and an exported call needs end >= start + S. The shapes then no longer follow
/// the position, so a decode step replays one recording instead of recording anew every step.
/// Only through permutes and reshapes that keep their input's sizes (`unit_permutes_to_reshapes`'),
/// each with no other reader.
pub fn uncut_attention_windows(g: &mut Graph) -> usize {
    // Size symbols: which tensor's which dim.
    let size_of: std::collections::HashMap<SymId, (TensorId, usize)> = g
        .nodes
        .iter()
        .filter_map(|n| match n {
            Node::Sym(SymOp::Size { out, tensor, dim }) => Some((*out, (*tensor, *dim))),
            _ => None,
        })
        .collect();
    let mut readers: Vec<Vec<&Op>> = vec![Vec::new(); g.tensors.len()];
    for o in g.ops() {
        for &t in &o.inputs {
            readers[t].push(o);
        }
    }
    // A size used but by reshapes of the same tensor (followed below) would see the uncut length.
    let mut sym_users: std::collections::HashMap<SymId, Vec<Option<TensorId>>> = Default::default();
    for n in &g.nodes {
        match n {
            Node::Op(o) => {
                let view_of = matches!(o.kind, OpKind::Reshape { .. }).then(|| o.inputs[0]);
                for i in o.kind.ints() {
                    if let Int::Sym(s) = i {
                        sym_users.entry(s).or_default().push(view_of);
                    }
                }
            }
            Node::Sym(SymOp::Arith { a, b, .. }) => {
                for i in [a, b] {
                    if let Int::Sym(s) = i {
                        sym_users.entry(*s).or_default().push(None);
                    }
                }
            }
            Node::Sym(_) => {}
        }
    }
    for n in &g.nodes {
        match n {
            Node::Sym(SymOp::Size { out, tensor, .. }) => {
                let users = sym_users.get(out).map_or(&[][..], |u| &u[..]);
                if users.iter().any(|&u| u != Some(*tensor)) {
                    readers[*tensor].push(&EXTERNAL);
                }
            }
            Node::Sym(SymOp::ReadInput { tensor, .. }) => readers[*tensor].push(&EXTERNAL),
            _ => {}
        }
    }
    // Whether every reader of `t` (cut along `dim`), through views, is an attention reading it
    // as rows of keys/values or columns of its mask, and each view has room for the whole.
    fn only_windows(
        g: &Graph,
        readers: &[Vec<&Op>],
        size_of: &std::collections::HashMap<SymId, (TensorId, usize)>,
        t: TensorId,
        dim: usize,
        whole: usize,
    ) -> bool {
        if g.outputs.contains(&t) || g.tensors[t].max_numel() < whole || readers[t].is_empty() {
            return false;
        }
        readers[t].iter().all(|o| match &o.kind {
            OpKind::Sdpa {
                all_rows: false,
                layout,
                ..
            } => o.inputs.iter().enumerate().all(|(k, &x)| {
                x != t
                    || match k {
                        1 | 2 => dim == if *layout == AttnLayout::Bshd { 1 } else { 2 },
                        3 => dim + 1 == g.tensors[t].max_shape.len(),
                        _ => false,
                    }
            }),
            OpKind::Permute { perm } => perm
                .iter()
                .position(|&p| p == dim)
                .is_some_and(|d| only_windows(g, readers, size_of, o.outputs[0], d, whole)),
            OpKind::Reshape { shape } if o.inputs[0] == t => {
                // Sizes kept (its input's, or 1s): the cut dim stays one dim.
                let kept = shape.iter().all(|d| match d {
                    Int::Lit(1) => true,
                    Int::Sym(s) => size_of.get(s).is_some_and(|&(st, _)| st == t),
                    Int::Lit(_) => false,
                });
                let at = shape
                    .iter()
                    .position(|d| matches!(d, Int::Sym(s) if size_of.get(s) == Some(&(t, dim))));
                kept && at
                    .is_some_and(|d| only_windows(g, readers, size_of, o.outputs[0], d, whole))
            }
            _ => false,
        })
    }
    let mut cuts = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        let Node::Op(o) = n else { continue };
        let OpKind::Slice {
            dim,
            start: Int::Lit(0),
            step: 1,
            end,
        } = o.kind
        else {
            continue;
        };
        let whole = g.tensors[o.inputs[0]].max_numel();
        if end != Int::Lit(i64::MAX)
            && only_windows(g, &readers, &size_of, o.outputs[0], dim, whole)
        {
            cuts.push(i);
        }
    }
    // Keys and values keep one length: uncut both or neither.
    let prod = producers(g);
    let source = |mut t: TensorId| loop {
        let i = prod[t]?;
        match &op_at(g, i).kind {
            OpKind::Slice { .. } => return Some(i),
            OpKind::Permute { .. } | OpKind::Reshape { .. } => t = op_at(g, i).inputs[0],
            _ => return None,
        }
    };
    loop {
        let before = cuts.len();
        for o in g.ops() {
            if let (OpKind::Sdpa { .. }, [_, k, v, ..]) = (&o.kind, &o.inputs[..]) {
                let (a, b) = (source(*k), source(*v));
                let cut = |s: Option<usize>| s.is_some_and(|i| cuts.contains(&i));
                if cut(a) != cut(b) {
                    cuts.retain(|i| Some(*i) != a && Some(*i) != b);
                }
            }
        }
        if cuts.len() == before {
            break;
        }
    }
    // The views on the way to attention had room for pos + S rows at most: now they hold the
    // whole (which would otherwise size the storage they alias by the larger bound).
    type Sizes = std::collections::HashMap<SymId, (TensorId, usize)>;
    fn widen(g: &mut Graph, size_of: &Sizes, t: TensorId, dim: usize, len: usize) {
        let views: Vec<(TensorId, usize)> = g
            .ops()
            .filter(|o| o.inputs.first() == Some(&t))
            .filter_map(|o| match &o.kind {
                OpKind::Permute { perm } => {
                    Some((o.outputs[0], perm.iter().position(|&p| p == dim)?))
                }
                OpKind::Reshape { shape } => {
                    let cut =
                        |d: &Int| matches!(d, Int::Sym(s) if size_of.get(s) == Some(&(t, dim)));
                    Some((o.outputs[0], shape.iter().position(cut)?))
                }
                _ => None,
            })
            .collect();
        for (v, d) in views {
            g.tensors[v].max_shape[d] = len;
            widen(g, size_of, v, d, len);
        }
    }
    for &i in &cuts {
        let Node::Op(o) = &mut g.nodes[i] else {
            continue;
        };
        // Uncut, the slice is a copy, which `drop_noop_copies` then drops where it may.
        let OpKind::Slice { dim, .. } = o.kind else {
            continue;
        };
        o.kind = OpKind::Copy;
        let (x, y) = (o.inputs[0], o.outputs[0]);
        let full = g.tensors[x].max_shape.clone();
        let len = full[dim];
        g.tensors[y].max_shape = full;
        widen(g, &size_of, y, dim, len);
    }
    cuts.len()
}

/// A `Slice` from 0 with step 1 to at least its dim's upper bound keeps every row: a `Copy`
/// (the XNNPACK exports slice masks `[:, 0:1024]` of 1024 columns), which `drop_noop_copies`
/// may then drop.
pub fn full_slices_to_copies(g: &mut Graph) -> usize {
    let mut n = 0;
    for node in &mut g.nodes {
        let Node::Op(o) = node else { continue };
        let OpKind::Slice {
            dim,
            start: Int::Lit(0),
            end: Int::Lit(end),
            step: 1,
        } = o.kind
        else {
            continue;
        };
        let (x, y) = (&g.tensors[o.inputs[0]], &g.tensors[o.outputs[0]]);
        let whole = x.max_shape.get(dim).is_some_and(|&d| end >= d as i64);
        if whole && x.max_shape == y.max_shape && x.dtype == y.dtype {
            o.kind = OpKind::Copy;
            n += 1;
        }
    }
    n
}

/// Host symbols defined alike (an input's element, a tensor's size, the same arithmetic of
/// the same symbols) become one: ExecuTorch exports read `input_pos` again for every layer, so
/// that each layer's slices of the same mask row looked different to `merge_common_ops`.
pub fn merge_common_syms(g: &mut Graph) -> usize {
    let mut writes = vec![0usize; g.sym_names.len()];
    for n in &g.nodes {
        if let Node::Sym(
            SymOp::Size { out, .. } | SymOp::ReadInput { out, .. } | SymOp::Arith { out, .. },
        ) = n
        {
            writes[*out] += 1;
        }
    }
    // A symbol the caller writes (a delegate's integer input) has no defining node.
    for io in &g.inputs {
        if let Io::Sym(s) = io {
            writes[*s] += 1;
        }
    }
    let mut repl: Vec<SymId> = (0..g.sym_names.len()).collect();
    let mut seen: std::collections::HashMap<SymOp, SymId> = Default::default();
    let mut dropped = vec![false; g.nodes.len()];
    for (node, drop) in g.nodes.iter_mut().zip(dropped.iter_mut()) {
        let Node::Sym(op) = node else { continue };
        let r = |i: &mut Int| {
            if let Int::Sym(s) = i {
                *s = repl[*s];
            }
        };
        let out = match op {
            SymOp::Arith { out, a, b, .. } => {
                r(a);
                r(b);
                *out
            }
            SymOp::Size { out, .. } | SymOp::ReadInput { out, .. } => *out,
        };
        if writes[out] != 1 {
            continue;
        }
        let mut key = op.clone();
        match &mut key {
            SymOp::Arith { out, .. } | SymOp::Size { out, .. } | SymOp::ReadInput { out, .. } => {
                *out = 0
            }
        }
        match seen.get(&key) {
            Some(&first) => {
                repl[out] = first;
                *drop = true;
            }
            None => {
                seen.insert(key, out);
            }
        }
    }
    for node in &mut g.nodes {
        if let Node::Op(o) = node {
            o.kind.map_syms(|s| repl[s]);
        }
    }
    for (_, s) in &mut g.sym_outputs {
        *s = repl[*s];
    }
    let mut k = dropped.iter();
    g.nodes.retain(|_| !k.next().copied().unwrap_or(false));
    dropped.iter().filter(|&&d| d).count()
}

/// A reader that is not an op (a size read by a host symbol).
static EXTERNAL: Op = Op {
    kind: OpKind::Copy,
    inputs: Vec::new(),
    outputs: Vec::new(),
};

/// `permute(permute(x, p1), p2)` becomes one `permute(x, p1∘p2)`, and a permute that moves
/// nothing becomes a `Copy`. ExecuTorch's llama KV cache leaves such round trips around every
/// layer's cache ([B, S, H, D] -> [B, H, S, D] -> back): whole-cache strided gathers per call.
pub fn fold_permutes(g: &mut Graph) -> usize {
    let mut n = 0;
    loop {
        let uses = use_counts(g);
        let prod = producers(g);
        let hit = g.nodes.iter().enumerate().find_map(|(i, node)| {
            let Node::Op(o) = node else { return None };
            let OpKind::Permute { perm: p2 } = &o.kind else {
                return None;
            };
            if p2.iter().enumerate().all(|(d, &p)| d == p) {
                return Some((i, None, p2.clone()));
            }
            let mid = o.inputs[0];
            let inner = prod[mid]?;
            let OpKind::Permute { perm: p1 } = &op_at(g, inner).kind else {
                return None;
            };
            let plain = matches!(g.tensors[mid].role, Role::Activation);
            if !plain || uses[mid] != 1 || p1.len() != p2.len() {
                return None;
            }
            // out.shape[d] = mid.shape[p2[d]] = x.shape[p1[p2[d]]].
            let composed = p2.iter().map(|&d| p1[d]).collect();
            Some((i, Some(inner), composed))
        });
        let Some((i, inner, perm)) = hit else { break };
        if let Some(inner) = inner {
            let src = op_at(g, inner).inputs[0];
            if let Node::Op(o) = &mut g.nodes[i] {
                o.inputs = vec![src];
            }
        }
        if let Node::Op(o) = &mut g.nodes[i] {
            o.kind = if perm.iter().enumerate().all(|(d, &p)| d == p) {
                OpKind::Copy
            } else {
                OpKind::Permute { perm }
            };
        }
        if let Some(inner) = inner {
            // Its output had this op as its only reader.
            g.nodes.remove(inner);
        }
        n += 1;
    }
    n
}

/// A permute that moves only dims of size 1 keeps every element in place: it becomes a reshape,
/// which shares its input's storage instead of copying it (the per-head K/V projections of the
/// Vulkan export, [1, S, 1, D] -> [1, 1, S, D]).
pub fn unit_permutes_to_reshapes(g: &mut Graph) -> usize {
    let written_in_place: std::collections::HashSet<TensorId> = g
        .ops()
        .filter(|o| matches!(o.kind, OpKind::CacheUpdate { .. }))
        .filter_map(|o| o.inputs.first().copied())
        .collect();
    let mut n = 0;
    let mut i = 0;
    while i < g.nodes.len() {
        let Node::Op(o) = &g.nodes[i] else {
            i += 1;
            continue;
        };
        let OpKind::Permute { perm } = &o.kind else {
            i += 1;
            continue;
        };
        let (x, out) = (o.inputs[0], o.outputs[0]);
        let xs = g.tensors[x].max_shape.clone();
        let moved: Vec<usize> = perm.iter().copied().filter(|&d| xs[d] != 1).collect();
        let in_place = moved.windows(2).all(|w| w[0] < w[1]);
        let plain = |t: TensorId| matches!(g.tensors[t].role, Role::Activation);
        let x_ok = matches!(g.tensors[x].role, Role::Activation | Role::Input(_));
        if !in_place
            || !x_ok
            || !plain(out)
            || g.outputs.contains(&out)
            || written_in_place.contains(&x)
            || perm.len() != xs.len()
        {
            i += 1;
            continue;
        }
        let perm = perm.clone();
        let mut nodes = Vec::new();
        let mut shape = Vec::with_capacity(perm.len());
        for &d in &perm {
            if xs[d] == 1 {
                shape.push(Int::Lit(1));
            } else {
                let s = g.add_sym(format!("{} dim {d}", g.tensors[x].name));
                nodes.push(Node::Sym(SymOp::Size {
                    out: s,
                    tensor: x,
                    dim: d,
                }));
                shape.push(Int::Sym(s));
            }
        }
        nodes.push(Node::Op(Op {
            kind: OpKind::Reshape { shape },
            inputs: vec![x],
            outputs: vec![out],
        }));
        let k = nodes.len();
        g.nodes.splice(i..=i, nodes);
        i += k;
        n += 1;
    }
    n
}

fn rename(g: &mut Graph, from: TensorId, to: TensorId) {
    for node in &mut g.nodes {
        match node {
            Node::Op(o) => o
                .inputs
                .iter_mut()
                .filter(|t| **t == from)
                .for_each(|t| *t = to),
            Node::Sym(SymOp::Size { tensor, .. }) if *tensor == from => *tensor = to,
            _ => {}
        }
    }
}

/// Removes ops whose outputs nobody reads (ops writing state are kept), and host symbols
/// nothing uses: a tensor only a dead symbol measures is dead too (a rewrite that bypasses a
/// chain leaves its `Size` symbols behind).
pub fn eliminate_dead(g: &mut Graph) -> usize {
    // One backward pass: nodes are in execution order, so a node's readers all come later.
    let mut live_t = vec![false; g.tensors.len()];
    let mut live_s = vec![false; g.sym_names.len()];
    for &t in &g.outputs {
        live_t[t] = true;
    }
    for &(_, s) in &g.sym_outputs {
        live_s[s] = true;
    }
    let mut keep = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate().rev() {
        match node {
            Node::Op(o) => {
                let writes_state = matches!(o.kind, OpKind::CacheUpdate { .. })
                    || o.outputs
                        .iter()
                        .any(|&t| matches!(g.tensors[t].role, Role::State(_)));
                if writes_state || o.outputs.iter().any(|&t| live_t[t]) {
                    keep[i] = true;
                    for &t in &o.inputs {
                        live_t[t] = true;
                    }
                    let used = std::cell::RefCell::new(Vec::new());
                    o.kind.clone().map_syms(|s| {
                        used.borrow_mut().push(s);
                        s
                    });
                    for s in used.into_inner() {
                        live_s[s] = true;
                    }
                }
            }
            Node::Sym(s) => {
                let out = match s {
                    SymOp::Size { out, .. }
                    | SymOp::ReadInput { out, .. }
                    | SymOp::Arith { out, .. } => *out,
                };
                if live_s[out] {
                    keep[i] = true;
                    match s {
                        SymOp::Size { tensor, .. } | SymOp::ReadInput { tensor, .. } => {
                            live_t[*tensor] = true
                        }
                        SymOp::Arith { a, b, .. } => {
                            for v in [a, b] {
                                if let Int::Sym(x) = v {
                                    live_s[*x] = true;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let removed = g
        .nodes
        .iter()
        .zip(&keep)
        .filter(|(n, &k)| !k && matches!(n, Node::Op(_)))
        .count();
    let mut k = keep.into_iter();
    g.nodes.retain(|_| k.next().unwrap_or(true));
    removed
}

/// A matmul operand that is one matrix repeated along the batch dims — `expand` of a matrix,
/// then reshapes that keep the last two dims and transposes of them, as exports repeat a single
/// KV head for every query head — is read once through the matmul's batch broadcasting: the
/// expansion (and a transpose of the whole expansion) no longer materialise every call.
pub fn unexpand_matmul_operands(g: &mut Graph) -> usize {
    let prod = producers(g);
    let tail = |s: &[usize]| (s.len() >= 2).then(|| [s[s.len() - 2], s[s.len() - 1]]);
    // (matmul node, the repeated matrix, whether the chain transposes it)
    let mut edits = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        let Node::Op(mm) = n else { continue };
        if mm.kind != (OpKind::MatMul { transpose_b: false }) || mm.inputs.len() != 2 {
            continue;
        }
        let (mut t, mut transposed) = (mm.inputs[1], false);
        let found = loop {
            let Some(p) = prod[t] else { break None };
            let o = op_at(g, p);
            let Some(&src) = o.inputs.first() else {
                break None;
            };
            let (ins, outs) = (&g.tensors[src].max_shape, &g.tensors[t].max_shape);
            match &o.kind {
                OpKind::Reshape { .. } if tail(ins).is_some() && tail(ins) == tail(outs) => {}
                OpKind::Permute { perm } if perm.len() >= 2 => {
                    let r = perm.len();
                    if perm[r - 2..] == [r - 1, r - 2] {
                        transposed = !transposed;
                    } else if perm[r - 2..] != [r - 2, r - 1] {
                        break None;
                    }
                }
                OpKind::Expand { .. } => {
                    let lead: usize = ins.iter().rev().skip(2).product();
                    break (lead == 1 && tail(ins).is_some() && tail(ins) == tail(outs))
                        .then_some(src);
                }
                _ => break None,
            }
            t = src;
        };
        if let Some(x) = found {
            edits.push((i, x, transposed));
        }
    }
    let n = edits.len();
    for (i, x, transposed) in edits.into_iter().rev() {
        let Node::Op(mm) = &g.nodes[i] else { continue };
        let b = mm.inputs[1];
        let rb = g.tensors[b].max_shape.len();
        let (xs, dtype) = (g.tensors[x].max_shape.clone(), g.tensors[x].dtype);
        let rx = xs.len();
        let name = g.tensors[x].name.clone();
        let (s0, s1) = (
            g.add_sym(format!("{name} rows")),
            g.add_sym(format!("{name} cols")),
        );
        let mut nodes = vec![
            Node::Sym(SymOp::Size {
                out: s0,
                tensor: x,
                dim: rx - 2,
            }),
            Node::Sym(SymOp::Size {
                out: s1,
                tensor: x,
                dim: rx - 1,
            }),
        ];
        let mut shape = vec![Int::Lit(1); rb - 2];
        shape.extend([Int::Sym(s0), Int::Sym(s1)]);
        let mut mshape = vec![1; rb - 2];
        mshape.extend(&xs[rx - 2..]);
        let m = g.add_tensor(
            format!("{name} as one matrix"),
            dtype,
            mshape.clone(),
            Role::Activation,
        );
        nodes.push(Node::Op(Op {
            kind: OpKind::Reshape { shape },
            inputs: vec![x],
            outputs: vec![m],
        }));
        let mut operand = m;
        if transposed {
            mshape.swap(rb - 2, rb - 1);
            let mt = g.add_tensor(
                format!("{name} transposed"),
                dtype,
                mshape,
                Role::Activation,
            );
            let perm = (0..rb - 2).chain([rb - 1, rb - 2]).collect();
            nodes.push(Node::Op(Op {
                kind: OpKind::Permute { perm },
                inputs: vec![m],
                outputs: vec![mt],
            }));
            operand = mt;
        }
        if let Node::Op(mm) = &mut g.nodes[i] {
            mm.inputs[1] = operand;
        }
        g.nodes.splice(i..i, nodes);
    }
    if n > 0 {
        eliminate_dead(g);
    }
    n
}

/// Union-find over tensors that may share storage (views, cache updates in place); `find`
/// gives a set's root.
fn storage_sets(g: &Graph) -> Vec<TensorId> {
    let mut storage: Vec<TensorId> = (0..g.tensors.len()).collect();
    for o in g.ops() {
        if matches!(o.kind, OpKind::Reshape { .. } | OpKind::CacheUpdate { .. }) {
            let (a, b) = (
                find(&mut storage, o.inputs[0]),
                find(&mut storage, o.outputs[0]),
            );
            storage[a] = b;
        }
    }
    storage
}

fn find(s: &mut [TensorId], mut t: TensorId) -> TensorId {
    while s[t] != t {
        s[t] = s[s[t]];
        t = s[t];
    }
    t
}

/// Most inputs and steps `fuse_elementwise_chains` puts in one chain (a GPU chain's parameters
/// fill one 256-byte uniform slot).
pub const CHAIN_INPUTS: usize = 3;
pub const CHAIN_STEPS: usize = 6;

/// An f32 element-wise op as chain steps over its inputs, if it is one.
fn as_chain(g: &Graph, o: &Op) -> Option<(Vec<ChainStep>, Vec<TensorId>)> {
    let f32s = o
        .inputs
        .iter()
        .chain(&o.outputs)
        .all(|&t| g.tensors[t].dtype == DType::F32);
    if !f32s {
        return None;
    }
    let step = match &o.kind {
        OpKind::ElementwiseChain { steps } => return Some((steps.clone(), o.inputs.clone())),
        OpKind::Unary(u) => ChainStep::Unary(*u),
        OpKind::Binary(b) if !b.is_comparison() => ChainStep::Binary {
            op: *b,
            input: 1,
            operand_first: false,
        },
        OpKind::BinaryScalar {
            op,
            scalar,
            scalar_first,
        } if !op.is_comparison() => ChainStep::Scalar {
            op: *op,
            scalar: *scalar,
            scalar_first: *scalar_first,
        },
        OpKind::Clamp { min, max } => ChainStep::Clamp {
            min: *min,
            max: *max,
        },
        _ => return None,
    };
    Some((vec![step], o.inputs.clone()))
}

/// An f32 element-wise op whose input is the result of another (or of a chain) that nothing else
/// reads joins it in one `ElementwiseChain`: one dispatch, no intermediate tensor. Decode steps
/// are dozens of such pairs per layer (residual add + clamp, gelu · up, scores · scale + mask).
/// One fusion found by a pass's search: consumer node `i` becomes `kind` over `inputs` and its
/// producer node `p` goes.
type Fusion = (usize, usize, OpKind, Vec<TensorId>);

/// Applies `search`'s fusions until it finds none (each one changes the uses and producers the
/// next search sees); returns how many it applied.
fn fuse_until_done(g: &mut Graph, search: impl Fn(&Graph) -> Option<Fusion>) -> usize {
    let mut n = 0;
    while let Some((i, p, kind, inputs)) = search(g) {
        if let Node::Op(c) = &mut g.nodes[i] {
            c.kind = kind;
            c.inputs = inputs;
        }
        g.nodes.remove(p);
        n += 1;
    }
    n
}

pub fn fuse_elementwise_chains(g: &mut Graph) -> usize {
    fuse_until_done(g, |g| {
        let uses = use_counts(g);
        let prod = producers(g);
        // Tensors that may share storage (views, cache updates in place): a chain must not write
        // what it reads, which its parts did not when the shared tensor was written in between.
        let mut storage = storage_sets(g);
        for (i, node) in g.nodes.iter().enumerate() {
            let Node::Op(e) = node else { continue };
            let Some((e_steps, e_ins)) = as_chain(g, e) else {
                continue;
            };
            if e_steps.len() != 1 {
                continue;
            }
            // The operand that a fusable producer computes: v itself, or the binary's right side.
            for (pos, &t) in e_ins.iter().enumerate() {
                let Some(p) = prod[t] else { continue };
                let po = op_at(g, p);
                if uses[t] != 1
                    || !matches!(g.tensors[t].role, Role::Activation)
                    || po.outputs.len() != 1
                {
                    continue;
                }
                let Some((mut steps, mut ins)) = as_chain(g, po) else {
                    continue;
                };
                let step = match e_steps[0] {
                    ChainStep::Binary { op, .. } => {
                        let other = e_ins[1 - pos];
                        let k = match ins.iter().position(|&x| x == other) {
                            Some(k) => k,
                            None => {
                                ins.push(other);
                                ins.len() - 1
                            }
                        };
                        ChainStep::Binary {
                            op,
                            input: k,
                            operand_first: pos == 1,
                        }
                    }
                    st => st,
                };
                steps.push(step);
                let out = find(&mut storage, e.outputs[0]);
                let overlaps = ins.iter().any(|&t| find(&mut storage, t) == out);
                if ins.len() <= CHAIN_INPUTS && steps.len() <= CHAIN_STEPS && !overlaps {
                    return Some((i, p, OpKind::ElementwiseChain { steps }, ins));
                }
            }
        }
        None
    })
}

/// Constants larger than this are not compared by `dedupe_constants` (an attention mask table
/// of 1024 x 1024 f32 is 4 MiB).
const DEDUPE_MAX_BYTES: usize = 4 << 20;

/// Constants of one dtype, shape and content become one tensor, so that ops computing the same
/// thing from them can merge (`merge_common_ops`): exports repeat small tables per layer (RoPE
/// frequencies, attention masks). Weights that linears and embeddings read are left alone: they
/// are distinct in any real model and large to compare.
pub fn dedupe_constants(g: &mut Graph) -> usize {
    let mut weights = vec![false; g.tensors.len()];
    for o in g.ops() {
        let w: &[TensorId] = match &o.kind {
            OpKind::Linear { .. } => o.inputs.get(1..).unwrap_or(&[]),
            OpKind::Embedding { weight } => &o.inputs[..weight.tensor_count().min(o.inputs.len())],
            _ => &[],
        };
        for &t in w {
            weights[t] = true;
        }
    }
    // (dtype, shape) -> representatives; a candidate is compared byte for byte with each.
    let mut reps: std::collections::HashMap<(DType, Vec<usize>), Vec<TensorId>> =
        Default::default();
    let mut renames = Vec::new();
    for (t, def) in g.tensors.iter().enumerate() {
        let Role::Constant(blob) = &def.role else {
            continue;
        };
        let n = def.max_bytes();
        if weights[t] || n > DEDUPE_MAX_BYTES || blob.len() < n {
            continue;
        }
        let list = reps.entry((def.dtype, def.max_shape.clone())).or_default();
        let same = list.iter().copied().find(|&r| match &g.tensors[r].role {
            Role::Constant(b) => b[..n] == blob[..n],
            _ => false,
        });
        match same {
            Some(r) => renames.push((t, r)),
            None => list.push(t),
        }
    }
    for &(from, to) in &renames {
        rename(g, from, to);
        for o in g.outputs.iter_mut().filter(|o| **o == from) {
            *o = to;
        }
    }
    renames.len()
}

/// An op that computes what an earlier op computed — the same kind on the same inputs, none of
/// which may change in between — is dropped and its readers read the earlier result. Exports
/// recompute per layer what only depends on the positions (RoPE cos/sin, the attention mask):
/// once deduplicated constants make those chains identical, each runs once per call.
pub fn merge_common_ops(g: &mut Graph) -> usize {
    // Storage a later op may overwrite: states, what cache updates write in place, and views
    // (reshapes) of those. Ops reading them are not merged.
    let mut mutable: Vec<bool> = g
        .tensors
        .iter()
        .map(|t| matches!(t.role, Role::State(_)))
        .collect();
    // A symbol written more than once would make equal attributes differ in value.
    let mut sym_writes = vec![0usize; g.sym_names.len()];
    for n in &g.nodes {
        match n {
            Node::Op(o) => match o.kind {
                OpKind::CacheUpdate { .. } => {
                    for &t in o.inputs.iter().take(1).chain(&o.outputs) {
                        mutable[t] = true;
                    }
                }
                OpKind::Reshape { .. } if mutable[o.inputs[0]] => mutable[o.outputs[0]] = true,
                _ => {}
            },
            Node::Sym(
                SymOp::Size { out, .. } | SymOp::ReadInput { out, .. } | SymOp::Arith { out, .. },
            ) => sym_writes[*out] += 1,
        }
    }
    let mut repl: Vec<TensorId> = (0..g.tensors.len()).collect();
    let mut seen: std::collections::HashMap<(String, Vec<TensorId>), Vec<TensorId>> =
        Default::default();
    let mut dropped = vec![false; g.nodes.len()];
    let (tensors, outputs) = (&g.tensors, &g.outputs);
    for (node, drop) in g.nodes.iter_mut().zip(dropped.iter_mut()) {
        match node {
            Node::Op(o) => o.inputs.iter_mut().for_each(|t| *t = repl[*t]),
            Node::Sym(SymOp::Size { tensor, .. }) => *tensor = repl[*tensor],
            Node::Sym(_) => {}
        }
        let Node::Op(o) = &*node else { continue };
        let syms = std::cell::RefCell::new(Vec::new());
        o.kind.clone().map_syms(|s| {
            syms.borrow_mut().push(s);
            s
        });
        let syms = syms.into_inner();
        let eligible = !matches!(o.kind, OpKind::CacheUpdate { .. })
            && !o.inputs.iter().any(|&t| mutable[t])
            && syms.iter().all(|&s| sym_writes[s] <= 1)
            && o.outputs.iter().all(|&t| {
                matches!(tensors[t].role, Role::Activation) && !mutable[t] && !outputs.contains(&t)
            });
        if !eligible {
            continue;
        }
        let key = (format!("{:?}", o.kind), o.inputs.clone());
        match seen.get(&key) {
            Some(prev)
                if prev.len() == o.outputs.len()
                    && prev.iter().zip(&o.outputs).all(|(&a, &b)| {
                        let (a, b) = (&tensors[a], &tensors[b]);
                        a.dtype == b.dtype && a.max_shape == b.max_shape
                    }) =>
            {
                for (&a, &b) in prev.iter().zip(&o.outputs) {
                    repl[b] = a;
                }
                *drop = true;
            }
            Some(_) => {}
            None => {
                seen.insert(key, o.outputs.clone());
            }
        }
    }
    let mut k = dropped.iter();
    g.nodes.retain(|_| !k.next().copied().unwrap_or(false));
    dropped.iter().filter(|&&d| d).count()
}

/// Rewrites for a graph about to run, after `optimize`: fused ops no longer match the patterns
/// `optimize` looks for, so a graph that will still be joined with others (a delegate inlined
/// into its whole method) is only optimized, and finished once joined.
pub fn finish(g: &mut Graph) -> Vec<(&'static str, usize)> {
    vec![
        ("fuse_mul_mean", fuse_mul_mean(g)),
        ("fuse_elementwise_chains", fuse_elementwise_chains(g)),
        ("fuse_norm_chains", fuse_norm_chains(g)),
        ("fuse_norm_ropes", fuse_norm_ropes(g)),
    ]
}

/// A `Mean` of an f32 `Binary(Mul)` that nothing else reads becomes one `MulMean`: the
/// products are never stored (the demo export's attention, whose products are 72 MiB a layer in
/// a 32-token prompt), with the same bits.
pub fn fuse_mul_mean(g: &mut Graph) -> usize {
    fuse_until_done(g, |g| {
        let uses = use_counts(g);
        let prod = producers(g);
        let mut storage = storage_sets(g);
        for (i, node) in g.nodes.iter().enumerate() {
            let Node::Op(m) = node else { continue };
            let OpKind::Mean { dims, keepdim } = &m.kind else {
                continue;
            };
            let t = m.inputs[0];
            let Some(p) = prod[t] else { continue };
            let mul = op_at(g, p);
            let f32s = mul.inputs.iter().chain([&t, &m.outputs[0]]);
            let out = find(&mut storage, m.outputs[0]);
            if mul.kind == OpKind::Binary(BinaryOp::Mul)
                && mul.inputs.len() == 2
                && uses[t] == 1
                && matches!(g.tensors[t].role, Role::Activation)
                && f32s.into_iter().all(|&x| g.tensors[x].dtype == DType::F32)
                && mul.inputs.iter().all(|&x| find(&mut storage, x) != out)
            {
                let kind = OpKind::MulMean {
                    dims: dims.clone(),
                    keepdim: *keepdim,
                };
                return Some((i, p, kind, mul.inputs.clone()));
            }
        }
        None
    })
}

/// An `RmsNorm` whose result only a `Rope` rotates becomes one `RmsNormRope`: the norm's
/// workgroup rotates the row it holds (Gemma's q and k norms, 50 dispatches of an E2B step).
pub fn fuse_norm_ropes(g: &mut Graph) -> usize {
    fuse_until_done(g, |g| {
        let uses = use_counts(g);
        let prod = producers(g);
        let mut storage = storage_sets(g);
        for (i, node) in g.nodes.iter().enumerate() {
            let Node::Op(r) = node else { continue };
            let OpKind::Rope {
                style,
                rotary,
                seq_dim,
                start,
            } = r.kind
            else {
                continue;
            };
            let t = r.inputs[0];
            let Some(p) = prod[t] else { continue };
            let norm = op_at(g, p);
            let OpKind::RmsNorm { eps } = norm.kind else {
                continue;
            };
            let out = find(&mut storage, r.outputs[0]);
            let reads: Vec<TensorId> = norm.inputs.iter().chain(&r.inputs[1..]).copied().collect();
            if uses[t] == 1
                && matches!(g.tensors[t].role, Role::Activation)
                && !r.inputs[1..].contains(&t)
                && reads.iter().all(|&x| find(&mut storage, x) != out)
            {
                let mut inputs = norm.inputs.clone();
                inputs.extend(&r.inputs[1..]);
                let kind = OpKind::RmsNormRope {
                    eps,
                    weighted: norm.inputs.len() > 1,
                    style,
                    rotary,
                    seq_dim,
                    start,
                };
                return Some((i, p, kind, inputs));
            }
        }
        None
    })
}

/// An `RmsNorm` whose result only an element-wise op or chain of its shape reads becomes one
/// `RmsNormChain` with it: the norm's workgroup applies the chain to the row it holds, so the
/// chain costs no dispatch of its own (Gemma's post-norms and their residual adds, 3 a layer).
/// Runs after `fuse_elementwise_chains`, on whole chains.
pub fn fuse_norm_chains(g: &mut Graph) -> usize {
    fuse_until_done(g, |g| {
        let uses = use_counts(g);
        let prod = producers(g);
        let mut storage = storage_sets(g);
        for (i, node) in g.nodes.iter().enumerate() {
            let Node::Op(c) = node else { continue };
            let Some((steps, ins)) = as_chain(g, c) else {
                continue;
            };
            for (j, &t) in ins.iter().enumerate() {
                let Some(p) = prod[t] else { continue };
                let norm = op_at(g, p);
                let OpKind::RmsNorm { eps } = norm.kind else {
                    continue;
                };
                let out = find(&mut storage, c.outputs[0]);
                let reads: Vec<TensorId> = norm.inputs.iter().chain(&ins).copied().collect();
                let fits = uses[t] == 1
                    && matches!(g.tensors[t].role, Role::Activation)
                    && ins.iter().filter(|&&x| x == t).count() == 1
                    && g.tensors[c.outputs[0]].max_shape == g.tensors[t].max_shape
                    && ins.len() <= CHAIN_INPUTS
                    && steps.len() <= CHAIN_STEPS
                    && reads.iter().all(|&r| find(&mut storage, r) != out);
                if fits {
                    let mut inputs = norm.inputs.clone();
                    inputs.extend(ins.iter().filter(|&&x| x != t));
                    let kind = OpKind::RmsNormChain {
                        eps,
                        weighted: norm.inputs.len() > 1,
                        norm_input: j,
                        steps,
                    };
                    return Some((i, p, kind, inputs));
                }
            }
        }
        None
    })
}

/// `matmul(a, permute(b))` with a permute that swaps only the last two dims reads b transposed
/// instead (`transpose_b`): the export's K cache transposes (a whole-cache copy per layer and
/// call) go.
pub fn fold_transpose_into_matmul(g: &mut Graph) -> usize {
    let uses = use_counts(g);
    let prod = producers(g);
    let mut edits = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        let Node::Op(mm) = n else { continue };
        if mm.kind != (OpKind::MatMul { transpose_b: false }) || mm.inputs.len() != 2 {
            continue;
        }
        let t = mm.inputs[1];
        let Some(p) = prod[t] else { continue };
        let OpKind::Permute { perm } = &op_at(g, p).kind else {
            continue;
        };
        let r = perm.len();
        let swaps_last_two = r >= 2
            && perm[..r - 2].iter().enumerate().all(|(d, &v)| d == v)
            && perm[r - 2..] == [r - 1, r - 2];
        if swaps_last_two && uses[t] == 1 && matches!(g.tensors[t].role, Role::Activation) {
            edits.push((i, op_at(g, p).inputs[0]));
        }
    }
    for &(i, b) in &edits {
        if let Node::Op(mm) = &mut g.nodes[i] {
            mm.kind = OpKind::MatMul { transpose_b: true };
            mm.inputs[1] = b;
        }
    }
    if !edits.is_empty() {
        eliminate_dead(g);
    }
    edits.len()
}

/// One decomposed attention found by `fuse_attention`.
struct AttnFound {
    /// The p·V matmul node, which the fused op replaces.
    pv: usize,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    mask: Option<TensorId>,
    scale: f32,
    hq: usize,
    hkv: usize,
}

/// The value of a one-element f32 constant.
fn scalar_constant(g: &Graph, t: TensorId) -> Option<f32> {
    (g.tensors[t].dtype == DType::F32)
        .then(|| g.scalar_constant(t))
        .flatten()
        .map(|v| v as f32)
}

fn find_attention(g: &Graph) -> Option<AttnFound> {
    let uses = use_counts(g);
    let prod = producers(g);
    let single = |t: TensorId| {
        uses[t] == 1
            && matches!(g.tensors[t].role, Role::Activation)
            && g.tensors[t].dtype == DType::F32
    };
    // Back through reshapes that only this chain reads.
    let back = |mut t: TensorId| {
        while let Some(p) = prod[t] {
            let o = op_at(g, p);
            if !matches!(o.kind, OpKind::Reshape { .. }) || !single(o.inputs[0]) {
                break;
            }
            t = o.inputs[0];
        }
        t
    };
    let shape = |t: TensorId| g.tensors[t].max_shape.as_slice();
    let lead = |t: TensorId| {
        let s = shape(t);
        s[..s.len().saturating_sub(2)].to_vec()
    };
    'pv: for (i, node) in g.nodes.iter().enumerate() {
        let Node::Op(pv) = node else { continue };
        if pv.kind != (OpKind::MatMul { transpose_b: false }) || pv.inputs.len() != 2 {
            continue;
        }
        let (p_in, v) = (pv.inputs[0], pv.inputs[1]);
        if !single(p_in) {
            continue;
        }
        let probs = back(p_in);
        let Some(sm) = prod[probs].map(|p| op_at(g, p)) else {
            continue;
        };
        if sm.kind != OpKind::Softmax || !single(sm.inputs[0]) {
            continue;
        }
        // Scores, through an optional mask add and an optional scale, to q·Kᵀ.
        let mut chain = vec![p_in, probs];
        let mut x = back(sm.inputs[0]);
        chain.extend([sm.inputs[0], x]);
        let mut mask = None;
        let mut scale = None;
        let mut scores = None;
        // Walking back from the softmax: the mask add (first) then the scale, as Sdpa applies
        // them (a scale after the mask add would scale the mask too).
        for step in 0..3 {
            let Some(o) = prod[x].map(|p| op_at(g, p)) else {
                continue 'pv;
            };
            match (&o.kind, o.inputs.as_slice()) {
                (OpKind::MatMul { transpose_b: true }, &[q, k]) => {
                    scores = Some((q, k));
                    break;
                }
                (OpKind::Binary(BinaryOp::Mul), &[a, b]) if scale.is_none() => {
                    let (t, c) = match (scalar_constant(g, a), scalar_constant(g, b)) {
                        (_, Some(c)) => (a, c),
                        (Some(c), _) => (b, c),
                        _ => continue 'pv,
                    };
                    scale = Some(c);
                    x = t;
                }
                (
                    OpKind::BinaryScalar {
                        op: BinaryOp::Mul,
                        scalar,
                        ..
                    },
                    &[t],
                ) if scale.is_none() => {
                    scale = Some(*scalar as f32);
                    x = t;
                }
                (OpKind::Binary(BinaryOp::Add), &[a, b]) if step == 0 => {
                    // The scores are the operand made by the scale or the matmul.
                    let made = |t: TensorId| {
                        prod[back(t)].is_some_and(|p| {
                            matches!(
                                op_at(g, p).kind,
                                OpKind::MatMul { transpose_b: true }
                                    | OpKind::Binary(BinaryOp::Mul)
                                    | OpKind::BinaryScalar {
                                        op: BinaryOp::Mul,
                                        ..
                                    }
                            )
                        })
                    };
                    let (t, m) = if single(a) && made(a) { (a, b) } else { (b, a) };
                    mask = Some(m);
                    x = t;
                }
                _ => continue 'pv,
            }
            if !single(x) {
                continue 'pv;
            }
            chain.push(x);
            x = back(x);
            chain.push(x);
        }
        let Some((q, k)) = scores else { continue };
        // Shapes: q [.., S, D], k and v [.., C, D], every score tensor [.., S, C] with as many
        // rows (heads) as q.
        let (qs, ks) = (shape(q), shape(k));
        if qs.len() < 2 || ks.len() < 2 || shape(v) != ks || qs[qs.len() - 1] != ks[ks.len() - 1] {
            continue;
        }
        let (s, c) = (qs[qs.len() - 2], ks[ks.len() - 2]);
        let hq: usize = lead(q).iter().product();
        let ends_sc = |t: TensorId| {
            let sh = shape(t);
            sh.len() >= 2
                && sh[sh.len() - 2..] == [s, c]
                && sh[..sh.len() - 2].iter().product::<usize>() == hq
        };
        if !chain.iter().all(|&t| ends_sc(t)) || g.tensors[q].dtype != DType::F32 {
            continue;
        }
        // k's batch dims broadcast over q's as GQA does: equal up to some point, 1 after it.
        let (lq, mut lk) = (lead(q), lead(k));
        if lk.len() > lq.len() {
            continue;
        }
        while lk.len() < lq.len() {
            lk.insert(0, 1);
        }
        let m = lq.iter().zip(&lk).take_while(|(a, b)| a == b).count();
        let hkv: usize = lk.iter().product();
        if lk[m..].iter().any(|&d| d != 1) || hkv == 0 || hq % hkv != 0 {
            continue;
        }
        // With several kv heads, p's heads must line up with q's as v's with k's.
        if hkv > 1 && (lead(p_in) != lead(q)) {
            continue;
        }
        if let Some(mt) = mask {
            let ms = shape(mt);
            let ok = ms.len() >= 2
                && ms[..ms.len() - 2].iter().all(|&d| d == 1)
                && ms[ms.len() - 2..] == [s, c]
                && g.tensors[mt].dtype == DType::F32;
            if !ok {
                continue;
            }
        }
        // The fused op reads q, k and the mask where p·V ran: nothing between may write them.
        let Some(qk_node) = prod[x] else { continue };
        let mut sets = storage_sets(g);
        let read: Vec<TensorId> = [Some(q), Some(k), mask]
            .into_iter()
            .flatten()
            .map(|t| find(&mut sets, t))
            .collect();
        for n in &g.nodes[qk_node + 1..i] {
            if let Node::Op(o) = n {
                if matches!(o.kind, OpKind::Reshape { .. }) {
                    continue; // a view writes nothing
                }
                for &w in &o.outputs {
                    if read.contains(&find(&mut sets, w)) {
                        continue 'pv;
                    }
                }
            }
        }
        return Some(AttnFound {
            pv: i,
            q,
            k,
            v,
            mask,
            scale: scale.unwrap_or(1.0),
            hq,
            hkv,
        });
    }
    None
}

/// The attention exports decompose over a whole KV cache, `softmax(q·Kᵀ · c + mask) · V`
/// (matmul, scale, mask add, softmax, matmul, with reshapes between), becomes one `Sdpa` over
/// every cache row: four dispatches and a `[heads, S, cache]` score tensor become one op whose
/// kernel skips the keys the mask hides (a decode step at position p reads p rows, not the
/// cache's capacity).
pub fn fuse_attention(g: &mut Graph) -> usize {
    let mut n = 0;
    while let Some(a) = find_attention(g) {
        let Node::Op(pv) = &g.nodes[a.pv] else { break };
        let out = pv.outputs[0];
        let d = *g.tensors[a.q].max_shape.last().unwrap_or(&0);
        let mut nodes = Vec::new();
        // [1, heads, rows, d] views of q, k and v, rows as the call has them.
        let mut view = |g: &mut Graph, t: TensorId, heads: usize, what: &str| {
            let sh = g.tensors[t].max_shape.clone();
            let rows = g.add_sym(format!("{} {what} rows", g.tensors[t].name));
            nodes.push(Node::Sym(SymOp::Size {
                out: rows,
                tensor: t,
                dim: sh.len() - 2,
            }));
            let v4 = g.add_tensor(
                format!("{} as [1, {heads}, rows, {d}]", g.tensors[t].name),
                DType::F32,
                vec![1, heads, sh[sh.len() - 2], d],
                Role::Activation,
            );
            let shape = vec![
                Int::Lit(1),
                Int::Lit(heads as i64),
                Int::Sym(rows),
                Int::Lit(d as i64),
            ];
            nodes.push(Node::Op(Op {
                kind: OpKind::Reshape { shape },
                inputs: vec![t],
                outputs: vec![v4],
            }));
            (v4, rows)
        };
        let (q4, s) = view(g, a.q, a.hq, "q");
        let (k4, _) = view(g, a.k, a.hkv, "k");
        let (v4, _) = view(g, a.v, a.hkv, "v");
        let o4 = g.add_tensor(
            format!("{} attention", g.tensors[out].name),
            DType::F32,
            g.tensors[q4].max_shape.clone(),
            Role::Activation,
        );
        let mut inputs = vec![q4, k4, v4];
        inputs.extend(a.mask);
        nodes.push(Node::Op(Op {
            kind: OpKind::Sdpa {
                layout: AttnLayout::Bhsd,
                scale: a.scale,
                causal: false,
                window: None,
                softcap: None,
                start: Int::Lit(0),
                all_rows: true,
            },
            inputs,
            outputs: vec![o4],
        }));
        let os = g.tensors[out].max_shape.clone();
        let mut shape: Vec<Int> = os[..os.len() - 2]
            .iter()
            .map(|&x| Int::Lit(x as i64))
            .collect();
        shape.extend([Int::Sym(s), Int::Lit(d as i64)]);
        nodes.push(Node::Op(Op {
            kind: OpKind::Reshape { shape },
            inputs: vec![o4],
            outputs: vec![out],
        }));
        g.nodes.splice(a.pv..a.pv + 1, nodes);
        eliminate_dead(g);
        n += 1;
    }
    n
}

/// The default pipeline run at load; returns (pass name, rewrites) pairs for `inspect`.
pub fn optimize(g: &mut Graph) -> Vec<(&'static str, usize)> {
    vec![
        ("fold_permutes", fold_permutes(g)),
        ("unit_permutes_to_reshapes", unit_permutes_to_reshapes(g)),
        ("full_slices_to_copies", full_slices_to_copies(g)),
        ("drop_noop_copies", drop_noop_copies(g)),
        ("fuse_rms_norm", fuse_rms_norm(g)),
        ("fuse_rotate_half", fuse_rotate_half(g)),
        ("dedupe_constants", dedupe_constants(g)),
        ("merge_common_syms", merge_common_syms(g)),
        ("merge_common_ops", merge_common_ops(g)),
        ("unexpand_matmul_operands", unexpand_matmul_operands(g)),
        ("fold_transpose_into_matmul", fold_transpose_into_matmul(g)),
        ("fuse_attention", fuse_attention(g)),
        ("uncut_attention_windows", uncut_attention_windows(g)),
        ("drop_uncut_copies", drop_noop_copies(g)),
        ("eliminate_dead", eliminate_dead(g)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::cpu::CpuExecutor;
    use crate::pte::{Blob, Bytes};
    use std::sync::Arc;

    fn constant(v: &[f32]) -> Role {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Role::Constant(Blob::whole(Arc::new(Bytes::Owned(bytes))))
    }

    /// x -> copy -> pow/mean/add/rsqrt/mul -> * w -> out, as the fixtures' export leaves it.
    fn decomposed_norm(rows: usize, d: usize) -> Graph {
        let mut g = Graph::default();
        let f = DType::F32;
        let x = g.add_tensor("x", f, vec![rows, d], Role::Input(0));
        let w: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.1).collect();
        let w = g.add_tensor("w", f, vec![d], constant(&w));
        let c = g.add_tensor("c", f, vec![rows, d], Role::Activation);
        let sq = g.add_tensor("sq", f, vec![rows, d], Role::Activation);
        let m = g.add_tensor("m", f, vec![rows, 1], Role::Activation);
        let a = g.add_tensor("a", f, vec![rows, 1], Role::Activation);
        let r = g.add_tensor("r", f, vec![rows, 1], Role::Activation);
        let y = g.add_tensor("y", f, vec![rows, d], Role::Activation);
        let out = g.add_tensor("out", f, vec![rows, d], Role::Activation);
        g.op(OpKind::Copy, vec![x], vec![c]);
        g.op(
            OpKind::BinaryScalar {
                op: BinaryOp::Pow,
                scalar: 2.0,
                scalar_first: false,
            },
            vec![c],
            vec![sq],
        );
        g.op(
            OpKind::Mean {
                dims: vec![1],
                keepdim: true,
            },
            vec![sq],
            vec![m],
        );
        g.op(
            OpKind::BinaryScalar {
                op: BinaryOp::Add,
                scalar: 1e-6,
                scalar_first: false,
            },
            vec![m],
            vec![a],
        );
        g.op(OpKind::Unary(UnaryOp::Rsqrt), vec![a], vec![r]);
        g.op(OpKind::Binary(BinaryOp::Mul), vec![c, r], vec![y]);
        g.op(OpKind::Binary(BinaryOp::Mul), vec![y, w], vec![out]);
        g.inputs = vec![Io::Tensor(x)];
        g.outputs = vec![out];
        g
    }

    fn run(g: Graph, x: &[f32], shape: &[usize]) -> Vec<u8> {
        let data: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut e = CpuExecutor::new(g).unwrap();
        let out = e
            .run(&[InputValue::Tensor {
                shape: shape.to_vec(),
                data: &data,
            }])
            .unwrap();
        out[0].data.clone()
    }

    #[test]
    fn rms_norm_cluster_fuses_to_one_op_with_the_same_result() {
        let (rows, d) = (3, 7);
        let x: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let g = decomposed_norm(rows, d);
        let mut fused = g.clone();
        assert_eq!(drop_noop_copies(&mut fused), 1);
        assert_eq!(fuse_rms_norm(&mut fused), 2, "cluster + weight");
        let kinds: Vec<String> = fused.ops().map(|o| o.kind.label()).collect();
        assert_eq!(kinds, vec!["rms_norm"]);
        let (a, b) = (run(g, &x, &[rows, d]), run(fused, &x, &[rows, d]));
        let to_f = |v: &[u8]| {
            v.chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>()
        };
        for (p, q) in to_f(&a).iter().zip(to_f(&b)) {
            assert!((p - q).abs() <= 1e-6 * p.abs().max(1.0), "{p} vs {q}");
        }
    }

    #[test]
    fn cluster_with_a_shared_intermediate_is_left_alone() {
        let mut g = decomposed_norm(2, 4);
        // Make the mean an extra graph output: fusing would lose it.
        let m = 5;
        g.outputs.push(m);
        assert_eq!(fuse_rms_norm(&mut g), 0);
    }

    /// x [2,3,4,5] -> permute -> permute -> (permute) -> out, each intermediate read once.
    fn permute_chain(perms: &[&[usize]]) -> Graph {
        let mut g = Graph::default();
        let f = DType::F32;
        let mut shape = vec![2, 3, 4, 5];
        let mut t = g.add_tensor("x", f, shape.clone(), Role::Input(0));
        g.inputs = vec![Io::Tensor(t)];
        for (k, p) in perms.iter().enumerate() {
            shape = p.iter().map(|&d| shape[d]).collect();
            let o = g.add_tensor(format!("p{k}"), f, shape.clone(), Role::Activation);
            g.op(OpKind::Permute { perm: p.to_vec() }, vec![t], vec![o]);
            t = o;
        }
        g.outputs = vec![t];
        g
    }

    #[test]
    fn permute_round_trips_fold_to_a_copy_and_chains_to_one_permute() {
        let x: Vec<f32> = (0..120).map(|i| i as f32 * 0.5 - 7.0).collect();
        let cases: [(&[&[usize]], &str); 3] = [
            (&[&[0, 2, 1, 3], &[0, 2, 1, 3]], "layout[copy]"),
            (&[&[0, 2, 1, 3], &[3, 1, 0, 2]], "layout[permute]"),
            (
                &[&[1, 0, 2, 3], &[0, 2, 3, 1], &[3, 2, 1, 0]],
                "layout[permute]",
            ),
        ];
        for (perms, label) in cases {
            let g = permute_chain(perms);
            let mut folded = g.clone();
            assert_eq!(fold_permutes(&mut folded), perms.len() - 1, "{perms:?}");
            let kinds: Vec<String> = folded.ops().map(|o| o.kind.label()).collect();
            assert_eq!(kinds, vec![label], "{perms:?}");
            assert_eq!(
                run(g, &x, &[2, 3, 4, 5]),
                run(folded, &x, &[2, 3, 4, 5]),
                "{perms:?}"
            );
        }
    }

    #[test]
    fn permutes_of_unit_dims_become_reshapes_with_the_same_result() {
        let x: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 - 3.0).collect();
        let f = DType::F32;
        // [1, 5, 1, 8] -> [1, 1, 5, 8] keeps every element in place; -> [8, 1, 5, 1] does not.
        for (perm, reshaped) in [([0, 2, 1, 3], 1), ([3, 2, 1, 0], 0)] {
            let mut g = Graph::default();
            let xt = g.add_tensor("x", f, vec![1, 5, 1, 8], Role::Input(0));
            let shape: Vec<usize> = perm.iter().map(|&d| [1, 5, 1, 8][d]).collect();
            let y = g.add_tensor("y", f, shape, Role::Activation);
            let z = g.add_tensor("z", f, g.tensors[y].max_shape.clone(), Role::Activation);
            g.op(
                OpKind::Permute {
                    perm: perm.to_vec(),
                },
                vec![xt],
                vec![y],
            );
            g.op(OpKind::Unary(UnaryOp::Neg), vec![y], vec![z]);
            g.inputs = vec![Io::Tensor(xt)];
            g.outputs = vec![z];
            let mut r = g.clone();
            assert_eq!(unit_permutes_to_reshapes(&mut r), reshaped, "{perm:?}");
            assert_eq!(
                r.ops().filter(|o| o.kind.name() == "layout").count(),
                1 - reshaped
            );
            assert_eq!(
                run(g, &x, &[1, 5, 1, 8]),
                run(r, &x, &[1, 5, 1, 8]),
                "{perm:?}"
            );
        }
    }

    #[test]
    fn a_permute_whose_result_is_also_read_elsewhere_is_kept() {
        let mut g = permute_chain(&[&[0, 2, 1, 3], &[0, 2, 1, 3]]);
        let mid = g.ops().next().unwrap().outputs[0];
        g.outputs.push(mid);
        assert_eq!(fold_permutes(&mut g), 0);
        let kinds: Vec<String> = g.ops().map(|o| o.kind.label()).collect();
        assert_eq!(kinds, vec!["layout[permute]", "layout[permute]"]);
    }

    #[test]
    fn dead_ops_are_removed_but_state_writes_stay() {
        let mut g = decomposed_norm(2, 4);
        let f = DType::F32;
        let extra = g.add_tensor("unused", f, vec![2, 4], Role::Activation);
        g.op(OpKind::Unary(UnaryOp::Exp), vec![0], vec![extra]);
        let cache = g.add_tensor("cache", f, vec![4, 4], Role::State(None));
        g.op(
            OpKind::CacheUpdate {
                axis: 0,
                start: Int::Lit(0),
            },
            vec![cache, 0],
            vec![cache],
        );
        let before = g.ops().count();
        assert_eq!(eliminate_dead(&mut g), 1);
        assert_eq!(g.ops().count(), before - 1);
        assert!(g
            .ops()
            .any(|o| matches!(o.kind, OpKind::CacheUpdate { .. })));
    }

    /// A copy that a cache update then writes in place is a snapshot, not a no-op: dropping it
    /// would let the update change the copy's source, which is read again afterwards.
    #[test]
    fn copies_written_in_place_are_kept() {
        let f = DType::F32;
        let mut g = Graph::default();
        let x = g.add_tensor("x", f, vec![4, 2], Role::Input(0));
        let c = g.add_tensor("c", f, vec![4, 2], Role::Activation);
        let v = g.add_tensor("v", f, vec![1, 2], Role::Activation);
        let u = g.add_tensor("u", f, vec![4, 2], Role::Activation);
        let y = g.add_tensor("y", f, vec![4, 2], Role::Activation);
        g.op(OpKind::Copy, vec![x], vec![c]);
        g.op(
            OpKind::Slice {
                dim: 0,
                start: Int::Lit(3),
                end: Int::Lit(4),
                step: 1,
            },
            vec![x],
            vec![v],
        );
        g.op(
            OpKind::CacheUpdate {
                axis: 0,
                start: Int::Lit(0),
            },
            vec![c, v],
            vec![u],
        );
        g.op(OpKind::Unary(UnaryOp::Neg), vec![x], vec![y]);
        g.inputs = vec![Io::Tensor(x)];
        g.outputs = vec![y];
        let xs: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let want = run(g.clone(), &xs, &[4, 2]);
        assert_eq!(drop_noop_copies(&mut g), 0);
        assert_eq!(run(g, &xs, &[4, 2]), want);
    }

    /// Three "layers", each computing cos(concat(pos * freq, pos * freq)) from its own copy of
    /// the frequencies (layers 0 and 1 equal, layer 2 different), scaling a running product by
    /// it, writing that into a cache and reading the cache back: the tables of layers 0 and 1
    /// are one computation, the cache reads are not (the cache changes in between).
    fn repeated_tables() -> Graph {
        let (s, h) = (3usize, 4usize);
        let (f, i) = (DType::F32, DType::I64);
        let mut g = Graph::default();
        let pos = g.add_tensor("pos", i, vec![s], Role::Input(0));
        let x = g.add_tensor("x", f, vec![s, 2 * h], Role::Input(1));
        g.inputs = vec![Io::Tensor(pos), Io::Tensor(x)];
        let cache = g.add_tensor("cache", f, vec![s, 2 * h], Role::State(None));
        let t = |g: &mut Graph, dtype, shape: &[usize]| {
            let n = g.tensors.len();
            g.add_tensor(format!("t{n}"), dtype, shape.to_vec(), Role::Activation)
        };
        let mut run = x;
        for (l, base) in [0.5f32, 0.5, 0.25].into_iter().enumerate() {
            let freq: Vec<f32> = (0..h).map(|k| base.powi(k as i32)).collect();
            let freq = g.add_tensor(format!("freq{l}"), f, vec![h], constant(&freq));
            let c = t(&mut g, f, &[s]);
            g.op(OpKind::Cast, vec![pos], vec![c]);
            let r = t(&mut g, f, &[s, 1]);
            let shape = vec![Int::Lit(s as i64), Int::Lit(1)];
            g.op(OpKind::Reshape { shape }, vec![c], vec![r]);
            let m = t(&mut g, f, &[s, h]);
            g.op(OpKind::Binary(BinaryOp::Mul), vec![r, freq], vec![m]);
            let cat = t(&mut g, f, &[s, 2 * h]);
            g.op(OpKind::Concat { dim: 1 }, vec![m, m], vec![cat]);
            let cos = t(&mut g, f, &[s, 2 * h]);
            g.op(OpKind::Unary(UnaryOp::Cos), vec![cat], vec![cos]);
            let next = t(&mut g, f, &[s, 2 * h]);
            g.op(OpKind::Binary(BinaryOp::Mul), vec![run, cos], vec![next]);
            run = next;
            let u = t(&mut g, f, &[s, 2 * h]);
            let kind = OpKind::CacheUpdate {
                axis: 0,
                start: Int::Lit(0),
            };
            g.op(kind, vec![cache, run], vec![u]);
            let back = t(&mut g, f, &[s, 2 * h]);
            g.op(OpKind::Unary(UnaryOp::Neg), vec![cache], vec![back]);
            g.outputs.push(back);
        }
        g.outputs.push(run);
        g
    }

    fn repeated_tables_inputs() -> (Vec<u8>, Vec<u8>) {
        let pos: Vec<u8> = [5i64, 6, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let x: Vec<u8> = (0..24)
            .flat_map(|k| (k as f32 * 0.3 - 2.0).to_le_bytes())
            .collect();
        (pos, x)
    }

    /// `mean(a * b, dims)` as the demo export's attention leaves it: a mul, then a mean.
    fn mul_then_mean(ash: &[usize], bsh: &[usize], dims: &[usize], keepdim: bool) -> Graph {
        let mut g = Graph::default();
        let f = DType::F32;
        let full = crate::ir::broadcast(ash, bsh).unwrap();
        let a = g.add_tensor("a", f, ash.to_vec(), Role::Input(0));
        let b = g.add_tensor("b", f, bsh.to_vec(), Role::Input(1));
        let p = g.add_tensor("p", f, full.clone(), Role::Activation);
        let kind = OpKind::Mean {
            dims: dims.to_vec(),
            keepdim,
        };
        let shape = crate::ir::op_shapes(&kind, &[&full], &[])
            .unwrap()
            .remove(0);
        let y = g.add_tensor("y", f, shape, Role::Activation);
        g.op(OpKind::Binary(BinaryOp::Mul), vec![a, b], vec![p]);
        g.op(kind, vec![p], vec![y]);
        g.inputs = vec![Io::Tensor(a), Io::Tensor(b)];
        g.outputs = vec![y];
        g
    }

    #[test]
    fn mul_then_mean_fuses_to_one_op_with_the_same_bits() {
        // The demo's q·k (over the head dim) and p·v (over the cache), a transposed operand,
        // several dims, keepdim; values of both signs and magnitudes, so rounding shows.
        type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], bool);
        let cases: &[Case] = &[
            (&[1, 3, 3, 5, 1, 64], &[1, 3, 1, 1, 40, 64], &[5], false),
            (&[1, 3, 3, 5, 40, 1], &[1, 3, 1, 1, 40, 64], &[4], false),
            (&[6, 9], &[6, 9], &[1], true),
            (&[6, 9], &[6, 1], &[0], false),
            (&[4, 6, 5], &[6, 5], &[0, 2], true),
        ];
        for (k, &(ash, bsh, dims, keepdim)) in cases.iter().enumerate() {
            let g = mul_then_mean(ash, bsh, dims, keepdim);
            let mut fused = g.clone();
            assert_eq!(fuse_mul_mean(&mut fused), 1);
            let ops: Vec<&str> = fused.ops().map(|o| o.kind.name()).collect();
            assert_eq!(ops, ["mul_mean"]);
            let data = |sh: &[usize], seed: usize| -> Vec<u8> {
                (0..sh.iter().product::<usize>())
                    .map(|i| ((i * 7919 + seed * 104729) % 2003) as f32 / 97.0 - 10.3)
                    .flat_map(|x| x.to_le_bytes())
                    .collect()
            };
            let (da, db) = (data(ash, 2 * k), data(bsh, 2 * k + 1));
            let run = |g: Graph| {
                let ins = [
                    InputValue::Tensor {
                        shape: ash.to_vec(),
                        data: &da,
                    },
                    InputValue::Tensor {
                        shape: bsh.to_vec(),
                        data: &db,
                    },
                ];
                let out = CpuExecutor::new(g).unwrap().run(&ins).unwrap().remove(0);
                (out.sizes, out.data)
            };
            assert_eq!(run(g), run(fused), "{ash:?} * {bsh:?} over {dims:?}");
        }
    }

    #[test]
    fn a_product_read_elsewhere_or_of_integers_is_not_fused() {
        let mut g = mul_then_mean(&[4, 8], &[4, 8], &[1], false);
        let p = g.ops().next().unwrap().outputs[0];
        g.outputs.push(p);
        assert_eq!(fuse_mul_mean(&mut g), 0);
        let mut g = mul_then_mean(&[4, 8], &[4, 8], &[1], false);
        g.tensors[0].dtype = DType::I64;
        g.tensors[1].dtype = DType::I64;
        g.tensors[2].dtype = DType::I64;
        assert_eq!(fuse_mul_mean(&mut g), 0);
    }

    #[test]
    fn repeated_table_chains_run_once_with_the_same_results() {
        let g = repeated_tables();
        let mut merged = g.clone();
        assert_eq!(dedupe_constants(&mut merged), 1, "freq1 is freq0");
        // Layer 1's cast, reshape, mul, concat and cos, layer 2's cast and reshape; not the
        // cache reads, nor layer 2's mul by its own frequencies.
        assert_eq!(merge_common_ops(&mut merged), 7);
        let count = |g: &Graph, label: &str| g.ops().filter(|o| o.kind.label() == label).count();
        assert_eq!(count(&merged, "elementwise[cos]"), 2);
        assert_eq!(count(&merged, "elementwise[neg]"), 3);
        let (pos, x) = repeated_tables_inputs();
        let outs = |g: Graph| {
            let mut e = CpuExecutor::new(g).unwrap();
            let ins = [
                InputValue::Tensor {
                    shape: vec![3],
                    data: &pos,
                },
                InputValue::Tensor {
                    shape: vec![3, 8],
                    data: &x,
                },
            ];
            e.run(&ins)
                .unwrap()
                .into_iter()
                .map(|t| t.data)
                .collect::<Vec<_>>()
        };
        let want = outs(g);
        assert_ne!(want[0], want[1], "the cache reads differ");
        assert_eq!(outs(merged), want);
    }

    #[test]
    fn ops_reading_a_cache_or_a_graph_output_are_not_merged() {
        let mut g = repeated_tables();
        // Make layer 1's cos a graph output: it keeps its own tensor.
        let cos1 = g
            .ops()
            .filter(|o| o.kind == OpKind::Unary(UnaryOp::Cos))
            .nth(1)
            .unwrap()
            .outputs[0];
        g.outputs.push(cos1);
        dedupe_constants(&mut g);
        assert_eq!(merge_common_ops(&mut g), 6);
        assert!(g.ops().any(|o| o.outputs == [cos1]));
    }

    /// RoPE as the Vulkan export leaves it: cos/sin of concat(pos * freq, pos * freq) viewed
    /// as [1, 1, S, D], then `x * cos + concat(-x[.., h:], x[.., :h]) * sin` for x [1, H, S, D];
    /// `swap` flips the operands of the commutative ops, `hi` is where the high slice starts.
    fn rotate_half_graph(heads: usize, swap: bool, hi: i64) -> Graph {
        let (s, d) = (3usize, 8usize);
        let h = d / 2;
        let f = DType::F32;
        let mut g = Graph::default();
        let pos = g.add_tensor("pos", DType::I64, vec![s], Role::Input(0));
        let x = g.add_tensor("x", f, vec![1, heads, s, d], Role::Input(1));
        g.inputs = vec![Io::Tensor(pos), Io::Tensor(x)];
        let t = |g: &mut Graph, shape: &[usize]| {
            let n = g.tensors.len();
            g.add_tensor(format!("t{n}"), f, shape.to_vec(), Role::Activation)
        };
        let lits = |v: &[usize]| v.iter().map(|&k| Int::Lit(k as i64)).collect::<Vec<_>>();
        let freq: Vec<f32> = (0..h).map(|k| 0.6f32.powi(k as i32)).collect();
        let freq = g.add_tensor("freq", f, vec![h], constant(&freq));
        let c = t(&mut g, &[s]);
        g.op(OpKind::Cast, vec![pos], vec![c]);
        let r = t(&mut g, &[s, 1]);
        g.op(
            OpKind::Reshape {
                shape: lits(&[s, 1]),
            },
            vec![c],
            vec![r],
        );
        let m = t(&mut g, &[s, h]);
        g.op(OpKind::Binary(BinaryOp::Mul), vec![r, freq], vec![m]);
        let cat = t(&mut g, &[s, d]);
        g.op(OpKind::Concat { dim: 1 }, vec![m, m], vec![cat]);
        let mut tables = Vec::new();
        for u in [UnaryOp::Cos, UnaryOp::Sin] {
            let v = t(&mut g, &[s, d]);
            g.op(OpKind::Unary(u), vec![cat], vec![v]);
            let v4 = t(&mut g, &[1, 1, s, d]);
            let shape = lits(&[1, 1, s, d]);
            g.op(OpKind::Reshape { shape }, vec![v], vec![v4]);
            tables.push(v4);
        }
        let ord = |a: TensorId, b: TensorId| if swap { vec![b, a] } else { vec![a, b] };
        let xs = [1, heads, s, d];
        let hs = [1, heads, s, h];
        let xc = t(&mut g, &xs);
        g.op(OpKind::Binary(BinaryOp::Mul), ord(x, tables[0]), vec![xc]);
        let slice = |g: &mut Graph, a: i64, b: i64| {
            let o = t(g, &hs);
            let kind = OpKind::Slice {
                dim: 3,
                start: Int::Lit(a),
                end: Int::Lit(b),
                step: 1,
            };
            g.op(kind, vec![x], vec![o]);
            o
        };
        let lo = slice(&mut g, 0, h as i64);
        let hi_t = slice(&mut g, hi, i64::MAX);
        let neg = t(&mut g, &hs);
        g.op(OpKind::Unary(UnaryOp::Neg), vec![hi_t], vec![neg]);
        let rot = t(&mut g, &xs);
        g.op(OpKind::Concat { dim: 3 }, vec![neg, lo], vec![rot]);
        let rs = t(&mut g, &xs);
        g.op(OpKind::Binary(BinaryOp::Mul), ord(rot, tables[1]), vec![rs]);
        let out = t(&mut g, &xs);
        g.op(OpKind::Binary(BinaryOp::Add), ord(xc, rs), vec![out]);
        g.outputs = vec![out];
        g
    }

    fn run2(g: Graph, heads: usize) -> Vec<u8> {
        let pos: Vec<u8> = [4i64, 9, 30].iter().flat_map(|v| v.to_le_bytes()).collect();
        let x: Vec<u8> = (0..heads * 24)
            .flat_map(|k| ((k as f32 * 0.37).sin() * 2.0).to_le_bytes())
            .collect();
        let mut e = CpuExecutor::new(g).unwrap();
        let ins = [
            InputValue::Tensor {
                shape: vec![3],
                data: &pos,
            },
            InputValue::Tensor {
                shape: vec![1, heads, 3, 8],
                data: &x,
            },
        ];
        e.run(&ins).unwrap().remove(0).data
    }

    #[test]
    fn rotate_half_chains_become_one_rope_with_the_same_result() {
        for (heads, swap) in [(1, false), (2, true), (3, false)] {
            let g = rotate_half_graph(heads, swap, 4);
            let mut fused = g.clone();
            assert_eq!(fuse_rotate_half(&mut fused), 1, "{heads} heads");
            eliminate_dead(&mut fused);
            let kinds: Vec<String> = fused.ops().map(|o| o.kind.label()).collect();
            assert_eq!(
                kinds,
                [
                    "elementwise[cast]",
                    "reshape",
                    "elementwise[mul]",
                    "elementwise[cos]",
                    "elementwise[sin]",
                    "rope"
                ]
            );
            assert_eq!(run2(g, heads), run2(fused, heads), "{heads} heads");
        }
    }

    #[test]
    fn a_rotation_by_other_than_half_is_left_alone() {
        let mut g = rotate_half_graph(2, false, 3);
        // The high slice starts at 3 (its declared shape is wrong, but no op runs here).
        assert_eq!(fuse_rotate_half(&mut g), 0);
    }

    /// Element-wise pairs as decode layers have them, plus a non-commutative op whose fused
    /// operand is on the right, a producer read twice, and a chain past the step limit.
    fn elementwise_pairs() -> Graph {
        let f = DType::F32;
        let (h, s) = (3usize, 5usize);
        let mut g = Graph::default();
        let x = g.add_tensor("x", f, vec![h, s], Role::Input(0));
        let r = g.add_tensor("r", f, vec![h, s], Role::Input(1));
        let mask = g.add_tensor("mask", f, vec![s], Role::Input(2));
        g.inputs = vec![Io::Tensor(x), Io::Tensor(r), Io::Tensor(mask)];
        let scale = g.add_tensor("scale", f, vec![], constant(&[0.75]));
        let t = |g: &mut Graph| {
            let n = g.tensors.len();
            g.add_tensor(format!("t{n}"), f, vec![h, s], Role::Activation)
        };
        let op = |g: &mut Graph, kind: OpKind, ins: Vec<TensorId>| {
            let o = t(g);
            g.op(kind, ins, vec![o]);
            o
        };
        let add = op(&mut g, OpKind::Binary(BinaryOp::Add), vec![x, r]);
        let clamp = OpKind::Clamp {
            min: Some(-1.5),
            max: Some(2.0),
        };
        let res = op(&mut g, clamp, vec![add]);
        let gl = op(&mut g, OpKind::Unary(UnaryOp::GeluTanh), vec![x]);
        let gm = op(&mut g, OpKind::Binary(BinaryOp::Mul), vec![gl, r]);
        let sc = op(&mut g, OpKind::Binary(BinaryOp::Mul), vec![x, scale]);
        let masked = op(&mut g, OpKind::Binary(BinaryOp::Add), vec![sc, mask]);
        // The chain on the right, its left operand one of its inputs: v = x - v.
        let sub = op(&mut g, OpKind::Binary(BinaryOp::Sub), vec![x, res]);
        let twice = op(&mut g, OpKind::Unary(UnaryOp::Exp), vec![gm]);
        let a = op(&mut g, OpKind::Unary(UnaryOp::Sin), vec![twice]);
        let b = op(&mut g, OpKind::Binary(BinaryOp::Div), vec![twice, masked]);
        let mut v = op(&mut g, OpKind::Binary(BinaryOp::Max), vec![a, b]);
        for k in 0..7 {
            let kind = OpKind::BinaryScalar {
                op: BinaryOp::Sub,
                scalar: k as f64 * 0.25,
                scalar_first: k % 2 == 1,
            };
            v = op(&mut g, kind, vec![v]);
        }
        g.outputs = vec![sub, v];
        g
    }

    #[test]
    fn elementwise_pairs_fuse_into_chains_with_the_same_results() {
        // The div's operands are a tensor read twice and a chain that has 3 inputs already;
        // the seven subtractions pass the step limit.
        const EXPECTED_LABELS: [&str; 6] = [
            "elementwise[mul+add]",
            "elementwise[add+clamp+sub]",
            "elementwise[gelutanh+mul+exp]",
            "elementwise[div]",
            "elementwise[sin+max+sub_scalar+sub_scalar+sub_scalar+sub_scalar]",
            "elementwise[sub_scalar+sub_scalar+sub_scalar]",
        ];
        let g = elementwise_pairs();
        let mut fused = g.clone();
        let n = fuse_elementwise_chains(&mut fused);
        let labels: Vec<String> = fused.ops().map(|o| o.kind.label()).collect();
        assert_eq!(labels, EXPECTED_LABELS, "{labels:?}");
        assert_eq!(n, 12, "18 ops in, 6 out");
        let x: Vec<u8> = (0..15)
            .flat_map(|k| ((k as f32 * 0.7).sin() * 3.0).to_le_bytes())
            .collect();
        let r: Vec<u8> = (0..15)
            .flat_map(|k| ((k as f32 * 1.3).cos() * 2.0).to_le_bytes())
            .collect();
        let m: Vec<u8> = (0..5)
            .flat_map(|k| (k as f32 - 2.0).to_le_bytes())
            .collect();
        let outs = |g: Graph| {
            let mut e = CpuExecutor::new(g).unwrap();
            let t = |shape: Vec<usize>, data| InputValue::Tensor { shape, data };
            e.run(&[t(vec![3, 5], &x), t(vec![3, 5], &r), t(vec![5], &m)])
                .unwrap()
                .into_iter()
                .map(|t| t.data)
                .collect::<Vec<_>>()
        };
        assert_eq!(outs(fused), outs(g));
    }

    /// Post-norm residual adds as the E2B export leaves them: norm → add(residual) → clamp (the
    /// norm the chain's second input), an unweighted norm → · layer scalar (broadcast) + residual,
    /// and a norm that a second op also reads (left alone).
    fn norms_then_chains(rows: usize, d: usize) -> Graph {
        let f = DType::F32;
        let mut g = Graph::default();
        let x = g.add_tensor("x", f, vec![rows, d], Role::Input(0));
        let r = g.add_tensor("r", f, vec![rows, d], Role::Input(1));
        g.inputs = vec![Io::Tensor(x), Io::Tensor(r)];
        let w: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.01).collect();
        let w = g.add_tensor("w", f, vec![d], constant(&w));
        let scale = g.add_tensor("scale", f, vec![1], constant(&[0.375]));
        let op = |g: &mut Graph, kind: OpKind, ins: Vec<TensorId>| {
            let n = g.tensors.len();
            let o = g.add_tensor(format!("t{n}"), f, vec![rows, d], Role::Activation);
            g.op(kind, ins, vec![o]);
            o
        };
        let eps = 1e-6;
        let n1 = op(&mut g, OpKind::RmsNorm { eps }, vec![x, w]);
        let a1 = op(&mut g, OpKind::Binary(BinaryOp::Add), vec![r, n1]);
        let clamp = OpKind::Clamp {
            min: Some(-1.0),
            max: Some(1.25),
        };
        let c1 = op(&mut g, clamp, vec![a1]);
        let n2 = op(&mut g, OpKind::RmsNorm { eps }, vec![c1]);
        let m2 = op(&mut g, OpKind::Binary(BinaryOp::Mul), vec![n2, scale]);
        let a2 = op(&mut g, OpKind::Binary(BinaryOp::Add), vec![m2, r]);
        let n3 = op(&mut g, OpKind::RmsNorm { eps }, vec![a2, w]);
        let a3 = op(&mut g, OpKind::Binary(BinaryOp::Sub), vec![x, n3]);
        g.outputs = vec![a3, n3];
        g
    }

    /// Attention over a cache updated in place at a position, its keys and values cut to the
    /// first pos + S rows and permuted to BSHD, its mask's columns cut likewise (ExecuTorch's
    /// XNNPACK LLM exports around `custom_sdpa`).
    fn windowed_attention() -> Graph {
        let f = DType::F32;
        let (smax, h, d, len) = (4, 2, 8, 16);
        let mut g = Graph::default();
        let q = g.add_tensor("q", f, vec![1, smax, h, d], Role::Input(0));
        let knew = g.add_tensor("k new", f, vec![1, 1, smax, d], Role::Input(1));
        let pos = g.add_tensor("pos", DType::I64, vec![1], Role::Input(2));
        let mask = g.add_tensor("mask", f, vec![smax, len], Role::Input(3));
        g.inputs = [q, knew, pos, mask].map(Io::Tensor).to_vec();
        let cache = g.add_tensor("cache", f, vec![1, 1, len, d], Role::State(None));
        let (p, sl, end) = (g.add_sym("pos"), g.add_sym("S"), g.add_sym("end"));
        g.nodes.push(Node::Sym(SymOp::ReadInput {
            out: p,
            tensor: pos,
            index: 0,
        }));
        g.nodes.push(Node::Sym(SymOp::Size {
            out: sl,
            tensor: q,
            dim: 1,
        }));
        g.nodes.push(Node::Sym(SymOp::Arith {
            out: end,
            op: SymArith::Add,
            a: Int::Sym(p),
            b: Int::Sym(sl),
        }));
        let update = OpKind::CacheUpdate {
            axis: 2,
            start: Int::Sym(p),
        };
        // The update's output aliases the cache (as `whole` lowers `slice_scatter`).
        let updated = g.add_tensor("updated", f, vec![1, 1, len, d], Role::Activation);
        g.op(update, vec![cache, knew], vec![updated]);
        let cut = |g: &mut Graph, x: TensorId, dim: usize| {
            let y = g.add_tensor("cut", f, g.tensors[x].max_shape.clone(), Role::Activation);
            let kind = OpKind::Slice {
                dim,
                start: Int::Lit(0),
                end: Int::Sym(end),
                step: 1,
            };
            g.op(kind, vec![x], vec![y]);
            y
        };
        let mut kv = Vec::new();
        for _ in 0..2 {
            let c = cut(&mut g, updated, 2);
            // Room for pos + S rows, as the export bounds them.
            let t = g.add_tensor("bshd", f, vec![1, len + smax - 1, 1, d], Role::Activation);
            let perm = vec![0, 2, 1, 3];
            g.op(OpKind::Permute { perm }, vec![c], vec![t]);
            kv.push(t);
        }
        let m = cut(&mut g, mask, 1);
        let y = g.add_tensor("y", f, vec![1, smax, h, d], Role::Activation);
        let attn = OpKind::Sdpa {
            layout: AttnLayout::Bshd,
            scale: 0.35,
            causal: false,
            window: None,
            softcap: None,
            start: Int::Sym(p),
            all_rows: false,
        };
        g.op(attn, vec![q, kv[0], kv[1], m], vec![y]);
        g.outputs = vec![y];
        g
    }

    #[test]
    fn attention_windows_read_uncut_with_the_same_results() {
        let g = windowed_attention();
        let mut uncut = g.clone();
        assert_eq!(uncut_attention_windows(&mut uncut), 3);
        // Keys, values and mask no longer follow the position: the cuts copy the whole, and
        // the views on the way to attention hold the whole cache, no more.
        let whole_views = |g: &Graph| {
            assert!(g.ops().all(|o| !matches!(o.kind, OpKind::Slice { .. })));
            let views: Vec<_> = g
                .ops()
                .filter(|o| matches!(o.kind, OpKind::Permute { .. } | OpKind::Reshape { .. }))
                .map(|o| g.tensors[o.outputs[0]].max_shape.clone())
                .collect();
            assert_eq!(views, [[1, 16, 1, 8], [1, 16, 1, 8]]);
        };
        whole_views(&uncut);
        // Nothing writes what they copy after them: the copies go.
        let mut dropped = uncut.clone();
        assert_eq!(drop_noop_copies(&mut dropped), 3);
        // Unless the cache is updated again: then the cache's copies stay (the mask's goes).
        let mut twice = uncut.clone();
        let cache = twice
            .ops()
            .find(|o| matches!(o.kind, OpKind::CacheUpdate { .. }))
            .map(|o| o.inputs.clone())
            .unwrap();
        let again = twice.add_tensor("again", DType::F32, vec![1, 1, 16, 8], Role::Activation);
        let update = OpKind::CacheUpdate {
            axis: 2,
            start: Int::Lit(0),
        };
        twice.op(update, cache, vec![again]);
        assert_eq!(drop_noop_copies(&mut twice), 1);
        let mut viewed = g.clone();
        unit_permutes_to_reshapes(&mut viewed);
        assert_eq!(uncut_attention_windows(&mut viewed), 3);
        whole_views(&viewed);
        assert_eq!(drop_noop_copies(&mut viewed), 3);
        // A cut that something else reads too stays.
        let mut shared = g.clone();
        let first_cut = shared
            .ops()
            .find(|o| matches!(o.kind, OpKind::Slice { .. }))
            .map(|o| o.outputs[0])
            .unwrap();
        shared.outputs.push(first_cut);
        assert_eq!(uncut_attention_windows(&mut shared), 1, "the mask's only");
        // Nor one whose length a symbol reads (MLX's start = kv_len - q_len); the values then
        // keep theirs too, so that keys and values stay one length.
        let mut sized = g.clone();
        let (len, x) = (sized.add_sym("k rows"), sized.add_sym("x"));
        sized.nodes.push(Node::Sym(SymOp::Size {
            out: len,
            tensor: first_cut,
            dim: 2,
        }));
        sized.nodes.push(Node::Sym(SymOp::Arith {
            out: x,
            op: SymArith::Sub,
            a: Int::Sym(len),
            b: Int::Lit(1),
        }));
        assert_eq!(uncut_attention_windows(&mut sized), 1, "the mask's only");

        let f32s = |n: usize, k: f32| -> Vec<u8> {
            (0..n)
                .flat_map(|i| ((i as f32 * k).sin()).to_le_bytes())
                .collect()
        };
        // A prompt of 3 at 0, then a step of 1 at 3: the second reads the first's rows.
        let calls: Vec<(usize, i64)> = vec![(3, 0), (1, 3)];
        let outs = |g: Graph| {
            let mut e = CpuExecutor::new(g).unwrap();
            let mut got = Vec::new();
            for (c, &(s, pos)) in calls.iter().enumerate() {
                let (q, k, m) = (
                    f32s(s * 2 * 8, 0.37 + c as f32),
                    f32s(s * 8, 0.71 + c as f32),
                    f32s(s * 16, 1.3),
                );
                let p = pos.to_le_bytes();
                let t = |shape: Vec<usize>, data| InputValue::Tensor { shape, data };
                let ins = [
                    t(vec![1, s, 2, 8], &q[..]),
                    t(vec![1, 1, s, 8], &k[..]),
                    t(vec![1], &p[..]),
                    t(vec![s, 16], &m[..]),
                ];
                got.push(e.run(&ins).unwrap().remove(0).data);
            }
            got
        };
        let want = outs(g);
        assert_eq!(outs(uncut), want);
        assert_eq!(outs(dropped), want);
        assert_eq!(outs(viewed), want);
    }

    /// Runs `g` on the CPU executor with f32 input `x` and i64 input `pos`.
    fn run_x_pos(g: Graph, x: &[f32], shape: Vec<usize>, pos: i64) -> Vec<Vec<u8>> {
        let mut e = CpuExecutor::new(g).unwrap();
        let data: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let p = pos.to_le_bytes();
        let ins = [
            InputValue::Tensor { shape, data: &data },
            InputValue::Tensor {
                shape: vec![1],
                data: &p,
            },
        ];
        e.run(&ins).unwrap().into_iter().map(|t| t.data).collect()
    }

    #[test]
    fn slices_of_every_row_become_copies_with_the_same_results() {
        let f = DType::F32;
        let mut g = Graph::default();
        let x = g.add_tensor("x", f, vec![3, 5], Role::Input(0));
        let pos = g.add_tensor("pos", DType::I64, vec![1], Role::Input(1));
        g.inputs = vec![Io::Tensor(x), Io::Tensor(pos)];
        let slice = |g: &mut Graph, end: i64, n: usize| {
            let y = g.add_tensor("cut", f, vec![3, n], Role::Activation);
            let kind = OpKind::Slice {
                dim: 1,
                start: Int::Lit(0),
                end: Int::Lit(end),
                step: 1,
            };
            g.op(kind, vec![x], vec![y]);
            y
        };
        let (a, b, c) = (
            slice(&mut g, 5, 5),
            slice(&mut g, i64::MAX, 5),
            slice(&mut g, 4, 4),
        );
        let ab = g.add_tensor("a+b", f, vec![3, 5], Role::Activation);
        g.op(OpKind::Binary(BinaryOp::Add), vec![a, b], vec![ab]);
        g.outputs = vec![ab, c];
        let mut copied = g.clone();
        assert_eq!(
            full_slices_to_copies(&mut copied),
            2,
            "0..4 of 5 stays a slice"
        );
        let mut dropped = copied.clone();
        assert_eq!(drop_noop_copies(&mut dropped), 2);
        assert_eq!(dropped.ops().count(), 2);
        let xs: Vec<f32> = (0..15).map(|i| (i as f32 * 0.3).sin()).collect();
        let want = run_x_pos(g, &xs, vec![3, 5], 0);
        assert_eq!(run_x_pos(copied, &xs, vec![3, 5], 0), want);
        assert_eq!(run_x_pos(dropped, &xs, vec![3, 5], 0), want);
    }

    #[test]
    fn symbols_defined_alike_merge_and_so_do_the_ops_reading_them() {
        let f = DType::F32;
        let mut g = Graph::default();
        let x = g.add_tensor("x", f, vec![6, 4], Role::Input(0));
        let pos = g.add_tensor("pos", DType::I64, vec![1], Role::Input(1));
        g.inputs = vec![Io::Tensor(x), Io::Tensor(pos)];
        // Each "layer" reads the position anew and takes row pos of x, as the exports do.
        let mut rows = Vec::new();
        for layer in 0..3 {
            let (p, e) = (g.add_sym("pos"), g.add_sym("end"));
            g.nodes.push(Node::Sym(SymOp::ReadInput {
                out: p,
                tensor: pos,
                index: 0,
            }));
            // The last layer's end is pos + 2: not the same symbol, nor the same slice.
            let more = if layer == 2 { 2 } else { 1 };
            g.nodes.push(Node::Sym(SymOp::Arith {
                out: e,
                op: SymArith::Add,
                a: Int::Sym(p),
                b: Int::Lit(more),
            }));
            let y = g.add_tensor("row", f, vec![more as usize, 4], Role::Activation);
            let kind = OpKind::Slice {
                dim: 0,
                start: Int::Sym(p),
                end: Int::Sym(e),
                step: 1,
            };
            g.op(kind, vec![x], vec![y]);
            rows.push(y);
        }
        let sum = g.add_tensor("sum", f, vec![1, 4], Role::Activation);
        g.op(OpKind::Binary(BinaryOp::Add), rows[..2].to_vec(), vec![sum]);
        g.outputs = vec![sum, rows[2]];
        let mut merged = g.clone();
        // The second and third position reads, the second end.
        assert_eq!(merge_common_syms(&mut merged), 3);
        let mut common = merged.clone();
        assert_eq!(
            merge_common_ops(&mut common),
            1,
            "the first two rows are one slice"
        );
        let mut untouched = g.clone();
        assert_eq!(merge_common_ops(&mut untouched), 0);
        let xs: Vec<f32> = (0..24).map(|i| (i as f32 * 0.7).cos()).collect();
        for pos in [0, 3] {
            let want = run_x_pos(g.clone(), &xs, vec![6, 4], pos);
            assert_eq!(run_x_pos(merged.clone(), &xs, vec![6, 4], pos), want);
            assert_eq!(run_x_pos(common.clone(), &xs, vec![6, 4], pos), want);
        }
    }

    #[test]
    fn norms_and_the_chains_only_they_feed_fuse_with_the_same_results() {
        let (rows, d) = (3, 37);
        let g = norms_then_chains(rows, d);
        let mut chained = g.clone();
        fuse_elementwise_chains(&mut chained);
        let mut fused = chained.clone();
        assert_eq!(fuse_norm_chains(&mut fused), 2);
        let labels: Vec<String> = fused.ops().map(|o| o.kind.label()).collect();
        assert_eq!(
            labels,
            [
                "rms_norm+[add+clamp]",
                "rms_norm+[mul+add]",
                "rms_norm",
                "elementwise[sub]"
            ],
            "{labels:?}"
        );
        let bytes = |f: fn(usize) -> f32| -> Vec<u8> {
            (0..rows * d).flat_map(|k| f(k).to_le_bytes()).collect()
        };
        let (x, r) = (
            bytes(|k| (k as f32 * 0.7).sin() * 3.0),
            bytes(|k| (k as f32 * 1.3).cos() * 2.0),
        );
        let outs = |g: Graph| {
            let mut e = CpuExecutor::new(g).unwrap();
            let t = |data| InputValue::Tensor {
                shape: vec![rows, d],
                data,
            };
            e.run(&[t(&x), t(&r)])
                .unwrap()
                .into_iter()
                .map(|t| t.data)
                .collect::<Vec<_>>()
        };
        let want = outs(g);
        assert_eq!(outs(chained), want);
        assert_eq!(outs(fused), want);
    }

    #[test]
    fn norms_that_only_a_rope_reads_fuse_with_the_same_results() {
        let f = DType::F32;
        let (s, h, d, rotary, max_pos) = (3, 2, 16, 12, 20);
        let mut g = Graph::default();
        let x = g.add_tensor("x", f, vec![1, s, h, d], Role::Input(0));
        g.inputs = vec![Io::Tensor(x)];
        let w: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.1).collect();
        let w = g.add_tensor("w", f, vec![d], constant(&w));
        let table = |k: f32| -> Vec<f32> {
            (0..max_pos * rotary / 2)
                .map(|i| (i as f32 * k).sin())
                .collect()
        };
        let cos = g.add_tensor("cos", f, vec![max_pos, rotary / 2], constant(&table(0.3)));
        let sin = g.add_tensor("sin", f, vec![max_pos, rotary / 2], constant(&table(0.7)));
        let t =
            |g: &mut Graph, name: &str| g.add_tensor(name, f, vec![1, s, h, d], Role::Activation);
        let (n1, r1, n2, r2) = (
            t(&mut g, "n1"),
            t(&mut g, "r1"),
            t(&mut g, "n2"),
            t(&mut g, "r2"),
        );
        let eps = 1e-6;
        let rope = |style| OpKind::Rope {
            style,
            rotary,
            seq_dim: 1,
            start: Int::Lit(4),
        };
        g.op(OpKind::RmsNorm { eps }, vec![x, w], vec![n1]);
        g.op(rope(RopeStyle::Half), vec![n1, cos, sin], vec![r1]);
        // Read by the rope and as an output: stays.
        g.op(OpKind::RmsNorm { eps }, vec![r1], vec![n2]);
        g.op(rope(RopeStyle::Interleaved), vec![n2, cos, sin], vec![r2]);
        g.outputs = vec![r2, n2];
        let mut fused = g.clone();
        assert_eq!(fuse_norm_ropes(&mut fused), 1);
        let labels: Vec<String> = fused.ops().map(|o| o.kind.label()).collect();
        assert_eq!(labels, ["rms_norm+rope", "rms_norm", "rope"], "{labels:?}");
        let xv: Vec<u8> = (0..s * h * d)
            .flat_map(|k| ((k as f32 * 0.37).sin() * 2.0).to_le_bytes())
            .collect();
        let outs = |g: Graph| {
            let mut e = CpuExecutor::new(g).unwrap();
            e.run(&[InputValue::Tensor {
                shape: vec![1, s, h, d],
                data: &xv,
            }])
            .unwrap()
            .into_iter()
            .map(|t| t.data)
            .collect::<Vec<_>>()
        };
        assert_eq!(outs(fused), outs(g));
    }

    /// A tensor written again after a view of it was taken (per-delegate graphs reuse storage
    /// so): a chain reading the view and writing the tensor would read what it writes.
    #[test]
    fn a_chain_that_would_write_storage_it_reads_is_not_fused() {
        let f = DType::F32;
        let mut g = Graph::default();
        let x = g.add_tensor("x", f, vec![4], Role::Input(0));
        g.inputs = vec![Io::Tensor(x)];
        let t = |g: &mut Graph, name: &str| g.add_tensor(name, f, vec![4], Role::Activation);
        let (a, view, m) = (t(&mut g, "a"), t(&mut g, "view"), t(&mut g, "m"));
        g.op(OpKind::Unary(UnaryOp::Exp), vec![x], vec![a]);
        let shape = vec![Int::Lit(4)];
        g.op(OpKind::Reshape { shape }, vec![a], vec![view]);
        g.op(OpKind::Unary(UnaryOp::Neg), vec![view], vec![m]);
        g.op(OpKind::Unary(UnaryOp::Sin), vec![m], vec![a]);
        g.outputs = vec![a];
        let mut renamed = g.clone();
        // The same chain into a tensor of its own fuses.
        let b = t(&mut renamed, "b");
        if let Some(Node::Op(o)) = renamed.nodes.last_mut() {
            o.outputs = vec![b];
        }
        renamed.outputs = vec![b];
        assert_eq!(fuse_elementwise_chains(&mut renamed), 1);
        assert_eq!(fuse_elementwise_chains(&mut g), 0);
    }

    #[test]
    fn a_transposed_matmul_operand_is_read_in_place_with_the_same_result() {
        let f = DType::F32;
        let mut g = Graph::default();
        let a = g.add_tensor("a", f, vec![2, 3, 4], Role::Input(0));
        let b = g.add_tensor("b", f, vec![1, 5, 4], Role::Input(1));
        let bt = g.add_tensor("bt", f, vec![1, 4, 5], Role::Activation);
        let y = g.add_tensor("y", f, vec![2, 3, 5], Role::Activation);
        g.op(
            OpKind::Permute {
                perm: vec![0, 2, 1],
            },
            vec![b],
            vec![bt],
        );
        g.op(OpKind::MatMul { transpose_b: false }, vec![a, bt], vec![y]);
        g.inputs = vec![Io::Tensor(a), Io::Tensor(b)];
        g.outputs = vec![y];
        let mut folded = g.clone();
        assert_eq!(fold_transpose_into_matmul(&mut folded), 1);
        let labels: Vec<String> = folded.ops().map(|o| o.kind.label()).collect();
        assert_eq!(labels, ["matmul[bt]"]);
        let av: Vec<u8> = (0..24)
            .flat_map(|k| ((k as f32 * 0.61).sin()).to_le_bytes())
            .collect();
        let bv: Vec<u8> = (0..20)
            .flat_map(|k| ((k as f32 * 0.37).cos()).to_le_bytes())
            .collect();
        let outs = |g: Graph| {
            let mut e = CpuExecutor::new(g).unwrap();
            let t = |shape: Vec<usize>, data| InputValue::Tensor { shape, data };
            e.run(&[t(vec![2, 3, 4], &av), t(vec![1, 5, 4], &bv)])
                .unwrap()
                .remove(0)
                .data
        };
        assert_eq!(outs(folded), outs(g));
    }

    /// Decode attention over one KV head repeated for 4 query heads, as the Vulkan export
    /// leaves it: scores = q · (expand → reshape → transpose → reshape)(k), out = p · expanded v.
    /// Both matmuls read the one head through batch broadcasting, with the same results.
    #[test]
    fn expanded_matmul_operands_are_broadcast_instead() {
        let f = DType::F32;
        let (h, s, d) = (4usize, 5usize, 3usize);
        let mut g = Graph::default();
        let x = g.add_tensor("kv", f, vec![1, 1, 1, s, d], Role::Input(0));
        let t = |g: &mut Graph, name: &str, shape: &[usize]| {
            g.add_tensor(name, f, shape.to_vec(), Role::Activation)
        };
        let lit = |v: &[usize]| v.iter().map(|&d| Int::Lit(d as i64)).collect::<Vec<_>>();
        let e = t(&mut g, "e", &[1, 1, h, s, d]);
        g.op(
            OpKind::Expand {
                shape: lit(&[1, 1, h, s, d]),
            },
            vec![x],
            vec![e],
        );
        let e4 = t(&mut g, "e4", &[1, h, s, d]);
        g.op(
            OpKind::Reshape {
                shape: lit(&[1, h, s, d]),
            },
            vec![e],
            vec![e4],
        );
        let et = t(&mut g, "et", &[1, h, d, s]);
        g.op(
            OpKind::Permute {
                perm: vec![0, 1, 3, 2],
            },
            vec![e4],
            vec![et],
        );
        let kt = t(&mut g, "kt", &[h, d, s]);
        g.op(
            OpKind::Reshape {
                shape: lit(&[h, d, s]),
            },
            vec![et],
            vec![kt],
        );
        let v = t(&mut g, "v", &[h, s, d]);
        g.op(
            OpKind::Reshape {
                shape: lit(&[h, s, d]),
            },
            vec![e],
            vec![v],
        );
        // q: the first row of each head's values, to keep the graph to one input.
        let q = t(&mut g, "q", &[h, 1, d]);
        g.op(
            OpKind::Slice {
                dim: 1,
                start: Int::Lit(0),
                end: Int::Lit(1),
                step: 1,
            },
            vec![v],
            vec![q],
        );
        let sc = t(&mut g, "scores", &[h, 1, s]);
        g.op(OpKind::MatMul { transpose_b: false }, vec![q, kt], vec![sc]);
        let o = t(&mut g, "out", &[h, 1, d]);
        g.op(OpKind::MatMul { transpose_b: false }, vec![sc, v], vec![o]);
        g.inputs = vec![Io::Tensor(x)];
        g.outputs = vec![o];
        let xs: Vec<f32> = (0..s * d).map(|i| (i as f32 * 0.37).sin()).collect();
        let want = run(g.clone(), &xs, &[1, 1, 1, s, d]);
        // The q slice reads the expansion too: it stays, the two matmul operands change.
        assert_eq!(unexpand_matmul_operands(&mut g), 2);
        // The transpose now moves one head's matrix; the one of the whole expansion is gone.
        let permutes: Vec<Vec<usize>> = g
            .ops()
            .filter(|o| matches!(o.kind, OpKind::Permute { .. }))
            .map(|o| g.tensors[o.inputs[0]].max_shape.clone())
            .collect();
        assert_eq!(permutes, [vec![1, s, d]]);
        assert_eq!(run(g, &xs, &[1, 1, 1, s, d]), want);
    }

    /// `softmax(q·Kᵀ · c + mask) · V` as exports decompose it: q `[lead_q.., S, D]`, k and v
    /// `[lead_k.., C, D]`, the scores reshaped to `[1, heads, S, C]` between the ops. With
    /// `mask_first` the mask is added before the scale (which then scales it too).
    fn decomposed_attention(lead_q: &[usize], lead_k: &[usize], mask_first: bool) -> Graph {
        let (s, c, d) = (3usize, 7usize, 5usize);
        let f = DType::F32;
        let hq: usize = lead_q.iter().product();
        let mut g = Graph::default();
        let cat = |a: &[usize], b: &[usize]| [a, b].concat();
        let q = g.add_tensor("q", f, cat(lead_q, &[s, d]), Role::Input(0));
        let k = g.add_tensor("k", f, cat(lead_k, &[c, d]), Role::Input(1));
        let v = g.add_tensor("v", f, cat(lead_k, &[c, d]), Role::Input(2));
        let mask = g.add_tensor("mask", f, vec![1, 1, s, c], Role::Input(3));
        let scale = g.add_tensor("scale", f, vec![], constant(&[0.37]));
        let t = |g: &mut Graph, name: &str, shape: Vec<usize>| {
            g.add_tensor(name, f, shape, Role::Activation)
        };
        let lit = |v: &[usize]| v.iter().map(|&d| Int::Lit(d as i64)).collect::<Vec<_>>();
        let sc = t(&mut g, "scores", cat(lead_q, &[s, c]));
        g.op(OpKind::MatMul { transpose_b: true }, vec![q, k], vec![sc]);
        let sc4 = t(&mut g, "scores4", vec![1, hq, s, c]);
        g.op(
            OpKind::Reshape {
                shape: lit(&[1, hq, s, c]),
            },
            vec![sc],
            vec![sc4],
        );
        let (a, b) = (
            t(&mut g, "a", vec![1, hq, s, c]),
            t(&mut g, "b", vec![1, hq, s, c]),
        );
        let (mul, add) = (OpKind::Binary(BinaryOp::Mul), OpKind::Binary(BinaryOp::Add));
        if mask_first {
            g.op(add, vec![sc4, mask], vec![a]);
            g.op(mul, vec![a, scale], vec![b]);
        } else {
            g.op(mul, vec![sc4, scale], vec![a]);
            g.op(add, vec![a, mask], vec![b]);
        }
        let p4 = t(&mut g, "p4", vec![1, hq, s, c]);
        g.op(OpKind::Softmax, vec![b], vec![p4]);
        let p = t(&mut g, "p", cat(lead_q, &[s, c]));
        g.op(
            OpKind::Reshape {
                shape: lit(&cat(lead_q, &[s, c])),
            },
            vec![p4],
            vec![p],
        );
        let y = t(&mut g, "y", cat(lead_q, &[s, d]));
        g.op(OpKind::MatMul { transpose_b: false }, vec![p, v], vec![y]);
        g.inputs = [q, k, v, mask].map(Io::Tensor).to_vec();
        g.outputs = vec![y];
        g
    }

    fn run_attention(g: Graph, seed: f32) -> Vec<f32> {
        let shapes: Vec<Vec<usize>> = (0..4).map(|i| g.tensors[i].max_shape.clone()).collect();
        let data: Vec<Vec<u8>> = shapes
            .iter()
            .enumerate()
            .map(|(i, sh)| {
                let n: usize = sh.iter().product();
                let (rows, cols) = (sh[sh.len() - 2], sh[sh.len() - 1]);
                (0..n)
                    .map(|k| match i {
                        // Causal from position 3 on; row 1 also hides key 0.
                        3 if (k % cols) > 3 + (k / cols) % rows || k == cols => f32::NEG_INFINITY,
                        _ => ((k as f32 + seed * (i + 1) as f32) * 0.71).sin(),
                    })
                    .flat_map(|x| x.to_le_bytes())
                    .collect()
            })
            .collect();
        let inputs: Vec<InputValue> = shapes
            .iter()
            .zip(&data)
            .map(|(sh, d)| InputValue::Tensor {
                shape: sh.clone(),
                data: d,
            })
            .collect();
        let out = CpuExecutor::new(g).unwrap().run(&inputs).unwrap();
        out[0]
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn decomposed_attention_fuses_to_one_sdpa_with_the_same_results() {
        // One kv head for 4 query heads (Gemma's MQA), one per head, and 2 kv heads for 4
        // query heads as GQA's broadcast batch dims leave them.
        for (lead_q, lead_k, hkv) in [
            (vec![4], vec![1], 1),
            (vec![4], vec![4], 4),
            (vec![1, 2, 2], vec![1, 2, 1], 2),
        ] {
            let g = decomposed_attention(&lead_q, &lead_k, false);
            let mut fused = g.clone();
            assert_eq!(fuse_attention(&mut fused), 1, "{lead_q:?} / {lead_k:?}");
            let labels: Vec<String> = fused.ops().map(|o| o.kind.label()).collect();
            assert!(!labels
                .iter()
                .any(|l| l.contains("matmul") || l == "softmax"));
            let sdpa = fused.ops().find(|o| matches!(o.kind, OpKind::Sdpa { .. }));
            let sdpa = sdpa.expect("an sdpa op");
            assert_eq!(sdpa.inputs.len(), 4, "q, k, v, mask");
            assert!(
                matches!(sdpa.kind, OpKind::Sdpa { scale, all_rows: true, .. } if scale == 0.37)
            );
            assert_eq!(fused.tensors[sdpa.inputs[1]].max_shape[1], hkv);
            let (a, b) = (run_attention(g, 0.5), run_attention(fused, 0.5));
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                    "{lead_q:?}: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn attention_that_sdpa_cannot_express_is_left_alone() {
        // The scale applied after the mask scales the mask too.
        let mut g = decomposed_attention(&[4], &[1], true);
        assert_eq!(fuse_attention(&mut g), 0);
        // Probabilities something else reads.
        let mut g = decomposed_attention(&[4], &[1], false);
        let p = g.tensors.iter().position(|t| t.name == "p").unwrap();
        g.outputs.push(p);
        assert_eq!(fuse_attention(&mut g), 0);
        // A cache write between the scores and p·V changes the k that p·V's place would read.
        let mut g = decomposed_attention(&[4], &[1], false);
        let (k, last) = (1, g.nodes.len() - 1);
        let ku = g.add_tensor("k written", DType::F32, vec![1, 7, 5], Role::Activation);
        let row = g.add_tensor("row", DType::F32, vec![1, 1, 5], constant(&[1.0; 5]));
        g.nodes.insert(
            last,
            Node::Op(Op {
                kind: OpKind::CacheUpdate {
                    axis: 1,
                    start: Int::Lit(0),
                },
                inputs: vec![k, row],
                outputs: vec![ku],
            }),
        );
        assert_eq!(fuse_attention(&mut g), 0);
    }
}
