// RMS norm over the last dim: y = x * rsqrt(mean(x²) + eps) * w. One workgroup per row, sized
// to the row (about one element, or one vec4 in `main4`, per invocation): a decode step's norms
// are one to a few dozen rows, so a row's latency is the cost. Each invocation keeps its first
// element in registers for the second pass. The sum of squares is summed by subgroup shuffles
// over runs of SG_LANES lanes where the device has them, then read by every invocation after one
// barrier (up to 32 runs; WG then a multiple of SG_LANES) or summed by a shared-memory tree (WG a
// power of two).

// RmsNormRope: the normed row rotated (`rotated`) instead of stored as it is.
// NORM off (main4_quant only): no norm, the row is the chain of x and the other inputs: an
// ElementwiseChain (the per-layer input's gelu · gate) whose short rows a quantized linear reads
// runs here, where a workgroup owns a row and can take its range for the quantization.
// QUANT (main4_quant, not ROPE): the stored row also quantized to int8 for the linear that reads it,
// packed as linear.wgsl's `act_quant_packed` packs it into that linear's scratch (binding 7),
// which then skips its own quantization dispatch (src/gpu/ops.rs `prequantized`).
// RmsNormChain: then an element-wise chain (`apply_chain`, chain.wgsl) whose input `norm_input` is
// the normed value and whose other inputs (0 to 2) are bound at 5 and 6, before the store.

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    // main4_pair: the second norm's.
    eps2: f32,
    steps: u32,
    norm_input: u32,
    rank: u32,
    // main4_cache_kv: the second norm's rows.
    v_rows: u32,
    shape: array<vec4<u32>, 2>,
    // Element strides over `shape` of the chain's other inputs; 0 on broadcast dims.
    strides: array<array<vec4<u32>, 2>, 2>,
    // Per chain step two words: a scalar's or the clamp bounds' f32 bits (chain.wgsl).
    words: array<vec4<u32>, 3>,
    // RmsNormRope, as rope.wgsl's: rotated pairs, elements between sequence positions, the
    // sequence length, the start's syms slot, rows of the cos/sin tables (bound at 5 and 6).
    half: u32,
    seq_stride: u32,
    seq_len: u32,
    start_slot: u32,
    table_rows: u32,
    // main4_cache: the cache's length along the update's axis, the rows' (value's) length
    // along it, the syms slot of the update's start, and whether cache_idx names the rows.
    cache_len: u32,
    value_len: u32,
    cache_start: u32,
    cache_indexed: u32,
}

override WG: u32 = 256u;
override HAS_W: bool = false;
// Lanes summed by subgroup shuffles (a power of two up to the subgroup size; 1: none).
override SG_LANES: u32 = 1u;
// norm_sum.wgsl's: WG and SG_LANES (src/gpu/ops.rs sets both pairs alike).
override NORM_WG: u32 = 256u;
override NORM_LANES: u32 = 1u;
override CHAIN: bool = false;
override NORM: bool = true;
// The chain's other inputs: how many; whether one differs in shape from x (and is not a
// single element, which OP<k>_ONE says).
override N_OPS: u32 = 0u;
override BCAST: bool = false;
override OP0_ONE: bool = false;
override OP1_ONE: bool = false;
// RmsNormRope: the normed row goes through workgroup memory (ROPE_D floats) to the rotation.
override ROPE: bool = false;
override INTERLEAVED: bool = false;
override ROPE_D: u32 = 1u;
// 0: no quantized copy; 1: packed in 4-bit weights' nibble order; 2: in order (quant.wgsl).
override QUANT: u32 = 0u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> y4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read> w4: array<vec4<f32>>;

@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(5) var<storage, read> op0: array<f32>;
@group(0) @binding(6) var<storage, read> op1: array<f32>;
@group(0) @binding(7) var<storage, read_write> qy: array<u32>;
// main4_cache: the cache rows of the value's rows (an update's indices), when it has them.
@group(0) @binding(7) var<storage, read> cache_idx: array<i32>;

// The chain applied to element i, whose normed value is n.
fn chained(n: f32, i: u32) -> f32 {
    if !CHAIN {
        return n;
    }
    return chain_with(n, chain_ops(i));
}

