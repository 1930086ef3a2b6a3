// RMS norm over the last dim: y = x * rsqrt(mean(x²) + eps) * w. One workgroup per row, sized
// to the row (about one element, or one vec4 in `main4`, per invocation): a decode step's norms
// are one to a few dozen rows, so a row's latency is the cost. Each invocation keeps its first
// element in registers for the second pass. The sum of squares is summed by subgroup shuffles
// over runs of SG_LANES lanes where the device has them, then a shared-memory tree (WG must be a
// power of two).

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    _pad: u32,
}

override WG: u32 = 256u;
override HAS_W: bool = false;
// Lanes summed by subgroup shuffles (a power of two up to the subgroup size; 1: none).
override SG_LANES: u32 = 1u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> y4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read> w4: array<vec4<f32>>;

var<workgroup> red: array<f32, WG>;

// The sum of `v` over the workgroup, in every invocation.
fn workgroup_sum(v: f32, t: u32) -> f32 {
    var s = v;
    // #if subgroups
    for (var k = SG_LANES / 2u; k > 0u; k = k / 2u) {
        s += subgroupShuffleXor(s, k);
    }
    // #endif
    let lanes = max(SG_LANES, 1u);
    if t % lanes == 0u {
        red[t / lanes] = s;
    }
    workgroupBarrier();
    for (var k = WG / lanes / 2u; k > 0u; k = k / 2u) {
        if t < k {
            red[t] += red[t + k];
        }
        workgroupBarrier();
    }
    return red[0];
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
        y[base + t] = v;
    }
    for (var j = t + WG; j < p.d; j += WG) {
        var v = x[base + j] * r;
        if HAS_W {
            v *= w[j];
        }
        y[base + j] = v;
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
    let d4 = p.d / 4u;
    let base = row * d4;
    var first = vec4<f32>();
    if t < d4 {
        first = x4[base + t];
    }
    var s = dot(first, first);
    for (var j = t + WG; j < d4; j += WG) {
        let v = x4[base + j];
        s += dot(v, v);
    }
    let r = 1.0 / sqrt(workgroup_sum(s, t) / f32(p.d) + p.eps);
    if t < d4 {
        var v = first * r;
        if HAS_W {
            v *= w4[t];
        }
        y4[base + t] = v;
    }
    for (var j = t + WG; j < d4; j += WG) {
        var v = x4[base + j] * r;
        if HAS_W {
            v *= w4[j];
        }
        y4[base + j] = v;
    }
}
