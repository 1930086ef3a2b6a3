// y[m, n] = x[m, :] · W[n, :] (+ bias[n]) with W f32, 4-bit or 8-bit, dequantized in registers:
// w = scale[n, g] * q + bias[n, g]. A weight larger than one storage binding is split by rows
// (src/gpu/memory.rs); each chunk is one dispatch writing output columns [n0, n0 + n).
//   act_quant  per-row dynamic int8 quantize-dequantize of x into a scratch buffer (8da4w), by
//              torchao's or XNNPACK's rounding (XNN_ROUNDING), as the CPU reference does.
//   matvec     few rows of x (decode): teams of invocations own 1-4 rows each and read 16-byte
//              weight quads (needs a quad inside one group: group % 32 for 4-bit, % 16 for
//              8-bit, K % 4 for f32); team sums by subgroup shuffles or shared memory.
//   matvec_q   the same for smaller groups: 8 rows per workgroup, single packed words; needs
//              K % 8 == 0 (4-bit) or K % 4 == 0 (8-bit).
//   matvec_f32 f32 weights of any K, coalesced scalar reads.
//   tiled      many rows (prefill): 64x64 output tiles, 16-deep K slices in shared memory.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // Row stride of y (all of N) and this chunk's first output column.
    ldy: u32,
    n0: u32,
    groups: u32,
    // Rows from `split` on are a second linear's (src/gpu/memory.rs pairs linears of one input):
    // its weights follow in the same buffers and its outputs go to y2 (N - split columns).
    split: u32,
    // matvec_ranged / act_quant_ranged: the first word of the row's site in the ranges buffer.
    // `linear3` (a third linear's rows, never ranged): the row where the third's begin.
    range_at: u32,
    // GLU: the chain's step words (chain.wgsl `apply_chain`); NORM_X: the norm's chain's.
    words: array<vec4<u32>, 3>,
    // NORM_X: the norm's eps, and which input of its chain the normed row is.
    eps: f32,
    norm_input: u32,
}

// 0: f32, 1: 4-bit, 2: 8-bit.
override KIND: u32 = 0u;
override GROUP: u32 = 32u;
override HAS_BIAS: bool = false;
// XNNPACK's fused multiply-adds: WGSL's fma() where the device fuses it (src/gpu/context.rs
// `fused_fma` probes), else rounded once by fma_rn.
override FMA_NATIVE: bool = false;
// xnn_gemm, xnn_matvec: each weight row's ksum computed at load (src/gpu/ksums.rs), bound after
// the outputs: at 8 alone (`linear`), 9 after a pair's second output or a gate/up chain's
// ranges (`linear_xnn`), 10 after a triple's third (`linear3`).
override KSUMS: bool = false;
// #if ks8
@group(0) @binding(8) var<storage, read> ksums: array<f32>;
// #endif
// #if ks9
@group(0) @binding(9) var<storage, read> ksums: array<f32>;
// #endif
// #if triple
@group(0) @binding(10) var<storage, read> ksums: array<f32>;
// #endif
// #if norm
@group(0) @binding(11) var<storage, read> ksums: array<f32>;
// #endif
// matvec: invocations per output (a power of two) and outputs per workgroup.
override TPR: u32 = 32u;
override RPW: u32 = 8u;
override WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> yu: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;
// x as raw words: f32, or from act_quant_packed int8 words, then (s, zp) per row.
@group(0) @binding(3) var<storage, read> xu4: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> scales: array<f32>;
@group(0) @binding(6) var<storage, read> biases: array<f32>;
// The biases are -8 · scales (symmetric 4-bit weights, nibbles q + 8): computed, not bound
// (src/gpu/memory.rs `derived_bias`); the same f32 the front end stored.
override DERIVED_BIAS: bool = false;

fn bias_at(g: u32) -> f32 {
    if DERIVED_BIAS {
        return neg8(scales[g]);
    }
    return biases[g];
}
@group(0) @binding(7) var<storage, read> bias: array<f32>;
@group(0) @binding(8) var<storage, read_write> y2: array<f32>;
// #if triple
// `linear3`: rows from p.range_at on are a third linear's (src/gpu/memory.rs `third`), stored
// to y3.
@group(0) @binding(9) var<storage, read_write> y3: array<f32>;
// #endif

// Output `row` (of this chunk) of x row m.
fn put(m: u32, row: u32, v: f32) {
    var end2 = p.n;
    // #if triple
    end2 = p.range_at;
    if row >= end2 {
        y3[m * (p.n - end2) + row - end2] = v;
        return;
    }
    // #endif
    if row < p.split {
        y[m * p.ldy + p.n0 + row] = v;
    } else {
        y2[m * (end2 - p.split) + row - p.split] = v;
    }
}

// An XNNPACK linear's output `row` of x row m: straight into y where its ksums take binding 8
// (no second output bound), else by `put` (a pair's or a triple's rows).
fn xnn_put(m: u32, row: u32, v: f32) {
    // #if ks8
    y[m * p.ldy + p.n0 + row] = v;
    // #endif
    // #if xnn_wide
    put(m, row, v);
    // #endif
}

// ---- act_quant: one workgroup per row of x; writes y = quant_dequant(x) (same shape). ----

// x through its raw 16-byte words (act_quant entries bind x only so, to read vec4s of any K).
fn x_at(i: u32) -> f32 {
    return bitcast<f32>(xu4[i / 4u][i % 4u]);
}

// Range of row `row` of x → its quantization parameters. Every invocation of the workgroup must
// call it (barriers). Reads 16-byte words where K allows.
fn row_quant(row: u32, t: u32) -> RowQuant {
    let base = row * p.k;
    var lo4 = vec4<f32>(0.0);
    var hi4 = vec4<f32>(0.0);
    if p.k % 4u == 0u {
        for (var j = t; j < p.k / 4u; j += WG) {
            let v = bitcast<vec4<f32>>(xu4[base / 4u + j]);
            lo4 = min(lo4, v);
            hi4 = max(hi4, v);
        }
    } else {
        for (var j = t; j < p.k; j += WG) {
            lo4.x = min(lo4.x, x_at(base + j));
            hi4.x = max(hi4.x, x_at(base + j));
        }
    }
    return row_params(min(min(lo4.x, lo4.y), min(lo4.z, lo4.w)),
                      max(max(hi4.x, hi4.y), max(hi4.z, hi4.w)), t);
}

// One workgroup per row of x; writes y = s · (q - zp) (same shape as x), for the tiled kernel.
@compute @workgroup_size(WG)
fn act_quant(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.m {
        return;
    }
    let r = row_quant(row, t);
    let base = row * p.k;
    for (var j = t; j < p.k; j += WG) {
        y[base + j] = (quantize(x_at(base + j), r) - r.zp) * r.s;
    }
}

// The same, packed for `matvec` with INT_X: row `row`'s q as K / 4 words of signed bytes, then
// after all M rows, (s, zp) per row as two f32 words. For 4-bit weights (KIND 1) each 8
// elements are stored as (0, 2, 4, 6), (1, 3, 5, 7): the order of a weight word's low and high
// nibbles once masked with 0x0f0f0f0f. Needs K % 8 == 0.
@compute @workgroup_size(WG)
fn act_quant_packed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.m {
        return;
    }
    let r = row_quant(row, t);
    for (var u = t; u < units(); u += WG) {
        pack_unit(row, u, r);
    }
    if t == 0u {
        put_params(row, r);
    }
}

// Packing units of a row: 8 elements (two words) for 4-bit weights, else 4 (one word).
fn units() -> u32 {
    return select(p.k / 4u, p.k / 8u, KIND == 1u);
}

// Unit u of row `row` of x quantized by r and packed into y.
fn pack_unit(row: u32, u: u32, r: RowQuant) {
    let base4 = row * p.k / 4u;
    if KIND == 1u {
        let q = pack8_nibble_order(bitcast<vec4<f32>>(xu4[base4 + 2u * u]),
                                   bitcast<vec4<f32>>(xu4[base4 + 2u * u + 1u]), r);
        yu[base4 + 2u * u] = q.x;
        yu[base4 + 2u * u + 1u] = q.y;
    } else {
        yu[base4 + u] = pack4(bitcast<vec4<f32>>(xu4[base4 + u]), r);
    }
}

// (s, zp) of row `row`, after all M rows' words.
fn put_params(row: u32, r: RowQuant) {
    yu[p.m * p.k / 4u + 2u * row] = bitcast<u32>(r.s);
    yu[p.m * p.k / 4u + 2u * row + 1u] = bitcast<u32>(r.zp);
}

// ---- quantizing from the range a row's producer left (range.wgsl) ----
@group(0) @binding(8) var<storage, read_write> ranges: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read> range4: array<vec4<u32>>;

// The largest of b over each run of SG_LANES lanes, in every lane of it.
fn run_max(b: vec2<u32>) -> vec2<u32> {
    var m = b;
    // #if subgroups
    for (var d = SG_LANES / 2u; d > 0u; d = d / 2u) {
        m = max(m, subgroupShuffleXor(m, d));
    }
    // #endif
    return m;
}

// One row (M = 1), one unit an invocation: grid (units / WG).
@compute @workgroup_size(WG)
fn act_quant_ranged(@builtin(workgroup_id) wg: vec3<u32>,
                    @builtin(local_invocation_index) t: u32) {
    // The slots' range, by every run of SG_LANES lanes (subgroup shuffles, no barrier: a
    // workgroup reduction cost more than the loads).
    // Two slots a 16-byte word; the loop's bound is a constant, so that it unrolls and its
    // loads are in flight together (one at a time cost more than the pass this replaces).
    let lanes = max(SG_LANES, 1u);
    var most = vec2<u32>(0u);
    for (var j = 0u; j < RANGE_SLOTS / 2u / lanes; j++) {
        let w = range4[p.range_at / 4u + j * lanes + t % lanes];
        most = max(most, max(w.xy, w.zw));
    }
    let span = range_span(run_max(most));
    let r = params_of(span.x, span.y);
    let u = wg.x * WG + t;
    if u < units() {
        pack_unit(0u, u, r);
    }
    if u == 0u {
        put_params(0u, r);
    }
}

