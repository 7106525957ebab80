#version 450
// kv_compact.comp — executes the keep / merge plans of a compressing
// policy on one side of one layer (backend_vk_policy.c records them after
// the policy ran on the host). A plan is a list of runs {first destination
// row, first source, rows}, with absolute rows (head h's entry j is row
// h * C + j): the source is a row of the same buffer, or with the high bit
// set a row the host or kv_merge.comp put in the stage (a merged entry's new
// key, value or logit bias), or (all bits set) zero (biases past a head's
// entries). Rows are the words of a row type plus, for q8_0 / q4_0, the fp16
// scales (kvq.glsl's layout), copied as bits: nothing is re-quantised here.
// Two dispatches: PHASE 0 reads every planned row into a scratch, PHASE 1
// writes them to their places, so the in-place compaction (a row moving down
// over rows still to be read) can run on the whole device at once. Thread t
// of the grid-strided range takes word t % ew of planned row t / ew, whose
// run it finds by binary search in the runs' prefix sums (pre[n_runs + 1]
// after the runs).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define HI 0x80000000u
#define ZERO 0xffffffffu
layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    U32 base; U32 runs; U32 stage; U32 scr;
    uint n_runs; uint total; uint rw; uint sph; uint p0h; uint srw; uint phase;
} pc;

uint src_word(uint src, uint i, uint w) {
    if (src == ZERO) return 0u;
    const bool staged = (src & HI) != 0u;
    const uint row = (src & ~HI) + i;
    if (w < pc.rw) return staged ? pc.stage.d[row * pc.srw + w] : pc.base.d[row * pc.rw + w];
    const uint k = w - pc.rw;
    return staged ? uint(U16(pc.stage).d[2u * (row * pc.srw + pc.rw) + k]) : uint(U16(pc.base).d[pc.p0h + row * pc.sph + k]);
}

void main() {
    const uint ew = pc.rw + pc.sph; // words (and scales) per row
    const uint pre0 = 3u * pc.n_runs;
    const uint n = pc.total * ew, step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint t = gl_GlobalInvocationID.x; t < n; t += step) {
        const uint R = t / ew, w = t % ew;
        uint lo = 0u, hi = pc.n_runs; // the run r with pre[r] <= R < pre[r + 1]
        while (hi - lo > 1u) {
            const uint mid = (lo + hi) / 2u;
            if (pc.runs.d[pre0 + mid] <= R) lo = mid;
            else hi = mid;
        }
        const uint i = R - pc.runs.d[pre0 + lo];
        if (pc.phase == 0u) {
            pc.scr.d[t] = src_word(pc.runs.d[3u * lo + 1u], i, w);
        } else {
            const uint dst = pc.runs.d[3u * lo] + i;
            if (w < pc.rw) pc.base.d[dst * pc.rw + w] = pc.scr.d[t];
            else U16(pc.base).d[pc.p0h + dst * pc.sph + (w - pc.rw)] = uint16_t(pc.scr.d[t]);
        }
    }
}
