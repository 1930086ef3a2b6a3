// Rotary embedding. One invocation per element of x; the position of a row is `start + s` where
// `start` is read from the syms buffer at run time, so decode steps replay one recording.

struct Params {
    n: u32,
    d: u32,
    half: u32,
    // Elements between consecutive sequence positions, and the sequence length.
    seq_stride: u32,
    seq_len: u32,
    start_slot: u32,
    table_rows: u32,
    _pad: u32,
}

override WG: u32 = 256u;
override INTERLEAVED: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> cos_t: array<f32>;
@group(0) @binding(5) var<storage, read> sin_t: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i >= p.n {
        return;
    }
    let r = i / p.d;
    let j = i % p.d;
    let pos = syms[p.start_slot] + i32((r * p.d / p.seq_stride) % p.seq_len);
    // Dims past the rotated pairs pass through; so does a position past the table (the reference
    // reports it as an error).
    if j >= 2u * p.half || pos < 0 || u32(pos) >= p.table_rows {
        y[i] = x[i];
        return;
    }
    let rp = rope_pair(j, p.half, INTERLEAVED);
    let t = u32(pos) * p.half + rp.pair;
    y[i] = rope_rotate(x[i], x[i - j + rp.other], cos_t[t], sin_t[t], rp.first);
}
