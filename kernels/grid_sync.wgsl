// The wait of a barrier across every workgroup of one dispatch (grid_barrier.wgsl,
// phase_chain.wgsl). The including kernel binds `sync`: [0] arrivals so far, [1] waits that
// gave up. Workgroups must all be resident at once, which WebGPU does not promise: a wait gives
// up after SPIN polls and counts a failure, and once one has failed no workgroup waits again,
// so such a device ends the dispatch with failures instead of hanging.
const SPIN: u32 = 1048576u;

// Call in uniform control flow: every workgroup's `goal`-th arrival in total (the n-th barrier
// of g workgroups: goal = n * g).
fn grid_sync(t: u32, goal: u32) {
    grid_arrive(t);
    grid_wait(t, goal);
}

// The barrier's first half: this workgroup's writes released, its arrival counted. Work that
// needs nothing of the others' (loads of weights no phase writes) can go between the halves.
fn grid_arrive(t: u32) {
    // Device-scope release of this workgroup's writes (naga: OpControlBarrier, Device memory
    // scope, AcquireRelease | UniformMemory) before the arrival is counted ...
    storageBarrier();
    if t == 0u {
        atomicAdd(&sync[0], 1u);
    }
}

// The second half: until `goal` arrivals, then the others' writes acquired.
fn grid_wait(t: u32, goal: u32) {
    if t == 0u {
        var s = 0u;
        while s < SPIN && atomicLoad(&sync[0]) < goal && atomicLoad(&sync[1]) == 0u {
            s++;
        }
        if s == SPIN {
            atomicAdd(&sync[1], 1u);
        }
    }
    // ... and its acquire once every workgroup has been counted.
    storageBarrier();
}
