/*
 * test_kv_types_policies.c — every registered policy on every KV storage
 * type (f32, f16, q8_0, q4_0, kivi2, kivi4 and a mixed q8_0-keys /
 * kivi4-values cache), without a model: random queries, keys and values
 * driven through ekv_kv_begin / ekv_kv_layer_forward / ekv_kv_end over a
 * 64-token prompt and 24 decode steps (2 layers, 4 query heads on 2 KV
 * heads, head_dim 32, KIVI G = 8 and R = 16 so that key groups form at
 * prefill and at decode and eviction lands inside them).
 *   - budget 1.0 equals the full cache of the same type bit for bit: every
 *     attention output of every forward, and the stored K/V at the end;
 *   - at budget 0.3, after every forward: the entry budget is held
 *     (prompt-only policies grow by one per step), positions increase,
 *     weights + evicted == tokens seen, the protected first tokens stay
 *     (local 4, elastic 1), outputs are finite, and the storage is the
 *     type's: row types hold exactly len rows of their size, KIVI key
 *     groups are consistent (1..G entries each, sum == quantised entries,
 *     two neighbours never fit in one group, fewer than max(R, G) keys and
 *     at most R values in the fp16 residual);
 *   - eviction moves quantised data without touching it: every entry that
 *     stands for itself (weight 1) reads back as its token's own row
 *     through the type — bit for bit for row types, KIVI values (fp16
 *     residual or the row quantised from it) and KIVI keys in the
 *     residual; KIVI keys in groups (which eviction may coalesce and
 *     merges re-quantise, docs/policies.md "KIVI storage") within two quantisation steps
 *     of the channel's range (seen: one). An entry that reads back another token's row
 *     fails this for every type;
 *   - M-RoPE (Qwen2-VL): the same drive with three RoPE positions per entry
 *     (a 4 x 8 image grid in the prompt, text after it shifted back, decode
 *     steps through rope_delta), plus elastic-v2 and snapkv+merge turning
 *     merged keys by each component (key=rotate): after every forward each
 *     entry still carries its own token's three positions, however the
 *     policy compacted or merged the head;
 *   - sliding-window attention (Mistral, kv->swa_window) on every type: a
 *     decode row equals f32 attention over exactly the rows it may see
 *     (stored rows of the window, read back before the step, plus the new
 *     token's row through the type), bit for bit, with the window's first
 *     entry inside KIVI key groups or in the fp16 residual.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kvquant.h"
#include "kv/kv.h"
#include "testutil.h"

enum { NL = 2, NH = 4, NKV = 2, HD = 32, G = 8, R = 16, PROMPT = 64, DECODE = 24, NPOS = PROMPT + DECODE };

struct combo {
    enum ekv_kv_type k, v;
};
static const struct combo k_combos[] = {
    {EKV_KV_F32, EKV_KV_F32},     {EKV_KV_F16, EKV_KV_F16},     {EKV_KV_Q8_0, EKV_KV_Q8_0}, {EKV_KV_Q4_0, EKV_KV_Q4_0},
    {EKV_KV_KIVI2, EKV_KV_KIVI2}, {EKV_KV_KIVI4, EKV_KV_KIVI4}, {EKV_KV_Q8_0, EKV_KV_KIVI4},
};
#define N_COMBOS ((int)(sizeof k_combos / sizeof k_combos[0]))

static uint64_t g_rng;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* The rows every token got, per layer: [NL][NPOS][NKV][HD]. */
static float g_k[NL][NPOS][NKV][HD], g_v[NL][NPOS][NKV][HD];

static bool prefill_only(const char *name) {
    const struct ekv_policy_ops *o = ekv_policy_find(name);
    return o && o->prompt_only;
}
static int protected_sinks(const char *name) {
    if (!strcmp(name, "local")) return 4;
    if (!strcmp(name, "elastic")) return 1;
    return 0;
}

