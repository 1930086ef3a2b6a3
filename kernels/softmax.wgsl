// Softmax over the last dim. One workgroup per row: a max reduction, then a sum of exponentials,
// both shared-memory trees (WG must be a power of two).

struct Params {
    rows: u32,
    d: u32,
}

override WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let base = row * p.d;
    var m = bitcast<f32>(0xff800000u);
    for (var j = t; j < p.d; j += WG) {
        m = max(m, x[base + j]);
    }
    red[t] = m;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k / 2u) {
        if t < k {
            red[t] = max(red[t], red[t + k]);
        }
        workgroupBarrier();
    }
    let mx = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var j = t; j < p.d; j += WG) {
        let e = exp(x[base + j] - mx);
        y[base + j] = e;
        s += e;
    }
    red[t] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k / 2u) {
        if t < k {
            red[t] += red[t + k];
        }
        workgroupBarrier();
    }
    let inv = red[0];
    for (var j = t; j < p.d; j += WG) {
        y[base + j] = y[base + j] / inv;
    }
}
