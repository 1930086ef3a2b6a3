// Attention of q over the first kv_len = start + S rows of the k/v caches, `start` read from the
// syms buffer at run time (decode steps replay one recording), or over every row (ALL_ROWS, the
// mask deciding). Keys the mask gives -inf cost no dot product, and no row of v in `main`;
// `split` skips chunks without a visible key: a decode step at position p reads ~p cache rows,
// not the cache's capacity.
//
// `main`: one workgroup per (query, head, batch); keys are visited in blocks of WG with an online
// softmax (running max and sum), the output accumulated in shared memory, so any kv_len runs in
// fixed memory. `split` + `combine` (decode, and a chat turn's few queries): the keys are cut
// into chunks of CK, one workgroup per (chunk, head, query) leaving its chunk's max, sum and
// unnormalised output in a scratch buffer, which `combine` merges (16 lanes of 16 invocations:
// WG = 256); that spreads a few queries over the GPU.
// `probs` (every cache row, many queries, Bhsd): a tiled matmul writes q·Kᵀ to a scratch, `probs`
// turns each row into probabilities in place, and a second matmul multiplies them by v, so each
// K/V load serves 64 queries.
// Layout, GQA and the cache length come in as strides; causal, window, softcap and mask as
// constants.

struct Params {
    s: u32,
    hq: u32,
    group: u32,
    d: u32,
    cache_len: u32,
    start_slot: u32,
    window: u32,
    mask_stride: u32,
    q_strides: vec4<u32>,  // batch, seq, head (output uses the same)
    kv_strides: vec4<u32>, // batch, seq, head
    scale: f32,
    softcap: f32,
    chunks: u32, // split/combine: chunks per query and head
    // combine with RANGE: the first word of the output's slots in the ranges buffer.
    range_at: u32,
    // split_normed: the norm's eps, and its rotation's as rms_norm.wgsl's (rotated pairs,
    // elements between positions, the sequence length, the start's syms slot, table rows).
    eps: f32,
    half: u32,
    seq_stride: u32,
    seq_len: u32,
    rope_start: u32,
    table_rows: u32,
    // split_kv: the k and v norms' eps, the k rotation's words (as the q's above), the cache
    // update's start slot, the caches' rows and whether the update's indices name the row.
    k_eps: f32,
    v_eps: f32,
    k_half: u32,
    k_seq_stride: u32,
    k_seq_len: u32,
    k_rope_start: u32,
    k_table_rows: u32,
    kv_start: u32,
    kv_rows: u32,
    kv_indexed: u32,
}

override WG: u32 = 64u;
override DMAX: u32 = 256u;
override CAUSAL: bool = false;
override WINDOW: bool = false;
override SOFTCAP: bool = false;
override HAS_MASK: bool = false;
override ALL_ROWS: bool = false;
// split: keys per workgroup (WG / CK threads share a key's dot product).
override CK: u32 = 32u;
// split/combine: chunks per query and head. Loop bounds are constants (DMAX, CK, CHUNKS) so the
// compiler unrolls them and keeps many loads in flight: a decode step is latency, not bandwidth.
override CHUNKS: u32 = 1u;
// k / v are f16 KV caches read in place (two f16 a word, src/gpu/memory.rs `Repr::F16`).
override K_F16: bool = false;
override V_F16: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(2) var<storage, read_write> o: array<f32>;
@group(0) @binding(3) var<storage, read> q: array<f32>;
// The caches: read, or (the `sdpa_kv` variant) also written by `split_kv`.
// #if kv_read
@group(0) @binding(4) var<storage, read> k: array<u32>;
@group(0) @binding(5) var<storage, read> v: array<u32>;
// #endif
// #if kv_write
@group(0) @binding(4) var<storage, read_write> k: array<u32>;
@group(0) @binding(5) var<storage, read_write> v: array<u32>;
// #endif
@group(0) @binding(6) var<storage, read> mask: array<f32>;
// combine with RANGE also leaves the range of its stores for the linear that quantizes them
// (range.wgsl).
override RANGE: bool = false;
@group(0) @binding(4) var<storage, read_write> ranges: array<atomic<u32>>;
// combine's input: split's scratch, (m, l, acc[d]) per (batch, query, head, chunk).
@group(0) @binding(3) var<storage, read> parts: array<f32>;
// split_normed: q (binding 3) holds the rows of a rotated rms_norm's input (Gemma's q norm with
// RoPE), which it norms (weight nw where HAS_W) and rotates (tables cos_t, sin_t) for its head
// itself, as rms_norm.wgsl's `main4` with NORM_WG invocations summing runs of NORM_LANES lanes
// does: the same bits (src/gpu/ops.rs `q_normed`).
override HAS_W: bool = false;
override INTERLEAVED: bool = false;
override NORM_WG: u32 = 64u;
override NORM_LANES: u32 = 1u;
@group(0) @binding(7) var<storage, read> nw: array<f32>;
@group(0) @binding(8) var<storage, read> cos_t: array<f32>;
@group(0) @binding(9) var<storage, read> sin_t: array<f32>;
var<workgroup> nq: array<f32, DMAX>;