/* M-RoPE mode: the prompt's tokens [IMG0, IMG0 + 32) are a 4 x 8 image
 * grid; RoPE positions of token p (time, height, width). */
static bool g_mrope;
enum { IMG0 = 10, IMG_W = 8, IMG_H = 4, IMG_N = IMG_W * IMG_H, MDELTA = IMG_W - IMG_N };
static void mrope_of(int64_t p, int32_t out[3]) {
    if (p >= IMG0 && p < IMG0 + IMG_N) {
        out[0] = IMG0;
        out[1] = IMG0 + (int32_t)(p - IMG0) / IMG_W;
        out[2] = IMG0 + (int32_t)(p - IMG0) % IMG_W;
    } else {
        out[0] = out[1] = out[2] = (int32_t)(p >= IMG0 + IMG_N ? p + MDELTA : p);
    }
}

static struct ekv_kv *new_cache(const char *policy, double budget, struct combo c) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = policy;
    p.budget = budget;
    p.seed = 5;
    p.type_k = c.k;
    p.type_v = c.v;
    p.kv_group = G;
    p.kv_residual = R;
    struct ekv_kv *kv = NULL;
    enum ekv_status s = ekv_kv_new(NL, NH, NKV, HD, &p, &kv);
    CHECK_MSG(s == EKV_OK, "%s on K %s / V %s: %s", policy, ekv_kv_type_name(c.k), ekv_kv_type_name(c.v),
              ekv_last_error());
    if (s == EKV_OK && g_mrope) /* the keys' RoPE, as ekv_seq_new sets it: 16 pairs in sections 4/6/6 */
        kv->rope = (struct ekv_rope_params){.dim = HD, .neox = true, .freq_base = 10000.0, .freq_scale = 1.0,
                                            .attn_factor = 1.0, .sections = {4, 6, 6, 0}};
    return s == EKV_OK ? kv : NULL;
}

/* One forward (prompt when stepi == 0, else one decode step) with the
 * inputs of g_rng; outputs of every layer to out [NL][n_new][NH][HD]. */
static enum ekv_status forward(struct ekv_kv *kv, int stepi, float *out) {
    static uint8_t ptags[PROMPT];
    for (int i = 0; i < PROMPT; i++) ptags[i] = (i >= 10 && i < 42) ? EKV_TAG_IMAGE : EKV_TAG_TEXT;
    struct ekv_kv_step st;
    if (stepi == 0)
        st = (struct ekv_kv_step){.is_prompt = true, .last_chunk = true, .pos0 = 0, .n_new = PROMPT, .prompt_pos0 = 0,
                                  .prompt_len = PROMPT, .prompt_tags = ptags, .tags = ptags};
    else
        st = (struct ekv_kv_step){.pos0 = PROMPT + stepi - 1, .n_new = 1};
    static int32_t mpos[PROMPT][3];
    if (g_mrope && stepi == 0) {
        for (int i = 0; i < PROMPT; i++) mrope_of(i, mpos[i]);
        st.mpos = &mpos[0][0];
    } else if (g_mrope) {
        st.rope_delta = MDELTA; /* text past the image */
    }
    static float q[PROMPT * NH * HD], k[PROMPT * NKV * HD], v[PROMPT * NKV * HD];
    enum ekv_status s = ekv_kv_begin(kv, &st);
    for (int il = 0; il < NL && s == EKV_OK; il++) {
        for (int i = 0; i < st.n_new * NH * HD; i++) q[i] = 2.0f * frand();
        for (int i = 0; i < st.n_new; i++)
            for (int h = 0; h < NKV; h++)
                for (int c = 0; c < HD; c++) {
                    /* channels of different ranges, as real keys have */
                    const int64_t pos = st.pos0 + i;
                    k[(i * NKV + h) * HD + c] = g_k[il][pos][h][c] = (1.0f + (float)(c % 4)) * frand();
                    v[(i * NKV + h) * HD + c] = g_v[il][pos][h][c] = frand();
                }
        float *o = out + (size_t)il * PROMPT * NH * HD;
        s = ekv_kv_layer_forward(kv, NULL, il, &st, q, k, v, o);
    }
    if (s == EKV_OK) s = ekv_kv_end(kv, &st);
    return s;
}

