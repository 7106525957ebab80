/*
 * backend_vk_clip.c — the vision tower on the GPU: what ekv_clip_encode_pixels
 * (LLaVA's CLIP with the mlp projector: LLaVA-1.5, each overview and tile of
 * LLaVA-1.6) and ekv_clip_encode_qwen2vl_pixels (Qwen2-VL and Qwen2.5-VL's
 * towers) do in src/vision (the references), so that an image's hundreds or
 * thousands of rows reach the cache without a CPU pass through the tower.
 * One submission per image or tile:
 *   patches (im2col on the host; rows padded with zeros to a multiple of 8)
 *   through the patch projection (+ bias) after the class token's row, then
 *   + position embeddings (ew.comp) — or, Qwen2-VL, the two temporal halves
 *   of its Conv3D summed (the second projection accumulates), the patches in
 *   2 x 2 block order; the pre-norm when there is one (layernorm.comp);
 *   per block: norm 1 (LayerNorm, or RMSNorm with bias for Qwen2.5-VL), Q/K/V
 *   (+ biases), Qwen2-VL's 2D RoPE on Q and K (ew.comp, the host's {cos,
 *   sin} table), attention over every row or, in Qwen2.5-VL's windowed
 *   blocks, over the rows of the same window (clip_attn.comp), the output
 *   projection added to x (matvec's accumulate), norm 2, the MLP (up +
 *   activation, or SwiGLU's gate and up through glu.comp) and down added
 *   to x; the post-norm; the projector (mm.0 + bias, GELU, mm.2 + bias) on
 *   the patch rows — Qwen2-VL's merger reads each 2 x 2 block as one row of
 *   4 E, which the block order makes contiguous; Idefics3 (SmolVLM): the
 *   pixel shuffle (ew.comp) and the connector's one map — into host memory.
 * The products are matvec.comp's (the language model's); the sums run in
 * other orders than the CPU's, so the embeddings agree to rounding, not
 * bits (tests/test_gpu.c "vision" states the bound). Idefics3's tiles and
 * overview come one by one (clip's ekv_clip_encode_tile), like LLaVA-1.6's.
 *
 * The device is a context's (images encoded with a GPU context) or one
 * opened for the tower alone (ekv_vision_set_device: the server's request
 * threads encode there, one at a time, beside the engine's context). The
 * tower's weights are uploaded on the first image into the tower state's
 * own table (struct ekv_vk_tower), keyed by ekv_clip_id, and replaced when
 * it meets another tower.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend_vk.h"
#include "gpu/vk_push.h"
#include "vision/clip_impl.h"

static int64_t pad8(int64_t n) { return (n + 7) & ~(int64_t)7; }

static bool is_qwen(const struct ekv_clip *c) { return c->hp.proj == EKV_CLIP_PROJ_QWEN2VL; }
static bool is_idefics(const struct ekv_clip *c) { return c->hp.proj == EKV_CLIP_PROJ_IDEFICS3; }

/* The block weights a tower reads (ffg only with SwiGLU). */
static void block_mats(const struct clip_layer *L, const struct ekv_weight *w[7]) {
    w[0] = &L->q, w[1] = &L->k, w[2] = &L->v, w[3] = &L->o, w[4] = &L->ff1, w[5] = &L->ff2;
    w[6] = L->ffg.data ? &L->ffg : NULL;
}

