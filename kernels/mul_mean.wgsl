// Mean of a broadcast product over some dims (`MulMean`): one invocation per output element sums
// its products in index order, as the CPU reference does, so a product tensor never exists.
// Each product is rounded to f32 before it is added: passed through its bits XOR a uniform
// zero, it cannot be contracted into a fused multiply-add (a differently rounded sum).

struct Params {
    n_out: u32,
    n_red: u32,
    kept_rank: u32,
    red_rank: u32,
    // Always 0: see above.
    zero: u32,
    kept_shape: array<vec4<u32>, 2>,
    kept_a: array<vec4<u32>, 2>,
    kept_b: array<vec4<u32>, 2>,
    red_shape: array<vec4<u32>, 2>,
    red_a: array<vec4<u32>, 2>,
    red_b: array<vec4<u32>, 2>,
}

override WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> a: array<f32>;
@group(0) @binding(4) var<storage, read> b: array<f32>;

// Offsets into a and b of element i over the kept or the reduced dims; the uniform is indexed
// in place (arrays passed by value are copied to the stack per call on CPU drivers).
fn offsets(i: u32, red: bool) -> vec2<u32> {
    var rem = i;
    var off = vec2<u32>(0u, 0u);
    let rank = select(p.kept_rank, p.red_rank, red);
    for (var d = i32(rank) - 1; d >= 0; d--) {
        let k = u32(d);
        var size = p.kept_shape[k / 4u][k % 4u];
        var st = vec2<u32>(p.kept_a[k / 4u][k % 4u], p.kept_b[k / 4u][k % 4u]);
        if red {
            size = p.red_shape[k / 4u][k % 4u];
            st = vec2<u32>(p.red_a[k / 4u][k % 4u], p.red_b[k / 4u][k % 4u]);
        }
        let qr = divmod(rem, size);
        off += qr.y * st;
        rem = qr.x;
    }
    return off;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let o = (wg.x + wg.y * nwg.x) * WG + lid;
    if o >= p.n_out {
        return;
    }
    let base = offsets(o, false);
    var s = 0.0;
    if p.red_rank == 1u {
        // One reduced dim (attention's dot products): a stride walk, no index arithmetic.
        let st = vec2<u32>(p.red_a[0].x, p.red_b[0].x);
        var off = base;
        for (var j = 0u; j < p.n_red; j++) {
            s += bitcast<f32>(bitcast<u32>(a[off.x] * b[off.y]) ^ p.zero);
            off += st;
        }
    } else {
        for (var j = 0u; j < p.n_red; j++) {
            let off = base + offsets(j, true);
            s += bitcast<f32>(bitcast<u32>(a[off.x] * b[off.y]) ^ p.zero);
        }
    }
    y[o] = s / f32(p.n_red);
}
