// A chain of 4-bit mat-vecs, each reading all of the one before's outputs, as a decode step's
// linears do: what the chain costs as one dispatch a phase against one persistent dispatch that
// passes a barrier across its workgroups between phases (grid_sync.wgsl), with or without the
// next phase's first weights loaded while that barrier waits (weights do not depend on the
// phase before). For `pteria bench --phases`
// (src/gpu/bench.rs `phase_chain`), not used by any model.
//
// A phase: y[n] = sum over k of scale(n, k / 128) * (nibble(n, k) - 8) * x[k], the nibbles of a
// row packed eight a word, low first. Activations pass between phases through `act` by plain
// loads and stores: each phase writes a region of its own, cleared before the chain and apart
// from the others' by at least a cache line, so no multiprocessor can hold a copy of it in its
// own cache, which no WGSL barrier invalidates (grid_barrier.wgsl), before it is written (a
// stale read would read the clearing's zeros, and the outputs would differ between the modes).
// Atomic loads and stores instead measured 0.45 µs a phase slower on an H200 (an earlier
// version of this kernel).

struct Phase {
    k: u32,
    n: u32,
    // Offsets in words of w, in floats of s, and in floats of act (x read, y written).
    w: u32,
    s: u32,
    x: u32,
    y: u32,
    _a: u32,
    _b: u32,
}

struct Params {
    // Phases first .. first + count run in this dispatch, a grid barrier between two.
    first: u32,
    count: u32,
    // Nonzero: load the next phase's first batch of weights before each grid barrier.
    prefetch: u32,
    _a: u32,
}

struct Table {
    ph: array<Phase, MAX_PHASES>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> tab: Table;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> s: array<f32>;
@group(0) @binding(4) var<storage, read_write> act: array<vec4<f32>>;
// [0]: arrivals so far, [1]: waits that gave up (grid_sync.wgsl).
@group(0) @binding(5) var<storage, read_write> sync: array<atomic<u32>, 4>;

const MAX_PHASES: u32 = 256u;
// The longest x a phase takes (as vec4s): 6144 floats.
const XMAX4: u32 = 1536u;
// A phase's rows go over the grid's teams, a row's 32-nibble chunks (16-byte loads) over its
// team's lanes, eight a lane at a time (all eight loaded before any is used).

override WG: u32 = 256u;
// Lanes a row: summed by subgroup shuffles, a power of two up to the subgroup size (1: no
// subgroups, an invocation a row).
override TEAM: u32 = 16u;
override SKIP: u32 = 0u;

// x, each run of 8 vec4s (one chunk's 32 floats) rotated by its chunk, so that the lanes of a
// team, reading consecutive chunks' same vec4, hit different banks.
var<workgroup> xs: array<vec4<f32>, XMAX4>;

fn xi(i: u32) -> u32 {
    return (i & ~7u) | ((i ^ (i >> 3u)) & 7u);
}

fn lo(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(w, w >> 4u, w >> 8u, w >> 12u) & vec4<u32>(15u)) - vec4<f32>(8.0);
}

fn hi(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(w >> 16u, w >> 20u, w >> 24u, w >> 28u) & vec4<u32>(15u))
        - vec4<f32>(8.0);
}

// Chunk c's 32 products with x, unscaled.
fn chunk_dot(v: vec4<u32>, c: u32) -> f32 {
    let b = 8u * c;
    let r = c & 7u;
    return dot(lo(v.x), xs[b + r]) + dot(hi(v.x), xs[b + (1u ^ r)])
        + dot(lo(v.y), xs[b + (2u ^ r)]) + dot(hi(v.y), xs[b + (3u ^ r)])
        + dot(lo(v.z), xs[b + (4u ^ r)]) + dot(hi(v.z), xs[b + (5u ^ r)])
        + dot(lo(v.w), xs[b + (6u ^ r)]) + dot(hi(v.w), xs[b + (7u ^ r)]);
}

fn team_sum(v: f32) -> f32 {
    var x = v;
    // #if subgroups
    for (var d = TEAM / 2u; d > 0u; d = d / 2u) {
        x += subgroupShuffleXor(x, d);
    }
    // #endif
    return x;
}

// A lane's chunks of a row, rounded up to a power of two: log2 of that. A lane's items (row,
// chunk) then number pass << shift | i, found without dividing.
fn per_shift(ph: Phase) -> u32 {
    let per = (ph.k / 32u + TEAM - 1u) / TEAM;
    return 32u - countLeadingZeros(per - 1u);
}

// Where a lane's `item`-th chunk of a phase lies: (row, chunk); past the rows or the row's
// chunks, the row is n or more, or the chunk k / 32 or more.
fn place(team: u32, teams: u32, lane: u32, shift: u32, item: u32) -> vec2<u32> {
    let mask = (1u << shift) - 1u;
    return vec2<u32>(team + (item >> shift) * teams, lane + (item & mask) * TEAM);
}

// Four chunks' weights and scales, in variables: with arrays indexed in loops, the loads
// measured at a sixth of the copy's rate, as if one were in flight a lane at a time.
struct Four {
    v0: vec4<u32>,
    v1: vec4<u32>,
    v2: vec4<u32>,
    v3: vec4<u32>,
    sc: vec4<f32>,
}