const char *ekv_vk_tower_unsupported(const struct ekv_clip *c) {
    const struct ekv_clip_hparams *hp = &c->hp;
    if (hp->proj != EKV_CLIP_PROJ_MLP && !is_qwen(c) && !is_idefics(c))
        return "only LLaVA's (mlp projector), Idefics3's and Qwen2-VL's towers run on the GPU in this version";
    const int dh = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    if (hp->n_embd % 8 || hp->n_embd_out % 8 || dh <= 0 || hp->n_embd % hp->n_head || dh > 256 || dh % 2)
        return "tower widths not a multiple of 8 (or heads over 256) run on the CPU";
    if (is_qwen(c) && !c->patch1.data) return "a Qwen2-VL tower without its second patch kernel";
    if (is_idefics(c) && (hp->scale_factor < 1 || (hp->image_size / hp->patch_size) % hp->scale_factor))
        return "an Idefics3 grid that the scale factor does not divide";
    const struct ekv_weight *w[4] = {&c->patch, is_idefics(c) ? &c->fc : &c->mm0, is_idefics(c) ? &c->fc : &c->mm2,
                                     is_qwen(c) ? &c->patch1 : &c->patch};
    for (int i = 0; i < 4; i++)
        if (!ekv_vk_weight_type_ok(w[i]->type)) return "a tower weight type without a GPU shader";
    for (int il = 0; il < hp->n_layer_run; il++) {
        const struct clip_layer *L = &c->layers[il];
        const struct ekv_weight *lw[7];
        block_mats(L, lw);
        for (int i = 0; i < 7; i++)
            if (lw[i] && !ekv_vk_weight_type_ok(lw[i]->type)) return "a tower weight type without a GPU shader";
        if (L->ffg.data && !hp->use_silu && !hp->use_gelu) return "a SwiGLU tower with quick GELU runs on the CPU";
    }
    if (hp->has_class && !c->cls) return "a class token without its embedding";
    return NULL;
}

/* Uploads tower c's weights into g->ct (replacing another tower's). */
static enum ekv_status upload_tower(struct ekv_vk_tower *g, const struct ekv_clip *c) {
    if (g->clip_id == ekv_clip_id(c)) return EKV_OK;
    ekv_vk_ttab_free(g->vk, &g->ct);
    g->clip_id = 0;
    const struct ekv_clip_hparams *hp = &c->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    struct ekv_vk *vk = g->vk;
    struct ekv_vk_ttab *tt = &g->ct;
    enum ekv_status s = ekv_vk_ttab_weight(vk, tt, &c->patch, "vision patch projection");
    if (s == EKV_OK && c->patch1.data) s = ekv_vk_ttab_weight(vk, tt, &c->patch1, "vision patch projection");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->patch_b, E, "vision patch bias");
    if (s == EKV_OK && c->pos) s = ekv_vk_ttab_vector(vk, tt, c->pos, (int64_t)hp->n_pos * E, "vision positions");
    const float *norms[4] = {c->pre_w, c->pre_b, c->post_w, c->post_b};
    for (int i = 0; i < 4 && s == EKV_OK; i++) s = ekv_vk_ttab_vector(vk, tt, norms[i], E, "vision norms");
    for (int il = 0; il < hp->n_layer_run && s == EKV_OK; il++) {
        const struct clip_layer *L = &c->layers[il];
        const struct ekv_weight *w[7];
        block_mats(L, w);
        for (int i = 0; i < 7 && s == EKV_OK; i++)
            if (w[i]) s = ekv_vk_ttab_weight(vk, tt, w[i], "vision block weights");
        const float *v[11] = {L->ln1_w, L->ln1_b, L->ln2_w, L->ln2_b, L->q_b, L->k_b, L->v_b, L->o_b, L->ff2_b,
                              L->ff1_b, L->ffg_b};
        for (int i = 0; i < 11 && s == EKV_OK; i++)
            s = ekv_vk_ttab_vector(vk, tt, v[i], i >= 9 ? F : E, "vision block vectors");
    }
    if (s == EKV_OK && is_idefics(c)) {
        s = ekv_vk_ttab_weight(vk, tt, &c->fc, "vision projector");
    } else if (s == EKV_OK) {
        s = ekv_vk_ttab_weight(vk, tt, &c->mm0, "vision projector");
        if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->mm0_b, hp->n_mm, "vision projector");
        if (s == EKV_OK) s = ekv_vk_ttab_weight(vk, tt, &c->mm2, "vision projector");
        if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->mm2_b, hp->n_embd_out, "vision projector");
    }
    ekv_vk_ttab_sort(tt);
    if (s != EKV_OK) {
        ekv_vk_ttab_free(vk, tt);
        return s;
    }
    g->clip_id = ekv_clip_id(c);
    return EKV_OK;
}

/* Device address of a vector uploaded to the tower's table (0: none). */
static uint64_t vec_addr(const struct ekv_vk_tower *g, const float *v) {
    const struct ekv_vk_tensor *t = v ? ekv_vk_ttab_find(&g->ct, v) : NULL;
    return t ? t->buf.addr : 0;
}