// The chain's other operands for element i (loads only, so they can be issued early).
fn chain_ops(i: u32) -> vec2<f32> {
    var o = vec2<u32>(i);
    if BCAST {
        var rem = i;
        o = vec2<u32>(0u);
        for (var d = i32(p.rank) - 1; d >= 0; d--) {
            let k = u32(d);
            let size = p.shape[k / 4u][k % 4u];
            let qr = divmod(rem, size);
            let idx = qr.y;
            rem = qr.x;
            o += idx * vec2<u32>(p.strides[0][k / 4u][k % 4u], p.strides[1][k / 4u][k % 4u]);
        }
    }
    var ops = vec2<f32>(0.0);
    if N_OPS > 0u {
        ops.x = op0[select(o.x, 0u, OP0_ONE)];
    }
    if N_OPS > 1u {
        ops.y = op1[select(o.y, 0u, OP1_ONE)];
    }
    return ops;
}

fn chain_with(n: f32, ops: vec2<f32>) -> f32 {
    return chain_around(n, ops, p.norm_input, p.words);
}

var<workgroup> nrow: array<f32, ROPE_D>;
// main4_quant: the stored row's words, packed from here after the range's reduction (whose
// barriers make them visible) rather than read back from y (on the H100, 3.70 → 3.64 ms a
// decode step). QROW words at most: a longer row is read back.
override QROW: u32 = 1u;
var<workgroup> qrow: array<vec4<f32>, QROW>;

// RmsNormRope: element j of the normed row in `nrow` (first element `base`) rotated as rope.wgsl
// does. Called after a barrier that follows the stores to `nrow`.
fn rotated(j: u32, base: u32) -> f32 {
    let pos = syms[p.start_slot] + i32((base / p.seq_stride) % p.seq_len);
    var v = nrow[j];
    if j < 2u * p.half && pos >= 0 && u32(pos) < p.table_rows {
        let rp = rope_pair(j, p.half, INTERLEAVED);
        let t = u32(pos) * p.half + rp.pair;
        v = rope_rotate(nrow[j], nrow[rp.other], op0[t], op1[t], rp.first);
    }
    return v;
}

fn chained4(n: vec4<f32>, i: u32) -> vec4<f32> {
    if !CHAIN {
        return n;
    }
    return vec4<f32>(chained(n.x, i), chained(n.y, i + 1u), chained(n.z, i + 2u), chained(n.w, i + 3u));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let base = row * p.d;
    var first = 0.0;
    if t < p.d {
        first = x[base + t];
    }
    var s = first * first;
    for (var j = t + WG; j < p.d; j += WG) {
        let v = x[base + j];
        s += v * v;
    }
    let r = 1.0 / sqrt(workgroup_sum(s, t) / f32(p.d) + p.eps);
    if t < p.d {
        var v = first * r;
        if HAS_W {
            v *= w[t];
        }
        if ROPE {
            nrow[t] = v;
        } else {
            y[base + t] = chained(v, base + t);
        }
    }
    for (var j = t + WG; j < p.d; j += WG) {
        var v = x[base + j] * r;
        if HAS_W {
            v *= w[j];
        }
        if ROPE {
            nrow[j] = v;
        } else {
            y[base + j] = chained(v, base + j);
        }
    }
    if ROPE {
        workgroupBarrier();
        for (var j = t; j < p.d; j += WG) {
            y[base + j] = rotated(j, base);
        }
    }
}

// The same for d % 4 == 0, by 16-byte words.
@compute @workgroup_size(WG)
fn main4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    norm_row4(row, t, row * (p.d / 4u));
}

// main4 with the rows stored into a KV cache (bound as y) where the cache update that reads them
// would have put them (cache_update.wgsl): value row r of each block of value_len goes to cache
// row cache_idx[r] (negative counts from the end; a row outside the cache is not stored) or
// start + r (an update that does not fit stores nothing). src/gpu/memory.rs `norm_cache`.
@compute @workgroup_size(WG)
fn main4_cache(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let at = cache_word(row);
    if at < 0 {
        return;
    }
    norm_row4(row, t, u32(at));
}

