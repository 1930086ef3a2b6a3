// Element-wise ops: unary, binary (NumPy broadcasting, or one scalar operand), where, clamp, cast.
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

fn at(v: array<vec4<u32>, 2>, d: u32) -> u32 {
    return v[d / 4u][d % 4u];
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
        let size = at(p.shape, k);
        let idx = rem % size;
        rem = rem / size;
        o += idx * vec3<u32>(at(p.sa, k), at(p.sb, k), at(p.sc, k));
    }
    return o;
}

fn index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wg.x + wg.y * nwg.x) * WG + lid;
}

// Abramowitz-Stegun style erfc (Numerical Recipes `erfcc`), fractional error below 1.2e-7, so
// GELU stays accurate in its small negative tail too.
fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(-z * z + poly);
}

// tanh of a clamped argument: some drivers evaluate tanh as a ratio of exponentials that
// overflows to NaN for large inputs; |x| = 15 already rounds to ±1 in f32.
fn tanh_safe(x: f32) -> f32 {
    return tanh(clamp(x, -15.0, 15.0));
}

// sin (shift 0) or cos (shift 1) to about an ulp of 1 for |x| up to ~1e5, as the reference's f32
// sin/cos. WGSL only bounds the builtins' absolute error on [-pi, pi], and NVIDIA's reduce large
// arguments (RoPE angles of a few hundred radians) in single precision: ~3e-5 off at 300 rad.
// x = j·pi/2 + r: pi/2 in three parts (Cephes' DP1..3, doubled), the first two short enough that
// j times them is exact, so r keeps its low bits with or without FMA contraction; then Cephes'
// sinf/cosf polynomials on |r| <= pi/4, and the quadrant (j + shift) mod 4 picks and signs one.
fn sin_cos(x: f32, shift: i32) -> f32 {
    let j = round(x * 0.63661977236758134);
    let r = ((x - j * 1.5703125) - j * 4.837512969970703125e-4) - j * 7.54978995489188216e-8;
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z
        + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    let q = (i32(j) + shift) & 3;
    let v = select(s, c, (q & 1) == 1);
    return select(v, -v, q >= 2);
}

fn unary_f(x: f32) -> f32 {
    return unary_op(OP, x);
}

fn unary_op(op: u32, x: f32) -> f32 {
    switch op {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 2u: { return exp(x); }
        case 3u: { return log(x); }
        case 4u: { return sqrt(x); }
        case 5u: { return 1.0 / sqrt(x); }
        case 6u: { return tanh_safe(x); }
        case 7u: { return sin_cos(x, 0); }
        case 8u: { return sin_cos(x, 1); }
        case 9u: { return 1.0 / (1.0 + exp(-x)); }
        case 10u: { return x / (1.0 + exp(-x)); }
        case 11u: {
            // 1 + erf(z) = erfc(-z)
            let z = x * 0.70710678118654752;
            let e = erfc_pos(abs(z));
            return 0.5 * x * select(2.0 - e, e, z < 0.0);
        }
        case 12u: {
            let k = 0.7978845608028654;
            return 0.5 * x * (1.0 + tanh_safe(k * (x + 0.044715 * x * x * x)));
        }
        case 13u: { return max(x, 0.0); }
        case 14u: { return x * x; }
        case 15u: { return 1.0 / x; }
        case 16u: { return floor(x); }
        case 17u: { return ceil(x); }
        default: { return f32(x == 0.0); }
    }
}

fn unary_i(x: i32) -> i32 {
    switch OP {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 14u: { return x * x; }
        default: { return i32(x == 0); }
    }
}

// powf with the sign rules of Rust's `powf` for negative bases and integral exponents; WGSL's pow
// is undefined for x < 0.
fn pow_f(x: f32, e: f32) -> f32 {
    if e == 0.0 {
        return 1.0;
    }
    if x >= 0.0 {
        return pow(x, e);
    }
    if e != trunc(e) {
        return bitcast<f32>(0x7fc00000u);
    }
    let r = pow(-x, e);
    let odd = e - 2.0 * floor(e * 0.5) == 1.0;
    return select(r, -r, odd);
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

fn binary_op(op: u32, x: f32, z: f32) -> f32 {
    switch op {
        case 0u: { return x + z; }
        case 1u: { return x - z; }
        case 2u: { return x * z; }
        case 3u: { return x / z; }
        case 4u: { return pow_f(x, z); }
        case 5u: { return max(x, z); }
        case 6u: { return min(x, z); }
        case 7u: { return f32(x == z); }
        case 8u: { return f32(x != z); }
        case 9u: { return f32(x < z); }
        case 10u: { return f32(x <= z); }
        case 11u: { return f32(x > z); }
        case 12u: { return f32(x >= z); }
        case 13u: { return f32(x != 0.0 && z != 0.0); }
        default: { return f32(x != 0.0 || z != 0.0); }
    }
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

// ElementwiseChain: f32 ops in sequence on one value per element, no intermediate tensors.
// Steps are (kind, op code, a, b): kind 0 unary; 1 binary with input a (b != 0: operand first);
// 2 binary with the f32 scalar of bits a (b != 0: scalar first); 3 clamp to [f32 a, f32 b].
struct ChainParams {
    n: u32,
    rank: u32,
    steps: u32,
    _pad: u32,
    shape: array<vec4<u32>, 2>,
    // Element strides over `shape` of inputs 0, 1, 2; 0 on broadcast dims.
    strides: array<array<vec4<u32>, 2>, 3>,
    step: array<vec4<u32>, 6>,
}

@group(0) @binding(0) var<uniform> pc: ChainParams;

fn chain_offsets(i: u32) -> vec3<u32> {
    if !BCAST {
        return vec3<u32>(i);
    }
    var rem = i;
    var o = vec3<u32>(0u);
    for (var d = i32(pc.rank) - 1; d >= 0; d--) {
        let k = u32(d);
        let size = at(pc.shape, k);
        let idx = rem % size;
        rem = rem / size;
        o += idx * vec3<u32>(at(pc.strides[0], k), at(pc.strides[1], k), at(pc.strides[2], k));
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
    var v = bitcast<f32>(a[o.x]);
    for (var s = 0u; s < pc.steps; s++) {
        let st = pc.step[s];
        switch st.x {
            case 0u: {
                v = unary_op(st.y, v);
            }
            case 1u: {
                var w = bitcast<f32>(a[o.x]);
                if st.z == 1u {
                    w = bitcast<f32>(b[o.y]);
                } else if st.z == 2u {
                    w = bitcast<f32>(c[o.z]);
                }
                v = select(binary_op(st.y, v, w), binary_op(st.y, w, v), st.w != 0u);
            }
            case 2u: {
                let w = bitcast<f32>(st.z);
                v = select(binary_op(st.y, v, w), binary_op(st.y, w, v), st.w != 0u);
            }
            default: {
                v = min(max(v, bitcast<f32>(st.z)), bitcast<f32>(st.w));
            }
        }
    }
    y[i] = bitcast<u32>(v);
}
