// The ranges buffer (src/gpu/ops.rs `ranged`): a producer that stores a row's elements across
// many workgroups (linear.wgsl's gate/up `matvec_ranged`, sdpa.wgsl's `combine`) also leaves
// their range there for the linear that quantizes the row (`act_quant_ranged`), which then needs
// no pass over the row first. A row's site is RANGE_SLOTS pairs of words, zeroed before every
// call: max(-v, 0) and max(v, 0) as the bits of non-negative floats, whose order is their bits'
// (atomicMax). Min and max are exact in any order, and the range includes 0 as both
// quantization rules' does, so the starting zeros are in it.
override RANGE_SLOTS: u32 = 256u;

// v's pair of words (its atomicMax operands): 0 for either side v does not reach.
fn range_bits(v: f32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(abs(min(v, 0.0))), bitcast<u32>(abs(max(v, 0.0))));
}

// The (lo, hi) that a site's largest words stand for.
fn range_span(w: vec2<u32>) -> vec2<f32> {
    return vec2<f32>(-bitcast<f32>(w.x), bitcast<f32>(w.y));
}