/* y (+)= W x (+ b) over n rows, W and b from the tower's table. */
static enum ekv_status mv(struct ekv_vk_tower *g, const struct ekv_weight *w, uint64_t x, uint32_t xs, uint64_t y,
                          uint32_t ys, const float *b, bool acc, int64_t n, bool barrier) {
    const struct ekv_vk_tensor *t = ekv_vk_ttab_find(&g->ct, w->data), *bt = b ? ekv_vk_ttab_find(&g->ct, b) : NULL;
    if (!t || (b && !bt)) return ekv_err(EKV_ERR_INTERNAL, "a vision tower weight is not on the device");
    return ekv_vk_matvec_rec(g->vk, t, bt, x, xs, y, ys, acc, (int32_t)n, barrier);
}

/* One image's (or tile's) shape and activations. */
enum { B_COLS, B_X, B_H, B_Q, B_K, B_V, B_ATT, B_FF, B_UP, B_MID, B_OUT, B_CS, B_WIN, B_COUNT };
struct tower_run {
    struct ekv_vk_buf b[B_COUNT];
    int64_t n;      /* rows through the blocks (patches, + the class row) */
    int64_t np;     /* patch rows */
    int64_t n_in;   /* rows into the projector: patches, 2 x 2 blocks of 4 E (Qwen2-VL), or s x s blocks
                       of s*s*E (Idefics3's pixel shuffle, in B_MID) */
    int64_t K8, F8, M8, E;
};

static void run_free(struct ekv_vk *vk, struct tower_run *t) {
    for (int i = 0; i < B_COUNT; i++) ekv_vk_buf_free(vk, &t->b[i]);
}

static enum ekv_status run_new(struct ekv_vk *vk, const struct ekv_clip *c, int W, int H, struct tower_run *t) {
    const struct ekv_clip_hparams *hp = &c->hp;
    memset(t, 0, sizeof *t);
    const int64_t P = hp->patch_size, E = hp->n_embd, dh = E / hp->n_head;
    t->np = (W / P) * (H / P);
    t->n = t->np + (hp->has_class ? 1 : 0);
    t->n_in = is_qwen(c) ? t->np / 4 : is_idefics(c) ? hp->n_tile_tokens : t->np;
    t->K8 = pad8(3 * P * P), t->F8 = pad8(hp->n_ff), t->M8 = pad8(hp->n_mm), t->E = E;
    const bool swiglu = c->layers[0].ffg.data != NULL;
    const int64_t n = t->n, floats[B_COUNT] = {t->np * t->K8, n * E, n * E, n * E, n * E, n * E, n * E, n * t->F8,
                                               swiglu ? n * t->F8 : 0, is_idefics(c) ? t->np * E : t->n_in * t->M8,
                                               t->n_in * (int64_t)hp->n_embd_out, is_qwen(c) ? n * dh : 0,
                                               hp->wa_pattern > 0 ? n : 0};
    static const char *const what[B_COUNT] = {"vision patches", "vision x", "vision h", "vision q", "vision k",
                                              "vision v", "vision attention", "vision mlp", "vision mlp",
                                              "vision projector", "vision output", "vision rope", "vision windows"};
    enum ekv_status s = EKV_OK;
    for (int i = 0; i < B_COUNT && s == EKV_OK; i++) {
        size_t bytes;
        if (floats[i] == 0) continue;
        if (!ekv_mul_ok((size_t)floats[i], sizeof(float), &bytes))
            s = ekv_err(EKV_ERR_OVERFLOW, "%s: %lld floats", what[i], (long long)floats[i]);
        else
            s = ekv_vk_buf_new(vk, bytes, i == B_COLS || i == B_OUT || i == B_CS || i == B_WIN, what[i], &t->b[i]);
    }
    if (s != EKV_OK) run_free(vk, t);
    return s;
}

