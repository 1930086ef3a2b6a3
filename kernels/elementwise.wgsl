// Element-wise ops: unary, binary (NumPy broadcasting, or one scalar operand), where, clamp, cast.
// The f32 op definitions are in chain.wgsl, which precedes this file in the module.
// Tensors are bound as raw 32-bit words: float tensors hold f32, integer and bool tensors i32
// (src/gpu/memory.rs), and the *_INT constants say which. INT_MATH picks the integer path exactly
// where the CPU reference (src/ir/cpu.rs) computes in integers.

struct Params {
    n: u32,
    rank: u32,
    scalar_f: f32,
    scalar_i: i32,
    lo_f: f32,
    hi_f: f32,
    lo_i: i32,
    hi_i: i32,
    shape: array<vec4<u32>, 2>,
    // Per-operand element strides over `shape`; 0 on broadcast dims.
    sa: array<vec4<u32>, 2>,
    sb: array<vec4<u32>, 2>,
    sc: array<vec4<u32>, 2>,
}

// Op code: UnaryOp or BinaryOp in declaration order (src/ir/mod.rs).
override OP: u32 = 0u;
override A_INT: bool = false;
override B_INT: bool = false;
override C_INT: bool = false;
override OUT_INT: bool = false;
override OUT_BOOL: bool = false;
override INT_MATH: bool = false;
// Operands differ in shape: compute per-operand offsets from `shape` and the strides.
override BCAST: bool = false;
// Binary with a scalar: 1 = scalar on the right, 2 = scalar on the left (`scalar_first`).
override SCALAR: u32 = 0u;
override WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;
@group(0) @binding(3) var<storage, read> a: array<u32>;
@group(0) @binding(4) var<storage, read> b: array<u32>;
@group(0) @binding(5) var<storage, read> c: array<u32>;

fn as_f(v: u32, is_int: bool) -> f32 {
    if is_int {
        return f32(bitcast<i32>(v));
    }
    return bitcast<f32>(v);
}

// Float to integer truncates toward zero, as the reference's `as i64` does.
fn as_i(v: u32, is_int: bool) -> i32 {
    if is_int {
        return bitcast<i32>(v);
    }
    return i32(bitcast<f32>(v));
}

fn store_f(i: u32, v: f32) {
    if OUT_INT {
        y[i] = bitcast<u32>(i32(v));
    } else {
        y[i] = bitcast<u32>(v);
    }
}

fn store_i(i: u32, v: i32) {
    if OUT_INT {
        y[i] = bitcast<u32>(v);
    } else {
        y[i] = bitcast<u32>(f32(v));
    }
}

// Element offsets of output element `i` in a, b, c.
fn offsets(i: u32) -> vec3<u32> {
    if !BCAST {
        return vec3<u32>(i);
    }
    var rem = i;
    var o = vec3<u32>(0u);
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let k = u32(d);
        // (The uniform indexed in place: `at` takes its array by value, which CPU drivers
        // copy to the stack per call; lavapipe ran a broadcast multiply 47x slower so.)
        let qr = divmod(rem, p.shape[k / 4u][k % 4u]);
        rem = qr.x;
        o += qr.y * vec3<u32>(p.sa[k / 4u][k % 4u], p.sb[k / 4u][k % 4u], p.sc[k / 4u][k % 4u]);
    }
    return o;
}

fn index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wg.x + wg.y * nwg.x) * WG + lid;
}

fn unary_f(x: f32) -> f32 {
    return unary_op(OP, x);
}

fn unary_i(x: i32) -> i32 {
    switch OP {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 14u: { return x * x; }
        default: { return i32(x == 0); }
    }
}

fn pow_i(x: i32, e: i32) -> i32 {
    var r = 1;
    var base = x;
    var k = u32(max(e, 0));
    loop {
        if k == 0u {
            break;
        }
        if (k & 1u) != 0u {
            r = r * base;
        }
        base = base * base;
        k = k >> 1u;
    }
    return r;
}

fn binary_f(x: f32, z: f32) -> f32 {
    return binary_op(OP, x, z);
}

fn binary_i(x: i32, z: i32) -> i32 {
    switch OP {
        case 0u: { return x + z; }
        case 1u: { return x - z; }
        case 2u: { return x * z; }
        case 3u: { return select(x / z, 0, z == 0); }
        case 4u: { return pow_i(x, z); }
        case 5u: { return max(x, z); }
        case 6u: { return min(x, z); }
        case 7u: { return i32(x == z); }
        case 8u: { return i32(x != z); }
        case 9u: { return i32(x < z); }
        case 10u: { return i32(x <= z); }
        case 11u: { return i32(x > z); }
        case 12u: { return i32(x >= z); }
        case 13u: { return i32(x != 0 && z != 0); }
        default: { return i32(x != 0 || z != 0); }
    }
}