// The first word of value row `row`'s cache row, or -1 where it is not stored.
fn cache_word(row: u32) -> i32 {
    let block = row / p.value_len;
    let r = row % p.value_len;
    let indexed = p.cache_indexed != 0u;
    var index = 0;
    if indexed {
        index = cache_idx[r];
    }
    let dst = cache_dst(indexed, index, syms[p.cache_start], r, p.value_len, p.cache_len);
    if dst < 0 {
        return -1;
    }
    return i32((block * p.cache_len + u32(dst)) * (p.d / 4u));
}

// main4_cache for its first p.rows rows, then p.v_rows rows of a second norm, unweighted and not
// rotated (eps2), of vx4 into the cache vc4 at the same cache rows: the v norm in the k norm's
// dispatch (src/gpu/memory.rs `kv_guest`). Its rows are normed as main4 norms them alone.
@group(0) @binding(8) var<storage, read> vx4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> vc4: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main4_cache_kv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) t: u32) {
    let flat = wg.x + wg.y * nwg.x;
    let second = flat >= p.rows;
    let row = select(flat, flat - p.rows, second);
    if row >= select(p.rows, p.v_rows, second) {
        return;
    }
    let at = cache_word(row);
    if at < 0 {
        return;
    }
    if !second {
        norm_row4(row, t, u32(at));
        return;
    }
    let d4 = p.d / 4u;
    let base = row * d4;
    var first = vec4<f32>();
    if t < d4 {
        first = vx4[base + t];
    }
    var s = dot(first, first);
    for (var j = t + WG; j < d4; j += WG) {
        let v = vx4[base + j];
        s += dot(v, v);
    }
    let r = 1.0 / sqrt(workgroup_sum(s, t) / f32(p.d) + p.eps2);
    if t < d4 {
        vc4[u32(at) + t] = scaled(first, r, false, first);
    }
    for (var j = t + WG; j < d4; j += WG) {
        vc4[u32(at) + j] = vx4[base + j] * r;
    }
}

// main4, then the stored row quantized (QUANT). Its own entry point: a module variable that an
// entry point can reach must be bound, even behind an override that is off.
@compute @workgroup_size(WG)
fn main4_quant(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let range = norm_row4(row, t, row * (p.d / 4u));
    let d4 = p.d / 4u;
    let stashed = d4 <= QROW;
    if !stashed {
        // Then the stored row is read back, visible to the workgroup after this barrier.
        storageBarrier();
    }
    pack_row(row, t, row_params(range.x, range.y, t), stashed);
}

// The row `row` quantized and packed into qy, from `qrow` (stashed) or from y (visible to the
// workgroup); `q` from row_params, whose barrier makes qrow's words visible.
fn pack_row(row: u32, t: u32, q: RowQuant, stashed: bool) {
    let d4 = p.d / 4u;
    let base = row * d4;
    if QUANT == 1u {
        for (var b = t; b < d4 / 2u; b += WG) {
            let pair = pack8_nibble_order(stored(stashed, base, 2u * b),
                                          stored(stashed, base, 2u * b + 1u), q);
            qy[base + 2u * b] = pair.x;
            qy[base + 2u * b + 1u] = pair.y;
        }
    } else {
        for (var i = t; i < d4; i += WG) {
            qy[base + i] = pack4(stored(stashed, base, i), q);
        }
    }
    if t == 0u {
        qy[p.rows * d4 + 2u * row] = bitcast<u32>(q.s);
        qy[p.rows * d4 + 2u * row + 1u] = bitcast<u32>(q.zp);
    }
}

// A second, plain norm (weight w2 if HAS_W2, eps in Params word 3) of the rows main4 stores,
// quantized as main4_quant quantizes: the first norm's dispatch runs the norm that reads its rows
// (src/gpu/ops.rs `norm_pair`; Gemma's post-norm with its residual add, then the next pre-norm).
// The second norm's f32 rows are not stored: only its linear reads them, packed. Needs
// d / 4 ≤ WG and ≤ QROW: an invocation's word of the first row stays in its registers and qrow.
override HAS_W2: bool = false;
@group(0) @binding(8) var<storage, read> w2: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main4_pair(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let d4 = p.d / 4u;
    var w_first = vec4<f32>(1.0);
    if HAS_W2 && t < d4 {
        w_first = w2[t];
    }
    norm_row4(row, t, row * d4);
    // As main4_quant's norm computes it from the stored row (the same bits).
    var first = vec4<f32>();
    if t < d4 {
        first = qrow[t];
    }
    // The first sum's runs may still be read from `red`.
    workgroupBarrier();
    let r = 1.0 / sqrt(workgroup_sum(dot(first, first), t) / f32(p.d) + p.eps2);
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    if t < d4 {
        let v = scaled(first, r, HAS_W2, w_first);
        qrow[t] = v;
        lo = min(lo, v);
        hi = max(hi, v);
    }
    let range = span4(lo, hi);
    pack_row(row, t, row_params(range.x, range.y, t), true);
}

