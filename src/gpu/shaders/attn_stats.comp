#version 450
// attn_stats.comp — the statistics KV-cache policies rank entries by
// (kv/kv.h, EKV_STAT_*), for one layer of one part of a forward, after its
// attention. A compressed cache's heads hold different lengths (meta: the
// entries each KV head held before this forward; the part's rows were
// appended after them), so the causal rule is by index: row i sees entries
// j <= L0 + i. Workgroup (block of 64 entries, KV head): each invocation
// owns one entry, recomputes its score against the R query heads of the
// group for every row that sees it (query rows staged in shared memory,
// the entry's key read once per tile of rows), turns the scores into
// probabilities with the row's max and sum from attn_combine (ml), and sums
// per entry over rows the group mean p of the R heads (colsum), the mean of
// p^2 (sumsq), the last row's mean (lastrow), the means of rows >= wrow
// (winsum), the share of heads with p >= 1/visible entries (bincount); and
// per block the entries with p < sparsity_p * the row's largest p
// (VL-Cache's counts; the largest p of a row is 1/L). With a sliding
// window (window != 0) a row sees only the entries from the first at a
// position > its own - window (binary search in the head's positions, the
// buffer at meta[H + 3], [H + 4]). Outputs are this
// forward's increments, st[slot][head][cap] floats and zeros[head][block];
// the host adds them to the cache's statistics (backend_vk_policy.c).
// Between the steps a policy reads them (flags bits 1-2, ACC_*), the
// increments are summed into acc (device memory, the layout of st) instead:
// each sum starts from acc's value and adds the rows in order; ACC_ADD
// writes it back to acc, ACC_FINAL writes it to st and zeroes acc. Bit 0
// of flags: the sparsity counts.
// -DKT= the key storage type (row types).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "kvq.glsl"
#define NONE 0xffffffffu
#define QF 4096 // floats of staged query vectors
#define ACC_ADD 1u
#define ACC_FINAL 2u
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    F32 q; U32 kc; F32 ml; U32 meta; F32 st; U32 zeros; F32 acc;
    uint n_head; uint n_head_kv; uint head_dim; uint n_ctx; uint rows; uint q_stride;
    uint cap; uint wrow; uint s_colsum; uint s_sumsq; uint s_last; uint s_win; uint s_bin; uint flags;
    float scale; float sparsity_p; uint window; uint pos0;
} pc;
shared float sq[QF];
shared float sm[64], sl[64];
shared uint slo[64]; // per row of the tile: its first visible entry
shared uint zsum;

// one statistic of one entry: where its sum starts (acc's value when
// summing, so that rows are added to it one by one: the same sums whether
// the rows come one per dispatch or many), and where it goes (ACC_*)
float in_stat(const uint slot, const uint sd, const uint o) {
    return (slot == NONE || ((pc.flags >> 1) & 3u) == 0u) ? 0.0 : pc.acc.d[slot * sd + o];
}
void out_stat(const uint slot, const uint sd, const uint o, const float v) {
    if (slot == NONE) return;
    const uint i = slot * sd + o, mode = (pc.flags >> 1) & 3u;
    if (mode == ACC_ADD) {
        pc.acc.d[i] = v;
    } else if (mode == ACC_FINAL) {
        pc.st.d[i] = v;
        pc.acc.d[i] = 0.0;
    } else {
        pc.st.d[i] = v;
    }
}

