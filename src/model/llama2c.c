/*
 * llama2c.c — loading Andrej Karpathy's llama2.c checkpoints (run.c
 * format): a header of seven int32 (dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size, seq_len; a negative vocab_size means a separate
 * classifier) followed by f32 arrays in a fixed order. The tokenizer comes
 * from a separate tok<N>.bin file. Every size is checked against the file.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "model/model.h"
#include "model/vocab.h"

void ekv_llama2c_unmap(void *map, size_t size) {
    if (map) munmap(map, size);
}

/* Cursor over the f32 payload. */
struct cursor {
    const float *base;
    size_t n;   /* floats available */
    size_t off; /* floats consumed */
    const char *path;
};

static enum ekv_status take(struct cursor *c, size_t count, const char *what, const float **out) {
    if (count > c->n - c->off)
        return ekv_err(EKV_ERR_FORMAT, "%s: truncated llama2.c checkpoint: %s needs %zu floats at float "
                       "offset %zu but only %zu remain", c->path, what, count, c->off, c->n - c->off);
    *out = c->base + c->off;
    c->off += count;
    return EKV_OK;
}

static void f32_weight(struct ekv_weight *w, const float *data, int64_t ne0, int64_t ne1) {
    w->type = EKV_F32;
    w->ne0 = ne0;
    w->ne1 = ne1;
    w->row_bytes = (size_t)ne0 * sizeof(float);
    w->data = data;
}

enum ekv_status ekv_model_load_llama2c(struct ekv_model *m, const char *path, const char *tok_path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ekv_err(EKV_ERR_IO, "%s: cannot open model file", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0) {
        close(fd);
        return ekv_err(EKV_ERR_IO, "%s: cannot stat model file", path);
    }
    size_t size = (size_t)st.st_size;
    if (size < 7 * sizeof(int32_t)) {
        close(fd);
        return ekv_err(EKV_ERR_FORMAT, "%s: %zu bytes is too small for a GGUF or llama2.c file", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return ekv_err(EKV_ERR_IO, "%s: cannot map model file", path);
    m->map = map;
    m->map_size = size;

    int32_t hdr[7];
    memcpy(hdr, map, sizeof hdr);
    int32_t dim = hdr[0], hidden = hdr[1], n_layers = hdr[2], n_heads = hdr[3], n_kv = hdr[4];
    int32_t vocab = hdr[5], seq_len = hdr[6];
    bool shared = vocab > 0;
    if (vocab < 0) vocab = vocab == INT32_MIN ? 0 : -vocab; /* INT32_MIN has no negation: refused below (fuzz_model) */
    if (dim <= 0 || dim > 65536 || hidden <= 0 || hidden > 1 << 20 || n_layers <= 0 || n_layers > 1024 ||
        n_heads <= 0 || n_heads > dim || n_kv <= 0 || n_kv > n_heads || vocab <= 0 || vocab > 1 << 22 ||
        seq_len <= 0 || seq_len > 1 << 22 || dim % n_heads)
        return ekv_err(EKV_ERR_FORMAT,
                       "%s: not a GGUF file, and its llama2.c header is implausible (dim %d, hidden %d, "
                       "layers %d, heads %d, kv heads %d, vocab %d, seq_len %d)",
                       path, dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len);
    int32_t hd = dim / n_heads;
    struct cursor c = {(const float *)((const char *)map + sizeof hdr), (size - sizeof hdr) / sizeof(float), 0, path};
    size_t D = (size_t)dim, H = (size_t)hidden, L = (size_t)n_layers, KV = (size_t)n_kv * (size_t)hd;

    struct ekv_model_info *in = &m->info;
    in->format = "llama2c";
    snprintf(m->arch, sizeof m->arch, "llama");
    const char *slash = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", slash ? slash + 1 : path);
    in->n_embd = dim;
    in->n_ff = hidden;
    in->n_layer = n_layers;
    in->n_head = n_heads;
    in->n_head_kv = n_kv;
    in->head_dim = hd;
    in->n_vocab = vocab;
    in->n_ctx_train = seq_len;
    in->rope_dim = hd;
    in->rope_freq_base = 10000.0f;
    in->norm_eps = 1e-5f;
    in->rope_neox = false;
    in->tied_output = shared;

    m->layers = calloc(L, sizeof *m->layers);
    m->vecs_len = 0; /* norms are used in place */
    if (!m->layers) return ekv_err(EKV_ERR_NOMEM, "%s: out of memory", path);

    const float *emb = NULL, *rms_att = NULL, *wq = NULL, *wk = NULL, *wv = NULL, *wo = NULL, *rms_ffn = NULL,
                *w1 = NULL, *w2 = NULL, *w3 = NULL, *rms_final = NULL, *skip = NULL, *wcls = NULL;
    enum ekv_status s;
    if ((s = take(&c, (size_t)vocab * D, "token embeddings", &emb)) ||
        (s = take(&c, L * D, "attention norms", &rms_att)) || (s = take(&c, L * D * D, "wq", &wq)) ||
        (s = take(&c, L * D * KV, "wk", &wk)) || (s = take(&c, L * D * KV, "wv", &wv)) ||
        (s = take(&c, L * D * D, "wo", &wo)) || (s = take(&c, L * D, "ffn norms", &rms_ffn)) ||
        (s = take(&c, L * D * H, "w1", &w1)) || (s = take(&c, L * H * D, "w2", &w2)) ||
        (s = take(&c, L * D * H, "w3", &w3)) || (s = take(&c, D, "final norm", &rms_final)) ||
        (s = take(&c, (size_t)seq_len * (size_t)hd, "RoPE tables", &skip)))
        return s;
    if (shared)
        wcls = emb;
    else if ((s = take(&c, (size_t)vocab * D, "classifier", &wcls)))
        return s;

    f32_weight(&m->tok_embd, emb, dim, vocab);
    f32_weight(&m->output, wcls, dim, vocab);
    m->output_norm = rms_final;
    for (size_t l = 0; l < L; l++) {
        struct ekv_layer_weights *W = &m->layers[l];
        W->attn_norm = rms_att + l * D;
        f32_weight(&W->wq, wq + l * D * D, dim, dim);
        f32_weight(&W->wk, wk + l * D * KV, dim, (int64_t)KV);
        f32_weight(&W->wv, wv + l * D * KV, dim, (int64_t)KV);
        f32_weight(&W->wo, wo + l * D * D, dim, dim);
        W->ffn_norm = rms_ffn + l * D;
        f32_weight(&W->w_gate, w1 + l * D * H, dim, hidden);
        f32_weight(&W->w_down, w2 + l * H * D, hidden, dim);
        f32_weight(&W->w_up, w3 + l * D * H, dim, hidden);
    }
    in->n_params = c.off;
    in->weight_bytes = (uint64_t)c.off * sizeof(float);

    char tok_buf[1024];
    if (!tok_path) {
        const char *dir_end = strrchr(path, '/');
        int dir_len = dir_end ? (int)(dir_end - path) : 1;
        snprintf(tok_buf, sizeof tok_buf, "%.*s/tok%d.bin", dir_len, dir_end ? path : ".", vocab);
        tok_path = tok_buf;
    }
    s = ekv_vocab_from_llama2c(tok_path, vocab, &m->vocab);
    if (s != EKV_OK) return s;
    return ekv_model_finish(m);
}