static uint32_t groups(int64_t n, int64_t per) {
    const int64_t g = (n + per - 1) / per;
    return (uint32_t)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

/* The tower's norm (LayerNorm, or RMSNorm for Qwen2.5-VL) of rows of x into y. */
static void norm(struct ekv_vk_tower *g, const struct ekv_clip *c, uint64_t x, const float *w, const float *b, uint64_t y,
                 int64_t rows) {
    struct ekv_vk_pc_layernorm pc = {.x = x, .w = vec_addr(g, w), .b = vec_addr(g, b), .y = y,
                                     .n = (uint32_t)c->hp.n_embd, .rows = (uint32_t)rows, .eps = c->hp.eps,
                                     .rms = c->hp.rms_norm ? 1u : 0u};
    ekv_vk_dispatch(g->vk, EKV_VK_LAYERNORM, &pc, sizeof pc, groups(rows, 1), 1, 1);
}

static void ew(struct ekv_vk_tower *g, uint64_t y, uint64_t a, int64_t n, uint32_t op, uint32_t dh, uint32_t E) {
    struct ekv_vk_pc_ew pc = {.y = y, .a = a, .n = (uint32_t)n, .op = op, .dh = dh, .E = E};
    ekv_vk_dispatch(g->vk, EKV_VK_EW, &pc, sizeof pc, groups(n, 256), 1, 1);
}

/* Idefics3's pixel shuffle of the patch rows px into B_MID, then the
 * connector's one linear map (no bias) into B_OUT. */
static enum ekv_status idefics_project(struct ekv_vk_tower *g, const struct ekv_clip *c, struct tower_run *t,
                                       uint64_t px) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const int64_t S = hp->scale_factor;
    struct ekv_vk_pc_ew pc = {.y = t->b[B_MID].addr, .a = px, .n = (uint32_t)(t->np * t->E), .op = EKV_VK_EW_SHUFFLE,
                              .dh = (uint32_t)S, .E = (uint32_t)t->E, .g = (uint32_t)(hp->image_size / hp->patch_size)};
    ekv_vk_dispatch(g->vk, EKV_VK_EW, &pc, sizeof pc, groups(pc.n, 256), 1, 1);
    return mv(g, &c->fc, t->b[B_MID].addr, (uint32_t)(S * S * t->E), t->b[B_OUT].addr, (uint32_t)hp->n_embd_out, NULL,
              false, t->n_in, true);
}

static uint32_t act_op(const struct ekv_clip_hparams *hp) {
    return hp->use_gelu ? EKV_VK_EW_GELU : hp->use_silu ? EKV_VK_EW_SILU : EKV_VK_EW_QUICK_GELU;
}

/* Attention of every row (workgroups of at most 65535 rows per dispatch). */
static void attend(struct ekv_vk_tower *g, const struct ekv_clip *c, struct tower_run *t, bool windowed) {
    const int64_t dh = t->E / c->hp.n_head;
    struct ekv_vk_pc_clip_attn pa = {.q = t->b[B_Q].addr, .k = t->b[B_K].addr, .v = t->b[B_V].addr,
                                     .o = t->b[B_ATT].addr, .win = windowed ? t->b[B_WIN].addr : 0,
                                     .n = (uint32_t)t->n, .E = (uint32_t)t->E, .dh = (uint32_t)dh,
                                     .scale = 1.0f / sqrtf((float)dh)};
    for (int64_t r = 0; r < t->n; r += 65535) {
        pa.t0 = (uint32_t)r;
        const uint32_t rows = (uint32_t)EKV_MIN((int64_t)65535, t->n - r);
        ekv_vk_dispatch(g->vk, EKV_VK_CLIP_ATTN, &pa, sizeof pa, rows, (uint32_t)c->hp.n_head, 1);
    }
}

