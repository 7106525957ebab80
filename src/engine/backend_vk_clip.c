/*
 * backend_vk_clip.c — the vision tower on the GPU: ekv_clip_encode_pixels
 * (src/vision/clip.c, the reference) for a fixed-size ViT with the mlp
 * projector (LLaVA-1.5; each overview and tile of LLaVA-1.6), so that the
 * image's hundreds of rows reach the cache without a CPU pass through the
 * tower. One submission per image or tile:
 *   patches (im2col on the host, rows padded with zeros to a multiple of 8)
 *   through the patch projection (+ bias) after the class token's row,
 *   + position embeddings (ew.comp), pre-LayerNorm (layernorm.comp);
 *   per block: LN1, Q/K/V (+ biases), attention over every row
 *   (clip_attn.comp), the output projection added to x (matvec's
 *   accumulate), LN2, MLP up (+ bias), GELU or quick GELU or SiLU, down
 *   (+ bias) added to x; post-LayerNorm when present; the projector
 *   (mm.0 + bias, GELU, mm.2 + bias) on the patch rows into host memory.
 * The products are matvec.comp's (the language model's); the sums run in
 * other orders than the CPU's, so the embeddings agree to rounding, not
 * bits (tests/test_gpu.c "vision" states the bound). Other towers
 * (Idefics3, Qwen2-VL, RMSNorm or SwiGLU blocks) run on the CPU:
 * ekv_vk_clip_unsupported says why.
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

#define CLIP_ATTN_MAXN 1024 /* clip_attn.comp's MAXN */

static int64_t pad8(int64_t n) { return (n + 7) & ~(int64_t)7; }

const char *ekv_vk_tower_unsupported(const struct ekv_clip *c) {
    const struct ekv_clip_hparams *hp = &c->hp;
    if (hp->proj != EKV_CLIP_PROJ_MLP) return "only the mlp projector's tower (LLaVA) runs on the GPU in this version";
    if (hp->rms_norm) return "RMSNorm towers run on the CPU in this version";
    if (hp->n_pos > CLIP_ATTN_MAXN) return "towers of more than 1024 positions run on the CPU in this version";
    const int dh = hp->n_embd / hp->n_head;
    if (hp->n_embd % 8 || hp->n_embd_out % 8 || dh <= 0 || hp->n_embd % hp->n_head)
        return "tower widths not a multiple of 8 run on the CPU";
    const struct ekv_weight *w[4] = {&c->patch, &c->mm0, &c->mm2, NULL};
    for (int i = 0; i < 3; i++)
        if (!ekv_vk_weight_type_ok(w[i]->type)) return "a tower weight type without a GPU shader";
    for (int il = 0; il < hp->n_layer_run; il++) {
        const struct clip_layer *L = &c->layers[il];
        if (L->ffg.data) return "SwiGLU towers run on the CPU in this version";
        const struct ekv_weight *lw[6] = {&L->q, &L->k, &L->v, &L->o, &L->ff1, &L->ff2};
        for (int i = 0; i < 6; i++)
            if (!ekv_vk_weight_type_ok(lw[i]->type)) return "a tower weight type without a GPU shader";
        if (!L->ln1_w || !L->ln1_b || !L->ln2_w || !L->ln2_b) return "a tower block without LayerNorm weights";
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
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->patch_b, E, "vision patch bias");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->pos, (int64_t)hp->n_pos * E, "vision positions");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->pre_w, E, "vision pre-norm");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->pre_b, E, "vision pre-norm");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->post_w, E, "vision post-norm");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->post_b, E, "vision post-norm");
    for (int il = 0; il < hp->n_layer_run && s == EKV_OK; il++) {
        const struct clip_layer *L = &c->layers[il];
        const struct ekv_weight *w[6] = {&L->q, &L->k, &L->v, &L->o, &L->ff1, &L->ff2};
        for (int i = 0; i < 6 && s == EKV_OK; i++) s = ekv_vk_ttab_weight(vk, tt, w[i], "vision block weights");
        const float *v[10] = {L->ln1_w, L->ln1_b, L->ln2_w, L->ln2_b, L->q_b, L->k_b, L->v_b, L->o_b, L->ff2_b, L->ff1_b};
        for (int i = 0; i < 10 && s == EKV_OK; i++) s = ekv_vk_ttab_vector(vk, tt, v[i], i == 9 ? F : E, "vision block vectors");
    }
    if (s == EKV_OK) s = ekv_vk_ttab_weight(vk, tt, &c->mm0, "vision projector");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->mm0_b, hp->n_mm, "vision projector");
    if (s == EKV_OK) s = ekv_vk_ttab_weight(vk, tt, &c->mm2, "vision projector");
    if (s == EKV_OK) s = ekv_vk_ttab_vector(vk, tt, c->mm2_b, hp->n_embd_out, "vision projector");
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

