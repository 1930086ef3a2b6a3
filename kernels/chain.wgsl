// The f32 element-wise ops by code (UnaryOp / BinaryOp in declaration order, src/ir/mod.rs) and
// one ElementwiseChain step; the module of every kernel that applies chains (elementwise,
// rms_norm) starts with this file (src/gpu/context.rs).

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

// A chain's steps are specialised: STEPS of them, step s described by override STEP<s> =
// kind | op code << 2 | input << 8 | first << 10, kinds 0 unary, 1 binary with chain input
// `input`, 2 binary with a scalar, 3 clamp; `first`: the operand (input or scalar) on the left.
// Scalars and clamp bounds are f32 bits in the uniform words `w` of the step (x: scalar or
// lower bound, y: upper bound). Constant codes fold each step to its one operation.
override STEPS: u32 = 0u;
override STEP0: u32 = 0u;
override STEP1: u32 = 0u;
override STEP2: u32 = 0u;
override STEP3: u32 = 0u;
override STEP4: u32 = 0u;
override STEP5: u32 = 0u;

fn chain_step(code: u32, w: vec2<u32>, v: f32, ins: vec3<f32>) -> f32 {
    let op = (code >> 2u) & 63u;
    let first = ((code >> 10u) & 1u) != 0u;
    switch code & 3u {
        case 0u: {
            return unary_op(op, v);
        }
        case 1u: {
            let x = ins[(code >> 8u) & 3u];
            if first {
                return binary_op(op, x, v);
            }
            return binary_op(op, v, x);
        }
        case 2u: {
            let x = bitcast<f32>(w.x);
            if first {
                return binary_op(op, x, v);
            }
            return binary_op(op, v, x);
        }
        default: {
            return min(max(v, bitcast<f32>(w.x)), bitcast<f32>(w.y));
        }
    }
}

// A norm's chain (rms_norm.wgsl's, and linear.wgsl's `matvec_normed`) of the normed value n at
// chain input `ni` and the chain's other inputs (ops, in order) around it.
fn chain_around(n: f32, ops: vec2<f32>, ni: u32, w: array<vec4<u32>, 3>) -> f32 {
    let ins = vec3<f32>(select(ops.x, n, ni == 0u), select(select(ops.x, ops.y, ni > 1u), n, ni == 1u),
                        select(ops.y, n, ni == 2u));
    return apply_chain(ins.x, ins, w);
}

// The chain on v with its inputs at this element; `w` holds each step's two uniform words.
fn apply_chain(v0: f32, ins: vec3<f32>, w: array<vec4<u32>, 3>) -> f32 {
    var v = v0;
    if STEPS > 0u {
        v = chain_step(STEP0, w[0].xy, v, ins);
    }
    if STEPS > 1u {
        v = chain_step(STEP1, w[0].zw, v, ins);
    }
    if STEPS > 2u {
        v = chain_step(STEP2, w[1].xy, v, ins);
    }
    if STEPS > 3u {
        v = chain_step(STEP3, w[1].zw, v, ins);
    }
    if STEPS > 4u {
        v = chain_step(STEP4, w[2].xy, v, ins);
    }
    if STEPS > 5u {
        v = chain_step(STEP5, w[2].zw, v, ins);
    }
    return v;
}