// ---- matvec ----

var<workgroup> red: array<f32, WG>;

fn nibbles(word: u32, shift: u32) -> vec4<f32> {
    let v = word >> shift;
    return vec4<f32>(f32(v & 0xfu), f32((v >> 4u) & 0xfu), f32((v >> 8u) & 0xfu), f32((v >> 12u) & 0xfu));
}

fn signed_bytes(word: u32) -> vec4<f32> {
    let v = i32(word);
    return vec4<f32>(f32(extractBits(v, 0u, 8u)), f32(extractBits(v, 8u, 8u)),
                     f32(extractBits(v, 16u, 8u)), f32(extractBits(v, 24u, 8u)));
}

// Sums `red` over each run of TPR invocations, leaving the total at the run's first slot.
fn reduce_rows(t: u32, lane: u32) {
    for (var s = TPR / 2u; s > 0u; s = s / 2u) {
        if lane < s {
            red[t] += red[t + s];
        }
        workgroupBarrier();
    }
}

fn finish(row: u32, m: u32, lane: u32, t: u32) {
    if lane == 0u && row < p.n {
        var v = red[t];
        if HAS_BIAS {
            v += bias[p.n0 + row];
        }
        put(m, row, v);
    }
}

// Each invocation walks the packed words of ROWS rows at once, so one load of x serves them all;
// consecutive invocations read consecutive words of a row (coalesced).
const ROWS = 8u;
var<workgroup> red_rows: array<f32, ROWS * WG>;

