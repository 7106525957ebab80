#version 450
// attn.comp — causal attention of a forward's query rows over a full
// cache, split-K: workgroup (KV head group, row, split) takes the keys
// [split * split_len, (split + 1) * split_len) that the row may see
// (positions <= its own, inside the sliding window when there is one), in
// chunks of 128 with a running max and sum (online softmax), and writes its
// unnormalised output with the max and sum of its exponentials to
// part[row][head][split][head_dim + 2]; attn_combine.comp merges the splits.
// GQA: query head h reads KV head h / G, G = n_head / n_head_kv; one
// workgroup serves up to GMAX of a KV head's query heads, so each key and
// value it reads is read once for all of them (x = kvh * ceil(G / GMAX) +
// group). Every query head's arithmetic is that of a workgroup serving it
// alone (same order of every sum), so the grouping changes no bit.
// head_dim <= 256 and a multiple of 8. Compiled per storage type of the keys and of the
// values (-DKT=KV_F16 -DVT=KV_Q8_0 ...; kvq.glsl reads them).
// A compressed cache (meta != 0; backend_vk_policy.c) holds a different
// number of entries per KV head: meta[h] entries were there before this
// part's rows were appended after them, so row i sees entries
// [0, meta[h] + i] by index, and with meta[n_head_kv] != 0 the score of
// entry j gets the logit bias b[h * n_ctx + j] (log of the tokens a merged
// entry stands for; b is the device buffer at the address in
// meta[n_head_kv + 1], [n_head_kv + 2], low word first). With a sliding
// window a row sees the entries at positions > its own - window: the
// head's positions are the buffer at meta[n_head_kv + 3], [n_head_kv + 4].
// Without meta, entry index = position (a full cache).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "kvq.glsl"
#define CHUNK 128
#define MAXD 256
#define GMAX 8
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    F32 q; U32 kc; U32 vc; F32 part; F16 kscr; F16 vscr; U32 meta;
    uint n_head; uint n_head_kv; uint head_dim; uint n_ctx; uint pos0; uint rows; uint q_stride;
    uint n_split; uint split_len; uint window; float scale;
    uint g; uint tc_k; uint tc_v; uint nq_k; uint nq_v; uint scr_stride; uint kv_pos0;
} pc;
shared float sq[GMAX * MAXD];  // the group's queries [GMAX][D]
shared float sp[GMAX * CHUNK]; // scores, then exponentials [GMAX][CHUNK]
shared float sv[GMAX * 512];   // P V partial sums [GMAX][NS][D] (NS * D = 512)
shared float sred[GMAX * 64];  // per head, one slot per subgroup

KvSide kside() {
    if (uint64_t(pc.meta) != 0ul) return kv_side_meta(pc.kc, pc.meta, pc.n_head_kv, pc.n_ctx, pc.head_dim, false);
    return KvSide(pc.kc, pc.kscr, pc.n_head_kv, pc.n_ctx, pc.head_dim, pc.g, pc.tc_k, pc.nq_k, pc.kv_pos0, pc.scr_stride,
                  U32(0ul), 0u);
}
KvSide vside() {
    if (uint64_t(pc.meta) != 0ul) return kv_side_meta(pc.vc, pc.meta, pc.n_head_kv, pc.n_ctx, pc.head_dim, true);
    return KvSide(pc.vc, pc.vscr, pc.n_head_kv, pc.n_ctx, pc.head_dim, pc.g, pc.tc_v, pc.nq_v, pc.kv_pos0, pc.scr_stride,
                  U32(0ul), 0u);
}

// wg_max / wg_sum (common.glsl) of each of the group's ng heads at once:
// the same subgroup operations and the same order over subgroups
void grp_max(inout float v[GMAX], const uint ng) {
    [[unroll]] for (uint i = 0; i < GMAX; i++)
        if (i < ng) {
            const float t = subgroupMax(v[i]);
            if (subgroupElect()) sred[i * 64u + gl_SubgroupID] = t;
        }
    barrier();
    [[unroll]] for (uint i = 0; i < GMAX; i++)
        if (i < ng) {
            float t = sred[i * 64u];
            for (uint k = 1; k < gl_NumSubgroups; k++) t = max(t, sred[i * 64u + k]);
            v[i] = t;
        }
    barrier();
}
void grp_sum(inout float v[GMAX], const uint ng) {
    [[unroll]] for (uint i = 0; i < GMAX; i++)
        if (i < ng) {
            const float t = subgroupAdd(v[i]);
            if (subgroupElect()) sred[i * 64u + gl_SubgroupID] = t;
        }
    barrier();
    [[unroll]] for (uint i = 0; i < GMAX; i++)
        if (i < ng) {
            float t = 0.0;
            for (uint k = 0; k < gl_NumSubgroups; k++) t += sred[i * 64u + k];
            v[i] = t;
        }
    barrier();
}

