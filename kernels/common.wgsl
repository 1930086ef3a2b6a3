// Shared by every kernel file (appended to each by src/gpu/context.rs).

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