// Sums each row's per-invocation partials (shared-memory tree) and writes the ROWS outputs.
fn reduce_and_store(t: u32, rows: u32, row0: u32, m: u32, acc_lo: vec4<f32>, acc_hi: vec4<f32>) {
    for (var r = 0u; r < 4u; r++) {
        red_rows[r * WG + t] = acc_lo[r];
        red_rows[(r + 4u) * WG + t] = acc_hi[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if t < s {
            for (var r = 0u; r < ROWS; r++) {
                red_rows[r * WG + t] += red_rows[r * WG + t + s];
            }
        }
        workgroupBarrier();
    }
    if t < rows {
        var v = red_rows[t * WG];
        if HAS_BIAS {
            v += bias[p.n0 + row0 + t];
        }
        put(m, row0 + t, v);
    }
}

// One row's share of a packed word: Σ x·(s·q + b) = s·Σ x·q + b·Σ x over the word's elements,
// which all fall in one group.
fn row_dot(row: u32, words: u32, i: u32, k0: u32, xa: vec4<f32>, xb: vec4<f32>, sx: f32) -> f32 {
    let word = w[row * words + i];
    var dq: f32;
    if KIND == 1u {
        dq = dot(xa, nibbles(word, 0u)) + dot(xb, nibbles(word, 16u));
    } else {
        dq = dot(xa, signed_bytes(word));
    }
    let g = row * p.groups + k0 / GROUP;
    return scales[g] * dq + bias_at(g) * sx;
}

@compute @workgroup_size(WG)
fn matvec_q(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
    let row0 = (wg.x + wg.y * nwg.x) * ROWS;
    let m = wg.z;
    // Elements per u32 word: 8 nibbles or 4 bytes; a group spans whole words.
    let per_word = select(4u, 8u, KIND == 1u);
    let words = p.k / per_word;
    let xrow = m * p.k / 4u;
    let rows = min(ROWS, p.n - min(row0, p.n));
    // Rows past the chunk repeat its last row (cheaper than a branch in the hot loop); only
    // valid rows are written. Two vec4 accumulators, not an indexed array, keep them in registers.
    let last = p.n - 1u;
    var acc_lo = vec4<f32>(0.0);
    var acc_hi = vec4<f32>(0.0);
    for (var i = t; i < words; i += WG) {
        let k0 = i * per_word;
        let xa = x4[xrow + k0 / 4u];
        var xb = vec4<f32>(0.0);
        if KIND == 1u {
            xb = x4[xrow + k0 / 4u + 1u];
        }
        let sx = dot(xa + xb, vec4<f32>(1.0));
        acc_lo += vec4<f32>(row_dot(min(row0, last), words, i, k0, xa, xb, sx),
                            row_dot(min(row0 + 1u, last), words, i, k0, xa, xb, sx),
                            row_dot(min(row0 + 2u, last), words, i, k0, xa, xb, sx),
                            row_dot(min(row0 + 3u, last), words, i, k0, xa, xb, sx));
        acc_hi += vec4<f32>(row_dot(min(row0 + 4u, last), words, i, k0, xa, xb, sx),
                            row_dot(min(row0 + 5u, last), words, i, k0, xa, xb, sx),
                            row_dot(min(row0 + 6u, last), words, i, k0, xa, xb, sx),
                            row_dot(min(row0 + 7u, last), words, i, k0, xa, xb, sx));
    }
    reduce_and_store(t, rows, row0, m, acc_lo, acc_hi);
}

// ---- matvec: the decode path ----
// A team of TEAM consecutive invocations owns RPT rows; each invocation walks the rows' 16-byte
// weight quads (32 nibbles, 16 bytes or 4 floats, all in one group) TEAM apart, so one load of x
// serves RPT rows and a team reads its rows contiguously. Teams are as wide as it takes to keep
// enough loads in flight: a few hundred rows of a long K need whole workgroups per row.
// Nibbles become floats by the exponent trick (or-ing 0x4B000000 makes 2^23 + n, exact):
// integer-to-float conversion runs at a fraction of the FMA rate on most GPUs.
// Needs K % (elements per quad) == 0 and, quantized, GROUP % (elements per quad) == 0.
override TEAM: u32 = 16u;
// Rows a team owns (4, 2 or 1): fewer where there are few rows, so that more warps share the
// work (a decode mat-vec of a few hundred rows is otherwise a handful of warps per SM, each with
// a long chain of dependent instructions).
override RPT: u32 = 4u;
// Lanes summed by subgroup shuffles (a power of two up to the subgroup size; 1: none), the
// rest of the team through shared memory.
override SG_LANES: u32 = 1u;
// x comes from act_quant_packed: integer dot products of int8 activations with the raw 4/8-bit
// weights (dot4I8Packed, DP4A where the GPU has it) replace the per-element dequantization:
// Σ x·w over a group = s · (sc · (Σ q·n - zp Σ n) + b · (Σ q - zp · G)).
override INT_X: bool = false;
// The rows are a paired linear's two halves (gate/up) whose only reader is an element-wise chain
// of the two (gelu(gate) · up, chain.wgsl): a team owns rows of both, RPT / 2 each, and stores
// the chain's value at the first half's row (y, N / 2 columns) instead of either output.
// GLU_FIRST: the chain's input 0 is the first half.
override GLU: bool = false;
override GLU_FIRST: bool = true;
// x is an element-wise chain of x and y2 (src/gpu/ops.rs `chain_loaded`; INT_X, one row, one
// quad a lane): the workgroup chains and quantizes the row itself (`chain_quad`), as the chain's
// own dispatch would have (the same bits).
override CHAIN_X: bool = false;
// x is the row of an rms_norm that only this linear quantizes (`linear_norm`'s `matvec_normed`):
// the teams take the row's int8 words from workgroup memory (`chain_words`).
override NORM_X: bool = false;

var<workgroup> red4: array<vec4<f32>, WG>;

// Team sums by a shared-memory tree past the subgroup: reading up to 8 runs after one barrier,
// added in the tree's order (the same bits), measured no faster on the H100 (E2B-shaped decode
// step 3.026-3.029 ms against 3.028-3.034).
fn team_sum(v: vec4<f32>, t: u32, lane: u32) -> vec4<f32> {
    var s = v;
    // #if subgroups
    for (var d = SG_LANES / 2u; d > 0u; d = d / 2u) {
        s += subgroupShuffleXor(s, d);
    }
    // #endif
    if SG_LANES >= TEAM {
        return s;
    }
    // Every lane of a run of SG_LANES now holds its run's sum: add the runs' first lanes.
    red4[t] = s;
    workgroupBarrier();
    for (var d = TEAM / 2u; d >= max(SG_LANES, 1u); d = d / 2u) {
        if lane < d {
            red4[t] += red4[t + d];
        }
        workgroupBarrier();
    }
    return red4[t - lane];
}

const MAGIC = 0x4B000000u;
const MAGIC_F = 8388608.0;

// The 8 nibbles of a word as floats, low nibble first, split into two vec4.
fn nib_lo(word: u32) -> vec4<f32> {
    let v = (vec4<u32>(word) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(0xfu);
    return bitcast<vec4<f32>>(v | vec4<u32>(MAGIC)) - vec4<f32>(MAGIC_F);
}
fn nib_hi(word: u32) -> vec4<f32> {
    let v = (vec4<u32>(word) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(0xfu);
    return bitcast<vec4<f32>>(v | vec4<u32>(MAGIC)) - vec4<f32>(MAGIC_F);
}
// Signed bytes: 2^23 + 128 + b, then less both.
fn sbytes(word: u32) -> vec4<f32> {
    let v = ((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu)) ^ vec4<u32>(0x80u);
    return bitcast<vec4<f32>>(v | vec4<u32>(MAGIC)) - vec4<f32>(MAGIC_F + 128.0);
}

// One row's share of quad i: x is the quad's activations (8, 4 or 1 vec4 used), sx their sum.
fn quad_dot(row: u32, quads: u32, i: u32, xs: array<vec4<f32>, 8>, sx: f32) -> f32 {
    let q = w4[row * quads + i];
    if KIND == 0u {
        return dot(xs[0], bitcast<vec4<f32>>(q));
    }
    var dq: f32;
    if KIND == 1u {
        dq = dot(xs[0], nib_lo(q.x)) + dot(xs[1], nib_hi(q.x)) + dot(xs[2], nib_lo(q.y))
            + dot(xs[3], nib_hi(q.y)) + dot(xs[4], nib_lo(q.z)) + dot(xs[5], nib_hi(q.z))
            + dot(xs[6], nib_lo(q.w)) + dot(xs[7], nib_hi(q.w));
    } else {
        dq = dot(xs[0], sbytes(q.x)) + dot(xs[1], sbytes(q.y)) + dot(xs[2], sbytes(q.z))
            + dot(xs[3], sbytes(q.w));
    }
    let per_quad = select(16u, 32u, KIND == 1u);
    let g = row * p.groups + i * per_quad / GROUP;
    return scales[g] * dq + bias_at(g) * sx;
}

// The row of x's zero point and scale (INT_X), read before the loop.
var<private> zp_x: f32;
var<private> s_x: f32;

// A weight quad as integer dots take it: 4-bit nibbles masked into bytes (a pairs with x's
// first word of 4, b with its second), or 8-bit bytes in a; the sum of its values; its group.
// `int_dot` unpacks the same way inline: through this struct the E2B-shaped decode step took
// 2394 µs against 2347 (H100).
struct WQuad {
    a: vec4<u32>,
    b: vec4<u32>,
    sn: i32,
    g: u32,
}

fn wquad(row: u32, quads: u32, i: u32) -> WQuad {
    let q = w4[row * quads + i];
    var w: WQuad;
    if KIND == 1u {
        let m4 = 0x0f0f0f0fu;
        w.a = vec4<u32>(q.x & m4, (q.x >> 4u) & m4, q.y & m4, (q.y >> 4u) & m4);
        w.b = vec4<u32>(q.z & m4, (q.z >> 4u) & m4, q.w & m4, (q.w >> 4u) & m4);
        // Byte lanes of the sum stay below 8 · 15 = 120: no carries between them.
        let all = w.a.x + w.a.y + w.a.z + w.a.w + w.b.x + w.b.y + w.b.z + w.b.w;
        w.sn = i32(dot4U8Packed(all, 0x01010101u));
    } else {
        w.a = q;
        let ones = 0x01010101u;
        w.sn = dot4I8Packed(q.x, ones) + dot4I8Packed(q.y, ones) + dot4I8Packed(q.z, ones)
            + dot4I8Packed(q.w, ones);
    }
    let per_quad = select(16u, 32u, KIND == 1u);
    w.g = row * p.groups + i * per_quad / GROUP;
    return w;
}

// One row's share of quad i against int8 activations (without the row's scale s_x).
fn int_dot(row: u32, quads: u32, i: u32, xa: vec4<u32>, xb: vec4<u32>, sq: f32) -> f32 {
    let q = w4[row * quads + i];
    var sqn: i32;
    var sn: i32;
    var elems: f32;
    if KIND == 1u {
        let m4 = 0x0f0f0f0fu;
        let l0 = q.x & m4;
        let h0 = (q.x >> 4u) & m4;
        let l1 = q.y & m4;
        let h1 = (q.y >> 4u) & m4;
        let l2 = q.z & m4;
        let h2 = (q.z >> 4u) & m4;
        let l3 = q.w & m4;
        let h3 = (q.w >> 4u) & m4;
        sqn = dot4I8Packed(l0, xa.x) + dot4I8Packed(h0, xa.y) + dot4I8Packed(l1, xa.z)
            + dot4I8Packed(h1, xa.w) + dot4I8Packed(l2, xb.x) + dot4I8Packed(h2, xb.y)
            + dot4I8Packed(l3, xb.z) + dot4I8Packed(h3, xb.w);
        // Byte lanes of the sum stay below 8 · 15 = 120: no carries between them.
        sn = i32(dot4U8Packed(l0 + h0 + l1 + h1 + l2 + h2 + l3 + h3, 0x01010101u));
        elems = 32.0;
    } else {
        sqn = dot4I8Packed(q.x, xa.x) + dot4I8Packed(q.y, xa.y) + dot4I8Packed(q.z, xa.z)
            + dot4I8Packed(q.w, xa.w);
        let ones = 0x01010101u;
        sn = dot4I8Packed(q.x, ones) + dot4I8Packed(q.y, ones) + dot4I8Packed(q.z, ones)
            + dot4I8Packed(q.w, ones);
        elems = 16.0;
    }
    let per_quad = select(16u, 32u, KIND == 1u);
    let g = row * p.groups + i * per_quad / GROUP;
    return int_sums(sqn, sn, g, sq, zp_x, elems);
}

// Weight quad w against int8 activations (xa, xb; their sum sq, zero point zp).
fn wdot(w: WQuad, xa: vec4<u32>, xb: vec4<u32>, sq: f32, zp: f32) -> f32 {
    var sqn = dot4I8Packed(w.a.x, xa.x) + dot4I8Packed(w.a.y, xa.y) + dot4I8Packed(w.a.z, xa.z)
        + dot4I8Packed(w.a.w, xa.w);
    var elems = 16.0;
    if KIND == 1u {
        sqn += dot4I8Packed(w.b.x, xb.x) + dot4I8Packed(w.b.y, xb.y) + dot4I8Packed(w.b.z, xb.z)
            + dot4I8Packed(w.b.w, xb.w);
        elems = 32.0;
    }
    return int_sums(sqn, w.sn, w.g, sq, zp, elems);
}

// Quad group g's share from the integer sums Σ q·n (sqn) and Σ n (sn) and x's sum sq, zero
// point zp, over `elems` elements.
fn int_sums(sqn: i32, sn: i32, g: u32, sq: f32, zp: f32, elems: f32) -> f32 {
    // Both sums are exact integers (below 2^24): Σ (q - zp)·n and Σ (q - zp).
    let qn = f32(sqn) - zp * f32(sn);
    let qs = sq - zp * elems;
    if KIND == 1u {
        // 4-bit weights are n = round(w / s) + 8 with bias b = -8s: subtracting 8 Σ (q - zp)
        // in integers leaves one rounding, where s·Σ(q-zp)·n + b·Σ(q-zp) rounds two products
        // that mostly cancel (errors of several ulps, enough to flip a later int8 rounding).
        // Derived biases make the second term (+0) · qs, which leaves every sum unchanged
        // (they start at +0, so none is ever -0).
        if DERIVED_BIAS {
            return scales[g] * (qn - 8.0 * qs);
        }
        return scales[g] * (qn - 8.0 * qs) + (biases[g] + 8.0 * scales[g]) * qs;
    }
    return scales[g] * qn + bias_at(g) * qs;
}

// The quad mat-vecs' grid is (x rows, workgroups): the rows of x that one block of weights
// serves run next to each other (src/gpu/ops.rs). Returns (workgroup, row of x).
fn quad_grid(wg: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    return vec2<u32>(wg.y + wg.z * nwg.y, wg.x);
}

@compute @workgroup_size(WG)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) t: u32) {
    let pos = quad_grid(wg, nwg);
    let wgi = pos.x;
    let m = pos.y;
    var chained: array<vec4<u32>, 2>;
    if CHAIN_X {
        chained = chain_quad(t);
    }
    let s = team_sums(wgi, m, t, chained);
    if GLU {
        glu_store(wgi, m, t, s);
        return;
    }
    store_rows(wgi, m, t, s);
}

// `matvec_rows`: rows of x a workgroup takes (2, 4 or 8; INT_X, a prompt; not CHAIN_X, NORM_X).
// Each weight quad, loaded and unpacked once, meets every one of them, and each x word up to RPT
// weight rows, from registers: one row of x a workgroup loaded every weight quad and its scale
// again for each row.
override XROWS: u32 = 1u;

// `matvec` over XROWS rows of x a workgroup: its own entry point, so that a recording names it.
@compute @workgroup_size(WG)
fn matvec_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) t: u32) {
    let pos = quad_grid(wg, nwg);
    x_rows(pos.x, pos.y * XROWS, t);
}

// The x words of quad i of x row `xr` (clamped to the rows there are), and their sum.
struct XQuad {
    a: vec4<u32>,
    b: vec4<u32>,
    sq: f32,
}

fn xquad(xr: u32, i: u32) -> XQuad {
    let xw = select(1u, 2u, KIND == 1u);
    let at = min(xr, p.m - 1u) * p.k / 16u + i * xw;
    var x: XQuad;
    x.a = xu4[at];
    if KIND == 1u {
        x.b = xu4[at + 1u];
    }
    let ones = 0x01010101u;
    x.sq = f32(dot4I8Packed(x.a.x, ones) + dot4I8Packed(x.a.y, ones) + dot4I8Packed(x.a.z, ones)
        + dot4I8Packed(x.a.w, ones) + dot4I8Packed(x.b.x, ones) + dot4I8Packed(x.b.y, ones)
        + dot4I8Packed(x.b.z, ones) + dot4I8Packed(x.b.w, ones));
    return x;
}

// x row xr's (scale, zero point), from act_quant_packed's words after all M rows.
fn x_params(xr: u32) -> vec2<f32> {
    let pr = p.m * p.k / 4u + 2u * min(xr, p.m - 1u);
    return vec2<f32>(bitcast<f32>(xu4[pr / 4u][pr % 4u]),
                     bitcast<f32>(xu4[(pr + 1u) / 4u][(pr + 1u) % 4u]));
}

