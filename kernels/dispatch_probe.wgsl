// A chain of negations for `pteria bench --kernels`' raw Vulkan probe (src/gpu/raw_vulkan.rs),
// not used by any model: compiled to SPIR-V by naga and dispatched through the driver with no
// wgpu in between, to say what the driver itself charges for a dispatch and for the barrier
// before it, and what a kernel pays when its first load's address needs a uniform (as every
// kernel in kernels/ reads its Params).

struct Params {
    n: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

const N: u32 = 1536u;

// The length a compile-time constant: the load waits for nothing.
@compute @workgroup_size(256)
fn plain(@builtin(global_invocation_id) g: vec3<u32>) {
    if g.x < N {
        y[g.x] = -x[g.x];
    }
}

// The same, its guard from the uniform: the load waits for the uniform's.
@compute @workgroup_size(256)
fn param(@builtin(global_invocation_id) g: vec3<u32>) {
    if g.x < p.n {
        y[g.x] = -x[g.x];
    }
}
