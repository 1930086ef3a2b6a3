// Batched a[.., M, K] @ b[.., K, N] with broadcast batch dims (up to 4); one workgroup z-slice
// per batch entry.
//   main  64x64 output tiles, 16-deep K slices in shared memory (`parts` + `ksum`: K split).
//   rows  few rows of a (decode attention: q·Kᵀ, p·V): 16 columns × KS K-slices per workgroup
//         and row; a tile of 64 rows would be almost all padding there, and 16 K-slices of one
//         load per step left a K = 1024 p·V a chain of 64 dependent loads (about 20 us per
//         decode matmul on an H100).
// Rows of a, b and y may be further apart than a row's length (`lda`, `ldb`, `ldy`): attention
// reads the heads of a [B, S, H, D] q, k and v, and writes such an output, in place.

struct Params {
    m: u32,
    k: u32,
    n: u32,
    batch_rank: u32,
    batch_shape: vec4<u32>,
    // Matrix strides (in elements) of a, b and y per batch dim; 0 where broadcast.
    a_strides: vec4<u32>,
    b_strides: vec4<u32>,
    y_strides: vec4<u32>,
    // Element strides between rows of a, of b as stored (N-rows when TRANS_B) and of y.
    lda: u32,
    ldb: u32,
    ldy: u32,
    // SPAN: the syms slot of the attention's start and the query count (see `span_end`).
    span_slot: u32,
    span_len: u32,
}

// b is stored transposed ([.., N, K]): b(k, n) at n·K + k.
override TRANS_B: bool = false;
// b is an f16 KV cache read in place (two f16 a word, src/gpu/memory.rs `Repr::F16`).
override B_F16: bool = false;
// Attention over a KV cache (`main` only; src/gpu/ops.rs `sdpa`): keys from start + S (causal:
// start + the tile's last row + 1) on hold nothing the query may see. 1: such output columns
// (scores) are left unwritten; 2: the K loop (over probabilities, 0 there) stops before them.
override SPAN: u32 = 0u;
override SPAN_CAUSAL: bool = false;
// Split K (`main`): KSPLIT workgroup z-slices per batch entry, each over its share of K's slices
// (of the keys a SPAN 2 tile sees), leave partial tiles in y, a scratch of [KSPLIT][batch][M][N];
// `ksum` adds them in order into the output. A chat turn's p·V has a few dozen 64x64 tiles, each
// a walk over the whole cache: too few workgroups, too long a chain.
override KSPLIT: u32 = 1u;

const BM = 64u;
const BN = 64u;
const BK = 16u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> a: array<f32>;
@group(0) @binding(4) var<storage, read> b: array<u32>;

var<workgroup> as_: array<f32, 1024>; // [BK][BM]

