// Mean or sum over a set of dims. One workgroup per output element: the kept dims locate the base offset,
// the reduced dims are walked in a shared-memory tree reduction (WG must be a power of two).

struct Params {
    n_out: u32,
    n_red: u32,
    kept_rank: u32,
    red_rank: u32,
    kept_shape: array<vec4<u32>, 2>,
    kept_strides: array<vec4<u32>, 2>,
    red_shape: array<vec4<u32>, 2>,
    red_strides: array<vec4<u32>, 2>,
}

override WG: u32 = 64u;
override MEAN: bool = true;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;

var<workgroup> red: array<f32, WG>;

// Offset of element i over the kept (`red` false) or reduced dims. The uniform is indexed in
// place: arrays passed by value are copied to the stack per call on CPU drivers.
fn offset(i: u32, red: bool) -> u32 {
    var rem = i;
    var off = 0u;
    let rank = select(p.kept_rank, p.red_rank, red);
    for (var d = i32(rank) - 1; d >= 0; d--) {
        let k = u32(d);
        var size = p.kept_shape[k / 4u][k % 4u];
        var stride = p.kept_strides[k / 4u][k % 4u];
        if red {
            size = p.red_shape[k / 4u][k % 4u];
            stride = p.red_strides[k / 4u][k % 4u];
        }
        let qr = divmod(rem, size);
        off += qr.y * stride;
        rem = qr.x;
    }
    return off;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let o = wg.x + wg.y * nwg.x;
    if o >= p.n_out {
        return;
    }
    let base = offset(o, false);
    var s = 0.0;
    for (var g = t; g < p.n_red; g += WG) {
        s += x[base + offset(g, true)];
    }
    red[t] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k / 2u) {
        if t < k {
            red[t] += red[t + k];
        }
        workgroupBarrier();
    }
    if t == 0u {
        if MEAN {
            y[o] = red[0] / f32(p.n_red);
        } else {
            y[o] = red[0];
        }
    }
}