void main() {
    const uint row = gl_WorkGroupID.y, si = gl_WorkGroupID.z;
    const uint tid = gl_LocalInvocationID.x, nth = gl_WorkGroupSize.x;
    const uint D = pc.head_dim;
    const uint G = pc.n_head / pc.n_head_kv, n_grp = (G + GMAX - 1u) / GMAX;
    const uint kvh = gl_WorkGroupID.x / n_grp, gi0 = (gl_WorkGroupID.x % n_grp) * GMAX;
    const uint h0 = kvh * G + gi0, ng = min(GMAX, G - gi0); // query heads h0 .. h0 + ng - 1
    const uint pos = pc.pos0 + row;
    const bool managed = uint64_t(pc.meta) != 0ul;
    const uint L0 = managed ? pc.meta.d[kvh] : pc.kv_pos0; // entries before the part's rows
    const bool biased = managed && pc.meta.d[pc.n_head_kv] != 0u;
    const uint bias0 = kvh * pc.n_ctx;
    F32 bias = F32(biased ? uint64_t(pc.meta.d[pc.n_head_kv + 1u]) | (uint64_t(pc.meta.d[pc.n_head_kv + 2u]) << 32)
                                : uint64_t(pc.q));
    uint lo_w = (!managed && pc.window > 0u && pos + 1u > pc.window) ? pos + 1u - pc.window : 0u;
    const uint end = L0 + (pos - pc.kv_pos0) + 1u;
    if (managed && pc.window > 0u && pos + 1u > pc.window) {
        // a compressed cache: the first entry at a position inside the window,
        // by binary search over the head's positions (ascending)
        U32 P = U32(uint64_t(pc.meta.d[pc.n_head_kv + 3u]) | (uint64_t(pc.meta.d[pc.n_head_kv + 4u]) << 32));
        const uint want = pos + 1u - pc.window, base = kvh * pc.n_ctx;
        uint a = 0u, b = end;
        while (a < b) {
            const uint mid = (a + b) / 2u;
            if (P.d[base + mid] < want) a = mid + 1u;
            else b = mid;
        }
        lo_w = a;
    }
    const uint lo = max(lo_w, si * pc.split_len);
    const uint hi = min(end, (si + 1u) * pc.split_len); // exclusive
    KvSide ks = kside(), vs = vside();
    const uint NO = D / 8u, NS = nth / NO, eo = tid % NO, ls = tid / NO; // octets, key lanes
    for (uint i = 0; i < ng; i++)
        for (uint d = tid; d < D; d += nth) sq[i * D + d] = pc.q.d[row * pc.q_stride + (h0 + i) * D + d];
    barrier();
    float m[GMAX], l[GMAX], acc[GMAX][4];
    [[unroll]] for (uint i = 0; i < GMAX; i++) {
        m[i] = -1.0 / 0.0;
        l[i] = 0.0;
        acc[i] = float[4](0.0, 0.0, 0.0, 0.0);
    }
    for (uint c0 = lo; c0 < hi; c0 += CHUNK) {
        const uint c1 = min(hi, c0 + CHUNK);
        float lmax[GMAX];
        [[unroll]] for (uint i = 0; i < GMAX; i++) lmax[i] = -1.0 / 0.0;
        for (uint j = c0 + tid; j < c1; j += nth) {
            float s[GMAX];
            [[unroll]] for (uint i = 0; i < GMAX; i++) s[i] = 0.0;
            for (uint e0 = 0; e0 < NO; e0 += 4u) { // 8 channels at a time, 4 loads in flight
                float k[4][8];
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (e0 + u < NO) kv_row8(KT, false, ks, kvh, j, e0 + u, k[u]);
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (e0 + u < NO) {
                        const uint o = 8u * (e0 + u);
                        const vec4 k0 = vec4(k[u][0], k[u][1], k[u][2], k[u][3]);
                        const vec4 k1 = vec4(k[u][4], k[u][5], k[u][6], k[u][7]);
                        [[unroll]] for (uint i = 0; i < GMAX; i++)
                            if (i < ng) {
                                const uint qo = i * D + o;
                                s[i] += dot(k0, vec4(sq[qo], sq[qo + 1], sq[qo + 2], sq[qo + 3]));
                                s[i] += dot(k1, vec4(sq[qo + 4], sq[qo + 5], sq[qo + 6], sq[qo + 7]));
                            }
                    }
            }
            const float b = biased ? bias.d[bias0 + j] : 0.0;
            [[unroll]] for (uint i = 0; i < GMAX; i++)
                if (i < ng) {
                    float si_ = s[i] * pc.scale;
                    if (biased) si_ += b;
                    sp[i * CHUNK + j - c0] = si_;
                    lmax[i] = max(lmax[i], si_);
                }
        }
        grp_max(lmax, ng);
        float nm[GMAX], lsum[GMAX], corr[GMAX];
        [[unroll]] for (uint i = 0; i < GMAX; i++) {
            nm[i] = max(m[i], lmax[i]);
            lsum[i] = 0.0;
        }
        for (uint j = c0 + tid; j < c1; j += nth)
            [[unroll]] for (uint i = 0; i < GMAX; i++)
                if (i < ng) {
                    const float e = exp(sp[i * CHUNK + j - c0] - nm[i]);
                    sp[i * CHUNK + j - c0] = e;
                    lsum[i] += e;
                }
        grp_sum(lsum, ng); // its barriers publish sp
        [[unroll]] for (uint i = 0; i < GMAX; i++) {
            corr[i] = l[i] > 0.0 ? exp(m[i] - nm[i]) : 0.0;
            l[i] = l[i] * corr[i] + lsum[i];
        }
        // P V: invocation (lane ls of NS, octet e) sums keys c0 + ls, + NS, ...
        // in order (4 loads in flight) for every head of the group, then the
        // NS partial sums of each channel are added in lane order
        if (ls < NS) {
            float a[GMAX][8];
            [[unroll]] for (uint i = 0; i < GMAX; i++) a[i] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            for (uint j0 = c0 + ls; j0 < c1; j0 += 4u * NS) {
                float v[4][8];
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (j0 + u * NS < c1) kv_row8(VT, true, vs, kvh, j0 + u * NS, eo, v[u]);
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (j0 + u * NS < c1)
                        [[unroll]] for (uint i = 0; i < GMAX; i++)
                            if (i < ng) {
                                const float p = sp[i * CHUNK + j0 + u * NS - c0];
                                [[unroll]] for (uint c = 0; c < 8u; c++) a[i][c] += p * v[u][c];
                            }
            }
            [[unroll]] for (uint i = 0; i < GMAX; i++)
                if (i < ng)
                    [[unroll]] for (uint c = 0; c < 8u; c++) sv[i * 512u + ls * D + 8u * eo + c] = a[i][c];
        }
        barrier();
        [[unroll]] for (uint i = 0; i < GMAX; i++)
            if (i < ng)
                [[unroll]] for (uint k = 0; k < 4; k++) {
                    const uint d = tid + k * nth;
                    if (d < D) {
                        float a = 0.0;
                        for (uint q = 0; q < NS; q++) a += sv[i * 512u + q * D + d];
                        acc[i][k] = acc[i][k] * corr[i] + a;
                    }
                }
        [[unroll]] for (uint i = 0; i < GMAX; i++) m[i] = nm[i];
        barrier(); // sp and sv are rewritten by the next chunk
    }
    [[unroll]] for (uint i = 0; i < GMAX; i++)
        if (i < ng) {
            const uint ob = ((row * pc.n_head + h0 + i) * pc.n_split + si) * (D + 2u);
            [[unroll]] for (uint k = 0; k < 4; k++) {
                const uint d = tid + k * nth;
                if (d < D) pc.part.d[ob + d] = acc[i][k];
            }
            if (tid == 0) {
                pc.part.d[ob + D] = m[i];
                pc.part.d[ob + D + 1] = l[i];
            }
        }
}
