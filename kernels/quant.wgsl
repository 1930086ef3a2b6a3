// Dynamic per-row int8 activation quantization (the 8da4w linears' `act_quant`), shared by
// linear.wgsl's act_quant entries and the rms_norm kernel, which quantizes the row it has just
// normed for the quantized linear that reads it (no act_quant dispatch on the decode path).
// The including kernel has `WG` and `SG_LANES` overrides.

// XNNPACK's qd8 rounding (x · (255 / range)) instead of torchao's (x / (range / 255)).
override XNN_ROUNDING: bool = false;

// a / b correctly rounded (to nearest, ties to even), as the CPU reference divides: WGSL's
// division may be off by ulps (it is on NVIDIA), which moves values sitting on rounding ties, and
// fma is not fused everywhere (lavapipe), so a residual step cannot fix it. Long division of the
// 24-bit significands in integers, 7 quotient bits per u32 division (4 dependent steps, where
// one bit per step took 25 on every quantization's critical path); zeros, subnormals,
// infinities and NaN take plain division.
fn div_rn(a: f32, b: f32) -> f32 {
    let ua = bitcast<u32>(a);
    let ub = bitcast<u32>(b);
    let ea = (ua >> 23u) & 0xffu;
    let eb = (ub >> 23u) & 0xffu;
    if ea == 0u || eb == 0u || ea == 255u || eb == 255u {
        return a / b;
    }
    let ma = (ua & 0x7fffffu) | 0x800000u;
    let mb = (ub & 0x7fffffu) | 0x800000u;
    var e = i32(ea) - i32(eb) + 127;
    var rem = ma;
    if rem < mb {
        rem = rem << 1u;
        e -= 1;
    }
    // rem in [mb, 2 mb): the leading quotient bit is 1. Then 28 more (rem < 2^24, so rem << 7
    // fits): 23 for the significand, a guard bit, and 4 that join the remainder in deciding ties.
    rem -= mb;
    var q = 1u;
    for (var i = 0u; i < 4u; i++) {
        rem = rem << 7u;
        let d = rem / mb;
        rem -= d * mb;
        q = (q << 7u) | d;
    }
    let guard = (q >> 4u) & 1u;
    let sticky = (q & 0xfu) != 0u || rem != 0u;
    q = q >> 5u;
    if guard == 1u && (sticky || (q & 1u) == 1u) {
        q += 1u;
    }
    if q == 0x1000000u {
        q = q >> 1u;
        e += 1;
    }
    if e <= 0 || e >= 255 {
        return a / b;
    }
    return bitcast<f32>(((ua ^ ub) & 0x80000000u) | (u32(e) << 23u) | (q & 0x7fffffu));
}

// x / 255 correctly rounded for x ≥ 0, as `div_rn` gives it, but without integer divisions on
// every quantization's critical path, nor a branch to `div_rn`: with such a branch, never taken,
// the E2B-shaped decode step took 3.67-3.71 ms on the H100, without it 3.57-3.61 (`div_rn`
// itself: 3.70).
// The hardware quotient q is within a few ulps; its residual x - 255 q, taken exactly in
// integers, says by how many: with x = mx 2^ex and q = mq 2^eq (24-bit significands),
// x - 255 q = 2^eq (mx 2^(ex - eq) - 255 mq), where ex - eq is 7 or 8 near x / 255, so both terms
// fit in 32 bits. x / 255 is never a tie (that would make an even number, x 2^(1 - eq), equal
// 255 (2 mq + 1)), so the residual's ulps / 255 round unambiguously. A second step corrects a
// first that crossed into the next binade (whose ulp differs). Below 1e-5 the quotient is under
// the quantization's smallest scale, which replaces it; inf and NaN divide as they are.
fn div255_rn(x: f32) -> f32 {
    let q = div255_step(x, div255_step(x, bitcast<u32>(x / 255.0)));
    return select(bitcast<f32>(q), x / 255.0, !(x >= 1e-5 && x <= 1e30));
}

// q moved by the ulps (of q) that x / 255 lies from it, rounded.
fn div255_step(x: f32, q: u32) -> u32 {
    let ux = bitcast<u32>(x);
    let shift = clamp(i32(ux >> 23u) - i32(q >> 23u), 7, 8);
    let mx = (ux & 0x7fffffu) | 0x800000u;
    let mq = (q & 0x7fffffu) | 0x800000u;
    let units = bitcast<i32>((mx << u32(shift)) - 255u * mq);
    return u32(i32(q) + i32(round(f32(units) / 255.0)));
}

// round(div_rn(a, s)), the reference's quotient rounded to an integer (ties to even), for
// |a / s| < 512, with no division and no branch: the E2B-shaped decode step took 3.58 ms on the
// H100 with a branch to `div_rn` for quotients near a tie, 3.04 with plain (inexact) rounding.
// Only a quotient near a tie t = n + 1/2 is in doubt; there the remainder a - t·s decides it,
// taken exactly: t has at most 10 significant bits and s is split into two 12-bit halves, so
// both products are exact (also where the compiler fuses them into an fma), |a| - t·hi is exact
// (the two lie within a factor 2), and the remainder fits 24 bits. div_rn(a, s) is t itself while
// the remainder lies within half the float spacing at t (times s); t's last significand bit is 0,
// so it also wins both boundary ties.
fn round_quotient(a: f32, r: RowQuant) -> f32 {
    let av = abs(a);
    let d = av * r.inv;
    let n = floor(d);
    let t = n + 0.5;
    let rem = (av - t * r.hi) - t * r.lo;
    // Half the spacing of floats at t, times s. Below t = 1/2 (a power of two) the spacing
    // halves, but there "t itself" and "below" both round to 0.
    let half = r.s * bitcast<f32>((bitcast<u32>(t) & 0x7f800000u) - (24u << 23u));
    let even = n + 2.0 * fract(0.5 * n);
    let near = select(select(even, n + 1.0, rem > half), n, rem < -half);
    let q = select(round(d), near, abs(d - t) < 1e-3);
    return select(q, -q, a < 0.0);
}

