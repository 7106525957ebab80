/*
 * model.c — loading Llama-family models from GGUF: hyper-parameters from
 * `<arch>.*` metadata (never from hard-coded shapes), weight views into the
 * mapped file with every shape checked against the metadata, the embedded
 * tokenizer, and the public model/tokenizer API that wraps it all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/serial.h"
#include "core/util.h"
#include "model/gguf.h"
#include "kernels/kvquant.h"
#include "model/model.h"
#include "model/vocab.h"

struct ekv_model_params ekv_model_default_params(void) {
    struct ekv_model_params p = {.tokenizer_path = NULL};
    return p;
}

float *ekv_model_take_vec(struct ekv_model *m, size_t n) {
    if (m->vecs_used + n > m->vecs_len) return NULL;
    float *p = m->vecs + m->vecs_used;
    m->vecs_used += n;
    return p;
}

/* ---- GGUF helpers ---- */

static enum ekv_status get_u32_key(const struct ekv_gguf_file *f, const char *arch, const char *suffix,
                                   bool required, uint32_t dflt, uint32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    enum ekv_status s = ekv_gguf_get_u32(f, key, out);
    if (s == EKV_ERR_NOT_FOUND && !required) {
        *out = dflt;
        return EKV_OK;
    }
    return s;
}

static enum ekv_status get_f32_key(const struct ekv_gguf_file *f, const char *arch, const char *suffix,
                                   bool required, float dflt, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    enum ekv_status s = ekv_gguf_get_f32(f, key, out);
    if (s == EKV_ERR_NOT_FOUND && !required) {
        *out = dflt;
        return EKV_OK;
    }
    return s;
}

/* <arch>.<suffix> as a string into buf; "" when absent. */
static enum ekv_status get_str_key(const struct ekv_gguf_file *f, const char *arch, const char *suffix, char *buf,
                                   size_t n) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    struct ekv_gguf_str v;
    buf[0] = 0;
    enum ekv_status s = ekv_gguf_get_str(f, key, &v);
    if (s == EKV_ERR_NOT_FOUND) return EKV_OK;
    if (s == EKV_OK) ekv_gguf_str_copy(v, buf, n);
    return s;
}

/* RoPE scaling metadata as llama.cpp reads it (llama_model::load_hparams,
 * llama_context's cparams): type (default linear, which without a factor
 * scales nothing), factor (or the old rope.scale_linear), original
 * context, attention factor and YaRN's betas, extrapolation mix and log
 * multiplier. Every value is checked. */
