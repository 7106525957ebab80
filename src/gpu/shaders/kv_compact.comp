#version 450
// kv_compact.comp — executes the keep / merge plans of compressing policies
// (backend_vk_plan.c records them after the policies ran on the host), for
// every layer, side and sequence of a forward in one pair of dispatches. A
// segment is one (sequence, layer, side) buffer: seg[8] = {base lo, hi,
// stage lo, hi, rw, sph, p0h, srw}. A plan is a list of runs
// {first destination row, first source, rows, segment}, rows absolute in
// the segment's buffer (head h's entry j is row h * C + j): the source is a
// row of the same buffer, or with the high bit set a row the host or
// kv_merge.comp put in the segment's stage (a merged entry's new key,
// value or logit bias), or (all bits set) zero (biases past a head's
// entries). Rows are the rw words of a row type plus, for q8_0 / q4_0, the
// sph fp16 scales at half p0h + row * sph (kvq.glsl's layout), copied as
// bits: nothing is re-quantised here. PHASE 0 reads every planned word into
// a scratch, PHASE 1 writes them to their places, so in-place compaction (a
// row moving down over rows still to be read) runs on the whole device at
// once. Thread t of the grid-strided range takes scratch word t, whose run r
// it finds by binary search in the runs' prefix sums of words (pre[r] <= t <
// pre[r + 1], pre[n_runs] the total).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define HI 0x80000000u
#define ZERO 0xffffffffu
layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    U32 runs; U32 pre; U32 segs; U32 scr;
    uint n_runs; uint phase;
} pc;

uint src_word(const uint sg, uint src, uint i, uint w) {
    if (src == ZERO) return 0u;
    U32 base = U32(uint64_t(pc.segs.d[sg]) | (uint64_t(pc.segs.d[sg + 1u]) << 32));
    const uint rw = pc.segs.d[sg + 4u], sph = pc.segs.d[sg + 5u], p0h = pc.segs.d[sg + 6u];
    const bool staged = (src & HI) != 0u;
    const uint row = (src & ~HI) + i;
    if (staged) {
        U32 stage = U32(uint64_t(pc.segs.d[sg + 2u]) | (uint64_t(pc.segs.d[sg + 3u]) << 32));
        const uint srw = pc.segs.d[sg + 7u];
        return w < rw ? stage.d[row * srw + w] : uint(U16(stage).d[2u * (row * srw + rw) + (w - rw)]);
    }
    return w < rw ? base.d[row * rw + w] : uint(U16(base).d[p0h + row * sph + (w - rw)]);
}

void main() {
    const uint total = pc.pre.d[pc.n_runs], step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint t = gl_GlobalInvocationID.x; t < total; t += step) {
        uint lo = 0u, hi = pc.n_runs; // the run r with pre[r] <= t < pre[r + 1]
        while (hi - lo > 1u) {
            const uint mid = (lo + hi) / 2u;
            if (pc.pre.d[mid] <= t) lo = mid;
            else hi = mid;
        }
        const uint sg = 8u * pc.runs.d[4u * lo + 3u];
        const uint ew = pc.segs.d[sg + 4u] + pc.segs.d[sg + 5u]; // words (and scales) per row
        const uint i = (t - pc.pre.d[lo]) / ew, w = (t - pc.pre.d[lo]) % ew;
        if (pc.phase == 0u) {
            pc.scr.d[t] = src_word(sg, pc.runs.d[4u * lo + 1u], i, w);
        } else {
            U32 base = U32(uint64_t(pc.segs.d[sg]) | (uint64_t(pc.segs.d[sg + 1u]) << 32));
            const uint rw = pc.segs.d[sg + 4u];
            const uint dst = pc.runs.d[4u * lo] + i;
            if (w < rw) base.d[dst * rw + w] = pc.scr.d[t];
            else U16(base).d[pc.segs.d[sg + 6u] + dst * pc.segs.d[sg + 5u] + (w - rw)] = uint16_t(pc.scr.d[t]);
        }
    }
}