// Element i of b.
fn b_el(i: u32) -> f32 {
    if B_F16 {
        return unpack2x16float(b[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(b[i]);
}

// Element (k, n) of the b matrix at offset `o`.
fn b_at(o: u32, k: u32, n: u32) -> f32 {
    if TRANS_B {
        return b_el(o + n * p.ldb + k);
    }
    return b_el(o + k * p.ldb + n);
}

// Batch entries: the product of the batch dims.
fn batches() -> u32 {
    var nb = 1u;
    for (var d = 0u; d < p.batch_rank; d++) {
        nb *= p.batch_shape[d];
    }
    return nb;
}

// Element offsets of batch entry z in a, b and y.
fn batch_offsets(z: u32) -> vec3<u32> {
    var rem = z;
    var o = vec3<u32>(0u);
    for (var d = i32(p.batch_rank) - 1; d >= 0; d--) {
        let c = rem % p.batch_shape[d];
        rem = rem / p.batch_shape[d];
        o += c * vec3<u32>(p.a_strides[d], p.b_strides[d], p.y_strides[d]);
    }
    return o;
}

// SPAN: where the keys that rows m0.. of the tile may see end, at most `full`.
fn span_end(m0: u32, full: u32) -> u32 {
    var rows = p.span_len;
    if SPAN_CAUSAL {
        rows = min(m0 + BM, p.m);
    }
    return u32(clamp(syms[p.span_slot] + i32(rows), 0, i32(full)));
}

// K-slices per workgroup of `rows` (a power of two, 16 * KS invocations): enough that each
// invocation walks at most a few unrolled steps of 4 independent loads.
override KS: u32 = 16u;
var<workgroup> part_k: array<f32, 1024>; // [KS][16]

@compute @workgroup_size(16, KS)
fn rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = wg.x * 16u + lid.x;
    let m = wg.y;
    let o = batch_offsets(wg.z);
    var acc = vec4<f32>();
    if n < p.n {
        let arow = o.x + m * p.lda;
        // 16 consecutive n of one row of b per K-slice: 64-byte reads; 4 slices per step so that
        // 4 loads are in flight per invocation, not one dependent chain.
        var k = lid.y;
        for (; k + 3u * KS < p.k; k += 4u * KS) {
            acc += vec4<f32>(a[arow + k], a[arow + k + KS], a[arow + k + 2u * KS],
                             a[arow + k + 3u * KS])
                 * vec4<f32>(b_at(o.y, k, n), b_at(o.y, k + KS, n), b_at(o.y, k + 2u * KS, n),
                             b_at(o.y, k + 3u * KS, n));
        }
        for (; k < p.k; k += KS) {
            acc.x += a[arow + k] * b_at(o.y, k, n);
        }
    }
    part_k[lid.y * 16u + lid.x] = (acc.x + acc.y) + (acc.z + acc.w);
    workgroupBarrier();
    for (var s = KS / 2u; s > 0u; s = s / 2u) {
        if lid.y < s {
            part_k[lid.y * 16u + lid.x] += part_k[(lid.y + s) * 16u + lid.x];
        }
        workgroupBarrier();
    }
    if lid.y == 0u && n < p.n {
        y[o.z + m * p.ldy + n] = part_k[lid.x];
    }
}
// `rows` for b stored transposed: the 16 lanes of a column walk its K contiguously (64-byte
// reads), 4 independent loads per step; 16 columns per workgroup.
@compute @workgroup_size(16, 16)
fn rows_bt(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = wg.x * 16u + lid.y;
    let m = wg.y;
    let o = batch_offsets(wg.z);
    var acc = vec4<f32>();
    if n < p.n {
        let arow = o.x + m * p.lda;
        let bcol = o.y + n * p.ldb;
        var k = lid.x;
        for (; k + 48u < p.k; k += 64u) {
            acc += vec4<f32>(a[arow + k], a[arow + k + 16u], a[arow + k + 32u], a[arow + k + 48u])
                 * vec4<f32>(b_el(bcol + k), b_el(bcol + k + 16u), b_el(bcol + k + 32u),
                             b_el(bcol + k + 48u));
        }
        for (; k < p.k; k += 16u) {
            acc.x += a[arow + k] * b_el(bcol + k);
        }
    }
    part_k[lid.y * 16u + lid.x] = (acc.x + acc.y) + (acc.z + acc.w);
    workgroupBarrier();
    for (var s = 8u; s > 0u; s = s / 2u) {
        if lid.x < s {
            part_k[lid.y * 16u + lid.x] += part_k[lid.y * 16u + lid.x + s];
        }
        workgroupBarrier();
    }
    if lid.x == 0u && n < p.n {
        y[o.z + m * p.ldy + n] = part_k[lid.y * 16u];
    }
}

var<workgroup> bs: array<f32, 1024>; // [BK][BN]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    tile(wg, lid, t);
}

// `main` with its K split (KSPLIT > 1): an entry point of its own, so that a recording names it.
@compute @workgroup_size(16, 16)
fn parts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(local_invocation_index) t: u32) {
    tile(wg, lid, t);
}