static enum ekv_status read_rope_scaling(struct ekv_model *m) {
    const struct ekv_gguf_file *f = m->gguf;
    struct ekv_model_info *in = &m->info;
    const char *a = m->arch;
    char type[32];
    uint32_t orig = 0;
    enum ekv_status s;
    if ((s = get_str_key(f, a, "rope.scaling.type", type, sizeof type)) ||
        (s = get_f32_key(f, a, "rope.scaling.factor", false, 0.0f, &in->rope_scale_factor)) ||
        (s = get_u32_key(f, a, "rope.scaling.original_context_length", false, 0, &orig)) ||
        (s = get_f32_key(f, a, "rope.scaling.attn_factor", false, 1.0f, &in->rope_attn_factor)) ||
        (s = get_f32_key(f, a, "rope.scaling.yarn_beta_fast", false, 32.0f, &in->yarn_beta_fast)) ||
        (s = get_f32_key(f, a, "rope.scaling.yarn_beta_slow", false, 1.0f, &in->yarn_beta_slow)) ||
        (s = get_f32_key(f, a, "rope.scaling.yarn_ext_factor", false, -1.0f, &in->yarn_ext_factor)) ||
        (s = get_f32_key(f, a, "rope.scaling.yarn_log_multiplier", false, 0.0f, &in->yarn_log_mul)))
        return ekv_err_prefix(s, "%s", m->path);
    if (in->rope_scale_factor == 0.0f &&
        (s = get_f32_key(f, a, "rope.scale_linear", false, 0.0f, &in->rope_scale_factor)))
        return ekv_err_prefix(s, "%s", m->path);
    if (!isfinite(in->rope_scale_factor) || in->rope_scale_factor < 0.0f || in->rope_scale_factor > 1e6f)
        return ekv_err(EKV_ERR_FORMAT, "%s: rope scaling factor %g out of range", m->path,
                       (double)in->rope_scale_factor);
    if (in->rope_scale_factor == 0.0f) in->rope_scale_factor = 1.0f; /* absent */
    if (!(in->rope_attn_factor > 0.0f && in->rope_attn_factor < 1e3f))
        return ekv_err(EKV_ERR_FORMAT, "%s: rope.scaling.attn_factor %g out of range", m->path,
                       (double)in->rope_attn_factor);
    if (!isfinite(in->yarn_beta_fast) || !isfinite(in->yarn_beta_slow) || !(in->yarn_beta_fast > 0.0f) ||
        !(in->yarn_beta_slow > 0.0f) || !isfinite(in->yarn_ext_factor) || in->yarn_ext_factor > 1e3f ||
        !isfinite(in->yarn_log_mul) || fabsf(in->yarn_log_mul) > 1e3f)
        return ekv_err(EKV_ERR_FORMAT, "%s: YaRN parameters out of range (beta fast %g, slow %g, ext %g, log mul %g)",
                       m->path, (double)in->yarn_beta_fast, (double)in->yarn_beta_slow, (double)in->yarn_ext_factor,
                       (double)in->yarn_log_mul);
    if (orig > (1u << 24)) return ekv_err(EKV_ERR_FORMAT, "%s: original context length %u implausible", m->path, orig);
    in->rope_orig_ctx = (int32_t)orig; /* 0: n_ctx_train, set in ekv_model_finish */
    if (!type[0]) in->rope_scaling = in->rope_scale_factor != 1.0f ? "linear" : "none";
    else if (!strcmp(type, "none")) in->rope_scaling = "none";
    else if (!strcmp(type, "linear")) in->rope_scaling = "linear";
    else if (!strcmp(type, "yarn")) in->rope_scaling = "yarn";
    else if (!strcmp(type, "longrope")) in->rope_scaling = "longrope";
    else
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type '%s' is not supported (none, linear, yarn, longrope)",
                       m->path, a, type);
    uint32_t swa = 0;
    if ((s = get_u32_key(f, a, "attention.sliding_window", false, 0, &swa))) return ekv_err_prefix(s, "%s", m->path);
    in->sliding_window = swa > (1u << 30) ? (1 << 30) : (int32_t)swa;
    return EKV_OK;
}

/* A per-dimension factor tensor: [rope_dim/2] finite positive values. */
static enum ekv_status bind_rope_factors(struct ekv_model *m, const char *name, const float **out);

static enum ekv_status bind_matrix(struct ekv_model *m, const char *name, int64_t ne0, int64_t ne1,
                                   bool optional, struct ekv_weight *w) {
    const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) {
        if (optional) return EKV_OK;
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return ekv_err(EKV_ERR_FORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld] "
                       "from the metadata",
                       m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3], (long long)ne0, (long long)ne1);
    if (!ekv_dtype_can_compute(t->type))
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which ekv cannot compute",
                       m->path, name, ekv_dtype_name(t->type));
    w->type = t->type;
    w->ne0 = ne0;
    w->ne1 = ne1;
    if (!ekv_dtype_row_bytes(t->type, ne0, &w->row_bytes))
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor '%s': row of %lld elements does not fit type %s",
                       m->path, name, (long long)ne0, ekv_dtype_name(t->type));
    w->data = t->data;
    return EKV_OK;
}

/* 1-D tensor of n elements, copied to f32. *out stays NULL if optional and absent. */
static enum ekv_status bind_vec(struct ekv_model *m, const char *name, int64_t n, bool optional,
                                const float **out);

/* Rows [r0, r0 + n) of a bound matrix, as a matrix of its own. */
static struct ekv_weight weight_rows(const struct ekv_weight *w, int64_t r0, int64_t n) {
    struct ekv_weight v = *w;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    v.ne1 = n;
    return v;
}

/* Attention projections of layer l: attn_q/k/v, or one attn_qkv (Q rows,
 * then K, then V) as llama.cpp's create_tensor_qkv accepts for any
 * architecture, with a fused bias split the same way. */