/* x through the row type t (from_float then to_float). */
static void row_rt(enum ekv_kv_type t, const float *x, float *y) {
    uint8_t buf[HD * 4];
    const struct ekv_kv_type_traits *tr = ekv_kv_traits(t);
    tr->from_float(x, buf, HD);
    tr->to_float(buf, y, HD);
}
static void fp16_rt(const float *x, float *y) {
    for (int c = 0; c < HD; c++) y[c] = ekv_fp16_to_f32(ekv_f32_to_fp16(x[c]));
}

/* What entry j of head h (token pos) must read back as on side is_v; for
 * KIVI keys in groups: *bound > 0 and want = the token's own row. */
static void expected(const struct ekv_kv *kv, const struct ekv_kv_head *h, int32_t j, const float *x, bool is_v,
                     float *want, double *bound) {
    const enum ekv_kv_type t = is_v ? kv->fv.type : kv->fk.type;
    const struct ekv_kv_store *s = is_v ? &h->vs : &h->ks;
    *bound = 0;
    if (!ekv_kv_type_is_kivi(t)) {
        row_rt(t, x, want);
    } else if (j >= s->nq) {
        fp16_rt(x, want);
    } else if (is_v) {
        float y[HD];
        uint8_t row[HD * 2];
        fp16_rt(x, y);
        ekv_kivi_quant_vrow(y, HD, G, ekv_kv_traits(t)->bits, row);
        ekv_kivi_dequant_vrow(row, HD, G, ekv_kv_traits(t)->bits, want);
    } else {
        /* channel c spans (1 + c % 4) * [-1, 1): one step is that range / (2^b - 1) */
        memcpy(want, x, sizeof(float) * HD);
        *bound = 2.0 * 2.0 / ((1 << ekv_kv_traits(t)->bits) - 1);
    }
}

/* Storage and content checks of every head; returns a message or NULL. */
static const char *check_storage(const struct ekv_kv *kv) {
    static char msg[200];
    const bool kk = ekv_kv_type_is_kivi(kv->fk.type), kvv = ekv_kv_type_is_kivi(kv->fv.type);
    uint64_t rows_bytes = 0;
    for (int il = 0; il < NL; il++)
        for (int hk = 0; hk < NKV; hk++) {
            const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            rows_bytes += (uint64_t)h->len * (kv->fk.row_bytes + kv->fv.row_bytes);
            if (kk) {
                int32_t q = 0;
                for (int g = 0; g < h->ks.ng; g++) {
                    if (h->ks.gn[g] < 1 || h->ks.gn[g] > G) return "a key group holds 0 or more than G entries";
                    if (g + 1 < h->ks.ng && h->ks.gn[g] + h->ks.gn[g + 1] <= G) return "two neighbour key groups fit in one";
                    q += h->ks.gn[g];
                }
                if (q != h->ks.nq || h->ks.nq > h->len) return "key groups do not add up to the quantised keys";
                if (h->len - h->ks.nq >= (R > G ? R : G)) return "a full key block left in the fp16 residual";
            }
            if (kvv && (h->vs.nq > h->len || h->len - h->vs.nq > R)) return "more than R values in the fp16 residual";
            for (int32_t j = 0; j < h->len; j++) {
                if (h->weight[j] != 1.0f) continue; /* a merge anchor: the policy's mean, re-quantised */
                float k[HD], v[HD], wk[HD], wv[HD];
                double bk, bv;
                if (ekv_kv_head_get(kv, h, j, k, v) != EKV_OK) return "entry read failed";
                const int32_t p = h->pos[j];
                expected(kv, h, j, g_k[il][p][hk], false, wk, &bk);
                expected(kv, h, j, g_v[il][p][hk], true, wv, &bv);
                for (int c = 0; c < HD; c++) {
                    const bool okk = bk > 0 ? fabs((double)k[c] - wk[c]) <= bk * (1 + c % 4) : k[c] == wk[c];
                    if (!okk || v[c] != wv[c]) {
                        snprintf(msg, sizeof msg, "layer %d head %d entry %d (position %d): %s channel %d reads %g, want %g",
                                 il, hk, (int)j, (int)p, okk ? "value" : "key", c, okk ? v[c] : k[c], okk ? wv[c] : wk[c]);
                        return msg;
                    }
                }
            }
        }
    if (!kk && !kvv && ekv_kv_bytes(kv) != rows_bytes) return "row-type bytes differ from len rows of the type";
    if (ekv_kv_bytes(kv) > ekv_kv_bytes_full(kv, kv->n_seen)) return "more bytes than the full cache";
    return NULL;
}