/* The activations of one image or tile. */
enum { B_COLS, B_X, B_H, B_Q, B_K, B_V, B_ATT, B_FF, B_MID, B_OUT, B_COUNT };
struct tower_bufs {
    struct ekv_vk_buf b[B_COUNT];
    int64_t K8, F8, M8;
};

static void bufs_free(struct ekv_vk *vk, struct tower_bufs *t) {
    for (int i = 0; i < B_COUNT; i++) ekv_vk_buf_free(vk, &t->b[i]);
}

static enum ekv_status bufs_new(struct ekv_vk *vk, const struct ekv_clip_hparams *hp, int64_t K, struct tower_bufs *t) {
    memset(t, 0, sizeof *t);
    t->K8 = pad8(K), t->F8 = pad8(hp->n_ff), t->M8 = pad8(hp->n_mm);
    const int64_t np = hp->n_patches, n = hp->n_pos, E = hp->n_embd;
    const int64_t floats[B_COUNT] = {np * t->K8, n * E, n * E, n * E, n * E, n * E, n * E, n * t->F8, np * t->M8,
                                     np * (int64_t)hp->n_embd_out};
    static const char *const what[B_COUNT] = {"vision patches", "vision x", "vision h", "vision q", "vision k",
                                              "vision v", "vision attention", "vision mlp", "vision projector",
                                              "vision output"};
    enum ekv_status s = EKV_OK;
    for (int i = 0; i < B_COUNT && s == EKV_OK; i++) {
        size_t bytes;
        if (!ekv_mul_ok((size_t)floats[i], sizeof(float), &bytes))
            return ekv_err(EKV_ERR_OVERFLOW, "%s: %lld floats", what[i], (long long)floats[i]);
        s = ekv_vk_buf_new(vk, bytes, i == B_COLS || i == B_OUT, what[i], &t->b[i]);
    }
    if (s != EKV_OK) bufs_free(vk, t);
    return s;
}

static uint32_t groups(int64_t n, int64_t per) {
    const int64_t g = (n + per - 1) / per;
    return (uint32_t)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

static void layernorm(struct ekv_vk_tower *g, uint64_t x, const float *w, const float *b, uint64_t y, int64_t rows,
                      int64_t n, float eps) {
    struct ekv_vk_pc_layernorm pc = {.x = x, .w = vec_addr(g, w), .b = vec_addr(g, b), .y = y, .n = (uint32_t)n,
                                     .rows = (uint32_t)rows, .eps = eps};
    ekv_vk_dispatch(g->vk, EKV_VK_LAYERNORM, &pc, sizeof pc, groups(rows, 1), 1, 1);
}

static void ew(struct ekv_vk_tower *g, uint64_t y, uint64_t a, int64_t n, uint32_t op) {
    struct ekv_vk_pc_ew pc = {.y = y, .a = a, .n = (uint32_t)n, .op = op};
    ekv_vk_dispatch(g->vk, EKV_VK_EW, &pc, sizeof pc, groups(n, 256), 1, 1);
}

static uint32_t act_op(const struct ekv_clip_hparams *hp) {
    return hp->use_gelu ? EKV_VK_EW_GELU : hp->use_silu ? EKV_VK_EW_SILU : EKV_VK_EW_QUICK_GELU;
}

/* One block on x (the recording is open). */
static enum ekv_status record_block(struct ekv_vk_tower *g, const struct ekv_clip *c, int il, struct tower_bufs *t) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const struct clip_layer *L = &c->layers[il];
    const int64_t n = hp->n_pos, E = hp->n_embd, dh = E / hp->n_head;
    const uint64_t x = t->b[B_X].addr, h = t->b[B_H].addr, att = t->b[B_ATT].addr, ff = t->b[B_FF].addr;
    const uint32_t e = (uint32_t)E, f8 = (uint32_t)t->F8;
    layernorm(g, x, L->ln1_w, L->ln1_b, h, n, E, hp->eps);
    enum ekv_status s = mv(g, &L->q, h, e, t->b[B_Q].addr, e, L->q_b, false, n, false);
    if (s == EKV_OK) s = mv(g, &L->k, h, e, t->b[B_K].addr, e, L->k_b, false, n, false);
    if (s == EKV_OK) s = mv(g, &L->v, h, e, t->b[B_V].addr, e, L->v_b, false, n, true);
    if (s != EKV_OK) return s;
    struct ekv_vk_pc_clip_attn pa = {.q = t->b[B_Q].addr, .k = t->b[B_K].addr, .v = t->b[B_V].addr, .o = att,
                                     .n = (uint32_t)n, .E = e, .dh = (uint32_t)dh,
                                     .scale = 1.0f / sqrtf((float)dh)};
    ekv_vk_dispatch(g->vk, EKV_VK_CLIP_ATTN, &pa, sizeof pa, (uint32_t)n, (uint32_t)hp->n_head, 1);
    if ((s = mv(g, &L->o, att, e, x, e, L->o_b, true, n, true))) return s;
    layernorm(g, x, L->ln2_w, L->ln2_b, h, n, E, hp->eps);
    if ((s = mv(g, &L->ff1, h, e, ff, f8, L->ff1_b, false, n, true))) return s;
    ew(g, ff, 0, n * t->F8, act_op(hp)); /* the pad columns stay 0: act(0) = 0 */
    return mv(g, &L->ff2, ff, f8, x, e, L->ff2_b, true, n, true);
}