static enum ekv_status bind_qkv(struct ekv_model *m, uint32_t l, int64_t qd, int64_t kvd) {
    struct ekv_layer_weights *L = &m->layers[l];
    const int64_t E = m->info.n_embd;
    char nm[96];
    enum ekv_status s;
    snprintf(nm, sizeof nm, "blk.%u.attn_qkv.weight", l);
    if (ekv_gguf_find_tensor(m->gguf, nm)) {
        struct ekv_weight qkv;
        if ((s = bind_matrix(m, nm, E, qd + 2 * kvd, false, &qkv))) return s;
        L->wq = weight_rows(&qkv, 0, qd);
        L->wk = weight_rows(&qkv, qd, kvd);
        L->wv = weight_rows(&qkv, qd + kvd, kvd);
        const float *b = NULL;
        snprintf(nm, sizeof nm, "blk.%u.attn_qkv.bias", l);
        if ((s = bind_vec(m, nm, qd + 2 * kvd, true, &b))) return s;
        if (b) {
            L->bq = b;
            L->bk = b + qd;
            L->bv = b + qd + kvd;
        }
        m->info.fused_qkv = true;
        return EKV_OK;
    }
    static const char *const part[3] = {"q", "k", "v"};
    struct ekv_weight *w[3] = {&L->wq, &L->wk, &L->wv};
    const float **bias[3] = {&L->bq, &L->bk, &L->bv};
    for (int i = 0; i < 3; i++) {
        const int64_t rows = i ? kvd : qd;
        snprintf(nm, sizeof nm, "blk.%u.attn_%s.weight", l, part[i]);
        if ((s = bind_matrix(m, nm, E, rows, false, w[i]))) return s;
        snprintf(nm, sizeof nm, "blk.%u.attn_%s.bias", l, part[i]);
        if ((s = bind_vec(m, nm, rows, true, bias[i]))) return s;
    }
    return EKV_OK;
}

/* Feed-forward in and gate: ffn_gate + ffn_up, or Phi-3's one ffn_up of
 * 2 n_ff rows, gate first (ggml's swiglu takes silu of the first half). */
static enum ekv_status bind_gate_up(struct ekv_model *m, uint32_t l) {
    struct ekv_layer_weights *L = &m->layers[l];
    const int64_t E = m->info.n_embd, FF = m->info.n_ff;
    char nm[96];
    enum ekv_status s;
    snprintf(nm, sizeof nm, "blk.%u.ffn_gate.weight", l);
    if (ekv_gguf_find_tensor(m->gguf, nm)) {
        if ((s = bind_matrix(m, nm, E, FF, false, &L->w_gate))) return s;
        snprintf(nm, sizeof nm, "blk.%u.ffn_up.weight", l);
        return bind_matrix(m, nm, E, FF, false, &L->w_up);
    }
    snprintf(nm, sizeof nm, "blk.%u.ffn_up.weight", l);
    const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(m->gguf, nm);
    if (t && t->ne[1] == 2 * FF) {
        struct ekv_weight gu;
        if ((s = bind_matrix(m, nm, E, 2 * FF, false, &gu))) return s;
        L->w_gate = weight_rows(&gu, 0, FF);
        L->w_up = weight_rows(&gu, FF, FF);
        m->info.fused_gate_up = true;
        return EKV_OK;
    }
    snprintf(nm, sizeof nm, "blk.%u.ffn_gate.weight", l);
    return ekv_err(EKV_ERR_FORMAT, "%s: tensor '%s' is missing (and blk.%u.ffn_up.weight does not hold gate and up: "
                   "%lld rows, not 2 x %lld)", m->path, nm, l, t ? (long long)t->ne[1] : 0LL, (long long)FF);
}

static enum ekv_status bind_rope_factors(struct ekv_model *m, const char *name, const float **out) {
    const int64_t n = m->info.rope_dim / 2;
    enum ekv_status s = bind_vec(m, name, n, true, out);
    if (s != EKV_OK || !*out) return s;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite((*out)[i]) || !((*out)[i] > 0.0f))
            return ekv_err(EKV_ERR_FORMAT, "%s: %s[%lld] = %g: rope factors must be positive", m->path, name,
                           (long long)i, (double)(*out)[i]);
    return EKV_OK;
}

