// RMS norm over the last dim: y = x * rsqrt(mean(x²) + eps) * w. One workgroup per row; the sum of
// squares is a shared-memory tree reduction (WG must be a power of two).

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    _pad: u32,
}

override WG: u32 = 256u;
override HAS_W: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<f32>;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let base = row * p.d;
    var s = 0.0;
    for (var j = t; j < p.d; j += WG) {
        let v = x[base + j];
        s += v * v;
    }
    red[t] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k / 2u) {
        if t < k {
            red[t] += red[t + k];
        }
        workgroupBarrier();
    }
    let r = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
    for (var j = t; j < p.d; j += WG) {
        var v = x[base + j] * r;
        if HAS_W {
            v *= w[j];
        }
        y[base + j] = v;
    }
}
