// A row of logits reduced to its sampling candidates (src/runtime/candidates.rs says why and
// holds the reference): every logit at or above the k-th largest of the row's block maxima.
// `block_max` leaves one maximum a block; `gather` ranks them, and each block that reaches the
// threshold appends its logits that do to the list by an atomic count. The host reads the count
// and the list; past CAP logits it reads the row instead.
//
// `pick` (greedy decoding) finds the row's first largest logit from the blocks' maxima: the
// first block whose maximum is the row's, then the first logit in it equal to that.
//
// `draw` (sampled decoding) picks as src/llm/sampler.rs does from the candidates, in f32: their
// top k, softmax at the temperature, top-p, min-p, then the token where the cumulative
// probability passes the call's uniform number. The host checks it against its own f64 pick.
//
// `c`: [0] the count, then CAP (id, logit bits) pairs, then the pick (NONE where the row is all
// NaN, or the candidates cannot decide a draw), then the pick again or 0 (what a fed call reads
// as its token), then the draw's uniform number (f32 bits, written by the host before each
// call), then one maximum a block (its bits).

struct Params {
    // The row's first element in x, its length, k, CAP (the most pairs stored), and its
    // blocks; `draw`'s temperature, top-p and min-p; the pairs `c` has room for (where the
    // words after them start).
    row: u32,
    n: u32,
    k: u32,
    cap: u32,
    blocks: u32,
    temperature: f32,
    top_p: f32,
    min_p: f32,
    slots: u32,
}

const BLOCK: u32 = 1024u;
const WG: u32 = 256u;
// src/runtime/candidates.rs MAX_BLOCKS.
const MAX_BLOCKS: u32 = 2048u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> c: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read> x: array<f32>;

var<workgroup> red: array<f32, WG>;
var<workgroup> maxima: array<f32, MAX_BLOCKS>;
var<workgroup> thr: f32;

// The larger of m and v, NaN never (v > m is false for a NaN v, and m is never NaN).
fn larger(m: f32, v: f32) -> f32 {
    return select(m, v, v > m);
}

