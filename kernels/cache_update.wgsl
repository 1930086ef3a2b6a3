// Writes `value` into a KV cache along one axis at `start`, read from the syms buffer at run time
// so that decode steps at different positions replay one recording. One invocation per element
// of value; an update that does not fit the cache writes nothing (the reference reports it).
// CACHE_F16: the cache holds two f16 a word (src/gpu/memory.rs `Repr::F16`); an invocation then
// packs a pair of elements into one word, so no two invocations write halves of one word (the
// planner makes f16 only caches whose rows after the axis have an even count of elements).

struct Params {
    n: u32,
    inner: u32,
    value_len: u32,
    cache_len: u32,
    start_slot: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

override WG: u32 = 256u;
override CACHE_F16: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> syms: array<i32>;
@group(0) @binding(2) var<storage, read_write> cache: array<u32>;
@group(0) @binding(3) var<storage, read> value: array<u32>;

// Elements each invocation moves.
fn per_invocation() -> u32 {
    return select(1u, 2u, CACHE_F16);
}

// Value element i (and i + 1 for an f16 cache) to cache element dst.
fn put(i: u32, dst: u32) {
    if CACHE_F16 {
        let pair = vec2<f32>(bitcast<f32>(value[i]), bitcast<f32>(value[i + 1u]));
        cache[dst >> 1u] = pack2x16float(pair);
    } else {
        cache[dst] = value[i];
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = ((wg.x + wg.y * nwg.x) * WG + lid) * per_invocation();
    if i >= p.n {
        return;
    }
    let row = p.value_len * p.inner;
    let o = i / row;
    let r = (i % row) / p.inner;
    let k = i % p.inner;
    let dst = cache_dst(false, 0, syms[p.start_slot], r, p.value_len, p.cache_len);
    if dst < 0 {
        return;
    }
    put(i, (o * p.cache_len + u32(dst)) * p.inner + k);
}

// `index_put` form: value row r goes to cache row indices[r] (negative counts from the end); an
// index outside the cache writes nothing (the reference reports it).
@group(0) @binding(4) var<storage, read> indices: array<i32>;

@compute @workgroup_size(WG)
fn indexed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = ((wg.x + wg.y * nwg.x) * WG + lid) * per_invocation();
    if i >= p.n {
        return;
    }
    let row = p.value_len * p.inner;
    let o = i / row;
    let r = (i % row) / p.inner;
    let k = i % p.inner;
    let dst = cache_dst(true, indices[r], 0, r, p.value_len, p.cache_len);
    if dst < 0 {
        return;
    }
    put(i, (o * p.cache_len + u32(dst)) * p.inner + k);
}
