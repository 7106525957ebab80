/*
 * vk_push.h — the push constants of each compute shader, as C structs
 * (the layouts of the push_constant blocks in src/gpu/shaders/NAME.comp:
 * device addresses first, then 32-bit fields). Shared by the backend and
 * the shader tests.
 */
#ifndef EKV_GPU_VK_PUSH_H
#define EKV_GPU_VK_PUSH_H

#include <stdint.h>

struct ekv_vk_pc_rmsnorm { uint64_t x, w, y; uint32_t n, rows, x_stride, y_stride; float eps; };
struct ekv_vk_pc_matvec {
    uint64_t w, s, x, y, b;
    uint32_t ne0, ne1, n, x_stride, y_stride, flags;
};
/* ekv_vk_pc_matvec.flags */
enum {
    EKV_VK_MV_ACC = 1,      /* Y += */
    EKV_VK_MV_BIAS = 2      /* + b */
};
struct ekv_vk_pc_rope_store {
    uint64_t q, k, v, cs, kdst, vdst, meta, posb, qdst;
    uint32_t n_head, H, D, rope_dim, neox, rows, q_stride, kv_stride, k_hstride, k_e0, v_hstride, v_e0, pos0;
};
struct ekv_vk_pc_attn {
    uint64_t q, kc, vc, part, kscr, vscr, meta;
    uint32_t n_head, n_head_kv, head_dim, n_ctx, pos0, rows, q_stride, n_split, split_len, window;
    float scale;
    uint32_t g, tc_k, tc_v, nq_k, nq_v, scr_stride, kv_pos0;
};
struct ekv_vk_pc_kivi {
    uint64_t base, scr;
    uint32_t H, C, D, G, TC, pos0, j0, n, scr_stride;
};
struct ekv_vk_pc_combine { uint64_t part, out, ml; uint32_t n_head, head_dim, rows, n_split, out_stride; };
struct ekv_vk_pc_attn_stats {
    uint64_t q, kc, ml, meta, st, zeros, acc;
    uint32_t n_head, n_head_kv, head_dim, n_ctx, rows, q_stride;
    uint32_t cap, wrow, s_colsum, s_sumsq, s_last, s_win, s_bin;
    uint32_t flags; /* bit 0: sparsity counts; bits 1-2: 0 increments, 1 add into acc, 2 acc + increment (acc zeroed) */
    float scale, sparsity_p;
    uint32_t window, pos0;
};
struct ekv_vk_pc_kv_merge {
    uint64_t base, stage, table, members, rots, hq, frows;
    uint32_t H, C, D, rw, srw, rd, neox, G, TC, NGC;
};
struct ekv_vk_pc_kivi_pack {
    uint64_t base, stage, pstage, units, members, frows;
    uint32_t H, C, D, G, TC, NGC, srw, psrw;
};
struct ekv_vk_pc_kv_compact { uint64_t runs, pre, segs, scr; uint32_t n_runs, phase; };
struct ekv_vk_pc_glu { uint64_t g, u; uint32_t n, gelu; };
struct ekv_vk_pc_layernorm { uint64_t x, w, b, y; uint32_t n, rows; float eps; uint32_t rms; };
struct ekv_vk_pc_clip_attn { uint64_t q, k, v, o, win; uint32_t n, E, dh; float scale; uint32_t t0; };
struct ekv_vk_pc_ew { uint64_t y, a; uint32_t n, op, dh, E, g; };
/* ekv_vk_pc_ew.op */
enum { EKV_VK_EW_ADD = 0, EKV_VK_EW_GELU, EKV_VK_EW_QUICK_GELU, EKV_VK_EW_SILU, EKV_VK_EW_ROPE, EKV_VK_EW_SHUFFLE };


#endif