/* Budget 0.3: the invariants after every forward. */
static void drive_invariants(const char *name, struct combo c) {
    struct ekv_kv *kv = new_cache(name, 0.3, c);
    if (!kv) return;
    static float out[NL * PROMPT * NH * HD];
    int32_t prev_len[NL][NKV] = {{0}};
    const char *bad = NULL;
    char where[160] = "";
    g_rng = 0xABCDEF;
    for (int stepi = 0; stepi <= DECODE && !bad; stepi++) {
        if (forward(kv, stepi, out) != EKV_OK) {
            bad = ekv_last_error();
            break;
        }
        snprintf(where, sizeof where, "step %d", stepi);
        const int n_out = (stepi == 0 ? PROMPT : 1) * NH * HD;
        for (int il = 0; il < NL && !bad; il++)
            for (int i = 0; i < n_out; i++)
                if (!isfinite(out[(size_t)il * PROMPT * NH * HD + i])) bad = "non-finite attention output";
        for (int il = 0; il < NL && !bad; il++) {
            const int32_t target = ekv_kv_target(kv, il);
            for (int hk = 0; hk < NKV && !bad; hk++) {
                const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                if (!strcmp(name, "full")) {
                    if (h->len != kv->n_seen) bad = "full evicted";
                } else if (prefill_only(name) && stepi > 0) {
                    if (h->len != prev_len[il][hk] + 1) bad = "a prompt-only policy changed the cache at decode";
                } else if (h->len > target) {
                    bad = "entry budget exceeded";
                }
                prev_len[il][hk] = h->len;
                double wsum = 0;
                for (int32_t j = 0; j < h->len && !bad; j++) {
                    wsum += h->weight[j];
                    if (j && h->pos[j] <= h->pos[j - 1]) bad = "positions not increasing";
                }
                if (!bad && fabs(wsum + (double)h->n_evicted - (double)kv->n_seen) > 1e-6)
                    bad = "weights + evicted != tokens seen";
                for (int32_t j = 0; j < h->len && !bad && g_mrope; j++) {
                    int32_t want[3];
                    mrope_of(h->pos[j], want);
                    if (!h->mpos || memcmp(h->mpos + 3 * (size_t)j, want, sizeof want))
                        bad = "an entry lost its token's M-RoPE positions";
                }
                const int ns = protected_sinks(name);
                for (int j = 0; j < ns && !bad && target > ns; j++)
                    if (h->len <= j || h->pos[j] != j) bad = "a protected first token was lost";
            }
        }
        if (!bad) bad = check_storage(kv);
    }
    CHECK_MSG(!bad, "%s at budget 0.3 on K %s / V %s, %s: %s", name, ekv_kv_type_name(c.k), ekv_kv_type_name(c.v),
              where, bad);
    /* the policy really evicted (or merged) on this type */
    if (strcmp(name, "full")) {
        const struct ekv_kv_head *h = &kv->layers[NL - 1].heads[0];
        CHECK_MSG(h->len < kv->n_seen && h->n_evicted + h->n_merged > 0, "%s on K %s: nothing evicted (len %d)", name,
                  ekv_kv_type_name(c.k), (int)h->len);
    }
    ekv_kv_free(kv);
}