// Weight quads w0..w3 (RPT of them) against x quad x: the team rows' shares, added to acc.
fn rows_dot(acc: vec4<f32>, w0: WQuad, w1: WQuad, w2: WQuad, w3: WQuad, x: XQuad,
            zp: f32) -> vec4<f32> {
    var a = acc;
    a.x += wdot(w0, x.a, x.b, x.sq, zp);
    if RPT > 1u {
        a.y += wdot(w1, x.a, x.b, x.sq, zp);
    }
    if RPT > 2u {
        a.z += wdot(w2, x.a, x.b, x.sq, zp);
        a.w += wdot(w3, x.a, x.b, x.sq, zp);
    }
    return a;
}

// `matvec` for x rows m0.. (XROWS of them: 2, 4 or 8): every team's sums of each, stored.
fn x_rows(wgi: u32, m0: u32, t: u32) {
    let lane = t % TEAM;
    let team = wgi * (WG / TEAM) + t / TEAM;
    let quads = p.k / select(16u, 32u, KIND == 1u);
    let r = team_rows(team);
    // Accumulators by constant index only (indexed by a loop variable they may leave
    // registers): the rows' blocks below are written out. x_params: (scale, zero point).
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    let x0 = x_params(m0);
    let x1 = x_params(m0 + 1u);
    let x2 = x_params(m0 + 2u);
    let x3 = x_params(m0 + 3u);
    let x4 = x_params(m0 + 4u);
    let x5 = x_params(m0 + 5u);
    let x6 = x_params(m0 + 6u);
    let x7 = x_params(m0 + 7u);
    for (var i = lane; i < quads; i += TEAM) {
        let w0 = wquad(r.x, quads, i);
        var w1 = w0;
        var w2 = w0;
        var w3 = w0;
        if RPT > 1u {
            w1 = wquad(r.y, quads, i);
        }
        if RPT > 2u {
            w2 = wquad(r.z, quads, i);
            w3 = wquad(r.w, quads, i);
        }
        a0 = rows_dot(a0, w0, w1, w2, w3, xquad(m0, i), x0.y);
        a1 = rows_dot(a1, w0, w1, w2, w3, xquad(m0 + 1u, i), x1.y);
        if XROWS > 2u {
            a2 = rows_dot(a2, w0, w1, w2, w3, xquad(m0 + 2u, i), x2.y);
            a3 = rows_dot(a3, w0, w1, w2, w3, xquad(m0 + 3u, i), x3.y);
        }
        if XROWS > 4u {
            a4 = rows_dot(a4, w0, w1, w2, w3, xquad(m0 + 4u, i), x4.y);
            a5 = rows_dot(a5, w0, w1, w2, w3, xquad(m0 + 5u, i), x5.y);
            a6 = rows_dot(a6, w0, w1, w2, w3, xquad(m0 + 6u, i), x6.y);
            a7 = rows_dot(a7, w0, w1, w2, w3, xquad(m0 + 7u, i), x7.y);
        }
    }
    x_store(wgi, m0, t, team_sum(a0, t, lane), x0.x);
    x_store(wgi, m0 + 1u, t, team_sum(a1, t, lane), x1.x);
    if XROWS > 2u {
        x_store(wgi, m0 + 2u, t, team_sum(a2, t, lane), x2.x);
        x_store(wgi, m0 + 3u, t, team_sum(a3, t, lane), x3.x);
    }
    if XROWS > 4u {
        x_store(wgi, m0 + 4u, t, team_sum(a4, t, lane), x4.x);
        x_store(wgi, m0 + 5u, t, team_sum(a5, t, lane), x5.x);
        x_store(wgi, m0 + 6u, t, team_sum(a6, t, lane), x6.x);
        x_store(wgi, m0 + 7u, t, team_sum(a7, t, lane), x7.x);
    }
}

// Team sums s of x row m (scale sx) stored, as `matvec` stores one row's.
fn x_store(wgi: u32, m: u32, t: u32, s: vec4<f32>, sx: f32) {
    if m >= p.m {
        return;
    }
    s_x = sx;
    if GLU {
        glu_store(wgi, m, t, s);
    } else {
        store_rows(wgi, m, t, s);
    }
}

// The team's sums of its rows (`team_sums`) stored as output rows of x row m.
fn store_rows(wgi: u32, m: u32, t: u32, s: vec4<f32>) {
    let lane = t % TEAM;
    let row = wgi * (WG / TEAM) * RPT + t / TEAM * RPT + lane;
    if lane < RPT && row < p.n {
        var v = s[lane];
        if INT_X {
            v *= s_x;
        }
        if HAS_BIAS {
            v += bias[p.n0 + row];
        }
        put(m, row, v);
    }
}

// `matvec` with GLU whose stores also leave their range (RANGE): its own entry point, as the
// ranges buffer takes the binding of y2, which no GLU store reaches.
@compute @workgroup_size(WG)
fn matvec_ranged(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) t: u32) {
    let pos = quad_grid(wg, nwg);
    let wgi = pos.x;
    let v = glu_store(wgi, pos.y, t, team_sums(wgi, pos.y, t, array<vec4<u32>, 2>()));
    // A team's stores are its first lanes': their range by subgroup shuffles, then one atomic
    // pair a team (a few thousand on few words cost the E2B gate/up mat-vec 4 us), each team on
    // its own slot where there are enough. Lanes that store nothing hold 0, which is in every
    // range, as is the buffer's starting 0: zeros need no atomic.
    let b = run_max(range_bits(v));
    let at = p.range_at + 2u * ((wgi * (WG / TEAM) + t / TEAM) % RANGE_SLOTS);
    if t % max(SG_LANES, 1u) == 0u && any(b != vec2<u32>(0u)) {
        atomicMax(&ranges[at], b.x);
        atomicMax(&ranges[at + 1u], b.y);
    }
}

// The chain of this invocation's row of each half, stored (GLU), else 0.
fn glu_store(wgi: u32, m: u32, t: u32, s: vec4<f32>) -> f32 {
    let lane = t % TEAM;
    let g0 = (wgi * (WG / TEAM) + t / TEAM) * (RPT / 2u);
    let half = RPT / 2u;
    if lane < half && g0 + lane < p.split {
        var a = s[lane];
        var z = s[lane + half];
        if INT_X {
            a *= s_x;
            z *= s_x;
        }
        let ins = vec3<f32>(select(z, a, GLU_FIRST), select(a, z, GLU_FIRST), 0.0);
        let v = apply_chain(ins.x, ins, p.words);
        y[m * p.ldy + g0 + lane] = v;
        return v;
    }
    return 0.0;
}

// CHAIN_X: the row through the chain of x and y2 (workgroup memory, CHAIN_K4 words), its
// range and its int8 words as act_quant_packed packs them, computed by the whole workgroup:
// each invocation chains and quantizes a few elements (every lane taking its own quad's 32
// cost more than the dispatch it saves: tanh and the exact rounding are long). Returns the
// invocation's quad for `team_sums` and sets zp_x and s_x. Every invocation calls it
// (barriers). Called by `matvec` only: `matvec_ranged` binds y2's slot to the ranges buffer.
// The row's 16-byte words where CHAIN_X, else 1: `matvec` reaches these arrays whether or not
// CHAIN_X is on, and every mat-vec would otherwise hold them (src/gpu/ops.rs `CHAIN_LOAD_MAX_K`).
override CHAIN_K4: u32 = 1u;
var<workgroup> chain_row: array<vec4<f32>, CHAIN_K4>;
var<workgroup> chain_words: array<u32, CHAIN_K4>;

fn chain_quad(t: u32) -> array<vec4<u32>, 2> {
    let k4 = p.k / 4u;
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    for (var u = t; u < k4; u += WG) {
        let a = bitcast<vec4<f32>>(xu4[u]);
        let e = u * 4u;
        let z = vec4<f32>(y2[e], y2[e + 1u], y2[e + 2u], y2[e + 3u]);
        let c = vec4<f32>(apply_chain(a.x, vec3<f32>(a.x, z.x, 0.0), p.words),
                          apply_chain(a.y, vec3<f32>(a.y, z.y, 0.0), p.words),
                          apply_chain(a.z, vec3<f32>(a.z, z.z, 0.0), p.words),
                          apply_chain(a.w, vec3<f32>(a.w, z.w, 0.0), p.words));
        chain_row[u] = c;
        lo = min(lo, c);
        hi = max(hi, c);
    }
    pack_chain_row(lo, hi, t);
    var out: array<vec4<u32>, 2>;
    let lane = t % TEAM;
    let w = lane * select(4u, 8u, KIND == 1u);
    if w < k4 {
        out[0] = vec4<u32>(chain_words[w], chain_words[w + 1u], chain_words[w + 2u], chain_words[w + 3u]);
        if KIND == 1u {
            out[1] = vec4<u32>(chain_words[w + 4u], chain_words[w + 5u], chain_words[w + 6u],
                               chain_words[w + 7u]);
        }
    }
    return out;
}

// The row in chain_row (K / 4 words), whose invocations' stored values span [lo, hi], quantized
// into chain_words as act_quant_packed packs it; sets zp_x and s_x. Every invocation calls it
// (barriers; the first also makes chain_row visible, the last chain_words).
fn pack_chain_row(lo: vec4<f32>, hi: vec4<f32>, t: u32) {
    let k4 = p.k / 4u;
    let r = row_params(min(min(lo.x, lo.y), min(lo.z, lo.w)), max(max(hi.x, hi.y), max(hi.z, hi.w)), t);
    zp_x = r.zp;
    s_x = r.s;
    for (var u = t; u < k4; u += WG) {
        if KIND == 1u {
            // Word u of unit u / 2: its even or odd elements.
            chain_words[u] = nibble_word(chain_row[u & ~1u], chain_row[u | 1u], (u & 1u) == 1u, r);
        } else {
            chain_words[u] = pack4(chain_row[u], r);
        }
    }
    workgroupBarrier();
}

