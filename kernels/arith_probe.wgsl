// Arithmetic rates for `pteria bench --kernels` (src/gpu/bench.rs `arith_rate`), not used by any
// model: how many integer dot products of four int8 pairs (dot4I8Packed, DP4A where the GPU has
// it) and f32 multiply-adds the device runs a second, the ceiling of a prompt's linears.

struct Params {
    iters: u32,
    seed: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// One word an invocation, so that no compiler drops the chains.
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

override WG: u32 = 256u;

// Eight independent chains an invocation: each step's result is the next step's packed operand
// and its accumulator (one DP4A with its addend), so no compiler can fold the loop.
@compute @workgroup_size(WG)
fn dots(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = p.seed * 0x9e3779b9u;
    var a0 = gid.x ^ p.seed;
    var a1 = a0 + 1u;
    var a2 = a0 + 2u;
    var a3 = a0 + 3u;
    var a4 = a0 + 4u;
    var a5 = a0 + 5u;
    var a6 = a0 + 6u;
    var a7 = a0 + 7u;
    for (var i = 0u; i < p.iters; i++) {
        a0 = bitcast<u32>(dot4I8Packed(a0, b)) + a0;
        a1 = bitcast<u32>(dot4I8Packed(a1, b)) + a1;
        a2 = bitcast<u32>(dot4I8Packed(a2, b)) + a2;
        a3 = bitcast<u32>(dot4I8Packed(a3, b)) + a3;
        a4 = bitcast<u32>(dot4I8Packed(a4, b)) + a4;
        a5 = bitcast<u32>(dot4I8Packed(a5, b)) + a5;
        a6 = bitcast<u32>(dot4I8Packed(a6, b)) + a6;
        a7 = bitcast<u32>(dot4I8Packed(a7, b)) + a7;
    }
    out[gid.x] = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
}

// The same with f32 multiply-adds (each chain converging, never overflowing).
@compute @workgroup_size(WG)
fn fmas(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = 0.999 + f32(p.seed & 1u) * 1e-4;
    var a0 = f32(gid.x % 97u);
    var a1 = a0 + 1.0;
    var a2 = a0 + 2.0;
    var a3 = a0 + 3.0;
    var a4 = a0 + 4.0;
    var a5 = a0 + 5.0;
    var a6 = a0 + 6.0;
    var a7 = a0 + 7.0;
    for (var i = 0u; i < p.iters; i++) {
        a0 = fma(a0, m, 0.5);
        a1 = fma(a1, m, 0.5);
        a2 = fma(a2, m, 0.5);
        a3 = fma(a3, m, 0.5);
        a4 = fma(a4, m, 0.5);
        a5 = fma(a5, m, 0.5);
        a6 = fma(a6, m, 0.5);
        a7 = fma(a7, m, 0.5);
    }
    out[gid.x] = bitcast<u32>(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
}

// Whether fma() rounds once (src/gpu/context.rs `fused_fma`): a and c arrive as the params'
// bits, so that no compiler folds them.
@compute @workgroup_size(1)
fn fma_probe() {
    let a = bitcast<f32>(p.iters);
    let c = bitcast<f32>(p.seed);
    out[0] = bitcast<u32>(fma(a, a, c));
}
