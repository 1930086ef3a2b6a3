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

fn at(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
}

fn offset(i: u32, rank: u32, shape: array<vec4<u32>, 2>, strides: array<vec4<u32>, 2>) -> u32 {
    var rem = i;
    var off = 0u;
    for (var d = i32(rank) - 1; d >= 0; d--) {
        let k = u32(d);
        let qr = divmod(rem, at(shape, k));
        off += qr.y * at(strides, k);
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
    let base = offset(o, p.kept_rank, p.kept_shape, p.kept_strides);
    var s = 0.0;
    for (var g = t; g < p.n_red; g += WG) {
        s += x[base + offset(g, p.red_rank, p.red_shape, p.red_strides)];
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
