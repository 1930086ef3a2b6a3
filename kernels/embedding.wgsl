// Row gather from an f32, 4-bit or 8-bit table, dequantized in registers. A table larger than
// one storage binding is split by rows (src/gpu/memory.rs); each chunk is one dispatch that
// writes the ids falling in its rows [row0, row0 + rows).

struct Params {
    n: u32,
    cols: u32,
    row0: u32,
    rows: u32,
    total_rows: u32,
    groups: u32,
    _pad0: u32,
    _pad1: u32,
}

// 0: f32, 1: 4-bit packed (u8 [rows, cols/2], element 2j in the low nibble), 2: 8-bit signed.
override KIND: u32 = 0u;
override GROUP: u32 = 32u;
override IDS_INT: bool = true;
override WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<f32>;
@group(0) @binding(6) var<storage, read> biases: array<f32>;
// The biases are -8 · scales: computed, not bound (linear.wgsl's DERIVED_BIAS).
override DERIVED_BIAS: bool = false;

fn byte_at(b: u32) -> u32 {
    return (w[b / 4u] >> ((b % 4u) * 8u)) & 0xffu;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + lid;
    if i >= p.n {
        return;
    }
    let e = i / p.cols;
    let c = i % p.cols;
    var id: i32;
    if IDS_INT {
        id = bitcast<i32>(ids[e]);
    } else {
        id = i32(bitcast<f32>(ids[e]));
    }
    // An id outside the table reads as zero (the reference reports it); chunk 0 writes it.
    if id < 0 || u32(id) >= p.total_rows {
        if p.row0 == 0u {
            y[i] = 0.0;
        }
        return;
    }
    if u32(id) < p.row0 || u32(id) >= p.row0 + p.rows {
        return;
    }
    let r = u32(id) - p.row0;
    if KIND == 0u {
        y[i] = bitcast<f32>(w[r * p.cols + c]);
        return;
    }
    var q: f32;
    if KIND == 1u {
        let byte = byte_at(r * (p.cols / 2u) + c / 2u);
        q = f32((byte >> ((c % 2u) * 4u)) & 0xfu);
    } else {
        q = f32(extractBits(i32(byte_at(r * p.cols + c)), 0u, 8u));
    }
    let g = r * p.groups + c / GROUP;
    let s = scales[g];
    var bi: f32;
    if DERIVED_BIAS {
        bi = neg8(s);
    } else {
        bi = biases[g];
    }
    // A symmetric 4-bit group (b = -8·s) as s · (q - 8): one rounding, as ExecuTorch's
    // embedding_4bit and the CPU executor compute it.
    if KIND == 1u && bi == neg8(s) {
        y[i] = s * (q - 8.0);
    } else {
        y[i] = s * q + bi;
    }
}
