// Shared by every kernel file (appended to each by src/gpu/context.rs).

// Runs of subgroup lanes that a reduction sums by every invocation reading all of them after
// one barrier (quant.wgsl, norm_sum.wgsl); more take a shared-memory tree.
const FLAT_RUNS: u32 = 32u;

// (x / d, x % d) for d > 0 without an integer division. Shape arithmetic divides every
// element's index by runtime sizes, and an integer division is a scalar instruction per lane
// on CPU drivers (lavapipe spent most of a broadcast multiply in `div`). A float reciprocal
// estimate, one float correction from the remainder, then exact integer fix-ups.
fn divmod(x: u32, d: u32) -> vec2<u32> {
    if d <= 1u {
        return vec2<u32>(x * d, 0u);
    }
    let inv = 1.0 / f32(d);
    // Within a few hundred of the quotient: the remainder below stays inside an i32.
    var q = u32(f32(x) * inv);
    var r = bitcast<i32>(x - q * d);
    let c = i32(floor(f32(r) * inv));
    q = u32(i32(q) + c);
    r -= c * i32(d);
    loop {
        if r < 0 {
            q -= 1u;
            r += i32(d);
        } else if r >= i32(d) {
            q += 1u;
            r -= i32(d);
        } else {
            break;
        }
    }
    return vec2<u32>(q, u32(r));
}

// Rotary embedding of element j of a row of `2·half` rotated dims (the rest pass through): its
// pair's index into the cos/sin tables, its partner's index in the row, and whether it is the
// pair's first element. Interleaved pairs (2i, 2i+1) or rotate-half pairs (i, i + half).
struct RopePair {
    pair: u32,
    other: u32,
    first: bool,
}

fn rope_pair(j: u32, half: u32, interleaved: bool) -> RopePair {
    if interleaved {
        let first = j % 2u == 0u;
        return RopePair(j / 2u, select(j - 1u, j + 1u, first), first);
    }
    let first = j < half;
    return RopePair(select(j - half, j, first), select(j - half, j + half, first), first);
}

// x·c - partner·s for the pair's first element, x·c + partner·s for its second.
fn rope_rotate(x: f32, partner: f32, c: f32, s: f32, first: bool) -> f32 {
    if first {
        return x * c - partner * s;
    }
    return x * c + partner * s;
}

// The KV cache row that value row r of an update goes to (cache_update.wgsl, and rms_norm.wgsl
// storing its rows where that update would): `index` (negative counts from the end) when
// `indexed`, else start + r when all value_len rows fit; -1 when the row is not stored (the
// reference reports it).
fn cache_dst(indexed: bool, index: i32, start: i32, r: u32, value_len: u32, cache_len: u32) -> i32 {
    if indexed {
        var d = index;
        if d < 0 {
            d += i32(cache_len);
        }
        return select(-1, d, d >= 0 && u32(d) < cache_len);
    }
    if start < 0 || u32(start) + value_len > cache_len {
        return -1;
    }
    return start + i32(r);
}

// -8 · s for a scale s whose product is a normal float (src/gpu/memory.rs `derived_bias` checks
// every one), by its bits: exponent + 3, sign flipped. Not `-8.0 * s`: a shader compiler may
// rewrite s · q + (-8 · s) into s · (q - 8), which rounds differently (lavapipe's does).
fn neg8(s: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(s) ^ 0x80000000u) + (3u << 23u));
}