/* Patch rows of the pixels [3][S][S]: row (py, px) holds channel-major P x P
 * blocks (the convolution weight's layout), K8 floats with zeros past 3 P P. */
static void im2col(const struct ekv_clip_hparams *hp, const float *pixels, float *cols, int64_t K8) {
    const size_t P = (size_t)hp->patch_size, S = (size_t)hp->image_size, grid = S / P;
    for (size_t py = 0; py < grid; py++)
        for (size_t px = 0; px < grid; px++) {
            float *dst = cols + (py * grid + px) * (size_t)K8;
            memset(dst, 0, (size_t)K8 * sizeof(float));
            for (size_t ch = 0; ch < 3; ch++)
                for (size_t ky = 0; ky < P; ky++)
                    memcpy(dst + (ch * P + ky) * P, pixels + ch * S * S + (py * P + ky) * S + px * P, P * sizeof(float));
        }
}

static enum ekv_status record_tower(struct ekv_vk_tower *g, const struct ekv_clip *c, struct tower_bufs *t) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const int64_t np = hp->n_patches, n = hp->n_pos, E = hp->n_embd, cls = hp->has_class ? 1 : 0;
    const uint64_t x = t->b[B_X].addr;
    ekv_vk_fill(g->vk, &t->b[B_FF], 0, t->b[B_FF].bytes & ~(size_t)3, 0); /* the pad columns of the MLP rows */
    if (t->M8 != hp->n_mm) ekv_vk_fill(g->vk, &t->b[B_MID], 0, t->b[B_MID].bytes & ~(size_t)3, 0);
    enum ekv_status s = mv(g, &c->patch, t->b[B_COLS].addr, (uint32_t)t->K8,
                                          x + (uint64_t)(cls * E) * sizeof(float), (uint32_t)E, c->patch_b, false,
                                          np, true);
    if (s != EKV_OK) return s;
    ew(g, x, vec_addr(g, c->pos), n * E, EKV_VK_EW_ADD);
    if (c->pre_w) layernorm(g, x, c->pre_w, c->pre_b, x, n, E, hp->eps);
    for (int il = 0; il < hp->n_layer_run && s == EKV_OK; il++) s = record_block(g, c, il, t);
    if (s != EKV_OK) return s;
    if (c->post_w) layernorm(g, x, c->post_w, c->post_b, x, n, E, hp->eps);
    const uint32_t m8 = (uint32_t)t->M8, eo = (uint32_t)hp->n_embd_out;
    s = mv(g, &c->mm0, x + (uint64_t)(cls * E) * sizeof(float), (uint32_t)E, t->b[B_MID].addr, m8,
                          c->mm0_b, false, np, true);
    if (s != EKV_OK) return s;
    ew(g, t->b[B_MID].addr, 0, np * t->M8, EKV_VK_EW_GELU);
    return mv(g, &c->mm2, t->b[B_MID].addr, m8, t->b[B_OUT].addr, eo, c->mm2_b, false, np,
                             true);
}

enum ekv_status ekv_vk_tower_pixels(void *user, const struct ekv_clip *c, const float *pixels, float *out) {
    struct ekv_vk_tower *g = user;
    const char *why = ekv_vk_tower_unsupported(c);
    if (why) return ekv_err(EKV_ERR_UNSUPPORTED, "vision tower on the GPU: %s", why);
    const struct ekv_clip_hparams *hp = &c->hp;
    enum ekv_status s = upload_tower(g, c);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s: the vision tower's weights", ekv_vk_name(g->vk));
    struct tower_bufs t;
    const int64_t K = 3 * (int64_t)hp->patch_size * hp->patch_size;
    if ((s = bufs_new(g->vk, hp, K, &t)) != EKV_OK) return s;
    /* the class token's row; the patch rows are written by the projection */
    if (hp->has_class) s = ekv_vk_upload(g->vk, &t.b[B_X], 0, c->cls, (size_t)hp->n_embd * sizeof(float));
    if (s == EKV_OK) {
        im2col(hp, pixels, t.b[B_COLS].host, t.K8);
        s = ekv_vk_begin(g->vk);
    }
    if (s == EKV_OK) {
        s = record_tower(g, c, &t);
        if (s == EKV_OK) s = ekv_vk_submit(g->vk);
        else ekv_vk_abort(g->vk);
    }
    if (s == EKV_OK)
        memcpy(out, t.b[B_OUT].host, (size_t)hp->n_patches * (size_t)hp->n_embd_out * sizeof(float));
    bufs_free(g->vk, &t);
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
