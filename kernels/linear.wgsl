// y[m, n] = x[m, :] · W[n, :] (+ bias[n]) with W f32, 4-bit or 8-bit, dequantized in registers:
// w = scale[n, g] * q + bias[n, g]. A weight larger than one storage binding is split by rows
// (src/gpu/memory.rs); each chunk is one dispatch writing output columns [n0, n0 + n).
//   act_quant  per-row dynamic int8 quantize-dequantize of x into a scratch buffer (8da4w), by
//              torchao's or XNNPACK's rounding (XNN_ROUNDING), as the CPU reference does.
//   matvec_q   few rows of x (decode): a workgroup per 8 outputs, reading packed u32 words and
//              vec4 activations; needs K % 8 == 0 (4-bit) or K % 4 == 0 (8-bit), which groups
//              of a multiple of 8 guarantee.
//   matvec_q_wide  the same reading 16-byte weight quads, for more bytes in flight per
//              invocation; needs a quad inside one group (group % 32 for 4-bit, % 16 for 8-bit).
//              The host picks it for 8-bit weights, where it measured faster.
//   matvec_f32 the same for f32 weights, coalesced scalar reads, any K.
//   tiled      many rows (prefill): 64x64 output tiles, 16-deep K slices in shared memory.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // Row stride of y (all of N) and this chunk's first output column.
    ldy: u32,
    n0: u32,
    groups: u32,
    _pad0: u32,
    _pad1: u32,
}

// act_quant: XNNPACK's qd8 rounding (x · (255 / range)) instead of torchao's (x / (range / 255)).
override XNN_ROUNDING: bool = false;
// 0: f32, 1: 4-bit, 2: 8-bit.
override KIND: u32 = 0u;
override GROUP: u32 = 32u;
override HAS_BIAS: bool = false;
// matvec: invocations per output (a power of two) and outputs per workgroup.
override TPR: u32 = 32u;
override RPW: u32 = 8u;
override WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> scales: array<f32>;
@group(0) @binding(6) var<storage, read> biases: array<f32>;
@group(0) @binding(7) var<storage, read> bias: array<f32>;

// ---- act_quant: one workgroup per row of x; writes y = quant_dequant(x) (same shape). ----

var<workgroup> red_lo: array<f32, WG>;
var<workgroup> red_hi: array<f32, WG>;