// The team's sums of its RPT rows (every invocation calls it: barriers), as lanes of a vec4.
// The weight rows team `team` owns (RPT of 4 slots used). Rows past the chunk repeat its last
// row (no branch in the loop); only valid rows are written. Teams past the end still take part
// in the reduction's barriers. GLU: rows g0.. of the first half (p.split rows) in the first
// RPT / 2 slots, the same rows of the second half in the others.
fn team_rows(team: u32) -> vec4<u32> {
    let row0 = team * RPT;
    let last = p.n - 1u;
    var r = vec4<u32>(min(row0, last), min(row0 + 1u, last), min(row0 + 2u, last),
                      min(row0 + 3u, last));
    if GLU {
        let g0 = team * (RPT / 2u);
        let hl = p.split - 1u;
        if RPT == 2u {
            r.x = min(g0, hl);
            r.y = p.split + r.x;
        } else {
            r.x = min(g0, hl);
            r.y = min(g0 + 1u, hl);
            r.z = p.split + r.x;
            r.w = p.split + r.y;
        }
    }
    return r;
}

fn team_sums(wgi: u32, m: u32, t: u32, chained: array<vec4<u32>, 2>) -> vec4<f32> {
    let lane = t % TEAM;
    let team = wgi * (WG / TEAM) + t / TEAM;
    // x vec4s per quad: 8 (4-bit), 4 (8-bit), 1 (f32).
    let xq = select(select(1u, 4u, KIND == 2u), 8u, KIND == 1u);
    let quads = p.k / (xq * 4u);
    let xrow = m * p.k / 4u;
    let rows = team_rows(team);
    let r0 = rows.x;
    let r1 = rows.y;
    let r2 = rows.z;
    let r3 = rows.w;
    var acc = vec4<f32>(0.0);
    if INT_X {
        // 16 x bytes per vec4 word: 2 words per 4-bit quad, 1 per 8-bit quad.
        let xw = select(1u, 2u, KIND == 1u);
        let xrow16 = m * p.k / 16u;
        var xa = vec4<u32>(0u);
        var xb = vec4<u32>(0u);
        if CHAIN_X {
            xa = chained[0];
            xb = chained[1];
        } else if !NORM_X {
            let xp = x_params(m);
            s_x = xp.x;
            zp_x = xp.y;
        }
        for (var i = lane; i < quads; i += TEAM) {
            if NORM_X {
                let u = i * 4u * xw;
                xa = vec4<u32>(chain_words[u], chain_words[u + 1u], chain_words[u + 2u],
                               chain_words[u + 3u]);
                if KIND == 1u {
                    xb = vec4<u32>(chain_words[u + 4u], chain_words[u + 5u], chain_words[u + 6u],
                                   chain_words[u + 7u]);
                }
            } else if !CHAIN_X {
                xa = xu4[xrow16 + i * xw];
                if KIND == 1u {
                    xb = xu4[xrow16 + i * xw + 1u];
                }
            }
            let ones = 0x01010101u;
            let sq = f32(dot4I8Packed(xa.x, ones) + dot4I8Packed(xa.y, ones)
                + dot4I8Packed(xa.z, ones) + dot4I8Packed(xa.w, ones)
                + dot4I8Packed(xb.x, ones) + dot4I8Packed(xb.y, ones)
                + dot4I8Packed(xb.z, ones) + dot4I8Packed(xb.w, ones));
            acc.x += int_dot(r0, quads, i, xa, xb, sq);
            if RPT > 1u {
                acc.y += int_dot(r1, quads, i, xa, xb, sq);
            }
            if RPT > 2u {
                acc.z += int_dot(r2, quads, i, xa, xb, sq);
                acc.w += int_dot(r3, quads, i, xa, xb, sq);
            }
        }
    }
    for (var i = lane; i < quads && !INT_X; i += TEAM) {
        var xs: array<vec4<f32>, 8>;
        let x0 = xrow + i * xq;
        xs[0] = bitcast<vec4<f32>>(xu4[x0]);
        var sum4 = xs[0];
        if KIND != 0u {
            xs[1] = bitcast<vec4<f32>>(xu4[x0 + 1u]);
            xs[2] = bitcast<vec4<f32>>(xu4[x0 + 2u]);
            xs[3] = bitcast<vec4<f32>>(xu4[x0 + 3u]);
            sum4 += xs[1] + xs[2] + xs[3];
        }
        if KIND == 1u {
            xs[4] = bitcast<vec4<f32>>(xu4[x0 + 4u]);
            xs[5] = bitcast<vec4<f32>>(xu4[x0 + 5u]);
            xs[6] = bitcast<vec4<f32>>(xu4[x0 + 6u]);
            xs[7] = bitcast<vec4<f32>>(xu4[x0 + 7u]);
            sum4 += xs[4] + xs[5] + xs[6] + xs[7];
        }
        let sx = dot(sum4, vec4<f32>(1.0));
        acc.x += quad_dot(r0, quads, i, xs, sx);
        if RPT > 1u {
            acc.y += quad_dot(r1, quads, i, xs, sx);
        }
        if RPT > 2u {
            acc.z += quad_dot(r2, quads, i, xs, sx);
            acc.w += quad_dot(r3, quads, i, xs, sx);
        }
    }
    return team_sum(acc, t, lane);
}

// #if norm
// `linear_norm`: x is the one row of an rms_norm (weight nw where NORM_W; its chain's other
// input, if any, bound at 8 where CHAIN_X binds y2) that only this linear quantizes: every
// workgroup norms the row as rms_norm.wgsl's `main4_quant` does (NORM_WG invocations summing
// runs of NORM_LANES lanes: the same bits), the first stores it (ny) for the norm's other
// readers, and the teams take its int8 words from workgroup memory. The norm is not dispatched
// (src/gpu/ops.rs `norm_loaded`). Needs K / 4 <= NORM_WG <= WG.
override NORM_W: bool = false;
override NORM_CHAIN: bool = false;
// norm_sum.wgsl's: the norm's workgroup and lanes (as its own dispatch would have them).
override NORM_WG: u32 = 256u;
override NORM_LANES: u32 = 1u;
@group(0) @binding(9) var<storage, read_write> ny: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read> nw: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn matvec_normed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) t: u32) {
    let wgi = quad_grid(wg, nwg).x;
    norm_row(wgi == 0u, t);
    store_rows(wgi, 0u, t, team_sums(wgi, 0u, t, array<vec4<u32>, 2>()));
}

// The norm's row into chain_row and chain_words (and ny where `store`).
fn norm_row(store: bool, t: u32) {
    let d4 = p.k / 4u;
    // Weight and chain operand loaded with x, before the reduction (as main4_quant does).
    var first = vec4<f32>();
    var w_first = vec4<f32>(1.0);
    var z = vec4<f32>();
    if t < d4 {
        first = bitcast<vec4<f32>>(xu4[t]);
        if NORM_W {
            w_first = nw[t];
        }
        if NORM_CHAIN {
            let e = 4u * t;
            z = vec4<f32>(y2[e], y2[e + 1u], y2[e + 2u], y2[e + 3u]);
        }
    }
    let r = 1.0 / sqrt(workgroup_sum(dot(first, first), t) / f32(p.k) + p.eps);
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    if t < d4 {
        var v = first * r;
        if NORM_W {
            v *= w_first;
        }
        if NORM_CHAIN {
            let ni = p.norm_input;
            v = vec4<f32>(chain_around(v.x, vec2<f32>(z.x, 0.0), ni, p.words),
                          chain_around(v.y, vec2<f32>(z.y, 0.0), ni, p.words),
                          chain_around(v.z, vec2<f32>(z.z, 0.0), ni, p.words),
                          chain_around(v.w, vec2<f32>(z.w, 0.0), ni, p.words));
        }
        if store {
            ny[t] = v;
        }
        chain_row[t] = v;
        lo = min(lo, v);
        hi = max(hi, v);
    }
    pack_chain_row(lo, hi, t);
}

// #endif

@compute @workgroup_size(TPR, RPW)
fn matvec_f32(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
    let lane = lid.x;
    let t = lid.y * TPR + lane;
    let row = (wg.x + wg.y * nwg.x) * RPW + lid.y;
    let m = wg.z;
    var acc = 0.0;
    if row < p.n {
        for (var i = lane; i < p.k; i += TPR) {
            acc += x[m * p.k + i] * bitcast<f32>(w[row * p.k + i]);
        }
    }
    red[t] = acc;
    workgroupBarrier();
    reduce_rows(t, lane);
    finish(row, m, lane, t);
}

// ---- tiled ----

const BM = 64u;
const BN = 64u;
const BK = 16u;

// 16-byte words, so that an invocation's 4 rows (or columns) of a k are one shared-memory load.
var<workgroup> xs: array<vec4<f32>, 256>; // [BK][BM / 4]
var<workgroup> ws: array<vec4<f32>, 256>; // [BK][BN / 4]

fn byte_at(b: u32) -> u32 {
    return (w[b / 4u] >> ((b % 4u) * 8u)) & 0xffu;
}

// Dequantized W[n, k] of this chunk, zero outside it.
fn weight(n: u32, k: u32) -> f32 {
    if n >= p.n || k >= p.k {
        return 0.0;
    }
    if KIND == 0u {
        return bitcast<f32>(w[n * p.k + k]);
    }
    var q: f32;
    if KIND == 1u {
        let byte = byte_at(n * (p.k / 2u) + k / 2u);
        q = f32((byte >> ((k % 2u) * 4u)) & 0xfu);
    } else {
        q = f32(extractBits(i32(byte_at(n * p.k + k)), 0u, 8u));
    }
    let g = n * p.groups + k / GROUP;
    return scales[g] * q + bias_at(g);
}