@compute @workgroup_size(WG)
fn unary(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = index(wg, nwg, lid);
    if i >= p.n {
        return;
    }
    if INT_MATH {
        store_i(i, unary_i(as_i(a[i], A_INT)));
    } else {
        store_f(i, unary_f(as_f(a[i], A_INT)));
    }
}

@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = index(wg, nwg, lid);
    if i >= p.n {
        return;
    }
    if SCALAR != 0u {
        // The tensor operand is `a`; the scalar takes the other side.
        if INT_MATH {
            let x = as_i(a[i], A_INT);
            store_i(i, select(binary_i(x, p.scalar_i), binary_i(p.scalar_i, x), SCALAR == 2u));
        } else {
            let x = as_f(a[i], A_INT);
            store_f(i, select(binary_f(x, p.scalar_f), binary_f(p.scalar_f, x), SCALAR == 2u));
        }
        return;
    }
    let o = offsets(i);
    if INT_MATH {
        store_i(i, binary_i(as_i(a[o.x], A_INT), as_i(b[o.y], B_INT)));
    } else {
        store_f(i, binary_f(as_f(a[o.x], A_INT), as_f(b[o.y], B_INT)));
    }
}

// where(a, b, c): the condition is nonzero after truncation, as the reference's `.i()` reads it.
@compute @workgroup_size(WG)
fn where_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = index(wg, nwg, lid);
    if i >= p.n {
        return;
    }
    let o = offsets(i);
    let take_b = as_i(a[o.x], A_INT) != 0;
    if INT_MATH {
        store_i(i, select(as_i(c[o.z], C_INT), as_i(b[o.y], B_INT), take_b));
    } else {
        store_f(i, select(as_f(c[o.z], C_INT), as_f(b[o.y], B_INT), take_b));
    }
}

@compute @workgroup_size(WG)
fn clamp_range(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = index(wg, nwg, lid);
    if i >= p.n {
        return;
    }
    if A_INT {
        // The reference clamps integers in f64 and truncates: compare as float, return the
        // truncated bound.
        let x = bitcast<i32>(a[i]);
        let xf = f32(x);
        var r = x;
        if xf < p.lo_f {
            r = p.lo_i;
        } else if xf > p.hi_f {
            r = p.hi_i;
        }
        store_i(i, r);
    } else {
        store_f(i, min(max(bitcast<f32>(a[i]), p.lo_f), p.hi_f));
    }
}

@compute @workgroup_size(WG)
fn convert(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = index(wg, nwg, lid);
    if i >= p.n {
        return;
    }
    if OUT_BOOL {
        y[i] = u32(as_f(a[i], A_INT) != 0.0);
    } else if OUT_INT {
        y[i] = bitcast<u32>(as_i(a[i], A_INT));
    } else {
        y[i] = bitcast<u32>(as_f(a[i], A_INT));
    }
}

// ElementwiseChain: f32 ops in sequence on one value per element, no intermediate tensors
// (`apply_chain` in chain.wgsl).
struct ChainParams {
    n: u32,
    rank: u32,
    steps: u32,
    _pad: u32,
    shape: array<vec4<u32>, 2>,
    // Element strides over `shape` of inputs 0, 1, 2; 0 on broadcast dims.
    strides: array<array<vec4<u32>, 2>, 3>,
    // Per step two words: a scalar's or the clamp bounds' f32 bits (chain.wgsl).
    words: array<vec4<u32>, 3>,
}

@group(0) @binding(0) var<uniform> pc: ChainParams;
// The chain's inputs (1 to 3).
override N_IN: u32 = 3u;

fn chain_offsets(i: u32) -> vec3<u32> {
    if !BCAST {
        return vec3<u32>(i);
    }
    var rem = i;
    var o = vec3<u32>(0u);
    for (var d = i32(pc.rank) - 1; d >= 0; d--) {
        let k = u32(d);
        let size = pc.shape[k / 4u][k % 4u];
        let qr = divmod(rem, size);
        let idx = qr.y;
        rem = qr.x;
        o += idx * vec3<u32>(pc.strides[0][k / 4u][k % 4u], pc.strides[1][k / 4u][k % 4u],
                             pc.strides[2][k / 4u][k % 4u]);
    }
    return o;
}

@compute @workgroup_size(WG)
fn chain(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = index(wg, nwg, lid);
    if i >= pc.n {
        return;
    }
    let o = chain_offsets(i);
    var ins = vec3<f32>(bitcast<f32>(a[o.x]), 0.0, 0.0);
    if N_IN > 1u {
        ins.y = bitcast<f32>(b[o.y]);
    }
    if N_IN > 2u {
        ins.z = bitcast<f32>(c[o.z]);
    }
    y[i] = bitcast<u32>(apply_chain(ins.x, ins, pc.words));
}