/* Budget 1.0 against the full cache of the same type, bit for bit. */
static void compare_full(const char *name, struct combo c) {
    struct ekv_kv *a = new_cache("full", 1.0, c), *b = new_cache(name, 1.0, c);
    static float oa[NL * PROMPT * NH * HD], ob[NL * PROMPT * NH * HD];
    int differ = -1;
    for (int stepi = 0; a && b && stepi <= DECODE && differ < 0; stepi++) {
        g_rng = 0x5151 + (uint64_t)stepi;
        CHECK_OK(forward(a, stepi, oa));
        g_rng = 0x5151 + (uint64_t)stepi;
        CHECK_OK(forward(b, stepi, ob));
        const size_t n = (size_t)(stepi == 0 ? PROMPT : 1) * NH * HD;
        for (int il = 0; il < NL; il++)
            if (memcmp(oa + (size_t)il * PROMPT * NH * HD, ob + (size_t)il * PROMPT * NH * HD, n * sizeof(float)))
                differ = stepi;
    }
    bool same_kv = a && b;
    for (int il = 0; il < NL && same_kv; il++)
        for (int hk = 0; hk < NKV && same_kv; hk++) {
            const struct ekv_kv_head *ha = &a->layers[il].heads[hk], *hb = &b->layers[il].heads[hk];
            static float ka[NPOS * HD], va[NPOS * HD], kb[NPOS * HD], vb[NPOS * HD];
            same_kv = ha->len == hb->len && ha->len == NPOS;
            if (!same_kv) break;
            CHECK_OK(ekv_kv_head_gather(a, ha, NULL, ha->len, ka, va));
            CHECK_OK(ekv_kv_head_gather(b, hb, NULL, hb->len, kb, vb));
            same_kv = !memcmp(ka, kb, sizeof ka) && !memcmp(va, vb, sizeof va) && ekv_kv_bytes(a) == ekv_kv_bytes(b);
        }
    CHECK_MSG(differ < 0 && same_kv, "%s at budget 1.0 on K %s / V %s differs from the full cache (step %d, cache %s)",
              name, ekv_kv_type_name(c.k), ekv_kv_type_name(c.v), differ, same_kv ? "same" : "differs");
    ekv_kv_free(a);
    ekv_kv_free(b);
}

/* Sliding-window attention (kv->swa_window, Mistral) on every storage type,
 * through attend.c: a decode step's output equals ekv_attn_row (f32) over
 * the rows a query may see — the stored rows of the entries at positions >
 * p - W, read back dequantised before the step, plus the new token's row
 * through the type — bit for bit. The window's first entry falls inside
 * KIVI key groups and in the residual as the steps advance. */