// tiled: the next K slice's x and W are loaded into registers while this slice's products run
// (loading, then computing, cost one memory latency per 16-deep slice), and quantized W by whole
// words where K and the group allow (WORDS): one load of a word and of its group's scale and
// bias per 8 (4-bit) or 4 (8-bit) weights, where `weight` loads all three per weight.
override WORDS: bool = false;

var<private> px: array<f32, 4>;
var<private> pw: array<f32, 4>;
var<private> pword: u32;
var<private> pscale: f32;
var<private> pbias: f32;

// Weights a packed word holds, and the words of one row in a K slice.
fn per_word() -> u32 {
    return select(4u, 8u, KIND == 1u);
}

fn load_slice(m0: u32, n0: u32, k0: u32, t: u32) {
    for (var j = 0u; j < 4u; j++) {
        // Consecutive invocations read consecutive k of one row: coalesced in x and W.
        let e = t + j * 256u;
        let r = e / BK;
        let k = k0 + e % BK;
        let m = m0 + r;
        px[j] = 0.0;
        if m < p.m && k < p.k {
            px[j] = x[m * p.k + k];
        }
        if !WORDS {
            pw[j] = weight(n0 + r, k);
        }
    }
    let per = per_word();
    if WORDS && t < BN * (BK / per) {
        let n = n0 + t / (BK / per);
        let k = k0 + (t % (BK / per)) * per;
        pword = 0u;
        pscale = 0.0;
        pbias = 0.0;
        if n < p.n && k < p.k {
            pword = w[(n * p.k + k) / per];
            let g = n * p.groups + k / GROUP;
            pscale = scales[g];
            pbias = bias_at(g);
        }
    }
}

fn store_slice(t: u32) {
    for (var j = 0u; j < 4u; j++) {
        let e = t + j * 256u;
        xs[(e % BK) * (BM / 4u) + e / BK / 4u][(e / BK) % 4u] = px[j];
        if !WORDS {
            ws[(e % BK) * (BN / 4u) + e / BK / 4u][(e / BK) % 4u] = pw[j];
        }
    }
    let per = per_word();
    if WORDS && t < BN * (BK / per) {
        let r = t / (BK / per);
        let kk = (t % (BK / per)) * per;
        for (var i = 0u; i < per; i++) {
            var q: f32;
            if KIND == 1u {
                q = f32((pword >> (4u * i)) & 0xfu);
            } else {
                q = f32(extractBits(i32(pword), 8u * i, 8u));
            }
            ws[(kk + i) * (BN / 4u) + r / 4u][r % 4u] = pscale * q + pbias;
        }
    }
}

@compute @workgroup_size(16, 16)
fn tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(local_invocation_index) t: u32) {
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    var acc: array<vec4<f32>, 4>;
    load_slice(m0, n0, 0u, t);
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        store_slice(t);
        workgroupBarrier();
        if k0 + BK < p.k {
            load_slice(m0, n0, k0 + BK, t);
        }
        for (var kk = 0u; kk < BK; kk++) {
            let a = xs[kk * (BM / 4u) + lid.y];
            let b = ws[kk * (BN / 4u) + lid.x];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    // Constant indices into acc: indexed by a loop variable it may leave registers.
    put_row(m0 + lid.y * 4u, n0 + lid.x * 4u, acc[0]);
    put_row(m0 + lid.y * 4u + 1u, n0 + lid.x * 4u, acc[1]);
    put_row(m0 + lid.y * 4u + 2u, n0 + lid.x * 4u, acc[2]);
    put_row(m0 + lid.y * 4u + 3u, n0 + lid.x * 4u, acc[3]);
}

// Outputs (m, n0..n0 + 4) of the tiled kernel.
fn put_row(m: u32, n0: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        let n = n0 + j;
        if m < p.m && n < p.n {
            var o = v[j];
            if HAS_BIAS {
                o += bias[p.n0 + n];
            }
            put(m, n, o);
        }
    }
}

// ---- xnn_gemm: XNNPACK's qd8-f32-qb4w / qd8-f32-qc8w arithmetic, bit for bit ----
// x comes from act_quant_packed (XNN_ROUNDING). Per output, as the CPU reference
// (src/ir/cpu.rs `linear_qd8`, measured against ExecuTorch's XNNPACK runtime) computes it: exact
// integer sums, then float terms added in a fixed order, so the result does not depend on how
// the integer work is spread over invocations. 4-bit (w = n - 8; activations unsigned,
// u = q + 128, zpu = zp + 128):
//   ksum = Σ over runs of 16 columns, in order: ksum - f32(Σ w) · s_g
//   y = ksum · zpu;  y = fma(f32(Σ u·w over g), s_g, y)  for each group g in order
// 8-bit (signed bytes, u = q, runs of one group, y + f32(Σ u·w) · s_g unfused). Then
//   rest_g = b_g + 8·s_g (0 for symmetric weights);  r += rest_g · f32(Σ (u - zpu) over g)
//   out = (y + r) · (1 / multiplier) (+ bias)
// A workgroup owns XR weight rows and XM rows of x (prefill reads each weight once for XM
// rows). Groups go XC at a time through shared memory: the integer sums of every (row, group)
// pair spread over the invocations, then XR · XM invocations add the float terms in order.
// When all groups fit in one chunk, ksum's run sums come from the same pass; otherwise a
// first, weight-only pass computes ksum.
// Needs GROUP % 8 == 0 (4-bit) or % 4 (8-bit).
override XR: u32 = 8u;
// (At most 8: the per-invocation sums are fixed-size arrays.)
override XM: u32 = 1u;
override XC: u32 = 32u;
// ksum runs per group: GROUP / 16 for 4-bit weights with GROUP % 16 == 0, else 1.
override RPG: u32 = 1u;

// Per (row, x row, group of the chunk): Σ q·n (4-bit, raw nibbles) or Σ q·w (8-bit).
var<workgroup> xnn_qn: array<i32, XR * XM * XC>;
// Per (row, group): Σ n (4-bit) or Σ w (8-bit); per (x row, group): Σ q.
var<workgroup> xnn_n: array<i32, XR * XC>;
var<workgroup> xnn_sq: array<i32, XM * XC>;
// Per (row, run): Σ w of the run (w = n - 8 for 4-bit).
var<workgroup> xnn_ws: array<i32, XR * XC * RPG>;

fn x_word(i: u32) -> u32 {
    return xu4[i / 4u][i % 4u];
}

// Columns per ksum run: 16 for 4-bit weights (how XNNPACK's packing sums them), else a group.
fn xnn_run() -> u32 {
    return GROUP / RPG;
}

// Σ w over run `u` of weight row `row`.
fn xnn_wsum(row: u32, u: u32) -> i32 {
    let ones = 0x01010101u;
    let run = xnn_run();
    var sw = 0;
    if KIND == 1u {
        let m4 = 0x0f0f0f0fu;
        let w0 = row * (p.k / 8u) + u * (run / 8u);
        for (var j = 0u; j < run / 8u; j++) {
            let wv = w[w0 + j];
            sw += i32(dot4U8Packed((wv & m4) + ((wv >> 4u) & m4), ones));
        }
        return sw - 8 * i32(run);
    }
    let w0 = row * (p.k / 4u) + u * (run / 4u);
    for (var j = 0u; j < run / 4u; j++) {
        sw += dot4I8Packed(w[w0 + j], ones);
    }
    return sw;
}

// Σ q of group g of x row m (XM rows from m0, the last repeated past p.m) into xnn_sq slot c.
fn xnn_qsum(mm: u32, g: u32, c: u32, m0: u32) {
    let ones = 0x01010101u;
    let xr = min(m0 + mm, p.m - 1u) * (p.k / 4u);
    var sq = 0;
    for (var j = g * (GROUP / 4u); j < (g + 1u) * (GROUP / 4u); j++) {
        sq += dot4I8Packed(x_word(xr + j), ones);
    }
    xnn_sq[mm * XC + c] = sq;
}

// The integer sums of group g of weight row `row` (slot r) against the XM x rows into slot c,
// and the group's ksum run sums.
fn xnn_group(row: u32, r: u32, g: u32, c: u32, m0: u32) {
    let ones = 0x01010101u;
    var qn: array<i32, 8>;
    var sn = 0;
    var run_sum = 0;
    let m4 = 0x0f0f0f0fu;
    // 4-bit: 8 nibbles a word; act_quant_packed stored each 8 activations as (0, 2, 4, 6),
    // (1, 3, 5, 7), the order of a word's low and high nibbles once masked.
    let per_word = select(4u, 8u, KIND == 1u);
    let words = GROUP / per_word;
    let run_words = words / RPG;
    let w0 = row * (p.k / per_word) + g * words;
    for (var j = 0u; j < words; j++) {
        let wv = w[w0 + j];
        let lo = wv & m4;
        let hi = (wv >> 4u) & m4;
        var wn: i32;
        if KIND == 1u {
            wn = i32(dot4U8Packed(lo + hi, ones));
        } else {
            wn = dot4I8Packed(wv, ones);
        }
        sn += wn;
        run_sum += wn;
        // (Computed at load where KSUMS.)
        if !KSUMS && (j + 1u) % run_words == 0u {
            let zero = select(0, 8 * i32(GROUP / RPG), KIND == 1u);
            xnn_ws[(r * XC + c) * RPG + j / run_words] = run_sum - zero;
            run_sum = 0;
        }
        for (var mm = 0u; mm < XM; mm++) {
            let xr = min(m0 + mm, p.m - 1u) * (p.k / 4u);
            if KIND == 1u {
                let xi = xr + 2u * (g * words + j);
                qn[mm] += dot4I8Packed(lo, x_word(xi)) + dot4I8Packed(hi, x_word(xi + 1u));
            } else {
                qn[mm] += dot4I8Packed(wv, x_word(xr + g * words + j));
            }
        }
    }
    for (var mm = 0u; mm < XM; mm++) {
        xnn_qn[(r * XM + mm) * XC + c] = qn[mm];
    }
    xnn_n[r * XC + c] = sn;
}

