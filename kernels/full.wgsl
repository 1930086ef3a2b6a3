// Fills a tensor with one 32-bit value (f32 or i32 bits, chosen on the host), or with
// `start + i * step` (arange), `start` read from the syms buffer at run time.

struct Params {
    n: u32,
    value: u32,
}

struct RangeParams {
    n: u32,
    start_slot: u32,
    step: i32,
    _pad: u32,
}

override WG: u32 = 256u;
override OUT_INT: bool = true;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(0) var<uniform> r: RangeParams;
@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i < p.n {
        y[i] = p.value;
    }
}

@compute @workgroup_size(WG)
fn arange(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i >= r.n {
        return;
    }
    let v = syms[r.start_slot] + i32(i) * r.step;
    if OUT_INT {
        y[i] = bitcast<u32>(v);
    } else {
        y[i] = bitcast<u32>(f32(v));
    }
}
