// kvq.glsl — the KV cache's storage types on the device: where the entries
// of one side (keys or values) of one layer lie, how a shader reads 8
// channels or one channel of an entry, and the quantisers, which must give
// the codes of the CPU's (src/kernels/quant.c, kvquant.c) bit for bit:
// fp16 conversions are done in integers (round to nearest even, whatever
// the driver's own rounding), divisions in double (the quotient of two
// floats is never halfway between two floats, and a double quotient is
// close enough to round to the correctly rounded float), and `precise`
// keeps multiply-then-add from being fused where the CPU does not fuse.
//
// Layout of one side's buffer (backend_vk_kv.c computes the same sizes;
// H KV heads, C entries per head = n_ctx, D = head_dim, words of 4 bytes):
//   rows  [H][C][RW words]: f32 / f16 values, or int8 (q8_0) / GGML q4_0
//         nibbles / KIVI codes (channel c in bits (c * b) % 32 of word
//         (c * b) / 32);
//   then, from word P0 = H * C * RW:
//     q8_0, q4_0: fp16 scales [H][C][D / 32];
//     KIVI keys:   [H][ceil(C / G)][D] words (fp16 scale | fp16 min << 16),
//                  one per (group of G entries, channel);
//     KIVI values: [H][C][D / G] words, one per (entry, group of G channels);
//   then, from word R0 = P0 + the parameter words (even), KIVI only: the
//   full-precision residual, a ring of TC fp16 rows per head [H][TC][D]
//   (entry j in slot j % TC). Entries [0, nq) are quantised, [nq, pos0)
//   are in the ring, and the rows of the forward being run, [pos0, ...),
//   in a scratch array [H][scr_stride][D] of fp16 (the CPU keeps them in
//   fp16 too until the forward ends; kivi.comp then quantises and moves).
// A compressing policy's KIVI side (hq != 0: backend_vk_plan.c) has a
// number of quantised entries per head, hq[h], and groups of keys of
// varying size (the CPU store's, src/kv/store.c): parameters
// [H][NGC][D] words per group, the group of each entry in a table
// [H][C] words at X0 (after the residual), and the residual of head h is
// linear: entry j >= hq[h] in slot j - hq[h] of [H][TC][D] (the forward's
// new rows are written there too; no scratch).
#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2
#define KV_Q4_0 3
#define KV_KIVI2 4
#define KV_KIVI4 5

struct KvSide {
    U32 base;
    F16 scr;        // KIVI: the forward's rows of this part ([H][scr_stride][D])
    uint H, C, D, G, TC, nq, pos0, scr_stride;
    U32 hq;         // a compressed KIVI side: [H] quantised entries per head (0: nq for every head)
    uint NGC;       // ... keys: groups of parameters per head
};

bool kv_managed(KvSide s) { return uint64_t(s.hq) != 0ul; }
uint kv_nq(KvSide s, uint h) { return kv_managed(s) ? s.hq.d[h] : s.nq; }

// A compressed cache's side from its layer's meta block (backend_vk_policy.c:
// [H] lengths, 5 words, [H] quantised keys, [H] quantised values, then G,
// TC of keys, NGC, TC of values, C).
KvSide kv_side_meta(U32 base, U32 meta, uint H, uint C, uint D, bool is_v) {
    const uint o = 3u * H + 5u;
    return KvSide(base, F16(base), H, C, D, meta.d[o], meta.d[is_v ? o + 3u : o + 1u], 0u, 0xffffffffu, 0u,
                  U32(uint64_t(meta) + 4ul * uint64_t(is_v ? 2u * H + 5u : H + 5u)), is_v ? 0u : meta.d[o + 2u]);
}

uint kv_bits(const uint t) { return t == KV_KIVI2 ? 2u : 4u; }
bool kv_kivi(const uint t) { return t >= KV_KIVI2; }

// words of one entry's row
uint kv_row_words(const uint t, uint D) {
    return t == KV_F32 ? D : t == KV_F16 ? D / 2u : t == KV_Q8_0 ? D / 4u : t == KV_Q4_0 ? D / 8u
                                                                    : D * kv_bits(t) / 32u;
}

uint kv_p0(const uint t, KvSide s) { return s.H * s.C * kv_row_words(t, s.D); }

uint kv_param_words(const uint t, const bool is_v, KvSide s) {
    if (t == KV_Q8_0 || t == KV_Q4_0) return (s.H * s.C * (s.D / 32u) + 1u) / 2u;
    if (!kv_kivi(t)) return 0u;
    return is_v ? s.H * s.C * (s.D / s.G) : kv_managed(s) ? s.H * s.NGC * s.D : s.H * ((s.C + s.G - 1u) / s.G) * s.D;
}

uint kv_r0(const uint t, const bool is_v, KvSide s) {
    return kv_p0(t, s) + ((kv_param_words(t, is_v, s) + 1u) & ~1u);
}

// fp16 index (in halves from base) of a residual entry of head h
uint kv_ring_half(const uint t, const bool is_v, KvSide s, uint h, uint j) {
    if (kv_managed(s)) return 2u * kv_r0(t, is_v, s) + (h * s.TC + (j - s.hq.d[h])) * s.D;
    return 2u * kv_r0(t, is_v, s) + (h * s.TC + j % s.TC) * s.D;
}

// word of a compressed KIVI key side's group table ([H][C] after the residual)
uint kv_x0(const uint t, KvSide s) { return kv_r0(t, false, s) + s.H * s.TC * s.D / 2u; }