// Word i of the row main4_quant stored from word `base` of y.
fn stored(stashed: bool, base: u32, i: u32) -> vec4<f32> {
    if stashed {
        return qrow[i];
    }
    return y4[base + i];
}

// Row `row` normed by 16-byte words and stored (or rotated) from word `obase` of y on; returns
// the range (lo, hi) of this invocation's stored values, with 0 (as quant.wgsl wants).
fn norm_row4(row: u32, t: u32, obase: u32) -> vec2<f32> {
    let d4 = p.d / 4u;
    let base = row * d4;
    var first = vec4<f32>();
    // The first word's weight and chain operands are loaded before the reduction, so that their
    // latency overlaps its barriers (a decode row is one word an invocation, or two).
    var w_first = vec4<f32>(1.0);
    var ops_first: array<vec2<f32>, 4>;
    if t < d4 {
        first = x4[base + t];
        if HAS_W {
            w_first = w4[t];
        }
        if CHAIN && !ROPE {
            for (var e = 0u; e < 4u; e++) {
                ops_first[e] = chain_ops(4u * (base + t) + e);
            }
        }
    }
    var s = dot(first, first);
    for (var j = t + WG; j < d4; j += WG) {
        let v = x4[base + j];
        s += dot(v, v);
    }
    var r = 1.0;
    if NORM {
        r = 1.0 / sqrt(workgroup_sum(s, t) / f32(p.d) + p.eps);
    }
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    if t < d4 {
        let v = scaled(first, r, HAS_W, w_first);
        if ROPE {
            stash4(t, v);
        } else {
            var o = v;
            if CHAIN {
                o = vec4<f32>(chain_with(v.x, ops_first[0]), chain_with(v.y, ops_first[1]),
                              chain_with(v.z, ops_first[2]), chain_with(v.w, ops_first[3]));
            }
            y4[obase + t] = o;
            if QUANT != 0u && t < QROW {
                qrow[t] = o;
            }
            lo = min(lo, o);
            hi = max(hi, o);
        }
    }
    for (var j = t + WG; j < d4; j += WG) {
        var v = x4[base + j] * r;
        if HAS_W {
            v *= w4[j];
        }
        if ROPE {
            stash4(j, v);
        } else {
            let o = chained4(v, 4u * (base + j));
            y4[obase + j] = o;
            if QUANT != 0u && j < QROW {
                qrow[j] = o;
            }
            lo = min(lo, o);
            hi = max(hi, o);
        }
    }
    if ROPE {
        workgroupBarrier();
        for (var j = t; j < d4; j += WG) {
            let e = 4u * j;
            let b = 4u * base;
            y4[obase + j] = vec4<f32>(rotated(e, b), rotated(e + 1u, b), rotated(e + 2u, b),
                                     rotated(e + 3u, b));
        }
    }
    return span4(lo, hi);
}

// A word of a row normed by r, times its weight word where the norm has one (both norms of
// main4_pair compute their words so, which keeps a pair's bits those of the two apart).
fn scaled(x: vec4<f32>, r: f32, weighted: bool, w: vec4<f32>) -> vec4<f32> {
    var v = x * r;
    if weighted {
        v *= w;
    }
    return v;
}

// (min of lo's lanes, max of hi's).
fn span4(lo: vec4<f32>, hi: vec4<f32>) -> vec2<f32> {
    return vec2<f32>(min(min(lo.x, lo.y), min(lo.z, lo.w)), max(max(hi.x, hi.y), max(hi.z, hi.w)));
}

fn stash4(j: u32, v: vec4<f32>) {
    nrow[4u * j] = v.x;
    nrow[4u * j + 1u] = v.y;
    nrow[4u * j + 2u] = v.z;
    nrow[4u * j + 3u] = v.w;
}