// One 64x64 output tile of `main` (or its partial tile, KSPLIT > 1).
fn tile(wg: vec3<u32>, lid: vec3<u32>, t: u32) {
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let z = wg.z / KSPLIT;
    let o = batch_offsets(z);
    let ao = o.x;
    let bo = o.y;
    // Uniform in the workgroup: returning before the barriers is allowed.
    if SPAN == 1u && n0 >= span_end(m0, p.n) {
        return;
    }
    var kbeg = 0u;
    var kend = p.k;
    if SPAN == 2u {
        kend = span_end(m0, p.k);
    }
    var yo = o.z;
    var ldy = p.ldy;
    if KSPLIT > 1u {
        let part = wg.z % KSPLIT;
        let per = (kend + KSPLIT * BK - 1u) / (KSPLIT * BK) * BK;
        kbeg = min(part * per, kend);
        kend = min(kbeg + per, kend);
        yo = (part * batches() + z) * p.m * p.n;
        ldy = p.n;
    }
    var acc: array<vec4<f32>, 4>;
    for (var k0 = kbeg; k0 < kend; k0 += BK) {
        for (var e = t; e < BM * BK; e += 256u) {
            let r = e / BK;
            let kk = e % BK;
            var av = 0.0;
            if m0 + r < p.m && k0 + kk < kend {
                av = a[ao + (m0 + r) * p.lda + k0 + kk];
            }
            as_[kk * BM + r] = av;
            // b is row-major in N: consecutive invocations read consecutive n.
            let kb = e / BN;
            let c = e % BN;
            var bv = 0.0;
            if k0 + kb < kend && n0 + c < p.n {
                bv = b_at(bo, k0 + kb, n0 + c);
            }
            bs[kb * BN + c] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let av = vec4<f32>(as_[kk * BM + lid.y * 4u], as_[kk * BM + lid.y * 4u + 1u],
                               as_[kk * BM + lid.y * 4u + 2u], as_[kk * BM + lid.y * 4u + 3u]);
            let bv = vec4<f32>(bs[kk * BN + lid.x * 4u], bs[kk * BN + lid.x * 4u + 1u],
                               bs[kk * BN + lid.x * 4u + 2u], bs[kk * BN + lid.x * 4u + 3u]);
            acc[0] += av.x * bv;
            acc[1] += av.y * bv;
            acc[2] += av.z * bv;
            acc[3] += av.w * bv;
        }
        workgroupBarrier();
    }
    // Constant indices into acc: indexed by a loop variable it may leave registers (the same
    // change took the tiled linear from 313 to 823 prefill tok/s on an H100).
    put_row(yo, ldy, m0 + lid.y * 4u, n0 + lid.x * 4u, acc[0]);
    put_row(yo, ldy, m0 + lid.y * 4u + 1u, n0 + lid.x * 4u, acc[1]);
    put_row(yo, ldy, m0 + lid.y * 4u + 2u, n0 + lid.x * 4u, acc[2]);
    put_row(yo, ldy, m0 + lid.y * 4u + 3u, n0 + lid.x * 4u, acc[3]);
}

// Outputs (m, n0..n0 + 4) of the tile of the batch entry at `yo`, rows `ldy` apart.
fn put_row(yo: u32, ldy: u32, m: u32, n0: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        let n = n0 + j;
        if m < p.m && n < p.n {
            y[yo + m * ldy + n] = v[j];
        }
    }
}

// Split K's partial tiles (binding a: [KSPLIT][batch][M][N]) added in order into y: one
// invocation an output element.
@compute @workgroup_size(256)
fn ksum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + t;
    let mn = p.m * p.n;
    let nb = batches();
    if i >= nb * mn {
        return;
    }
    let z = i / mn;
    let r = i % mn;
    var sum = 0.0;
    for (var part = 0u; part < KSPLIT; part++) {
        sum += a[(part * nb + z) * mn + r];
    }
    y[batch_offsets(z).z + r / p.n * p.ldy + r % p.n] = sum;
}