static enum ekv_status bind_vec(struct ekv_model *m, const char *name, int64_t n, bool optional,
                                const float **out) {
    const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(m->gguf, name);
    *out = NULL;
    if (!t) {
        if (optional) return EKV_OK;
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    }
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld]",
                       m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)n);
    float *dst = ekv_model_take_vec(m, (size_t)n);
    if (!dst) return ekv_err(EKV_ERR_INTERNAL, "%s: vector pool exhausted at '%s'", m->path, name);
    enum ekv_status s = ekv_dequantize_row(t->type, t->data, dst, n);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s: tensor '%s'", m->path, name);
    *out = dst;
    return EKV_OK;
}

enum ekv_status ekv_model_finish(struct ekv_model *m) {
    struct ekv_model_info *in = &m->info;
    in->arch = m->arch;
    in->name = m->name;
    if (in->n_embd <= 0 || in->n_layer <= 0 || in->n_head <= 0 || in->n_head_kv <= 0 || in->n_ff <= 0 ||
        in->n_vocab <= 0 || in->head_dim <= 0)
        return ekv_err(EKV_ERR_FORMAT, "%s: hyper-parameters must be positive (n_embd %d, layers %d, heads %d, "
                       "kv heads %d, ff %d, vocab %d)", m->path, in->n_embd, in->n_layer, in->n_head,
                       in->n_head_kv, in->n_ff, in->n_vocab);
    if (in->n_head % in->n_head_kv)
        return ekv_err(EKV_ERR_FORMAT, "%s: %d query heads are not a multiple of %d KV heads", m->path,
                       in->n_head, in->n_head_kv);
    if (in->rope_dim <= 0 || in->rope_dim > in->head_dim || in->rope_dim % 2)
        return ekv_err(EKV_ERR_FORMAT, "%s: rope dimension %d invalid for head size %d", m->path,
                       in->rope_dim, in->head_dim);
    if (!(in->norm_eps > 0.0f && in->norm_eps < 1.0f))
        return ekv_err(EKV_ERR_FORMAT, "%s: normalisation epsilon %g out of range", m->path,
                       (double)in->norm_eps);
    if (!(in->rope_freq_base > 0.0f) || !isfinite(in->rope_freq_base))
        return ekv_err(EKV_ERR_FORMAT, "%s: rope frequency base %g invalid", m->path,
                       (double)in->rope_freq_base);
    if (in->n_ctx_train <= 0) in->n_ctx_train = 2048;
    if (in->embd_scale == 0.0f) in->embd_scale = 1.0f;
    if (!in->rope_scaling) { /* a loader without scaling metadata (llama2.c) */
        in->rope_scaling = "none";
        in->rope_scale_factor = 1.0f;
        in->rope_attn_factor = 1.0f;
        in->yarn_beta_fast = 32.0f;
        in->yarn_beta_slow = 1.0f;
        in->yarn_ext_factor = -1.0f;
    }
    if (in->rope_orig_ctx <= 0) in->rope_orig_ctx = in->n_ctx_train;
    in->rope_freqs = m->rope_freqs != NULL;
    in->rope_long_short = m->rope_long != NULL;
    if ((m->rope_long == NULL) != (m->rope_short == NULL))
        return ekv_err(EKV_ERR_FORMAT, "%s: rope_factors_long and rope_factors_short come together", m->path);
    if (m->rope_long && !strcmp(in->rope_scaling, "none")) in->rope_scaling = "longrope";
    in->kv_bytes_per_token = (uint64_t)in->n_layer * (uint64_t)in->n_head_kv * 2u *
                             (uint64_t)ekv_kv_row_bytes(ekv_kv_type_default(), in->head_dim, 32);
    if (ekv_vocab_n_tokens(m->vocab) > in->n_vocab)
        return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer has %d tokens but the embedding only %d rows",
                       m->path, ekv_vocab_n_tokens(m->vocab), in->n_vocab);
    return EKV_OK;
}

/* Qwen2-VL's M-RoPE sections (<arch>.rope.dimension_sections, 4 integers,
 * llama.cpp reads them as int32 or uint32): each >= 0, some > 0, their sum
 * at most rope_dim / 2 (the rotated pairs). */
