// Attention of q over the first kv_len = start + S rows of the k/v caches, `start` read from the
// syms buffer at run time (decode steps replay one recording). One workgroup per (query, head,
// batch); keys are visited in blocks of WG with an online softmax (running max and sum), the
// output accumulated in shared memory, so any kv_len runs in fixed memory. Layout, GQA and the
// cache length come in as strides; causal, window, softcap and mask as constants.

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
    _pad0: u32,
    _pad1: u32,
}

override WG: u32 = 64u;
override DMAX: u32 = 256u;
override CAUSAL: bool = false;
override WINDOW: bool = false;
override SOFTCAP: bool = false;
override HAS_MASK: bool = false;
// k / v are f16 KV caches read in place (two f16 a word, src/gpu/memory.rs `Repr::F16`).
override K_F16: bool = false;
override V_F16: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(2) var<storage, read_write> o: array<f32>;
@group(0) @binding(3) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read> k: array<u32>;
@group(0) @binding(5) var<storage, read> v: array<u32>;
@group(0) @binding(6) var<storage, read> mask: array<f32>;

var<workgroup> qs: array<f32, DMAX>;
var<workgroup> acc: array<f32, DMAX>;
var<workgroup> sc: array<f32, WG>;

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
    let start = syms[p.start_slot];
    let kv_len = clamp(start + i32(p.s), 0, i32(p.cache_len));
    let pos = start + i32(i);
    var hi = kv_len;
    if CAUSAL {
        hi = min(hi, pos + 1);
    }
    var lo = 0;
    if WINDOW {
        lo = max(0, pos - i32(p.window) + 1);
    }
    let qo = bb * p.q_strides.x + i * p.q_strides.y + h * p.q_strides.z;
    let ko = bb * p.kv_strides.x + kh * p.kv_strides.z;
    for (var e = t; e < p.d; e += WG) {
        qs[e] = q[qo + e];
        acc[e] = 0.0;
    }
    workgroupBarrier();
    var m = NEG_INF;
    var l = 0.0;
    for (var j0 = lo; j0 < hi; j0 += i32(WG)) {
        let j = j0 + i32(t);
        var s = NEG_INF;
        if j < hi {
            let kr = ko + u32(j) * p.kv_strides.y;
            var dotv = 0.0;
            for (var e = 0u; e < p.d; e++) {
                dotv += qs[e] * k_at(kr + e);
            }
            s = dotv * p.scale;
            if SOFTCAP {
                s = tanh(clamp(s / p.softcap, -15.0, 15.0)) * p.softcap;
            }
            if HAS_MASK {
                s += mask[i * p.mask_stride + u32(j)];
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
        let count = u32(min(i32(WG), hi - j0));
        for (var e = t; e < p.d; e += WG) {
            var a = acc[e] * alpha;
            for (var jj = 0u; jj < count; jj++) {
                a += sc[jj] * v_at(ko + u32(j0 + i32(jj)) * p.kv_strides.y + e);
            }
            acc[e] = a;
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var e = t; e < p.d; e += WG) {
        o[qo + e] = select(acc[e] / l, 0.0, l == 0.0);
    }
}