/* One block on x (the recording is open). */
static enum ekv_status record_block(struct ekv_vk_tower *g, const struct ekv_clip *c, int il, struct tower_run *t) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const struct clip_layer *L = &c->layers[il];
    const int64_t n = t->n, E = t->E, dh = E / hp->n_head;
    const uint64_t x = t->b[B_X].addr, h = t->b[B_H].addr, ff = t->b[B_FF].addr;
    const uint32_t e = (uint32_t)E, f8 = (uint32_t)t->F8;
    norm(g, c, x, L->ln1_w, L->ln1_b, h, n);
    enum ekv_status s = mv(g, &L->q, h, e, t->b[B_Q].addr, e, L->q_b, false, n, false);
    if (s == EKV_OK) s = mv(g, &L->k, h, e, t->b[B_K].addr, e, L->k_b, false, n, false);
    if (s == EKV_OK) s = mv(g, &L->v, h, e, t->b[B_V].addr, e, L->v_b, false, n, true);
    if (s != EKV_OK) return s;
    if (is_qwen(c)) { /* the 2D RoPE on every head of q and k */
        ew(g, t->b[B_Q].addr, t->b[B_CS].addr, n * hp->n_head * (dh / 2), EKV_VK_EW_ROPE, (uint32_t)dh, e);
        ew(g, t->b[B_K].addr, t->b[B_CS].addr, n * hp->n_head * (dh / 2), EKV_VK_EW_ROPE, (uint32_t)dh, e);
    }
    attend(g, c, t, hp->wa_pattern > 0 && (il + 1) % hp->wa_pattern != 0);
    if ((s = mv(g, &L->o, t->b[B_ATT].addr, e, x, e, L->o_b, true, n, true))) return s;
    norm(g, c, x, L->ln2_w, L->ln2_b, h, n);
    if (L->ffg.data) { /* SwiGLU: act(gate) * up */
        if ((s = mv(g, &L->ffg, h, e, ff, f8, L->ffg_b, false, n, false)) ||
            (s = mv(g, &L->ff1, h, e, t->b[B_UP].addr, f8, L->ff1_b, false, n, true)))
            return s;
        struct ekv_vk_pc_glu pg = {.g = ff, .u = t->b[B_UP].addr, .n = (uint32_t)(n * t->F8), .gelu = hp->use_gelu};
        ekv_vk_dispatch(g->vk, EKV_VK_GLU, &pg, sizeof pg, groups(n * t->F8, 256), 1, 1);
    } else {
        if ((s = mv(g, &L->ff1, h, e, ff, f8, L->ff1_b, false, n, true))) return s;
        ew(g, ff, 0, n * t->F8, act_op(hp), 0, 0); /* the pad columns stay 0: act(0) = 0 */
    }
    return mv(g, &L->ff2, ff, f8, x, e, L->ff2_b, true, n, true);
}

static enum ekv_status record_tower(struct ekv_vk_tower *g, const struct ekv_clip *c, struct tower_run *t) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const int64_t E = t->E, cls = hp->has_class ? 1 : 0;
    const uint64_t x = t->b[B_X].addr, px = x + (uint64_t)(cls * E) * sizeof(float);
    /* the pad columns of the MLP rows (and SwiGLU's up rows, and the projector's) stay zero */
    ekv_vk_fill(g->vk, &t->b[B_FF], 0, t->b[B_FF].bytes & ~(size_t)3, 0);
    if (t->b[B_UP].buffer) ekv_vk_fill(g->vk, &t->b[B_UP], 0, t->b[B_UP].bytes & ~(size_t)3, 0);
    if (t->M8 != hp->n_mm) ekv_vk_fill(g->vk, &t->b[B_MID], 0, t->b[B_MID].bytes & ~(size_t)3, 0);
    const uint32_t k8 = (uint32_t)t->K8, e = (uint32_t)E;
    /* (Qwen2-VL's Conv3D has no bias here, as in qwen2vl.c's embed) */
    enum ekv_status s = mv(g, &c->patch, t->b[B_COLS].addr, k8, px, e, is_qwen(c) ? NULL : c->patch_b, false, t->np, true);
    if (s == EKV_OK && is_qwen(c)) s = mv(g, &c->patch1, t->b[B_COLS].addr, k8, px, e, NULL, true, t->np, true);
    if (s != EKV_OK) return s;
    if (c->pos) ew(g, x, vec_addr(g, c->pos), t->n * E, EKV_VK_EW_ADD, 0, 0);
    if (c->pre_w) norm(g, c, x, c->pre_w, c->pre_b, x, t->n);
    for (int il = 0; il < hp->n_layer_run && s == EKV_OK; il++) s = record_block(g, c, il, t);
    if (s != EKV_OK) return s;
    if (c->post_w) norm(g, c, x, c->post_w, c->post_b, x, t->n);
    if (is_idefics(c)) return idefics_project(g, c, t, px);
    const uint32_t in_w = (uint32_t)(is_qwen(c) ? 4 * E : E), m8 = (uint32_t)t->M8, eo = (uint32_t)hp->n_embd_out;
    s = mv(g, &c->mm0, px, in_w, t->b[B_MID].addr, m8, c->mm0_b, false, t->n_in, true);
    if (s != EKV_OK) return s;
    ew(g, t->b[B_MID].addr, 0, t->n_in * t->M8, EKV_VK_EW_GELU, 0, 0);
    return mv(g, &c->mm2, t->b[B_MID].addr, m8, t->b[B_OUT].addr, eo, c->mm2_b, false, t->n_in, true);
}