void main() {
    const uint h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint j = gl_WorkGroupID.x * 64u + tid;
    const uint D = pc.head_dim, H = pc.n_head_kv, R = pc.n_head / H;
    const uint L0 = pc.meta.d[h], len = L0 + pc.rows;
    const bool live = j < len;
    const float bias = (live && pc.meta.d[H] != 0u)
                           ? F32(uint64_t(pc.meta.d[H + 1u]) | (uint64_t(pc.meta.d[H + 2u]) << 32)).d[h * pc.n_ctx + j]
                           : 0.0;
    const uint TR = max(1u, min(64u / R, QF / (R * D))); // rows per tile
    const uint first = j > L0 ? j - L0 : 0u;             // the first row that sees j
    KvSide ks = kv_side_meta(pc.kc, pc.meta, H, pc.n_ctx, D, false); // (the row types read none of its KIVI fields)
    float a_col = 0.0, a_sq = 0.0, a_last = 0.0, a_win = 0.0, a_bin = 0.0;
    if (live) {
        const uint o = h * pc.cap + j, sd = H * pc.cap;
        a_col = in_stat(pc.s_colsum, sd, o);
        a_sq = in_stat(pc.s_sumsq, sd, o);
        a_win = in_stat(pc.s_win, sd, o);
        a_bin = in_stat(pc.s_bin, sd, o);
    }
    uint a_zero = 0u;
    if (tid == 0u) zsum = 0u;
    for (uint i0 = 0u; i0 < pc.rows; i0 += TR) {
        const uint nr = min(TR, pc.rows - i0), nq = nr * R;
        barrier();
        for (uint x = tid; x < nq * D; x += 64u) {
            const uint ii = x / (R * D), rem = x % (R * D);
            sq[x] = pc.q.d[(i0 + ii) * pc.q_stride + h * R * D + rem];
        }
        for (uint x = tid; x < nq; x += 64u) {
            const uint o = ((i0 + x / R) * pc.n_head + h * R + x % R) * 2u;
            sm[x] = pc.ml.d[o];
            sl[x] = pc.ml.d[o + 1u];
        }
        for (uint ii = tid; ii < nr; ii += 64u) { // each row's first visible entry (a sliding window)
            const uint i = i0 + ii;
            uint lo = 0u;
            if (pc.window > 0u && pc.pos0 + i + 1u > pc.window) {
                U32 P = U32(uint64_t(pc.meta.d[H + 3u]) | (uint64_t(pc.meta.d[H + 4u]) << 32));
                const uint want = pc.pos0 + i + 1u - pc.window, base = h * pc.n_ctx;
                uint a = 0u, b = L0 + i + 1u;
                while (a < b) {
                    const uint mid = (a + b) / 2u;
                    if (P.d[base + mid] < want) a = mid + 1u;
                    else b = mid;
                }
                lo = a;
            }
            slo[ii] = lo;
        }
        barrier();
        if (!live || i0 + nr <= first) continue;
        float s[64];
        [[unroll]] for (uint x = 0u; x < 64u; x++) s[x] = 0.0;
        for (uint e = 0u; e < D / 8u; e++) {
            float k[8];
            kv_row8(KT, false, ks, h, j, e, k);
            const vec4 k0 = vec4(k[0], k[1], k[2], k[3]), k1 = vec4(k[4], k[5], k[6], k[7]);
            [[unroll]] for (uint x = 0u; x < 64u; x++) {
                if (x < nq) {
                    const uint o = x * D + 8u * e;
                    s[x] += dot(k0, vec4(sq[o], sq[o + 1u], sq[o + 2u], sq[o + 3u]));
                    s[x] += dot(k1, vec4(sq[o + 4u], sq[o + 5u], sq[o + 6u], sq[o + 7u]));
                }
            }
        }
        [[unroll]] for (uint x = 0u; x < 64u; x++) {
            if (x < nq) s[x] = exp(s[x] * pc.scale + bias - sm[x]) / sl[x];
        }
        // per row of the tile, the R heads' probabilities in head order (the
        // index into s is a constant of the unrolled loop: no local memory)
        float sp = 0.0, sp2 = 0.0, thr = 0.0;
        uint cnt = 0u, z = 0u;
        bool vis = false;
        [[unroll]] for (uint x = 0u; x < 64u; x++) {
            if (x < nq) {
                const uint ii = x / R, r = x - ii * R, i = i0 + ii;
                if (r == 0u) {
                    vis = i >= first && j >= slo[ii];
                    thr = 1.0 / float(L0 + i + 1u - slo[ii]);
                    sp = 0.0, sp2 = 0.0, cnt = 0u, z = 0u;
                }
                if (vis) {
                    const float p = s[x];
                    sp += p;
                    sp2 += p * p;
                    cnt += p >= thr ? 1u : 0u;
                    z += p < pc.sparsity_p * (1.0 / sl[x]) ? 1u : 0u;
                    if (r + 1u == R) {
                        const float m = sp / float(R);
                        a_col += m;
                        a_sq += sp2 / float(R);
                        a_bin += float(cnt) / float(R);
                        if (i + 1u == pc.rows) a_last = m;
                        if (i >= pc.wrow) {
                            a_win += m;
                            a_zero += z;
                        }
                    }
                }
            }
        }
    }
    if (live) {
        const uint o = h * pc.cap + j, sd = H * pc.cap;
        out_stat(pc.s_colsum, sd, o, a_col);
        out_stat(pc.s_sumsq, sd, o, a_sq);
        out_stat(pc.s_last, sd, o, a_last);
        out_stat(pc.s_win, sd, o, a_win);
        out_stat(pc.s_bin, sd, o, a_bin);
    }
    if ((pc.flags & 1u) != 0u) {
        barrier();
        if (a_zero != 0u) atomicAdd(zsum, a_zero);
        barrier();
        if (tid == 0u) pc.zeros.d[h * gl_NumWorkGroups.x + gl_WorkGroupID.x] = zsum;
    }
}
