// A norm's sum of squares over its workgroup, in every invocation: rms_norm.wgsl's norms (all
// WG invocations) and sdpa.wgsl's `split_normed` (the first NORM_WG of its invocations forming
// a q norm's sum as that norm's own dispatch would, so the bits are the same; the others add
// nothing). The including kernel has overrides NORM_WG (the invocations that add) and
// NORM_LANES (summed by subgroup shuffles, a power of two up to the subgroup size; 1: none).
var<workgroup> norm_red: array<f32, NORM_WG>;

// Once per workgroup: the flat path ends with no barrier after its reads of `norm_red`.
fn workgroup_sum(v: f32, t: u32) -> f32 {
    var s = v;
    // #if subgroups
    for (var k = NORM_LANES / 2u; k > 0u; k = k / 2u) {
        s += subgroupShuffleXor(s, k);
    }
    // #endif
    let lanes = max(NORM_LANES, 1u);
    let runs = NORM_WG / lanes;
    if t < NORM_WG && t % lanes == 0u {
        norm_red[t / lanes] = s;
    }
    workgroupBarrier();
    if runs <= FLAT_RUNS {
        // One barrier; every invocation adds the runs' sums in the same order.
        var total = norm_red[0];
        for (var k = 1u; k < runs; k++) {
            total += norm_red[k];
        }
        return total;
    }
    for (var k = runs / 2u; k > 0u; k = k / 2u) {
        if t < k {
            norm_red[t] += norm_red[t + k];
        }
        workgroupBarrier();
    }
    return norm_red[0];
}