static enum ekv_status read_rope_sections(struct ekv_model *m, const char *path) {
    char key[96];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", m->arch);
    const struct ekv_gguf_value *v;
    enum ekv_status s = ekv_gguf_get_arr(m->gguf, key, GGUF_TYPE_COUNT, &v);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s: an M-RoPE model (%s) needs its position sections", path, m->arch);
    if ((v->v.arr.type != GGUF_TYPE_INT32 && v->v.arr.type != GGUF_TYPE_UINT32) || v->v.arr.n < 3 || v->v.arr.n > 4)
        return ekv_err(EKV_ERR_FORMAT, "%s: %s must be 3 or 4 32-bit integers", path, key);
    int64_t sum = 0;
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        int32_t x;
        memcpy(&x, (const char *)v->v.arr.data + 4 * i, 4);
        if (x < 0 || x > 4096) return ekv_err(EKV_ERR_FORMAT, "%s: %s[%d] = %d out of range", path, key, (int)i, x);
        m->info.rope_sections[i] = x;
        sum += x;
    }
    if (sum == 0 || sum > m->info.rope_dim / 2)
        return ekv_err(EKV_ERR_FORMAT, "%s: %s sum to %lld pairs; the rotated dimensions (%d) have %d", path, key,
                       (long long)sum, (int)m->info.rope_dim, (int)m->info.rope_dim / 2);
    return EKV_OK;
}

enum ekv_status ekv_model_load_gguf(struct ekv_model *m, const char *path) {
    enum ekv_status s = ekv_gguf_open(path, &m->gguf);
    if (s != EKV_OK) return s;
    const struct ekv_gguf_file *f = m->gguf;
    struct ekv_model_info *in = &m->info;
    in->format = "gguf";

    struct ekv_gguf_str arch;
    s = ekv_gguf_get_str(f, "general.architecture", &arch);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s", path);
    ekv_gguf_str_copy(arch, m->arch, sizeof m->arch);
    const bool qwen2vl = !strcmp(m->arch, "qwen2vl");
    const bool qwen2 = qwen2vl || !strcmp(m->arch, "qwen2"), phi3 = !strcmp(m->arch, "phi3"),
               gemma = !strcmp(m->arch, "gemma");
    if (strcmp(m->arch, "llama") && !qwen2 && !phi3 && !gemma)
        return ekv_err(EKV_ERR_UNSUPPORTED,
                       "%s: architecture '%s' is not supported (supported: llama (also Mistral), qwen2, qwen2vl, "
                       "phi3, gemma)", path, m->arch);
    struct ekv_gguf_str name;
    if (ekv_gguf_get_str(f, "general.name", &name) == EKV_OK) ekv_gguf_str_copy(name, m->name, sizeof m->name);

    uint32_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx, rope_dim, key_len;
    if ((s = get_u32_key(f, m->arch, "embedding_length", true, 0, &n_embd)) ||
        (s = get_u32_key(f, m->arch, "block_count", true, 0, &n_layer)) ||
        (s = get_u32_key(f, m->arch, "feed_forward_length", true, 0, &n_ff)) ||
        (s = get_u32_key(f, m->arch, "attention.head_count", true, 0, &n_head)) ||
        (s = get_u32_key(f, m->arch, "attention.head_count_kv", false, n_head, &n_head_kv)) ||
        (s = get_u32_key(f, m->arch, "context_length", false, 2048, &n_ctx)))
        return ekv_err_prefix(s, "%s", path);
    if (n_embd == 0 || n_embd > (1u << 20) || n_layer == 0 || n_layer > 4096 || n_head == 0 ||
        n_head > 4096 || n_head_kv == 0 || n_ff == 0 || n_ff > (1u << 22) || n_ctx > (1u << 24))
        return ekv_err(EKV_ERR_FORMAT, "%s: implausible hyper-parameters (n_embd %u, layers %u, heads %u, "
                       "kv heads %u, ff %u, context %u)", path, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx);
    if ((s = get_u32_key(f, m->arch, "attention.key_length", false, n_embd / n_head, &key_len)) ||
        (s = get_u32_key(f, m->arch, "rope.dimension_count", false, key_len, &rope_dim)) ||
        (s = get_f32_key(f, m->arch, "attention.layer_norm_rms_epsilon", false, 1e-5f, &in->norm_eps)) ||
        (s = get_f32_key(f, m->arch, "rope.freq_base", false, 10000.0f, &in->rope_freq_base)))
        return ekv_err_prefix(s, "%s", path);
    if ((s = read_rope_scaling(m)) != EKV_OK) return s;
    if (key_len == 0 || key_len > 1024)
        return ekv_err(EKV_ERR_FORMAT, "%s: head size %u implausible", path, key_len);
    in->n_embd = (int32_t)n_embd;
    in->n_layer = (int32_t)n_layer;
    in->n_head = (int32_t)n_head;
    in->n_head_kv = (int32_t)n_head_kv;
    in->head_dim = (int32_t)key_len;
    in->n_ff = (int32_t)n_ff;
    in->n_ctx_train = (int32_t)n_ctx;
    in->rope_dim = (int32_t)rope_dim;
    in->rope_neox = qwen2 || phi3 || gemma; /* llama.cpp's LLAMA_ROPE_TYPE_NEOX for these (MROPE: halves too) */
    if (qwen2vl && (s = read_rope_sections(m, path)) != EKV_OK) return s;
    in->ffn_gelu = gemma;
    in->embd_scale = gemma ? sqrtf((float)n_embd) : 1.0f;