// A zero the compiler cannot see (written to shared memory at run time): XOR-ing a value's bits
// with it makes a new value to every optimiser. Without it Mesa's inexact algebraic rules turn
// (a + b) - a into b, which leaves TwoSum's error term 0 (lavapipe then computed plain a·b + c
// in 52 of 576 probes), and a compiler may fuse a product into a following add.
var<workgroup> xnn_zero_shared: u32;
var<private> xnn_zero: u32;

fn opq(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ xnn_zero);
}

// (s, e) with s = RN(a + b) and s + e = a + b exactly (Knuth's TwoSum).
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = opq(a + b);
    let bb = opq(s - a);
    return vec2<f32>(s, (a - opq(s - bb)) + (b - bb));
}

// x as hi + lo, each of at most 12 significant bits (products of two such are exact).
fn split12(x: f32) -> vec2<f32> {
    let hi = bitcast<f32>(bitcast<u32>(x) & 0xfffff000u);
    return vec2<f32>(hi, x - hi);
}

// a · b + c rounded once. WGSL's fma() is not fused everywhere (lavapipe lowers it to a multiply
// and an add), and XNNPACK's blockwise kernels accumulate with a fused multiply-add. Dekker's
// exact product (ph + pl), Knuth's TwoSum with c, then Boldo and Melquiond's rounding to odd of
// the low parts before the final add: correctly rounded for finite, non-underflowing values,
// and the same bits on every GPU (each step is exact or one rounding, fused or not).
fn fma_rn(a: f32, b: f32, c: f32) -> f32 {
    let ph = opq(a * b);
    let sa = split12(a);
    let sb = split12(b);
    let pl = opq(opq(opq(sa.x * sb.x) - ph) + opq(sa.x * sb.y) + opq(sa.y * sb.x))
        + opq(sa.y * sb.y);
    let t = two_sum(c, ph);
    let lo = two_sum(t.y, opq(pl));
    var v = lo.x;
    if lo.y != 0.0 && (bitcast<u32>(v) & 1u) == 0u {
        // Round to odd: the neighbour on the exact sum's side has the odd last bit.
        if (lo.y > 0.0) == (v > 0.0) {
            v = bitcast<f32>(bitcast<u32>(v) + 1u);
        } else {
            v = bitcast<f32>(bitcast<u32>(v) - 1u);
        }
    }
    return t.x + v;
}


@compute @workgroup_size(WG)
fn xnn_gemm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
    let row0 = (wg.x + wg.y * nwg.x) * XR;
    let m0 = wg.z * XM;
    let last = p.n - 1u;
    // Invocation t < XR · XM adds the terms of weight row r for x row mm.
    let r = t / XM;
    let mm = t % XM;
    let m = min(m0 + mm, p.m - 1u);
    let mine = min(row0 + r, last);
    let pr = p.m * p.k / 4u + 2u * m;
    let inv = bitcast<f32>(x_word(pr));
    let zp = bitcast<f32>(x_word(pr + 1u));
    let four = KIND == 1u;
    let zero = select(0.0, 8.0, four);
    let zpu = zp + select(0.0, 128.0, four);
    let run = xnn_run();
    // (Products below go through opq so that no compiler fuses them into their adds.)
    if t == 0u {
        xnn_zero_shared = 0u;
    }
    workgroupBarrier();
    xnn_zero = xnn_zero_shared;
    let one_chunk = p.groups <= XC;
    // ksum starts y: over several chunks it takes its own weight-only pass first (unless it
    // comes computed).
    var ksum = 0.0;
    if KSUMS && t < XR * XM {
        ksum = ksums[p.n0 + mine];
    }
    for (var u0 = 0u; u0 < p.groups * RPG && !one_chunk && !KSUMS; u0 += XC * RPG) {
        let nc = min(XC * RPG, p.groups * RPG - u0);
        for (var i = t; i < XR * nc; i += WG) {
            xnn_ws[(i / nc) * XC * RPG + i % nc] = xnn_wsum(min(row0 + i / nc, last), u0 + i % nc);
        }
        workgroupBarrier();
        if t < XR * XM {
            for (var c = 0u; c < nc; c++) {
                let g = (u0 + c) / RPG;
                ksum -= opq(f32(xnn_ws[r * XC * RPG + c]) * scales[mine * p.groups + g]);
            }
        }
        workgroupBarrier();
    }
    var yv = 0.0;
    var rest_sum = 0.0;
    for (var g0 = 0u; g0 < p.groups; g0 += XC) {
        let nc = min(XC, p.groups - g0);
        for (var i = t; i < XM * nc; i += WG) {
            xnn_qsum(i / nc, g0 + i % nc, i % nc, m0);
        }
        for (var i = t; i < XR * nc; i += WG) {
            xnn_group(min(row0 + i / nc, last), i / nc, g0 + i % nc, i % nc, m0);
        }
        workgroupBarrier();
        if t < XR * XM {
            if one_chunk && !KSUMS {
                for (var u = 0u; u < nc * RPG; u++) {
                    ksum -= opq(f32(xnn_ws[r * XC * RPG + u]) * scales[mine * p.groups + u / RPG]);
                }
            }
            if g0 == 0u {
                yv = opq(ksum * zpu);
            }
            for (var c = 0u; c < nc; c++) {
                let qn = xnn_qn[t * XC + c];
                let sq = xnn_sq[mm * XC + c];
                let gi = mine * p.groups + g0 + c;
                let s = scales[gi];
                if four {
                    // Σ (q + 128)·(n - 8) from Σ q·n, Σ q and Σ n.
                    let uw = qn - 8 * sq + 128 * (xnn_n[r * XC + c] - 8 * i32(GROUP));
                    if FMA_NATIVE {
                        yv = fma(f32(uw), s, yv);
                    } else {
                        yv = fma_rn(f32(uw), s, yv);
                    }
                } else {
                    yv += opq(f32(qn) * s);
                }
                let rest = bias_at(gi) + opq(zero * s);
                if rest != 0.0 {
                    rest_sum += opq(rest * f32(sq - i32(zp) * i32(GROUP)));
                }
            }
        }
        workgroupBarrier();
    }
    if t < XR * XM && row0 + r < p.n && m0 + mm < p.m {
        // (Not fused with the bias add: NVIDIA's compiler contracts such pairs.)
        var v = opq((yv + rest_sum) * inv);
        if HAS_BIAS {
            v += bias[p.n0 + row0 + r];
        }
        xnn_put(m, row0 + r, v);
    }
}

// ---- xnn_matvec: xnn_gemm's arithmetic for one row of x (decode), 4-bit weights ----
// The same exact integer sums and the same float terms in the same order as xnn_gemm, so the
// same bits, laid out for a single x row: a workgroup owns XR weight rows; each 16-byte quad of
// weights is one invocation's (consecutive invocations read consecutive quads, and the x words
// they meet), its integer sums added to its (row, group)'s by subgroup shuffles, or atomics in
// shared memory (integers: any order gives the same sums); then XR invocations add each row's
// float terms in order onto its ksum · zero point. The ksums (Σ over each 16 columns, in order,
// of -(Σ w) · scale, which depend on the weights alone) come computed at load
// (src/gpu/ksums.rs). Needs GROUP % 32 == 0; XG = K / GROUP groups a row.
override XG: u32 = 1u;
// The subgroup's lanes (1 without subgroups): a group's quads add by shuffles where they fit.
override XSG: u32 = 1u;

// Per (row, group) at row · XS + group, XS = XG | 1: an odd stride, so that the XR invocations
// adding rows' terms read different banks.
override XS: u32 = 1u;
var<workgroup> xv_uw: array<atomic<i32>, XR * XS>;
var<workgroup> xv_ui: array<i32, XR * XS>;
var<workgroup> xv_s: array<f32, XR * XS>;
var<workgroup> xv_sq: array<i32, XG>;

// Weight row of this workgroup's row r (of XR). GLU (a gate/up pair storing its chain, as
// `glu_store`): the first XR / 2 are the gate's rows from row0 / 2, the rest the up's same rows.
fn xnn_row(row0: u32, r: u32) -> u32 {
    if GLU {
        let half = XR / 2u;
        let g = min(row0 / 2u + r % half, p.split - 1u);
        return select(g, p.split + g, r >= half);
    }
    return min(row0 + r, p.n - 1u);
}

// x's 16-byte word i: act_quant_packed's, or (CHAIN_X, NORM_X) the chain's or the norm's row
// quantized in workgroup memory.
fn xnn_x4(i: u32) -> vec4<u32> {
    if CHAIN_X || NORM_X {
        return vec4<u32>(chain_words[4u * i], chain_words[4u * i + 1u], chain_words[4u * i + 2u],
                         chain_words[4u * i + 3u]);
    }
    return xu4[xnn_m * (p.k / 16u) + i];
}

// The row of x this workgroup takes (`xnn_matvec_rows`; 0 for one row).
var<private> xnn_m: u32 = 0u;

