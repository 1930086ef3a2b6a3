// A barrier across every workgroup of one dispatch: what a persistent kernel (one dispatch
// running a decode step's phases in turn) would pay between phases, where a dispatch boundary
// costs a launch and a pipeline barrier. For `pteria bench --kernels` (src/gpu/bench.rs
// `grid_barrier`), not used by any model.
//
// It needs every workgroup resident at once (grid_sync.wgsl says what happens where they are
// not; lavapipe runs a few at a time). Each round a workgroup also reads what its left
// neighbour wrote the round before: a stale value counts a failure too, so the barrier is
// checked to order memory, not only to count.

struct Params {
    rounds: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// [0]: arrivals so far, [1]: waits that gave up, [2]: stale reads.
@group(0) @binding(1) var<storage, read_write> sync: array<atomic<u32>, 4>;
// Two rows of one word a workgroup, written in alternate rounds. Atomics: with plain loads and
// stores every grid of 32 or more workgroups failed on an H200 (likely a stale read from a
// multiprocessor's own cache, which no WGSL barrier invalidates; naga declares no storage
// buffer Coherent).
@group(0) @binding(2) var<storage, read_write> cells: array<atomic<u32>>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let n = nwg.x;
    let left = (wg.x + n - 1u) % n;
    for (var r = 0u; r < p.rounds; r++) {
        if t == 0u {
            if atomicLoad(&cells[((r + 1u) % 2u) * n + left]) != r {
                atomicAdd(&sync[2], 1u);
            }
            atomicStore(&cells[(r % 2u) * n + wg.x], r + 1u);
        }
        grid_sync(t, (r + 1u) * n);
    }
}