// A KIVI residual value: the ring below pos0, the forward's scratch from it.
float kv_resid(const uint t, const bool is_v, KvSide s, uint h, uint j, uint c) {
    if (j < s.pos0 || kv_managed(s)) return float(F16(s.base).d[kv_ring_half(t, is_v, s, h, j) + c]);
    return float(s.scr.d[(h * s.scr_stride + (j - s.pos0)) * s.D + c]);
}

// the fp16 scale and minimum of KIVI code (h, j, c)
vec2 kivi_param(const uint t, const bool is_v, KvSide s, uint h, uint j, uint c) {
    const uint p0 = kv_p0(t, s);
    const uint w = is_v ? p0 + (h * s.C + j) * (s.D / s.G) + c / s.G
                 : kv_managed(s) ? p0 + (h * s.NGC + s.base.d[kv_x0(t, s) + h * s.C + j]) * s.D + c
                                 : p0 + (h * ((s.C + s.G - 1u) / s.G) + j / s.G) * s.D + c;
    return unpackHalf2x16(s.base.d[w]);
}

// Channels 8e .. 8e + 7 of entry j of head h.
void kv_row8(const uint t, const bool is_v, KvSide s, uint h, uint j, uint e, out float x[8]) {
    const uint row = h * s.C + j;
    if (t == KV_F32) {
        const uint o = (row * s.D) / 4u + 2u * e;
        vec4 a = V4(s.base).d[o], b = V4(s.base).d[o + 1u];
        x = float[8](a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
    } else if (t == KV_F16) {
        uvec4 u = U4(s.base).d[(row * s.D) / 8u + e];
        vec2 a = unpackHalf2x16(u.x), b = unpackHalf2x16(u.y), c = unpackHalf2x16(u.z), d = unpackHalf2x16(u.w);
        x = float[8](a.x, a.y, b.x, b.y, c.x, c.y, d.x, d.y);
    } else if (t == KV_Q8_0) {
        const uint w = row * (s.D / 4u) + 2u * e;
        const float d = float(F16(s.base).d[2u * kv_p0(t, s) + row * (s.D / 32u) + e / 4u]);
        const uint u0 = s.base.d[w], u1 = s.base.d[w + 1u];
        for (uint i = 0; i < 4u; i++) {
            x[i] = float(bitfieldExtract(int(u0), int(8u * i), 8)) * d;
            x[i + 4u] = float(bitfieldExtract(int(u1), int(8u * i), 8)) * d;
        }
    } else if (t == KV_Q4_0) {
        // block e / 4: bytes 0-15 hold elements 0-15 (low nibbles) and 16-31 (high)
        const uint w = row * (s.D / 8u) + (e / 4u) * 4u + (e % 2u) * 2u, sh = ((e % 4u) / 2u) * 4u;
        const float d = float(F16(s.base).d[2u * kv_p0(t, s) + row * (s.D / 32u) + e / 4u]);
        const uint u0 = s.base.d[w], u1 = s.base.d[w + 1u];
        for (uint i = 0; i < 4u; i++) {
            x[i] = float(int((u0 >> (8u * i + sh)) & 15u) - 8) * d;
            x[i + 4u] = float(int((u1 >> (8u * i + sh)) & 15u) - 8) * d;
        }
    } else if (j < kv_nq(s, h)) { // KIVI codes
        const uint b = kv_bits(t), bit0 = 8u * e * b;
        const uint u = s.base.d[row * kv_row_words(t, s.D) + bit0 / 32u] >> (bit0 % 32u);
        for (uint i = 0; i < 8u; i++) {
            const vec2 sm = kivi_param(t, is_v, s, h, j, 8u * e + i);
            x[i] = float((u >> (b * i)) & ((1u << b) - 1u)) * sm.x + sm.y;
        }
    } else {
        for (uint i = 0; i < 8u; i++) x[i] = kv_resid(t, is_v, s, h, j, 8u * e + i);
    }
}

// Channel c of entry j of head h.
float kv_elem(const uint t, const bool is_v, KvSide s, uint h, uint j, uint c) {
    const uint row = h * s.C + j;
    if (t == KV_F32) return F32(s.base).d[row * s.D + c];
    if (t == KV_F16) return float(F16(s.base).d[row * s.D + c]);
    if (t == KV_Q8_0 || t == KV_Q4_0) {
        const float d = float(F16(s.base).d[2u * kv_p0(t, s) + row * (s.D / 32u) + c / 32u]);
        if (t == KV_Q8_0) {
            const uint u = s.base.d[row * (s.D / 4u) + c / 4u];
            return float(bitfieldExtract(int(u), int(8u * (c % 4u)), 8)) * d;
        }
        const uint i = c % 32u, byte = (c / 32u) * 16u + i % 16u;
        const uint u = s.base.d[row * (s.D / 8u) + byte / 4u] >> (8u * (byte % 4u) + (i / 16u) * 4u);
        return float(int(u & 15u) - 8) * d;
    }
    if (j < kv_nq(s, h)) {
        const uint b = kv_bits(t), bit = c * b;
        const uint q = (s.base.d[row * kv_row_words(t, s.D) + bit / 32u] >> (bit % 32u)) & ((1u << b) - 1u);
        const vec2 sm = kivi_param(t, is_v, s, h, j, c);
        return float(q) * sm.x + sm.y;
    }
    return kv_resid(t, is_v, s, h, j, c);
}
