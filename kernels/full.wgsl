// Fills a tensor with one 32-bit value (f32 or i32 bits, chosen on the host).

struct Params {
    n: u32,
    value: u32,
}

override WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i < p.n {
        y[i] = p.value;
    }
}