fn chunk(ph: Phase, at: vec2<u32>) -> bool {
    return at.x < ph.n && at.y < ph.k / 32u;
}

// Items base .. base + 3, loaded only where there is a chunk (a lane past its rows loads
// nothing).
fn load(ph: Phase, team: u32, teams: u32, lane: u32, shift: u32, base: u32) -> Four {
    var f: Four;
    let ch = ph.k / 32u;
    let gs = ph.k / 128u;
    let a0 = place(team, teams, lane, shift, base);
    let a1 = place(team, teams, lane, shift, base + 1u);
    let a2 = place(team, teams, lane, shift, base + 2u);
    let a3 = place(team, teams, lane, shift, base + 3u);
    if chunk(ph, a0) {
        f.v0 = w[ph.w / 4u + a0.x * ch + a0.y];
        f.sc.x = s[ph.s + a0.x * gs + a0.y / 4u];
    }
    if chunk(ph, a1) {
        f.v1 = w[ph.w / 4u + a1.x * ch + a1.y];
        f.sc.y = s[ph.s + a1.x * gs + a1.y / 4u];
    }
    if chunk(ph, a2) {
        f.v2 = w[ph.w / 4u + a2.x * ch + a2.y];
        f.sc.z = s[ph.s + a2.x * gs + a2.y / 4u];
    }
    if chunk(ph, a3) {
        f.v3 = w[ph.w / 4u + a3.x * ch + a3.y];
        f.sc.w = s[ph.s + a3.x * gs + a3.y / 4u];
    }
    return f;
}

// One item's share of its row into `acc`; at the lane's last chunk of the row (the same item
// in every lane of the team), the team's sum stored and `acc` restarted.
fn take(ph: Phase, team: u32, teams: u32, lane: u32, shift: u32, items: u32, item: u32,
        v: vec4<u32>, sc: f32, acc: ptr<function, f32>) {
    if item >= items {
        return;
    }
    let at = place(team, teams, lane, shift, item);
    if chunk(ph, at) {
        if (SKIP & 2u) == 0u {
            *acc += sc * chunk_dot(v, at.y);
        } else {
            *acc += sc + bitcast<f32>(v.x ^ v.y ^ v.z ^ v.w);
        }
    }
    let last = (1u << shift) - 1u;
    if (item & last) == last {
        let sum = team_sum(*acc);
        *acc = 0.0;
        if lane == 0u && at.x < ph.n {
            let o = ph.y + at.x;
            act[o / 4u][o % 4u] = sum;
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let g = nwg.x;
    let teams = g * (WG / TEAM);
    let team = wg.x * (WG / TEAM) + t / TEAM;
    let lane = t % TEAM;
    var f: Four;
    var h: Four;
    // Whether the first eight of this phase are loaded already (before the barrier).
    var have = false;
    for (var i = 0u; i < p.count; i++) {
        let ph = tab.ph[p.first + i];
        let shift = per_shift(ph);
        let items = ((ph.n + teams - 1u) / teams) << shift;
        // The first weights are in flight while x is staged.
        if !have {
            f = load(ph, team, teams, lane, shift, 0u);
            h = load(ph, team, teams, lane, shift, 4u);
        }
        for (var r = 0u; r < XMAX4 / WG; r++) {
            let j = t + r * WG;
            if j < ph.k / 4u && (SKIP & 1u) == 0u {
                xs[xi(j)] = act[ph.x / 4u + j];
            }
        }
        workgroupBarrier();
        var acc = 0.0;
        for (var base = 0u; base < items; base += 8u) {
            if base > 0u {
                f = load(ph, team, teams, lane, shift, base);
                h = load(ph, team, teams, lane, shift, base + 4u);
            }
            take(ph, team, teams, lane, shift, items, base, f.v0, f.sc.x, &acc);
            take(ph, team, teams, lane, shift, items, base + 1u, f.v1, f.sc.y, &acc);
            take(ph, team, teams, lane, shift, items, base + 2u, f.v2, f.sc.z, &acc);
            take(ph, team, teams, lane, shift, items, base + 3u, f.v3, f.sc.w, &acc);
            take(ph, team, teams, lane, shift, items, base + 4u, h.v0, h.sc.x, &acc);
            take(ph, team, teams, lane, shift, items, base + 5u, h.v1, h.sc.y, &acc);
            take(ph, team, teams, lane, shift, items, base + 6u, h.v2, h.sc.z, &acc);
            take(ph, team, teams, lane, shift, items, base + 7u, h.v3, h.sc.w, &acc);
        }
        have = false;
        if i + 1u < p.count {
            grid_arrive(t);
            // In flight while the barrier waits for the others.
            if p.prefetch != 0u {
                let next = tab.ph[p.first + i + 1u];
                f = load(next, team, teams, lane, per_shift(next), 0u);
                h = load(next, team, teams, lane, per_shift(next), 4u);
                have = true;
            }
            grid_wait(t, (i + 1u) * g);
        }
    }
}