var<workgroup> qs: array<f32, DMAX>;
var<workgroup> acc: array<f32, DMAX>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> pk: array<f32, CK>;
var<workgroup> pk_l: array<f32, WG>;

fn k_at(i: u32) -> f32 {
    if K_F16 {
        return unpack2x16float(k[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(k[i]);
}

fn v_at(i: u32) -> f32 {
    if V_F16 {
        return unpack2x16float(v[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(v[i]);
}


// Keys query i may see: [lo, hi).
fn span(i: u32) -> vec2<i32> {
    let start = syms[p.start_slot];
    var hi = i32(p.cache_len);
    if !ALL_ROWS {
        hi = clamp(start + i32(p.s), 0, i32(p.cache_len));
    }
    let pos = start + i32(i);
    if CAUSAL {
        hi = min(hi, pos + 1);
    }
    var lo = 0;
    if WINDOW {
        lo = max(0, pos - i32(p.window) + 1);
    }
    return vec2<i32>(lo, hi);
}

fn mask_at(i: u32, j: u32) -> f32 {
    if HAS_MASK {
        return mask[i * p.mask_stride + j];
    }
    return 0.0;
}

// Part of q·k_j: dims first, first + stride, ...
fn dot_part(kr: u32, first: u32, stride: u32) -> f32 {
    var dotv = 0.0;
    for (var e = first; e < DMAX; e += stride) {
        dotv += qs[e] * k_at(kr + e);
    }
    return dotv;
}

// q·k_j's part over dims lane, lane + TPK, ...: a constant trip count the compiler unrolls.
// `fresh`: the key is this step's new row, normed by this workgroup into k_new (`split_kv`);
// kr then addresses another row of the cache, whose load is discarded (no branch around the
// loads: a conditional load in this loop cost the E2B-shaped step 0.19-0.21 ms on an H100).
fn dot_lane(kr: u32, lane: u32, fresh: bool) -> f32 {
    let TPK = WG / CK;
    var dotv = 0.0;
    for (var r = 0u; r < (DMAX + TPK - 1u) / TPK; r++) {
        let e = lane + r * TPK;
        if e < DMAX {
            var kv = k_at(kr + e);
            if KV_NEW {
                kv = select(kv, k_new[e], fresh);
            }
            dotv += qs[e] * kv;
        }
    }
    return dotv;
}

// The score from q·k_j and the mask's value, in the reference's order: scale, cap, mask.
fn finish(dotv: f32, mk: f32) -> f32 {
    var s = dotv * p.scale;
    if SOFTCAP {
        s = tanh(clamp(s / p.softcap, -15.0, 15.0)) * p.softcap;
    }
    return s + mk;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let NEG_INF = bitcast<f32>(0xff800000u);
    let flat = wg.x + wg.y * nwg.x;
    if flat >= p.s * p.hq {
        return;
    }
    let i = flat / p.hq;
    let h = flat % p.hq;
    let bb = wg.z;
    let kh = h / p.group;
    let r = span(i);
    let qo = bb * p.q_strides.x + i * p.q_strides.y + h * p.q_strides.z;
    let ko = bb * p.kv_strides.x + kh * p.kv_strides.z;
    for (var e = t; e < DMAX; e += WG) {
        qs[e] = q[qo + e];
        acc[e] = 0.0;
    }
    workgroupBarrier();
    var m = NEG_INF;
    var l = 0.0;
    for (var j0 = r.x; j0 < r.y; j0 += i32(WG)) {
        let j = j0 + i32(t);
        var s = NEG_INF;
        if j < r.y {
            let mk = mask_at(i, u32(j));
            if mk != NEG_INF {
                s = finish(dot_part(ko + u32(j) * p.kv_strides.y, 0u, 1u), mk);
            }
        }
        sc[t] = s;
        workgroupBarrier();
        var bm = NEG_INF;
        for (var e = 0u; e < WG; e++) {
            bm = max(bm, sc[e]);
        }
        let m_new = max(m, bm);
        // While every key so far is masked (m_new = -inf) nothing accumulates: keep alpha finite.
        let alpha = select(exp(m - m_new), 1.0, m_new == NEG_INF);
        workgroupBarrier();
        sc[t] = select(exp(s - m_new), 0.0, s == NEG_INF);
        workgroupBarrier();
        var bsum = 0.0;
        for (var e = 0u; e < WG; e++) {
            bsum += sc[e];
        }
        l = l * alpha + bsum;
        let count = u32(min(i32(WG), r.y - j0));
        for (var e = t; e < DMAX; e += WG) {
            var a = acc[e] * alpha;
            for (var jj = 0u; jj < count; jj++) {
                let w = sc[jj];
                if w != 0.0 {
                    a += w * v_at(ko + u32(j0 + i32(jj)) * p.kv_strides.y + e);
                }
            }
            acc[e] = a;
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var e = t; e < DMAX; e += WG) {
        o[qo + e] = select(acc[e] / l, 0.0, l == 0.0);
    }
}

// One chunk of CK keys for one (head, query, batch): grid (chunks, hq, s * batch). Writes the
// chunk's max m, sum l of exp(score - m) and sum of exp(score - m) · v to `o` (the scratch).
@compute @workgroup_size(WG)
fn split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let qo = split_q(wg);
    for (var e = t; e < DMAX; e += WG) {
        qs[e] = q[qo + e];
    }
    split_keys(wg, t);
}

// `split` with q the raw rows of a rotated norm (`norm_q`): its own entry point, as only it
// binds the norm's weight and tables.
@compute @workgroup_size(WG)
fn split_normed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    norm_q(split_q(wg), t);
    split_keys(wg, t);
}

// split_kv: this step's k and v rows (one a kv head, one query) arrive unnormed, and the
// workgroups whose chunk holds their cache row norm (and rotate k) them as rms_norm.wgsl's
// `main4_cache_kv` would (the same bits), use them from workgroup memory, and the first head of
// the kv head's group stores them into the caches: no other workgroup of the step reads that
// row (src/gpu/memory.rs `kv_split`). KV_D: DMAX there, else 1.
override KV_NEW: bool = false;
override KV_D: u32 = 1u;
var<workgroup> k_new: array<f32, KV_D>;
var<workgroup> v_new: array<f32, KV_D>;
// The cache row of this step's new key where this workgroup normed it, else -1.
var<private> new_row: i32 = -1;

// #if kv_write
@group(0) @binding(10) var<storage, read> kx: array<f32>;
@group(0) @binding(11) var<storage, read> vx: array<f32>;
@group(0) @binding(12) var<storage, read> kw: array<f32>;
// The update's indices, where it has them (`kv_indexed`).
@group(0) @binding(13) var<storage, read> kv_idx: array<i32>;
override HAS_KW: bool = false;
var<workgroup> new_at: i32;

@compute @workgroup_size(WG)
fn split_kv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    norm_q(split_q(wg), t);
    if t == 0u {
        let indexed = p.kv_indexed != 0u;
        var index = 0;
        if indexed {
            index = kv_idx[0];
        }
        new_at = cache_dst(indexed, index, syms[p.kv_start], 0u, 1u, p.kv_rows);
    }
    // (Also the barrier after norm_q's last reads of `nq` and of the norm's sums.)
    let dst = workgroupUniformLoad(&new_at);
    if dst >= 0 && u32(dst) / CK == wg.x {
        norm_new(wg, t, u32(dst));
        new_row = dst;
    }
    split_keys(wg, t);
}

// The new k and v rows of the workgroup's kv head normed into k_new (rotated) and v_new, and
// stored into the caches' row dst by the first head of the group. Every invocation calls it.
fn norm_new(wg: vec3<u32>, t: u32, dst: u32) {
    let kh = wg.y / p.group;
    let base = kh * DMAX;
    // The sums of squares as main4 forms them (`norm_q`).
    var sk = 0.0;
    var sv = 0.0;
    if t < NORM_WG {
        for (var j = t; j < DMAX / 4u; j += NORM_WG) {
            let e = base + 4u * j;
            let a = vec4<f32>(kx[e], kx[e + 1u], kx[e + 2u], kx[e + 3u]);
            let b = vec4<f32>(vx[e], vx[e + 1u], vx[e + 2u], vx[e + 3u]);
            sk += dot(a, a);
            sv += dot(b, b);
        }
    }
    let rk = 1.0 / sqrt(workgroup_sum(sk, t) / f32(DMAX) + p.k_eps);
    // workgroup_sum's last reads of its runs come before the next call's writes.
    workgroupBarrier();
    let rv = 1.0 / sqrt(workgroup_sum(sv, t) / f32(DMAX) + p.v_eps);
    for (var e = t; e < DMAX; e += WG) {
        var a = kx[base + e] * rk;
        if HAS_KW {
            a *= kw[e];
        }
        nq[e] = a;
        v_new[e] = vx[base + e] * rv;
    }
    workgroupBarrier();
    let pos = syms[p.k_rope_start] + i32((base / p.k_seq_stride) % p.k_seq_len);
    let at = wg.z / p.s * p.kv_strides.x + kh * p.kv_strides.z + dst * p.kv_strides.y;
    let store = wg.y % p.group == 0u;
    for (var e = t; e < DMAX; e += WG) {
        let a = nq_rotated(e, pos, p.k_half, p.k_table_rows);
        k_new[e] = a;
        if store {
            k[at + e] = bitcast<u32>(a);
            v[at + e] = bitcast<u32>(v_new[e]);
        }
    }
    // (split_keys starts with a barrier: k_new is visible there.)
}
// #endif

// The first element of the workgroup's head and query in q.
fn split_q(wg: vec3<u32>) -> u32 {
    let i = wg.z % p.s;
    return wg.z / p.s * p.q_strides.x + i * p.q_strides.y + wg.y * p.q_strides.z;
}

// `split` once qs holds the query (every invocation calls it).
fn split_keys(wg: vec3<u32>, t: u32) {
    let NEG_INF = bitcast<f32>(0xff800000u);
    let TPK = WG / CK;
    let c = wg.x;
    let h = wg.y;
    let i = wg.z % p.s;
    let bb = wg.z / p.s;
    let kh = h / p.group;
    let r = span(i);
    let ko = bb * p.kv_strides.x + kh * p.kv_strides.z;
    workgroupBarrier();
    let jl = t / TPK;
    let lane = t % TPK;
    let j = c * CK + jl;
    var mk = NEG_INF;
    if i32(j) >= r.x && i32(j) < r.y {
        mk = mask_at(i, j);
    }
    var part = 0.0;
    if mk != NEG_INF {
        // The new row comes from k_new; the cache row being stored is not read (row j ^ 1 is).
        let fresh = KV_NEW && i32(j) == new_row;
        part = dot_lane(ko + select(j, j ^ 1u, fresh) * p.kv_strides.y, lane, fresh);
    }
    sc[t] = part;
    workgroupBarrier();
    if lane == 0u {
        var s = NEG_INF;
        if mk != NEG_INF {
            var dotv = 0.0;
            for (var e = 0u; e < TPK; e++) {
                dotv += sc[t + e];
            }
            s = finish(dotv, mk);
        }
        pk[jl] = s;
    }
    workgroupBarrier();
    var m = NEG_INF;
    for (var e = 0u; e < CK; e++) {
        m = max(m, pk[e]);
    }
    workgroupBarrier();
    if t < CK {
        pk[t] = select(exp(pk[t] - m), 0.0, pk[t] == NEG_INF);
    }
    workgroupBarrier();
    var l = 0.0;
    for (var e = 0u; e < CK; e++) {
        l += pk[e];
    }
    let base = (((bb * p.s + i) * p.hq + h) * p.chunks + c) * (p.d + 2u);
    if t == 0u {
        o[base] = m;
        o[base + 1u] = l;
    }
    if l == 0.0 {
        return;
    }
    for (var r = 0u; r < (DMAX + WG - 1u) / WG; r++) {
        let e = t + r * WG;
        if e < DMAX {
            var a = 0.0;
            for (var jj = 0u; jj < CK; jj++) {
                // Every row loads (in flight together); a hidden key's row adds nothing, even NaN.
                let w = pk[jj];
                // As in dot_lane: the new row from v_new, another row's load discarded.
                let row = c * CK + jj;
                let fresh = KV_NEW && i32(row) == new_row;
                var x = v_at(ko + select(row, row ^ 1u, fresh) * p.kv_strides.y + e);
                if KV_NEW {
                    x = select(x, v_new[e], fresh);
                }
                a += select(0.0, w * x, w != 0.0);
            }
            o[base + 2u + e] = a;
        }
    }
}

// The head's row of q at qo normed and rotated into qs. Every invocation calls it.
fn norm_q(qo: u32, t: u32) {
    // The sum of squares as main4 forms it: invocation t < NORM_WG takes words t, t + NORM_WG, ...
    var s = 0.0;
    if t < NORM_WG {
        for (var j = t; j < DMAX / 4u; j += NORM_WG) {
            let e = qo + 4u * j;
            let v = vec4<f32>(q[e], q[e + 1u], q[e + 2u], q[e + 3u]);
            s += dot(v, v);
        }
    }
    let r = 1.0 / sqrt(workgroup_sum(s, t) / f32(DMAX) + p.eps);
    for (var e = t; e < DMAX; e += WG) {
        var v = q[qo + e] * r;
        if HAS_W {
            v *= nw[e];
        }
        nq[e] = v;
    }
    workgroupBarrier();
    let pos = syms[p.rope_start] + i32((qo / p.seq_stride) % p.seq_len);
    for (var e = t; e < DMAX; e += WG) {
        qs[e] = nq_rotated(e, pos, p.half, p.table_rows);
    }
}

// Element e of the row in `nq` rotated at position pos as rms_norm.wgsl's `rotated` does (the
// first `half` pairs, by tables of `rows` rows), for q and for the new k.
fn nq_rotated(e: u32, pos: i32, half: u32, rows: u32) -> f32 {
    var v = nq[e];
    if e < 2u * half && pos >= 0 && u32(pos) < rows {
        let rp = rope_pair(e, half, INTERLEAVED);
        let ti = u32(pos) * half + rp.pair;
        v = rope_rotate(nq[e], nq[rp.other], cos_t[ti], sin_t[ti], rp.first);
    }
    return v;
}

// Merges split's chunks for 16 dims of one (head, query, batch): grid (hq, ceil(d / 16),
// s * batch). Its 16 lanes of 16 invocations (WG = 256) each take every 16th chunk, then the
// lanes' sums are added in a fixed order: a long cache is 16 short loops, not one long one.
// The lanes load their chunks' (m, l) and outputs in one round, before the largest m (which
// the weights need) is known; finding the chunks that saw keys first took two rounds (E2B-shaped
// decode step on an H100: 2549 -> 2531 us after 128 tokens, 2587 -> 2553 after 512).
@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let NEG_INF = bitcast<f32>(0xff800000u);
    let h = wg.x;
    let i = wg.z % p.s;
    let bb = wg.z / p.s;
    let st = p.d + 2u;
    let row = ((bb * p.s + i) * p.hq + h) * p.chunks;
    let el = t % 16u;
    let lane = t / 16u;
    let e = wg.y * 16u + el;
    // Lane `lane` takes chunks lane, lane + 16, ...: each chunk's (m, l) and this invocation's
    // dim of its output, the first CPL of them loaded together, before the chunks' largest m
    // is known (a chunk that saw no key, l = 0, leaves its output unwritten: it weighs 0).
    var mc: array<f32, CPL>;
    var lc: array<f32, CPL>;
    var ac: array<f32, CPL>;
    var ml = NEG_INF;
    for (var n = 0u; n < (CHUNKS + 15u) / 16u; n++) {
        let c = lane + 16u * n;
        if c < CHUNKS {
            let at = (row + c) * st;
            let m_c = parts[at];
            let l_c = parts[at + 1u];
            if n < CPL {
                mc[n] = m_c;
                lc[n] = l_c;
                if e < DMAX {
                    ac[n] = parts[at + 2u + e];
                }
            }
            ml = max(ml, select(m_c, NEG_INF, l_c == 0.0));
        }
    }
    // The largest m of the chunks that saw keys, from every lane's.
    if el == 0u {
        sc[lane] = ml;
    }
    workgroupBarrier();
    var m = NEG_INF;
    for (var k = 0u; k < 16u; k++) {
        m = max(m, sc[k]);
    }
    var a = 0.0;
    var l = 0.0;
    for (var n = 0u; n < (CHUNKS + 15u) / 16u; n++) {
        let c = lane + 16u * n;
        if c < CHUNKS {
            let at = (row + c) * st;
            var m_c: f32;
            var l_c: f32;
            var a_c = 0.0;
            if n < CPL {
                m_c = mc[n];
                l_c = lc[n];
                a_c = ac[n];
            } else {
                m_c = parts[at];
                l_c = parts[at + 1u];
                if e < DMAX {
                    a_c = parts[at + 2u + e];
                }
            }
            let w = select(exp(m_c - m), 0.0, l_c == 0.0);
            l += select(0.0, l_c * w, w != 0.0);
            a += select(0.0, a_c * w, w != 0.0);
        }
    }
    workgroupBarrier();
    sc[t] = a;
    pk_l[t] = l;
    workgroupBarrier();
    if lane == 0u && e < DMAX {
        var at = 0.0;
        var lt = 0.0;
        for (var k = 0u; k < 16u; k++) {
            at += sc[k * 16u + el];
            lt += pk_l[k * 16u + el];
        }
        let qo = bb * p.q_strides.x + i * p.q_strides.y + h * p.q_strides.z;
        let v = select(at / lt, 0.0, lt == 0.0);
        o[qo + e] = v;
        if RANGE {
            // Every storing invocation on its own slot, where there are enough.
            let slot = p.range_at + 2u * (((wg.z * p.hq + h) * 64u + wg.y * 16u + el) % RANGE_SLOTS);
            let b = range_bits(v);
            atomicMax(&ranges[slot], b.x);
            atomicMax(&ranges[slot + 1u], b.y);
        }
    }
}

// Chunks per lane that combine loads before it knows their weights.
const CPL: u32 = 4u;

// Score `at` of the scratch in `o`, or with SCORE_PARTS > 1 the sum of the q·Kᵀ matmul's partial
// tiles for it in `parts` (matmul.wgsl's split K, in its order: [part][batch][head][query][row]).
override SCORE_PARTS: u32 = 1u;
fn score(at: u32, batches: u32) -> f32 {
    if SCORE_PARTS == 1u {
        return o[at];
    }
    var sum = 0.0;
    for (var part = 0u; part < SCORE_PARTS; part++) {
        sum += parts[part * batches * p.hq * p.s * p.cache_len + at];
    }
    return sum;
}

// Scores row (batch, head, query) of the scratch in `o`, [cache_len] each, into probabilities:
// scale, cap, mask (hidden keys and those outside the query's span get exactly 0), softmax.
// Grid (s * hq, batch).
@compute @workgroup_size(WG)
fn probs(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) t: u32) {
    let NEG_INF = bitcast<f32>(0xff800000u);
    let flat = wg.x + wg.y * nwg.x;
    if flat >= p.s * p.hq {
        return;
    }
    let i = flat % p.s;
    let h = flat / p.s;
    let r = span(i);
    let row = ((wg.z * p.hq + h) * p.s + i) * p.cache_len;
    // Each invocation rewrites only its own elements (j = t, t + WG, ...).
    var mx = NEG_INF;
    for (var j = t; j < p.cache_len; j += WG) {
        let mk = mask_at(i, j);
        var x = NEG_INF;
        if i32(j) >= r.x && i32(j) < r.y && mk != NEG_INF {
            x = finish(score(row + j, nwg.z), mk);
        }
        o[row + j] = x;
        mx = max(mx, x);
    }
    sc[t] = mx;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w >>= 1u) {
        if t < w {
            sc[t] = max(sc[t], sc[t + w]);
        }
        workgroupBarrier();
    }
    let m = sc[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var j = t; j < p.cache_len; j += WG) {
        let x = o[row + j];
        let e = select(exp(x - m), 0.0, x == NEG_INF);
        o[row + j] = e;
        sum += e;
    }
    sc[t] = sum;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w >>= 1u) {
        if t < w {
            sc[t] += sc[t + w];
        }
        workgroupBarrier();
    }
    let l = sc[0];
    for (var j = t; j < p.cache_len; j += WG) {
        o[row + j] = select(o[row + j] / l, 0.0, l == 0.0);
    }
}