    const struct ekv_gguf_tensor *te = ekv_gguf_find_tensor(f, "token_embd.weight");
    if (!te) return ekv_err(EKV_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", path);
    if (te->ne[1] <= 0 || te->ne[1] > (1 << 24))
        return ekv_err(EKV_ERR_FORMAT, "%s: token_embd.weight has %lld rows", path, (long long)te->ne[1]);
    in->n_vocab = (int32_t)te->ne[1];

    s = ekv_vocab_from_gguf(f, path, &m->vocab);
    if (s != EKV_OK) return s;

    /* one f32 pool for all vectors: norms and biases */
    size_t qd = (size_t)n_head * key_len, kvd = (size_t)n_head_kv * key_len;
    m->vecs_len = (size_t)n_embd * (1 + 2 * (size_t)n_layer) + (size_t)n_layer * (qd + 2 * kvd) + 3 * (size_t)rope_dim;
    m->vecs = malloc(m->vecs_len * sizeof(float));
    m->layers = calloc(n_layer, sizeof *m->layers);
    if (!m->vecs || !m->layers) return ekv_err(EKV_ERR_NOMEM, "%s: out of memory for weights", path);

    if ((s = bind_matrix(m, "token_embd.weight", n_embd, in->n_vocab, false, &m->tok_embd)) ||
        (s = bind_vec(m, "output_norm.weight", n_embd, false, &m->output_norm)) ||
        (s = bind_matrix(m, "output.weight", n_embd, in->n_vocab, true, &m->output)))
        return s;
    if (!m->output.data) {
        m->output = m->tok_embd;
        in->tied_output = true;
    }
    if (rope_dim == 0 || rope_dim > key_len || rope_dim % 2)
        return ekv_err(EKV_ERR_FORMAT, "%s: rope dimension %u invalid for head size %u", path, rope_dim, key_len);
    if ((s = bind_rope_factors(m, "rope_freqs.weight", &m->rope_freqs)) ||
        (s = bind_rope_factors(m, "rope_factors_long.weight", &m->rope_long)) ||
        (s = bind_rope_factors(m, "rope_factors_short.weight", &m->rope_short)))
        return s;
    for (uint32_t l = 0; l < n_layer; l++) {
        struct ekv_layer_weights *L = &m->layers[l];
        char nm[96];
#define BINDM(field, suffix, a, b) \
    (snprintf(nm, sizeof nm, "blk.%u." suffix ".weight", l), bind_matrix(m, nm, a, b, false, &L->field))
#define BINDV(field, suffix, kind, n, opt) \
    (snprintf(nm, sizeof nm, "blk.%u." suffix "." kind, l), bind_vec(m, nm, n, opt, &L->field))
        if ((s = BINDV(attn_norm, "attn_norm", "weight", n_embd, false)) ||
            (s = bind_qkv(m, l, (int64_t)qd, (int64_t)kvd)) ||
            (s = BINDM(wo, "attn_output", (int64_t)qd, n_embd)) ||
            (s = BINDV(ffn_norm, "ffn_norm", "weight", n_embd, false)) ||
            (s = bind_gate_up(m, l)) ||
            (s = BINDM(w_down, "ffn_down", n_ff, n_embd)))
            return s;
#undef BINDM
#undef BINDV
    }
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        uint64_t ne = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) ne *= (uint64_t)t->ne[d];
        in->n_params += ne;
        in->weight_bytes += t->nbytes;
    }
    return ekv_model_finish(m);
}

