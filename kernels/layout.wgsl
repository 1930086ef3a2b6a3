// Data movement: one strided copy (`gather`) covers permute, slice, select, expand, concat (one
// dispatch per part) and copy; `index_select` gathers along a dim by an index tensor. Elements are
// moved as 32-bit words (16-byte words by `copy4` when contiguous); CONVERT converts between the
// f32 and i32 representations for `copy`, and reads an f16 KV cache (two f16 a word,
// src/gpu/memory.rs `Repr::F16`) into f32.

struct Params {
    n: u32,
    rank: u32,
    src_base: u32,
    dst_base: u32,
    // A run-time offset: syms[dyn_slot] (negative counts from the end, clamped to [0, dyn_n])
    // times dyn_stride is added to the source offset; dyn_slot = 0xffffffff means none.
    dyn_slot: u32,
    dyn_n: i32,
    dyn_stride: u32,
    _pad: u32,
    shape: array<vec4<u32>, 2>,
    src_strides: array<vec4<u32>, 2>,
    dst_strides: array<vec4<u32>, 2>,
}

struct IndexParams {
    n: u32,
    inner: u32,
    n_idx: u32,
    dim_len: u32,
}

override WG: u32 = 256u;
// 0: none, 1: i32 -> f32, 2: f32 -> i32 (truncating), 3: f32 -> bool, 4: i32 -> bool,
// 5: f16 (element `src` of the packed pairs) -> f32.
override CONVERT: u32 = 0u;
override IDX_INT: bool = true;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(0) var<uniform> q: IndexParams;
@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> y4: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> x4: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> idx: array<u32>;

fn convert(v: u32) -> u32 {
    switch CONVERT {
        case 1u: { return bitcast<u32>(f32(bitcast<i32>(v))); }
        case 2u: { return bitcast<u32>(i32(bitcast<f32>(v))); }
        case 3u: { return u32(bitcast<f32>(v) != 0.0); }
        case 4u: { return u32(v != 0u); }
        default: { return v; }
    }
}

@compute @workgroup_size(WG)
fn gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i >= p.n {
        return;
    }
    var rem = i;
    var src = p.src_base;
    var dst = p.dst_base;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let k = u32(d);
        // (Uniforms indexed in place, not through `at`: see elementwise.wgsl `offsets`.)
        let size = p.shape[k / 4u][k % 4u];
        let qr = divmod(rem, size);
        let c = qr.y;
        rem = qr.x;
        src += c * p.src_strides[k / 4u][k % 4u];
        dst += c * p.dst_strides[k / 4u][k % 4u];
    }
    if p.dyn_slot != 0xffffffffu {
        var v = syms[p.dyn_slot];
        if v < 0 {
            v += p.dyn_n;
        }
        src += u32(clamp(v, 0, p.dyn_n)) * p.dyn_stride;
    }
    if CONVERT == 5u {
        y[dst] = bitcast<u32>(unpack2x16float(x[src >> 1u])[src & 1u]);
    } else {
        y[dst] = convert(x[src]);
    }
}

// A contiguous copy of p.n 16-byte words from x4[src_base] to y4[dst_base]: the streaming case
// of `gather` (copy, reshape into new storage), and the device's bandwidth yardstick.
@compute @workgroup_size(WG)
fn copy4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i < p.n {
        y4[p.dst_base + i] = x4[p.src_base + i];
    }
}

@compute @workgroup_size(WG)
fn index_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i >= q.n {
        return;
    }
    let row = q.n_idx * q.inner;
    let o = i / row;
    let r = (i % row) / q.inner;
    let k = i % q.inner;
    var id: i32;
    if IDX_INT {
        id = bitcast<i32>(idx[r]);
    } else {
        id = i32(bitcast<f32>(idx[r]));
    }
    // An index out of range reads as zero (the reference reports it as an error).
    if id < 0 || u32(id) >= q.dim_len {
        y[i] = 0u;
        return;
    }
    y[i] = x[(o * q.dim_len + u32(id)) * q.inner + k];
}