var<workgroup> red_lo: array<f32, WG>;
var<workgroup> red_hi: array<f32, WG>;

// The row's quantization: x ≈ s · (q - zp) with q an integer in [-128, 127].
struct RowQuant {
    // torchao: 1 / scale is not used; XNNPACK: mul = 255 / range.
    mul: f32,
    s: f32,
    zp: f32,
    // torchao: 1 / s (an estimate) and s split into two halves of 12 significant bits.
    inv: f32,
    hi: f32,
    lo: f32,
}

fn split_scale(mul: f32, s: f32, zp: f32) -> RowQuant {
    let hi = bitcast<f32>(bitcast<u32>(s) & 0xfffff000u);
    return RowQuant(mul, s, zp, 1.0 / s, hi, s - hi);
}

// The quantization of a row whose elements this invocation saw span [lo, hi] (each
// invocation's range includes 0, as both rules' does). Every invocation of the workgroup must
// call it (barriers), once: the flat path ends with no barrier after its reads of red_lo/red_hi.
fn row_params(lo_t: f32, hi_t: f32, t: u32) -> RowQuant {
    var lo = lo_t;
    var hi = hi_t;
    // Runs of SG_LANES lanes by subgroup shuffles, then their first lanes through shared memory
    // (min and max are exact: any order gives the same range).
    // #if subgroups
    for (var d = SG_LANES / 2u; d > 0u; d = d / 2u) {
        lo = min(lo, subgroupShuffleXor(lo, d));
        hi = max(hi, subgroupShuffleXor(hi, d));
    }
    // #endif
    let lanes = max(SG_LANES, 1u);
    if t % lanes == 0u {
        red_lo[t / lanes] = lo;
        red_hi[t / lanes] = hi;
    }
    workgroupBarrier();
    var lo_all = red_lo[0];
    var hi_all = red_hi[0];
    if WG / lanes <= FLAT_RUNS {
        // Every invocation reads the runs' results: one barrier, where a tree takes one a level.
        for (var k = 1u; k < WG / lanes; k++) {
            lo_all = min(lo_all, red_lo[k]);
            hi_all = max(hi_all, red_hi[k]);
        }
    } else {
        for (var s = WG / lanes / 2u; s > 0u; s = s / 2u) {
            if t < s {
                red_lo[t] = min(red_lo[t], red_lo[t + s]);
                red_hi[t] = max(red_hi[t], red_hi[t + s]);
            }
            workgroupBarrier();
        }
        lo_all = red_lo[0];
        hi_all = red_hi[0];
    }
    return params_of(lo_all, hi_all);
}

// The quantization of a row whose elements span [lo_all, hi_all] (with 0).
fn params_of(lo_all: f32, hi_all: f32) -> RowQuant {
    if XNN_ROUNDING {
        // XNNPACK multiplies by 255 / range and picks the zero point from whichever end of the
        // range it represents with less error; ties round differently from torchao's divide.
        var mul = 1.0;
        if lo_all != hi_all {
            mul = div_rn(255.0, hi_all - lo_all);
        }
        let lo_m = lo_all * mul;
        let hi_m = hi_all * mul;
        var zp = 127.0 - hi_m;
        if (-128.0 + lo_m) + (127.0 + hi_m) > 0.0 {
            zp = -128.0 - lo_m;
        }
        return RowQuant(mul, div_rn(1.0, mul), round(clamp(zp, -128.0, 127.0)), 0.0, 0.0, 0.0);
    }
    let scale = max(div255_rn(hi_all - lo_all), 1.1920929e-7);
    let r = split_scale(0.0, scale, 0.0);
    // lo / scale lies in [-255, 0] (lo ≤ 0 ≤ hi), or is tiny once the scale is clamped.
    return split_scale(0.0, scale, clamp(-128.0 - round_quotient(lo_all, r), -128.0, 127.0));
}

// q of one element (an integer-valued float in [-128, 127]).
fn quantize(v: f32, r: RowQuant) -> f32 {
    if XNN_ROUNDING {
        return round(clamp(v * r.mul, -128.0 - r.zp, 127.0 - r.zp)) + r.zp;
    }
    return clamp(round_quotient(v, r) + r.zp, -128.0, 127.0);
}

fn pack4(v: vec4<f32>, r: RowQuant) -> u32 {
    let q = vec4<i32>(i32(quantize(v.x, r)), i32(quantize(v.y, r)), i32(quantize(v.z, r)),
                      i32(quantize(v.w, r)));
    return pack4xI8(q);
}

// Elements 0..8 of a row (words a, c) packed as a 4-bit weight word's nibbles pair them once
// masked with 0x0f0f0f0f: (0, 2, 4, 6), (1, 3, 5, 7). The packed layout (linear.wgsl
// `act_quant_packed`): each row's K / 4 words of signed bytes, then (s, zp) per row.
fn pack8_nibble_order(a: vec4<f32>, c: vec4<f32>, r: RowQuant) -> vec2<u32> {
    return vec2<u32>(nibble_word(a, c, false, r), nibble_word(a, c, true, r));
}

// One word of `pack8_nibble_order`: the even elements, or the odd.
fn nibble_word(a: vec4<f32>, c: vec4<f32>, odd: bool, r: RowQuant) -> u32 {
    return pack4(select(vec4<f32>(a.x, a.z, c.x, c.z), vec4<f32>(a.y, a.w, c.y, c.w), odd), r);
}