@compute @workgroup_size(256)
fn block_max(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let b = wg.x;
    var m = bitcast<f32>(0xff800000u);
    for (var j = 0u; j < BLOCK; j += WG) {
        let i = b * BLOCK + j + li;
        if i < p.n {
            m = larger(m, x[p.row + i]);
        }
    }
    red[li] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if li < s {
            red[li] = larger(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    if li == 0u {
        atomicStore(&c[4u + 2u * p.slots + b], bitcast<u32>(red[0]));
        // The count starts again each call; `gather` is the next dispatch.
        if b == 0u {
            atomicStore(&c[0], 0u);
        }
    }
}

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let b = wg.x;
    let NEG_INF = bitcast<f32>(0xff800000u);
    let base = 4u + 2u * p.slots;
    for (var i = li; i < p.blocks; i += WG) {
        maxima[i] = bitcast<f32>(atomicLoad(&c[base + i]));
    }
    if li == 0u {
        // Fewer than k blocks: every logit but -inf is a candidate.
        thr = NEG_INF;
    }
    workgroupBarrier();
    // Each maximum's rank (larger first, ties by block): the one ranked k - 1 is the threshold.
    for (var i = li; i < p.blocks; i += WG) {
        let m = maxima[i];
        var rank = 0u;
        for (var j = 0u; j < p.blocks; j++) {
            let o = maxima[j];
            rank += select(0u, 1u, o > m || (o == m && j < i));
        }
        if rank + 1u == p.k {
            thr = m;
        }
    }
    workgroupBarrier();
    let t = thr;
    if maxima[b] < t {
        return;
    }
    for (var j = 0u; j < BLOCK; j += WG) {
        let i = b * BLOCK + j + li;
        if i < p.n {
            let v = x[p.row + i];
            if v >= t && v != NEG_INF {
                let at = atomicAdd(&c[0], 1u);
                if at < p.cap {
                    atomicStore(&c[1u + 2u * at], i);
                    atomicStore(&c[2u + 2u * at], bitcast<u32>(v));
                }
            }
        }
    }
}

const NONE: u32 = 0xffffffffu;

var<workgroup> first_block: atomic<u32>;
var<workgroup> hit: atomic<u32>;
var<workgroup> hit_now: u32;

// One workgroup, after `block_max`: the first position of the row's largest logit, NaN never
// (src/runtime/candidates.rs `first_max`, the sampler's argmax).
@compute @workgroup_size(256)
fn pick(@builtin(local_invocation_index) li: u32) {
    let base = 4u + 2u * p.slots;
    var m = bitcast<f32>(0xff800000u);
    for (var i = li; i < p.blocks; i += WG) {
        let v = bitcast<f32>(atomicLoad(&c[base + i]));
        maxima[i] = v;
        m = larger(m, v);
    }
    red[li] = m;
    if li == 0u {
        atomicStore(&first_block, NONE);
        atomicStore(&hit, NONE);
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if li < s {
            red[li] = larger(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    let top = red[0];
    for (var i = li; i < p.blocks; i += WG) {
        if maxima[i] == top {
            atomicMin(&first_block, i);
        }
    }
    workgroupBarrier();
    // A block whose maximum is the row's holds it, unless that maximum is the -inf a block of
    // NaN starts from: then the whole row is searched below.
    let b = atomicLoad(&first_block);
    if b != NONE {
        for (var j = li; j < BLOCK; j += WG) {
            let i = b * BLOCK + j;
            if i < p.n && x[p.row + i] == top {
                atomicMin(&hit, i);
            }
        }
    }
    workgroupBarrier();
    if li == 0u {
        hit_now = atomicLoad(&hit);
    }
    if workgroupUniformLoad(&hit_now) == NONE {
        for (var i = li; i < p.n; i += WG) {
            if x[p.row + i] == top {
                atomicMin(&hit, i);
            }
        }
        workgroupBarrier();
    }
    if li == 0u {
        let h = atomicLoad(&hit);
        atomicStore(&c[1u + 2u * p.slots], h);
        atomicStore(&c[2u + 2u * p.slots], select(h, 0u, h == NONE));
    }
}

var<workgroup> keys: array<f32, 1024>;
var<workgroup> ids: array<u32, 1024>;
var<workgroup> order: array<u32, 1024>;
var<workgroup> count_now: u32;

// The draw's probability of the j-th best candidate before top-p and min-p: softmax over the top
// m at the temperature (the best's is exp(0)).
fn weight(j: u32) -> f32 {
    return exp((keys[order[j]] - keys[order[0]]) / p.temperature);
}

// One workgroup, after `gather`: a sampled pick from the candidates.
@compute @workgroup_size(256)
fn draw(@builtin(local_invocation_index) li: u32) {
    if li == 0u {
        count_now = atomicLoad(&c[0]);
    }
    let found = workgroupUniformLoad(&count_now);
    let at = 1u + 2u * p.slots;
    if found == 0u || found > p.cap {
        // Overflowed or empty: the host reads the row.
        if li == 0u {
            atomicStore(&c[at], NONE);
            atomicStore(&c[at + 1u], 0u);
        }
        return;
    }
    for (var i = li; i < found; i += WG) {
        ids[i] = atomicLoad(&c[1u + 2u * i]);
        keys[i] = bitcast<f32>(atomicLoad(&c[2u + 2u * i]));
    }
    workgroupBarrier();
    // Each candidate's rank: larger logit first, ties (signed zeros too) by the lower id.
    for (var i = li; i < found; i += WG) {
        let x = keys[i];
        var rank = 0u;
        for (var j = 0u; j < found; j++) {
            let y = keys[j];
            rank += select(0u, 1u, y > x || (y == x && ids[j] < ids[i]));
        }
        if rank < p.k {
            order[rank] = i;
        }
    }
    workgroupBarrier();
    if li != 0u {
        return;
    }
    let m = min(p.k, found);
    let u = bitcast<f32>(atomicLoad(&c[at + 2u]));
    var pick = ids[order[m - 1u]];
    if keys[order[0]] == bitcast<f32>(0x7f800000u) {
        // +inf takes all the mass, shared equally among the +inf logits.
        var q = 0u;
        while q < m && keys[order[q]] == keys[order[0]] {
            q++;
        }
        var acc = 0.0;
        for (var j = 0u; j < q; j++) {
            acc += 1.0 / f32(q);
            pick = ids[order[j]];
            if u < acc {
                break;
            }
        }
    } else {
        var sum = 0.0;
        for (var j = 0u; j < m; j++) {
            sum += weight(j);
        }
        // Top-p: the smallest run whose mass reaches it, the crossing token included.
        var keep = m;
        if p.top_p < 1.0 {
            var acc = 0.0;
            for (var j = 0u; j < m; j++) {
                acc += weight(j) / sum;
                if acc >= p.top_p {
                    keep = j + 1u;
                    break;
                }
            }
        }
        // Min-p against the best, then the kept mass renormalised.
        let floor = weight(0u) / sum * p.min_p;
        var kept = 0.0;
        for (var j = 0u; j < keep; j++) {
            let w = weight(j) / sum;
            if w >= floor {
                kept += w;
            }
        }
        var acc = 0.0;
        for (var j = 0u; j < keep; j++) {
            let w = weight(j) / sum;
            if w >= floor {
                acc += w / kept;
                pick = ids[order[j]];
                if u < acc {
                    break;
                }
            }
        }
    }
    atomicStore(&c[at], pick);
    atomicStore(&c[at + 1u], pick);
}