static void test_window(struct combo c) {
    enum { W = 21 };
    struct ekv_kv *kv = new_cache("full", 1.0, c);
    if (!kv) return;
    kv->swa_window = W;
    static float out[NL * PROMPT * NH * HD], rk[(NPOS + 1) * HD], rv[(NPOS + 1) * HD], want[NH / NKV * HD];
    static float probs[NH / NKV * (NPOS + 1)];
    int bad = 0, cases = 0;
    g_rng = 0x3141;
    CHECK_OK(forward(kv, 0, out));
    for (int stepi = 1; stepi <= DECODE; stepi++) {
        /* the rows every head holds before this step */
        static float before[NL][NKV][NPOS * HD * 2];
        int32_t len0[NL][NKV];
        for (int il = 0; il < NL; il++)
            for (int hk = 0; hk < NKV; hk++) {
                const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                len0[il][hk] = h->len;
                CHECK_OK(ekv_kv_head_gather(kv, h, NULL, h->len, before[il][hk], before[il][hk] + NPOS * HD));
            }
        const uint64_t rng0 = g_rng;
        CHECK_OK(forward(kv, stepi, out));
        /* replay the inputs: q of each layer comes first, then k and v (see forward) */
        uint64_t save = g_rng;
        g_rng = rng0;
        const int64_t p = PROMPT + stepi - 1;
        for (int il = 0; il < NL; il++) {
            float q[NH * HD];
            for (int i = 0; i < NH * HD; i++) q[i] = 2.0f * frand();
            for (int i = 0; i < NKV * HD * 2; i++) (void)frand();
            for (int hk = 0; hk < NKV; hk++) {
                const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                int32_t lo = 0, n = len0[il][hk];
                while (lo < n && h->pos[lo] <= p - W) lo++;
                for (int32_t j = lo; j < n; j++) {
                    memcpy(rk + (size_t)(j - lo) * HD, before[il][hk] + (size_t)j * HD, HD * sizeof(float));
                    memcpy(rv + (size_t)(j - lo) * HD, before[il][hk] + NPOS * HD + (size_t)j * HD, HD * sizeof(float));
                }
                /* the new row as appended: row types quantise it, KIVI keeps it in fp16 */
                float *nk = rk + (size_t)(n - lo) * HD, *nv = rv + (size_t)(n - lo) * HD;
                if (ekv_kv_type_is_kivi(c.k)) fp16_rt(g_k[il][p][hk], nk);
                else row_rt(c.k, g_k[il][p][hk], nk);
                if (ekv_kv_type_is_kivi(c.v)) fp16_rt(g_v[il][p][hk], nv);
                else row_rt(c.v, g_v[il][p][hk], nv);
                ekv_attn_row(q + (size_t)hk * (NH / NKV) * HD, NH / NKV, HD, rk, rv, n - lo + 1,
                             1.0f / sqrtf((float)HD), want, probs, NULL);
                cases++;
                bad += memcmp(want, out + (size_t)il * PROMPT * NH * HD + (size_t)hk * (NH / NKV) * HD,
                              sizeof want) != 0;
            }
        }
        g_rng = save;
    }
    CHECK_MSG(bad == 0, "sliding window on K %s / V %s: %d of %d decode rows differ from f32 attention over the visible rows",
              ekv_kv_type_name(c.k), ekv_kv_type_name(c.v), bad, cases);
    ekv_kv_free(kv);
}

int main(void) {
    int n_pol = 0;
    for (int i = 0; i < ekv_policy_count(); i++) {
        const struct ekv_policy_ops *o = ekv_policy_at(i);
        if (o->summary && !strncmp(o->summary, "stub:", 5)) continue;
        n_pol++;
        for (int ci = 0; ci < N_COMBOS; ci++) {
            compare_full(o->name, k_combos[ci]);
            drive_invariants(o->name, k_combos[ci]);
        }
    }
    for (int ci = 0; ci < N_COMBOS; ci++) test_window(k_combos[ci]);
    g_mrope = true;
    static const char *const merging[] = {"elastic-v2:key=rotate", "snapkv+merge:merge_key=rotate"};
    for (int ci = 0; ci < N_COMBOS; ci++) {
        for (int i = 0; i < ekv_policy_count(); i++) {
            const struct ekv_policy_ops *o = ekv_policy_at(i);
            if (o->summary && !strncmp(o->summary, "stub:", 5)) continue;
            drive_invariants(o->name, k_combos[ci]);
            compare_full(o->name, k_combos[ci]);
        }
        for (size_t m = 0; m < sizeof merging / sizeof merging[0]; m++) drive_invariants(merging[m], k_combos[ci]);
    }
    g_mrope = false;
    printf("test_kv_types_policies: %d policies x %d storage combinations\n", n_pol, N_COMBOS);
    CHECK(n_pol >= 11);
    return test_finish("test_kv_types_policies");
}