// Σ (q + 128)·(n - 8) over a weight quad and the two x quads it meets (word j of the quad meets
// x words 2j and 2j + 1: act_quant_packed's nibble order).
fn xnn_term(wv: vec4<u32>, xa: vec4<u32>, xb: vec4<u32>) -> i32 {
    let ones = 0x01010101u;
    let m4 = 0x0f0f0f0fu;
    var ws = array<u32, 4>(wv.x, wv.y, wv.z, wv.w);
    var xs = array<u32, 8>(xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w);
    var qn = 0;
    var sn = 0;
    var sq = 0;
    for (var j = 0u; j < 4u; j++) {
        let lo = ws[j] & m4;
        let hi = (ws[j] >> 4u) & m4;
        qn += dot4I8Packed(lo, xs[2u * j]) + dot4I8Packed(hi, xs[2u * j + 1u]);
        sn += i32(dot4U8Packed(lo + hi, ones));
        sq += dot4I8Packed(xs[2u * j], ones) + dot4I8Packed(xs[2u * j + 1u], ones);
    }
    return qn + 128 * sn - 8 * sq - 1024 * 32;
}

// Quad u's term v onto its (row, group)'s sum: by shuffles over the group's lanes, or atomics.
// Every lane of the workgroup calls it together (the shuffles).
fn xnn_add(u: u32, quads: u32, total: u32, shuffled: bool, v: i32) {
    let qg = GROUP / 32u;
    let r = u / quads;
    let c = u % quads;
    var s = v;
    if shuffled {
        // #if subgroups
        for (var d = 1u; d < qg; d *= 2u) {
            s += subgroupShuffleXor(s, d);
        }
        // #endif
        if u < total && c % qg == 0u {
            xv_ui[r * XS + c / qg] = s;
        }
    } else if u < total {
        atomicAdd(&xv_uw[r * XS + c / qg], s);
    }
}

// Row t's output (t < XR; 0 for the other invocations), bias aside. Every invocation calls it
// (barrier). CHAIN_X: after `chain_quad`. Each quad's integer term is whole (its Σ q too), so a
// group's quads add by subgroup shuffles where they share a run of lanes (one barrier, none
// before the weight loads), else by shared-memory atomics.
fn xnn_rows(row0: u32, t: u32) -> f32 {
    let ones = 0x01010101u;
    // x: K / 4 int8 words, then (1 / multiplier, zero point) (act_quant_packed).
    let xq = GROUP / 16u;
    // Quads a group; quads a row: K / 32 (8 nibbles a word).
    let qg = GROUP / 32u;
    let quads = p.k / 32u;
    let shuffled = XSG >= qg && (qg & (qg - 1u)) == 0u;
    if t == 0u {
        xnn_zero_shared = 0u;
    }
    // The row's ksum and x's parameters, loaded before the weights so that their latency
    // runs under the sums rather than after the barrier.
    var ks = 0.0;
    var inv = 0.0;
    var zp = 0.0;
    if !CHAIN_X && !NORM_X {
        // (After all of x's rows: act_quant_packed's layout.)
        let pr = p.m * p.k / 4u + 2u * xnn_m;
        inv = bitcast<f32>(x_word(pr));
        zp = bitcast<f32>(x_word(pr + 1u));
    }
    if t < XR {
        ks = ksums[p.n0 + xnn_row(row0, t)];
    }
    if !shuffled {
        for (var i = t; i < XR * XS; i += WG) {
            atomicStore(&xv_uw[i], 0);
        }
    }
    // The rows' scales, ahead of the terms that add them in order: an invocation's first in a
    // register until the sums are done (a store to shared memory would wait for its load
    // before the weights' loads go out), any others stored at once.
    let own = t < XR * XG;
    var scale = 0.0;
    if own {
        scale = scales[xnn_row(row0, t / XG) * p.groups + t % XG];
    }
    for (var i = t + WG; i < XR * XG; i += WG) {
        xv_s[(i / XG) * XS + i % XG] = scales[xnn_row(row0, i / XG) * p.groups + i % XG];
    }
    if !DERIVED_BIAS {
        for (var g = t; g < XG; g += WG) {
            var sq = 0;
            for (var j = 0u; j < xq; j++) {
                let v = xnn_x4(g * xq + j);
                sq += dot4I8Packed(v.x, ones) + dot4I8Packed(v.y, ones)
                    + dot4I8Packed(v.z, ones) + dot4I8Packed(v.w, ones);
            }
            xv_sq[g] = sq;
        }
    }
    if !shuffled {
        workgroupBarrier();
    }
    // Quad c meets x quads 2c and 2c + 1; every lane runs every pass (the shuffles). (Up to
    // four passes' loads issued before any sums, from private arrays, took a step 2.66 to 6.15
    // ms on an H200.)
    let total = XR * quads;
    for (var base = 0u; base < total; base += WG) {
        let u = base + t;
        var v = 0;
        if u < total {
            let c = u % quads;
            v = xnn_term(w4[xnn_row(row0, u / quads) * quads + c], xnn_x4(2u * c),
                         xnn_x4(2u * c + 1u));
        }
        xnn_add(u, quads, total, shuffled, v);
    }
    if own {
        xv_s[(t / XG) * XS + t % XG] = scale;
    }
    workgroupBarrier();
    xnn_zero = xnn_zero_shared;
    if t >= XR {
        return 0.0;
    }
    let r = t;
    let row = xnn_row(row0, r);
    if CHAIN_X || NORM_X {
        inv = s_x;
        zp = zp_x;
    }
    var yv = opq(ks * (zp + 128.0));
    var rest_sum = 0.0;
    for (var g = 0u; g < XG; g++) {
        let s = xv_s[r * XS + g];
        var uw = f32(xv_ui[r * XS + g]);
        if !shuffled {
            uw = f32(atomicLoad(&xv_uw[r * XS + g]));
        }
        if FMA_NATIVE {
            yv = fma(uw, s, yv);
        } else {
            yv = fma_rn(uw, s, yv);
        }
        // Biases of -8 · s (DERIVED_BIAS) leave b + 8 · s exactly 0.
        if !DERIVED_BIAS {
            let rest = biases[row * p.groups + g] + opq(8.0 * s);
            if rest != 0.0 {
                rest_sum += opq(rest * f32(xv_sq[g] - i32(zp) * i32(GROUP)));
            }
        }
    }
    return opq((yv + rest_sum) * inv);
}

var<workgroup> xv_out: array<f32, XR>;

// GLU: the chain of each gate row's output and its up row's, stored as `glu_store` does; returns
// the invocation's stored value (0 where it stores none). Every invocation calls it (barrier).
fn xnn_glu(row0: u32, t: u32, v: f32) -> f32 {
    if t < XR {
        xv_out[t] = v;
    }
    workgroupBarrier();
    let g = row0 / 2u + t;
    if t < XR / 2u && g < p.split {
        let a = xv_out[t];
        let z = xv_out[t + XR / 2u];
        let ins = vec3<f32>(select(z, a, GLU_FIRST), select(a, z, GLU_FIRST), 0.0);
        let c = apply_chain(ins.x, ins, p.words);
        y[g] = c;
        return c;
    }
    return 0.0;
}

@compute @workgroup_size(WG)
fn xnn_matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) t: u32) {
    let row0 = (wg.x + wg.y * nwg.x) * XR;
    // CHAIN_X: the chain of x and y2, quantized as act_quant_packed would (sets s_x, zp_x); only
    // where y2 does not take the ksums' binding (nor the ranges', `xnn_matvec_ranged`).
    // #if xnn_wide
    if CHAIN_X {
        chain_quad(t);
    }
    // #endif
    let v = xnn_rows(row0, t);
    if GLU {
        xnn_glu(row0, t, v);
        return;
    }
    if t < XR && row0 + t < p.n {
        var o = v;
        if HAS_BIAS {
            o += bias[p.n0 + row0 + t];
        }
        xnn_put(0u, row0 + t, o);
    }
}

// `xnn_matvec` for a prompt's rows of x, one a workgroup: x's row is the grid's fastest index,
// so that the workgroups reading one block of weight rows run together and find them cached
// (the same bits as `xnn_gemm`, which this replaces up to `quad_matvec_rows` rows).
@compute @workgroup_size(WG)
fn xnn_matvec_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) t: u32) {
    xnn_m = wg.x;
    let row0 = (wg.y + wg.z * nwg.y) * XR;
    let v = xnn_rows(row0, t);
    if t < XR && row0 + t < p.n && xnn_m < p.m {
        var o = v;
        if HAS_BIAS {
            o += bias[p.n0 + row0 + t];
        }
        xnn_put(xnn_m, row0 + t, o);
    }
}

// `xnn_matvec` with GLU whose stores also leave their range (as `matvec_ranged`), each
// workgroup on its own slot where there are enough. Only where the ksums do not take the ranges'
// binding.
// #if xnn_wide
@compute @workgroup_size(WG)
fn xnn_matvec_ranged(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) t: u32) {
    let wgi = wg.x + wg.y * nwg.x;
    let row0 = wgi * XR;
    let b = run_max(range_bits(xnn_glu(row0, t, xnn_rows(row0, t))));
    let at = p.range_at + 2u * (wgi % RANGE_SLOTS);
    if t % max(SG_LANES, 1u) == 0u && any(b != vec2<u32>(0u)) {
        atomicMax(&ranges[at], b.x);
        atomicMax(&ranges[at + 1u], b.y);
    }
}
// #endif

// #if norm
// `xnn_matvec` of the row the norm makes (as `matvec_normed`). After the
// overrides it reads (naga 30 fails on an override declared after its first use).
@compute @workgroup_size(WG)
fn xnn_matvec_normed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) t: u32) {
    let wgi = wg.x + wg.y * nwg.x;
    norm_row(wgi == 0u, t);
    let row0 = wgi * XR;
    let v = xnn_rows(row0, t);
    if t < XR && row0 + t < p.n {
        y[p.n0 + row0 + t] = v;
    }
}
// #endif