@compute @workgroup_size(WG)
fn act_quant(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.m {
        return;
    }
    let base = row * p.k;
    // The range always includes 0, as torchao's does.
    var lo = 0.0;
    var hi = 0.0;
    for (var j = t; j < p.k; j += WG) {
        lo = min(lo, x[base + j]);
        hi = max(hi, x[base + j]);
    }
    red_lo[t] = lo;
    red_hi[t] = hi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if t < s {
            red_lo[t] = min(red_lo[t], red_lo[t + s]);
            red_hi[t] = max(red_hi[t], red_hi[t + s]);
        }
        workgroupBarrier();
    }
    let lo_all = red_lo[0];
    let hi_all = red_hi[0];
    if XNN_ROUNDING {
        // XNNPACK multiplies by 255 / range and picks the zero point from whichever end of the
        // range it represents with less error; ties round differently from torchao's divide.
        var mul = 1.0;
        if lo_all != hi_all {
            mul = 255.0 / (hi_all - lo_all);
        }
        let lo_m = lo_all * mul;
        let hi_m = hi_all * mul;
        var zp = 127.0 - hi_m;
        if (-128.0 + lo_m) + (127.0 + hi_m) > 0.0 {
            zp = -128.0 - lo_m;
        }
        zp = round(clamp(zp, -128.0, 127.0));
        let inv = 1.0 / mul;
        for (var j = t; j < p.k; j += WG) {
            y[base + j] = round(clamp(x[base + j] * mul, -128.0 - zp, 127.0 - zp)) * inv;
        }
        return;
    }
    let scale = max((hi_all - lo_all) / 255.0, 1.1920929e-7);
    let zp = clamp(-128.0 - round(lo_all / scale), -128.0, 127.0);
    for (var j = t; j < p.k; j += WG) {
        let q = clamp(round(x[base + j] / scale) + zp, -128.0, 127.0);
        y[base + j] = (q - zp) * scale;
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
        y[m * p.ldy + p.n0 + row] = v;
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
        y[m * p.ldy + p.n0 + row0 + t] = v;
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
    return scales[g] * dq + biases[g] * sx;
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

// One row's share of a 16-byte weight quad (32 nibbles or 16 bytes, all in one group).
fn row_dot4(row: u32, quads: u32, i: u32, xrow: u32) -> f32 {
    let q = w4[row * quads + i];
    var dq: f32;
    var sx: f32;
    // Unrolled by hand: indexing the quad's components in a loop defeats register allocation.
    if KIND == 1u {
        let x0 = xrow + i * 8u;
        let a0 = x4[x0];
        let b0 = x4[x0 + 1u];
        let a1 = x4[x0 + 2u];
        let b1 = x4[x0 + 3u];
        let a2 = x4[x0 + 4u];
        let b2 = x4[x0 + 5u];
        let a3 = x4[x0 + 6u];
        let b3 = x4[x0 + 7u];
        dq = dot(a0, nibbles(q.x, 0u)) + dot(b0, nibbles(q.x, 16u)) + dot(a1, nibbles(q.y, 0u))
            + dot(b1, nibbles(q.y, 16u)) + dot(a2, nibbles(q.z, 0u)) + dot(b2, nibbles(q.z, 16u))
            + dot(a3, nibbles(q.w, 0u)) + dot(b3, nibbles(q.w, 16u));
        sx = dot(a0 + b0 + a1 + b1 + a2 + b2 + a3 + b3, vec4<f32>(1.0));
    } else {
        let x0 = xrow + i * 4u;
        let a0 = x4[x0];
        let a1 = x4[x0 + 1u];
        let a2 = x4[x0 + 2u];
        let a3 = x4[x0 + 3u];
        dq = dot(a0, signed_bytes(q.x)) + dot(a1, signed_bytes(q.y)) + dot(a2, signed_bytes(q.z))
            + dot(a3, signed_bytes(q.w));
        sx = dot(a0 + a1 + a2 + a3, vec4<f32>(1.0));
    }
    let per_quad = select(16u, 32u, KIND == 1u);
    let g = row * p.groups + i * per_quad / GROUP;
    return scales[g] * dq + biases[g] * sx;
}

@compute @workgroup_size(WG)
fn matvec_q_wide(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) t: u32) {
    let row0 = (wg.x + wg.y * nwg.x) * ROWS;
    let m = wg.z;
    let quads = p.k / select(16u, 32u, KIND == 1u);
    let xrow = m * p.k / 4u;
    let rows = min(ROWS, p.n - min(row0, p.n));
    let last = p.n - 1u;
    var acc_lo = vec4<f32>(0.0);
    var acc_hi = vec4<f32>(0.0);
    for (var i = t; i < quads; i += WG) {
        acc_lo += vec4<f32>(row_dot4(min(row0, last), quads, i, xrow),
                            row_dot4(min(row0 + 1u, last), quads, i, xrow),
                            row_dot4(min(row0 + 2u, last), quads, i, xrow),
                            row_dot4(min(row0 + 3u, last), quads, i, xrow));
        acc_hi += vec4<f32>(row_dot4(min(row0 + 4u, last), quads, i, xrow),
                            row_dot4(min(row0 + 5u, last), quads, i, xrow),
                            row_dot4(min(row0 + 6u, last), quads, i, xrow),
                            row_dot4(min(row0 + 7u, last), quads, i, xrow));
    }
    reduce_and_store(t, rows, row0, m, acc_lo, acc_hi);
}

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

var<workgroup> xs: array<f32, 1024>; // [BK][BM]
var<workgroup> ws: array<f32, 1024>; // [BK][BN]

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
    return scales[g] * q + biases[g];
}

@compute @workgroup_size(16, 16)
fn tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(local_invocation_index) t: u32) {
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var e = t; e < BM * BK; e += 256u) {
            // Consecutive invocations read consecutive k of one row: coalesced in x and W.
            let r = e / BK;
            let kk = e % BK;
            let m = m0 + r;
            let k = k0 + kk;
            var xv = 0.0;
            if m < p.m && k < p.k {
                xv = x[m * p.k + k];
            }
            xs[kk * BM + r] = xv;
            ws[kk * BN + r] = weight(n0 + r, k);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let a = vec4<f32>(xs[kk * BM + lid.y * 4u], xs[kk * BM + lid.y * 4u + 1u],
                              xs[kk * BM + lid.y * 4u + 2u], xs[kk * BM + lid.y * 4u + 3u]);
            let b = vec4<f32>(ws[kk * BN + lid.x * 4u], ws[kk * BN + lid.x * 4u + 1u],
                              ws[kk * BN + lid.x * 4u + 2u], ws[kk * BN + lid.x * 4u + 3u]);
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let m = m0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let n = n0 + lid.x * 4u + j;
            if m < p.m && n < p.n {
                var v = acc[i][j];
                if HAS_BIAS {
                    v += bias[p.n0 + n];
                }
                y[m * p.ldy + p.n0 + n] = v;
            }
        }
    }
}