enum ekv_status ekv_vk_tower_pixels(void *user, const struct ekv_clip *c, const float *pixels, int W, int H,
                                    float *out) {
    struct ekv_vk_tower *g = user;
    const char *why = ekv_vk_tower_unsupported(c);
    if (why) return ekv_err(EKV_ERR_UNSUPPORTED, "vision tower on the GPU: %s", why);
    const struct ekv_clip_hparams *hp = &c->hp;
    const int a = is_qwen(c) ? hp->patch_size * hp->merge : hp->image_size;
    if (W <= 0 || H <= 0 || W % a || H % a || (!is_qwen(c) && (W != hp->image_size || H != hp->image_size)) ||
        (int64_t)(W / a) * (H / a) > EKV_CLIP_QWEN2VL_MAX_TOKENS)
        return ekv_err(EKV_ERR_INVALID_ARG, "vision tower on the GPU: a %dx%d input does not fit the tower", W, H);
    enum ekv_status s = upload_tower(g, c);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s: the vision tower's weights", ekv_vk_name(g->vk));
    struct tower_run t;
    if ((s = run_new(g->vk, c, W, H, &t)) != EKV_OK) return s;
    /* the class token's row; the patch rows are written by the projection */
    if (hp->has_class) s = ekv_vk_upload(g->vk, &t.b[B_X], 0, c->cls, (size_t)hp->n_embd * sizeof(float));
    if (s == EKV_OK) {
        if (is_qwen(c))
            ekv_clip_qwen2vl_inputs(c, pixels, W, H, t.b[B_COLS].host, (size_t)t.K8, t.b[B_CS].host, t.b[B_WIN].host);
        else
            ekv_clip_patch_rows(c, pixels, t.b[B_COLS].host, (size_t)t.K8);
        s = ekv_vk_begin(g->vk);
    }
    if (s == EKV_OK) {
        s = record_tower(g, c, &t);
        if (s == EKV_OK) s = ekv_vk_submit(g->vk);
        else ekv_vk_abort(g->vk);
    }
    if (s == EKV_OK) memcpy(out, t.b[B_OUT].host, (size_t)t.n_in * (size_t)hp->n_embd_out * sizeof(float));
    run_free(g->vk, &t);
    return s;
}

enum ekv_status ekv_vk_tower_open(const char *spec, struct ekv_vk_tower **out) {
    *out = NULL;
    struct ekv_vk *vk = NULL;
    enum ekv_status s = ekv_vk_open(spec, &vk);
    if (s != EKV_OK || !vk) return s; /* auto and no GPU: the CPU */
    if (ekv_vk_matvec_m(vk) == 0) {
        ekv_vk_close(vk);
        return ekv_err(EKV_ERR_UNSUPPORTED, "device %s: subgroups of %u invocations (the matvec shader needs 8 or more)",
                       spec, ekv_vk_subgroup_size(vk));
    }
    struct ekv_vk_tower *t = calloc(1, sizeof *t);
    if (!t) {
        ekv_vk_close(vk);
        return ekv_err(EKV_ERR_NOMEM, "out of memory");
    }
    t->vk = vk;
    t->own = true;
    *out = t;
    return EKV_OK;
}

void ekv_vk_tower_release(struct ekv_vk_tower *t) {
    if (!t || !t->vk) return;
    ekv_vk_ttab_free(t->vk, &t->ct);
    t->clip_id = 0;
}

void ekv_vk_tower_free(struct ekv_vk_tower *t) {
    if (!t) return;
    ekv_vk_tower_release(t);
    if (t->own) ekv_vk_close(t->vk);
    free(t);
}