/* The int8 kernels read Q8_0/Q4_0 matrices 16 rows at a time from an
 * interleaved layout (src/kernels/repack.c): rearranged once here into
 * m->repacked, the file's pages of those matrices released, so resident
 * memory stays one copy of the weights. The token embedding is only read
 * row by row, unless tied to the output. */
static enum ekv_status repack_weights(struct ekv_model *m) {
    const int per_layer = 7, n_max = 2 + per_layer * m->info.n_layer;
    struct ekv_weight **ws = malloc((size_t)n_max * sizeof *ws);
    if (!ws) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    int n = 0;
    ws[n++] = &m->output;
    if (m->info.tied_output) ws[n++] = &m->tok_embd;
    for (int32_t l = 0; l < m->info.n_layer; l++) {
        struct ekv_layer_weights *L = &m->layers[l];
        struct ekv_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < per_layer; i++) ws[n++] = lw[i];
    }
    enum ekv_status s = ekv_weights_repack_mapped(ws, n, &m->repacked);
    free(ws);
    return s;
}

void ekv_model_rope_params(const struct ekv_model *m, int32_t n_ctx, struct ekv_rope_params *p) {
    const struct ekv_model_info *in = &m->info;
    const bool none = !strcmp(in->rope_scaling, "none"), yarn = !strcmp(in->rope_scaling, "yarn");
    memset(p, 0, sizeof *p);
    p->dim = in->rope_dim;
    p->neox = in->rope_neox;
    p->freq_base = in->rope_freq_base;
    p->freq_scale = none ? 1.0 : 1.0 / (double)in->rope_scale_factor;
    p->ext_factor = in->yarn_ext_factor >= 0.0f ? in->yarn_ext_factor : (yarn ? 1.0 : 0.0);
    p->attn_factor = 1.0;
    if (p->ext_factor != 0.0) {
        /* llama.cpp: yarn_attn_factor = mscale(f) [/ mscale(f, log_mul)] / (1 + 0.1 ln f),
         * the kernel then multiplies by 1 + 0.1 ln f again */
        const double fct = 1.0 / p->freq_scale;
        double ms = fct <= 1.0 ? 1.0 : 0.1 * log(fct) + 1.0;
        if (in->yarn_log_mul != 0.0f) ms /= fct <= 1.0 ? 1.0 : 0.1 * in->yarn_log_mul * log(fct) + 1.0;
        p->attn_factor = ms / (1.0 + 0.1 * log(fct));
    }
    p->attn_factor *= in->rope_attn_factor;
    double cd[2];
    ekv_rope_yarn_corr_dims(p->dim, in->rope_orig_ctx, p->freq_base, in->yarn_beta_fast, in->yarn_beta_slow, cd);
    p->corr_lo = cd[0];
    p->corr_hi = cd[1];
    memcpy(p->sections, in->rope_sections, sizeof p->sections);
    p->freq_factors = m->rope_freqs ? m->rope_freqs
                      : m->rope_long ? (n_ctx > in->rope_orig_ctx ? m->rope_long : m->rope_short)
                                     : NULL;
}

/* ---- public API ---- */

static bool is_gguf_file(const char *path, enum ekv_status *st) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        *st = ekv_err(EKV_ERR_IO, "%s: cannot open model file", path);
        return false;
    }
    unsigned char magic[4] = {0};
    size_t n = fread(magic, 1, 4, fp);
    fclose(fp);
    *st = EKV_OK;
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

static uint64_t weight_hash(uint64_t h, const struct ekv_weight *w) {
    const int64_t shape[3] = {(int64_t)w->type, w->ne0, w->ne1};
    h = ekv_fnv64(h, shape, sizeof shape);
    size_t n = 0;
    if (w->data && ekv_mul_ok((size_t)w->ne1, w->row_bytes, &n)) h = ekv_fnv64(h, w->data, n < 64 ? n : 64);
    return h;
}

/* What tells models apart for saved caches (ekv_model_fingerprint): the
 * GGUF's header, metadata and tensor infos byte for byte, or a llama2.c
 * checkpoint's config, size and vocabulary; and of every weight matrix the
 * first 64 bytes and the row count, so files that differ only in trained
 * weights differ too. Bytes of the file, so repacking changes nothing. */
