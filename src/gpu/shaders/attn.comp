#version 450
// attn.comp — causal attention of a forward's query rows over a full
// cache, split-K: workgroup (head, row, split) takes the keys
// [split * split_len, (split + 1) * split_len) that the row may see
// (positions <= its own, inside the sliding window when there is one), in
// chunks of 256 with a running max and sum (online softmax), and writes its
// unnormalised output with the max and sum of its exponentials to
// part[row][head][split][head_dim + 2]; attn_combine.comp merges the splits.
// GQA: query head h reads KV head h / (n_head / n_head_kv). head_dim <= 256
// and a multiple of 8. Compiled per storage type of the keys and of the
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
#define CHUNK 256
#define MAXD 256
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    F32 q; U32 kc; U32 vc; F32 part; F16 kscr; F16 vscr; U32 meta;
    uint n_head; uint n_head_kv; uint head_dim; uint n_ctx; uint pos0; uint rows; uint q_stride;
    uint n_split; uint split_len; uint window; float scale;
    uint g; uint tc_k; uint tc_v; uint nq_k; uint nq_v; uint scr_stride; uint kv_pos0;
} pc;
shared float sq[MAXD];
shared float sp[CHUNK];
shared float sv[512]; // P V partial sums [NS][D] (NS * D = 8 * 64 / (D / 8) * (D / 8) <= 512)

KvSide kside() {
    return KvSide(pc.kc, pc.kscr, pc.n_head_kv, pc.n_ctx, pc.head_dim, pc.g, pc.tc_k, pc.nq_k, pc.kv_pos0, pc.scr_stride);
}
KvSide vside() {
    return KvSide(pc.vc, pc.vscr, pc.n_head_kv, pc.n_ctx, pc.head_dim, pc.g, pc.tc_v, pc.nq_v, pc.kv_pos0, pc.scr_stride);
}

void main() {
    const uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, si = gl_WorkGroupID.z;
    const uint tid = gl_LocalInvocationID.x, nth = gl_WorkGroupSize.x;
    const uint D = pc.head_dim;
    const uint kvh = h / (pc.n_head / pc.n_head_kv);
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
    const uint ob = ((row * pc.n_head + h) * pc.n_split + si) * (D + 2u);
    KvSide ks = kside(), vs = vside();
    const uint NO = D / 8u, NS = nth / NO, eo = tid % NO, ls = tid / NO; // octets, key lanes
    for (uint d = tid; d < D; d += nth) sq[d] = pc.q.d[row * pc.q_stride + h * D + d];
    barrier();
    float m = -1.0 / 0.0, l = 0.0;
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint c0 = lo; c0 < hi; c0 += CHUNK) {
        const uint c1 = min(hi, c0 + CHUNK);
        float lmax = -1.0 / 0.0;
        for (uint j = c0 + tid; j < c1; j += nth) {
            float s = 0.0;
            for (uint e0 = 0; e0 < NO; e0 += 4u) { // 8 channels at a time, 4 loads in flight
                float k[4][8];
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (e0 + u < NO) kv_row8(KT, false, ks, kvh, j, e0 + u, k[u]);
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (e0 + u < NO) {
                        const uint o = 8u * (e0 + u);
                        s += dot(vec4(k[u][0], k[u][1], k[u][2], k[u][3]), vec4(sq[o], sq[o + 1], sq[o + 2], sq[o + 3]));
                        s += dot(vec4(k[u][4], k[u][5], k[u][6], k[u][7]),
                                 vec4(sq[o + 4], sq[o + 5], sq[o + 6], sq[o + 7]));
                    }
            }
            s *= pc.scale;
            if (biased) s += bias.d[bias0 + j];
            sp[j - c0] = s;
            lmax = max(lmax, s);
        }
        const float nm = max(m, wg_max(lmax));
        float lsum = 0.0;
        for (uint j = c0 + tid; j < c1; j += nth) {
            float e = exp(sp[j - c0] - nm);
            sp[j - c0] = e;
            lsum += e;
        }
        const float cl = wg_sum(lsum); // its barriers publish sp
        const float corr = l > 0.0 ? exp(m - nm) : 0.0;
        l = l * corr + cl;
        // P V: invocation (lane ls of NS, octet e) sums keys c0 + ls, + NS, ...
        // in order (4 loads in flight), then the NS partial sums of each
        // channel are added in lane order
        if (ls < NS) {
            float a[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            for (uint j0 = c0 + ls; j0 < c1; j0 += 4u * NS) {
                float v[4][8];
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (j0 + u * NS < c1) kv_row8(VT, true, vs, kvh, j0 + u * NS, eo, v[u]);
                [[unroll]] for (uint u = 0; u < 4u; u++)
                    if (j0 + u * NS < c1) {
                        const float p = sp[j0 + u * NS - c0];
                        [[unroll]] for (uint i = 0; i < 8u; i++) a[i] += p * v[u][i];
                    }
            }
            [[unroll]] for (uint i = 0; i < 8u; i++) sv[ls * D + 8u * eo + i] = a[i];
        }
        barrier();
        for (uint k = 0; k < 4; k++) {
            uint d = tid + k * nth;
            if (d >= D) break;
            float a = 0.0;
            for (uint q = 0; q < NS; q++) a += sv[q * D + d];
            acc[k] = acc[k] * corr + a;
        }
        m = nm;
        barrier(); // sp is rewritten by the next chunk
    }
    for (uint k = 0; k < 4; k++) {
        uint d = tid + k * nth;
        if (d < D) pc.part.d[ob + d] = acc[k];
    }
    if (tid == 0) {
        pc.part.d[ob + D] = m;
        pc.part.d[ob + D + 1] = l;
    }
}