static uint64_t model_fingerprint(const struct ekv_model *m) {
    uint64_t h = EKV_FNV64_INIT;
    if (m->gguf) {
        h = ekv_fnv64(h, ekv_gguf_bytes(m->gguf), ekv_gguf_data_offset(m->gguf));
    } else {
        const uint64_t sz = m->map_size;
        h = ekv_fnv64(h, &sz, sizeof sz);
        h = ekv_fnv64(h, m->map, m->map_size < 28 ? m->map_size : 28);
        for (int32_t t = 0; t < ekv_vocab_n_tokens(m->vocab); t++) {
            size_t n = 0;
            const char *txt = ekv_vocab_token_text(m->vocab, t, &n);
            if (txt) h = ekv_fnv64(h, txt, n);
            h = ekv_fnv64(h, &n, sizeof n);
        }
    }
    const struct ekv_weight *w[] = {&m->tok_embd, &m->output};
    for (size_t i = 0; i < EKV_ARRAY_LEN(w); i++) h = weight_hash(h, w[i]);
    for (int32_t l = 0; l < m->info.n_layer; l++) {
        const struct ekv_layer_weights *L = &m->layers[l];
        const struct ekv_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < EKV_ARRAY_LEN(lw); i++) h = weight_hash(h, lw[i]);
    }
    return h;
}

uint64_t ekv_model_fingerprint(const struct ekv_model *m) { return m ? m->fingerprint : 0; }

enum ekv_status ekv_model_load(const char *path, const struct ekv_model_params *params,
                               struct ekv_model **out) {
    ekv_err_clear();
    if (!path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_model_load: path and out are required");
    *out = NULL;
    struct ekv_model_params p = params ? *params : ekv_model_default_params();
    struct ekv_model *m = calloc(1, sizeof *m);
    if (!m) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", path);
    enum ekv_status s;
    bool gguf = is_gguf_file(path, &s);
    if (s == EKV_OK) s = gguf ? ekv_model_load_gguf(m, path) : ekv_model_load_llama2c(m, path, p.tokenizer_path);
    if (s == EKV_OK) m->fingerprint = model_fingerprint(m); /* before repacking: the file's bytes */
    if (s == EKV_OK && gguf && !p.no_repack) s = repack_weights(m);
    if (s != EKV_OK) {
        ekv_model_free(m);
        return s;
    }
    *out = m;
    return EKV_OK;
}

void ekv_model_free(struct ekv_model *m) {
    if (!m) return;
    ekv_repack_arena_free(&m->repacked);
    ekv_gguf_close(m->gguf);
    if (m->map) ekv_llama2c_unmap(m->map, m->map_size);
    ekv_vocab_free(m->vocab);
    free(m->layers);
    free(m->vecs);
    free(m);
}

void ekv_model_get_info(const struct ekv_model *model, struct ekv_model_info *info) {
    *info = model->info;
}

int32_t ekv_token_bos(const struct ekv_model *m) { return ekv_vocab_bos(m->vocab); }
int32_t ekv_token_eos(const struct ekv_model *m) { return ekv_vocab_eos(m->vocab); }
bool ekv_token_is_eog(const struct ekv_model *m, int32_t t) { return ekv_vocab_is_eog(m->vocab, t); }

enum ekv_status ekv_tokenize(const struct ekv_model *m, const char *text, size_t len, bool add_special,
                             bool parse_special, int32_t *tokens, size_t n_max, size_t *n_out) {
    ekv_err_clear();
    return ekv_vocab_tokenize(m->vocab, text, len, add_special, parse_special, tokens, n_max, n_out);
}

enum ekv_status ekv_token_to_piece(const struct ekv_model *m, int32_t token, bool special, char *buf,
                                   size_t n, size_t *n_out) {
    return ekv_vocab_token_to_piece(m->vocab, token, special, buf, n, n_out);
}

enum ekv_status ekv_detokenize(const struct ekv_model *m, const int32_t *tokens, size_t n_tokens,
                               bool special, bool remove_leading_space, char *buf, size_t n,
                               size_t *n_out) {
    return ekv_vocab_detokenize(m->vocab, tokens, n_tokens, special, remove_leading_space, buf, n, n_out);
}
