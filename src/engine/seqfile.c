/*
 * seqfile.c — saved sequences (ekv.h "Saved caches", issue 22): the file
 * around a cache's bytes (src/kv/persist.c). A compressed cache outlives its
 * request: read a document once, save it, answer later questions from the
 * file instead of reading the document again.
 *
 * Layout (little-endian; docs/kv-files.md):
 *   header, 48 bytes: "EKVCACHE", u32 version (1), u32 header size (48),
 *     u64 model fingerprint, u32 n_layer, n_head, n_head_kv, head_dim,
 *     u32 section count, u32 CRC-32C of the 44 bytes before it;
 *   sections, each: u32 kind, u32 index, u64 payload size, u32 CRC-32C of
 *     the payload, u32 CRC-32C of these 16 bytes; then the payload.
 *   Kinds, in this order: SEQ (model name, positions seen), TOKENS
 *   (optional: the token ids), KV (policy, parameters, state), one LAYER
 *   per layer (index = layer). Nothing may follow the last section.
 * Writing goes to "<path>.tmp", synced, then renamed over path.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/serial.h"
#include "core/util.h"
#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"

#define SF_MAGIC "EKVCACHE"
#define SF_VERSION 1u
#define SF_HEADER 48u
#define SF_SECTION 24u

enum { SEC_SEQ = 1, SEC_TOKENS = 2, SEC_KV = 3, SEC_LAYER = 4 };

/* Appends a section whose payload is p (CRCs filled in). */
static void put_section(struct ekv_wbuf *w, uint32_t kind, uint32_t index, const struct ekv_wbuf *p) {
    const size_t at = w->n;
    ekv_wbuf_u32(w, kind);
    ekv_wbuf_u32(w, index);
    ekv_wbuf_u64(w, (uint64_t)p->n);
    ekv_wbuf_u32(w, ekv_crc32c(0, p->p, p->n));
    ekv_wbuf_u32(w, 0);
    if (!w->oom) ekv_wbuf_set_u32(w, at + 20, ekv_crc32c(0, w->p + at, 16));
    ekv_wbuf_put(w, p->p, p->n);
}

static enum ekv_status build(const struct ekv_seq *seq, const int32_t *tokens, int32_t n_tokens, struct ekv_wbuf *w) {
    const struct ekv_model *m = seq->ctx->model;
    const struct ekv_kv *kv = seq->kv;
    enum ekv_status s = ekv_seq_ready(seq, "ekv_seq_save");
    if (s != EKV_OK) return s;
    if (seq->gpu)
        return ekv_err(EKV_ERR_UNSUPPORTED, "ekv_seq_save: the cache is held on %s; saving a GPU cache is not "
                                            "supported yet (run with device cpu)", seq->ctx->device_name);
    if (n_tokens < 0 || n_tokens > seq->n_seen || (n_tokens > 0 && !tokens))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_save: %d tokens for %lld positions", (int)n_tokens,
                       (long long)seq->n_seen);
    ekv_wbuf_put(w, SF_MAGIC, 8);
    const uint32_t hdr[] = {SF_VERSION, SF_HEADER};
    for (size_t i = 0; i < EKV_ARRAY_LEN(hdr); i++) ekv_wbuf_u32(w, hdr[i]);
    ekv_wbuf_u64(w, m->fingerprint);
    const uint32_t shape[] = {(uint32_t)kv->n_layer, (uint32_t)kv->n_head, (uint32_t)kv->n_head_kv,
                              (uint32_t)kv->head_dim, (uint32_t)(kv->n_layer + (tokens ? 3 : 2))};
    for (size_t i = 0; i < EKV_ARRAY_LEN(shape); i++) ekv_wbuf_u32(w, shape[i]);
    ekv_wbuf_u32(w, 0);
    if (!w->oom) ekv_wbuf_set_u32(w, 44, ekv_crc32c(0, w->p, 44));
    struct ekv_wbuf p = {0};
    const size_t nl = strlen(m->name);
    ekv_wbuf_u32(&p, (uint32_t)nl);
    ekv_wbuf_put(&p, m->name, nl);
    ekv_wbuf_u64(&p, (uint64_t)seq->n_seen);
    if (ekv_kv_mrope(kv)) ekv_wbuf_u64(&p, (uint64_t)seq->rope_delta); /* M-RoPE models only */
    put_section(w, SEC_SEQ, 0, &p);
    if (tokens) {
        p.n = 0;
        ekv_wbuf_u32(&p, (uint32_t)n_tokens);
        ekv_wbuf_i32s(&p, tokens, (size_t)n_tokens);
        put_section(w, SEC_TOKENS, 0, &p);
    }
    p.n = 0;
    s = ekv_kv_save_head(kv, &p);
    if (s == EKV_OK) put_section(w, SEC_KV, 0, &p);
    for (int il = 0; il < kv->n_layer && s == EKV_OK; il++) {
        p.n = 0;
        s = ekv_kv_save_layer(kv, il, &p);
        if (s == EKV_OK) put_section(w, SEC_LAYER, (uint32_t)il, &p);
    }
    if (s == EKV_OK && (p.oom || w->oom)) s = ekv_err(EKV_ERR_NOMEM, "ekv_seq_save: out of memory");
    ekv_wbuf_free(&p);
    return s;
}

enum ekv_status ekv_seq_save_mem(const struct ekv_seq *seq, const int32_t *tokens, int32_t n_tokens, void **data,
                                 size_t *size) {
    ekv_err_clear();
    if (!seq || !data || !size) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_save_mem: seq, data and size are required");
    *data = NULL;
    *size = 0;
    struct ekv_wbuf w = {0};
    enum ekv_status s = build(seq, tokens, n_tokens, &w);
    if (s != EKV_OK) {
        ekv_wbuf_free(&w);
        return s;
    }
    *data = w.p;
    *size = w.n;
    return EKV_OK;
}

enum ekv_status ekv_seq_save(const struct ekv_seq *seq, const int32_t *tokens, int32_t n_tokens, const char *path) {
    ekv_err_clear();
    if (!seq || !path || !*path) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_save: seq and path are required");
    struct ekv_wbuf w = {0};
    enum ekv_status s = build(seq, tokens, n_tokens, &w);
    const size_t pl = strlen(path);
    char *tmp = s == EKV_OK ? malloc(pl + 5) : NULL;
    if (s == EKV_OK && !tmp) s = ekv_err(EKV_ERR_NOMEM, "out of memory");
    if (s == EKV_OK) {
        memcpy(tmp, path, pl);
        memcpy(tmp + pl, ".tmp", 5);
        FILE *f = fopen(tmp, "wb");
        if (!f) {
            s = ekv_err(EKV_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        } else {
            bool ok = fwrite(w.p, 1, w.n, f) == w.n && fflush(f) == 0 && fsync(fileno(f)) == 0;
            const int e = errno;
            ok = (fclose(f) == 0) && ok;
            if (!ok) s = ekv_err(EKV_ERR_IO, "%s: write failed: %s", tmp, strerror(e ? e : errno));
            else if (rename(tmp, path) != 0) s = ekv_err(EKV_ERR_IO, "%s: cannot rename to %s: %s", tmp, path,
                                                         strerror(errno));
            if (s != EKV_OK) remove(tmp);
        }
    }
    free(tmp);
    ekv_wbuf_free(&w);
    return s;
}

/* One section's frame, checked (CRCs, size within the file). */
struct section {
    uint32_t kind, index;
    struct ekv_rbuf r; /* the payload */
};

static const char *kind_name(uint32_t k) {
    return k == SEC_SEQ ? "SEQ" : k == SEC_TOKENS ? "TOKENS" : k == SEC_KV ? "KV" : k == SEC_LAYER ? "LAYER" : "?";
}

static enum ekv_status next_section(struct ekv_rbuf *r, uint32_t i, struct section *out) {
    if (!ekv_rbuf_has(r, SF_SECTION)) return ekv_err(EKV_ERR_FORMAT, "section %u: truncated header", i);
    const uint8_t *h = r->p + r->at;
    out->kind = ekv_rbuf_u32(r);
    out->index = ekv_rbuf_u32(r);
    const uint64_t size = ekv_rbuf_u64(r);
    const uint32_t crc = ekv_rbuf_u32(r), hcrc = ekv_rbuf_u32(r);
    if (ekv_crc32c(0, h, 16) != hcrc) return ekv_err(EKV_ERR_FORMAT, "section %u: header checksum mismatch", i);
    if (size > r->n - r->at)
        return ekv_err(EKV_ERR_FORMAT, "section %u (%s): %llu bytes, the file holds %zu more (truncated)", i,
                       kind_name(out->kind), (unsigned long long)size, r->n - r->at);
    out->r = (struct ekv_rbuf){.p = r->p + r->at, .n = (size_t)size};
    if (ekv_crc32c(0, out->r.p, out->r.n) != crc)
        return ekv_err(EKV_ERR_FORMAT, "section %u (%s %u): checksum mismatch (the file is corrupt)", i,
                       kind_name(out->kind), out->index);
    r->at += (size_t)size;
    return EKV_OK;
}

/* The next section, which must be of kind `kind` and index `index`. */
static enum ekv_status want_section(struct ekv_rbuf *r, uint32_t *i, uint32_t n_sec, uint32_t kind, uint32_t index,
                                    struct section *out) {
    if (*i >= n_sec)
        return ekv_err(EKV_ERR_FORMAT, "section %s %u missing (the file holds %u sections)", kind_name(kind), index, n_sec);
    enum ekv_status s = next_section(r, *i, out);
    if (s != EKV_OK) return s;
    if (out->kind != kind || out->index != index)
        return ekv_err(EKV_ERR_FORMAT, "section %u is %s %u where %s %u belongs", *i, kind_name(out->kind),
                       out->index, kind_name(kind), index);
    (*i)++;
    return EKV_OK;
}

static enum ekv_status check_header(const struct ekv_model *m, struct ekv_rbuf *r, uint32_t *n_sec, uint64_t *fp) {
    if (r->n < 8 || memcmp(r->p, SF_MAGIC, 8) != 0)
        return ekv_err(EKV_ERR_FORMAT, "not a saved ekv cache (no EKVCACHE magic)");
    if (r->n < SF_HEADER) return ekv_err(EKV_ERR_FORMAT, "truncated header (%zu bytes)", r->n);
    r->at = 8;
    const uint32_t version = ekv_rbuf_u32(r), hsize = ekv_rbuf_u32(r);
    if (version != SF_VERSION)
        return ekv_err(EKV_ERR_FORMAT, "format version %u; this ekv reads version %u", version, SF_VERSION);
    if (hsize != SF_HEADER || ekv_crc32c(0, r->p, 44) != (uint32_t)(r->p[44] | r->p[45] << 8 | r->p[46] << 16 |
                                                                    (uint32_t)r->p[47] << 24))
        return ekv_err(EKV_ERR_FORMAT, "header checksum mismatch (the file is corrupt)");
    *fp = ekv_rbuf_u64(r);
    uint32_t shape[4];
    for (int i = 0; i < 4; i++) shape[i] = ekv_rbuf_u32(r);
    *n_sec = ekv_rbuf_u32(r);
    r->at = SF_HEADER;
    const struct ekv_model_info *in = &m->info;
    if (shape[0] != (uint32_t)in->n_layer || shape[1] != (uint32_t)in->n_head || shape[2] != (uint32_t)in->n_head_kv ||
        shape[3] != (uint32_t)in->head_dim)
        return ekv_err(EKV_ERR_FORMAT, "saved for another model: cache of %u layers x %u/%u heads x %u, this model "
                       "has %d x %d/%d x %d", shape[0], shape[1], shape[2], shape[3], in->n_layer, in->n_head,
                       in->n_head_kv, in->head_dim);
    if (*n_sec != (uint32_t)in->n_layer + 2 && *n_sec != (uint32_t)in->n_layer + 3)
        return ekv_err(EKV_ERR_FORMAT, "%u sections for %d layers", *n_sec, in->n_layer);
    return EKV_OK;
}

/* The SEQ and TOKENS sections: checked, tokens copied out. */
static enum ekv_status read_seq(const struct ekv_context *ctx, uint64_t fp, struct section *sq, struct section *tk,
                                bool have_tokens, int64_t *n_seen, int64_t *rope_delta, int32_t **tokens,
                                int32_t *n_tokens) {
    const struct ekv_model *m = ctx->model;
    char name[129];
    const uint32_t nl = ekv_rbuf_u32(&sq->r);
    if (nl > 128 || !ekv_rbuf_has(&sq->r, nl)) return ekv_err(EKV_ERR_FORMAT, "SEQ: model name of %u bytes", nl);
    ekv_rbuf_get(&sq->r, name, nl);
    name[nl] = 0;
    for (uint32_t i = 0; i < nl; i++)
        if ((unsigned char)name[i] < 0x20) name[i] = '?';
    *n_seen = ekv_rbuf_i64(&sq->r);
    *rope_delta = ekv_rope_is_multi(&ctx->rope) ? ekv_rbuf_i64(&sq->r) : 0;
    if (sq->r.bad || sq->r.at != sq->r.n) return ekv_err(EKV_ERR_FORMAT, "SEQ: %zu bytes, malformed", sq->r.n);
    if (fp != m->fingerprint)
        return ekv_err(EKV_ERR_FORMAT, "saved for another model ('%s', fingerprint %016llx); this is '%s' (%016llx)",
                       name, (unsigned long long)fp, m->name, (unsigned long long)m->fingerprint);
    if (*n_seen < 0 || *n_seen > ctx->params.n_ctx)
        return ekv_err(EKV_ERR_FORMAT, "the cache holds %lld positions, the context has %d", (long long)*n_seen,
                       ctx->params.n_ctx);
    /* images only ever take fewer positions than rows: text goes on at or below its row */
    if (*rope_delta > 0 || *rope_delta < -*n_seen)
        return ekv_err(EKV_ERR_FORMAT, "SEQ: M-RoPE position offset %lld for %lld positions", (long long)*rope_delta,
                       (long long)*n_seen);
    if (!have_tokens) return EKV_OK;
    const uint32_t nt = ekv_rbuf_u32(&tk->r);
    if (tk->r.bad || nt > (uint64_t)*n_seen || tk->r.n - tk->r.at != (size_t)nt * 4)
        return ekv_err(EKV_ERR_FORMAT, "TOKENS: %u ids for %lld positions in %zu bytes", nt, (long long)*n_seen, tk->r.n);
    int32_t *t = malloc((nt ? nt : 1) * sizeof *t);
    if (!t) return ekv_err(EKV_ERR_NOMEM, "out of memory for %u token ids", nt);
    ekv_rbuf_i32s(&tk->r, t, nt);
    for (uint32_t i = 0; i < nt; i++)
        if (t[i] < -1 || t[i] >= m->info.n_vocab) {
            const int32_t bad = t[i];
            free(t);
            return ekv_err(EKV_ERR_FORMAT, "TOKENS: id %d at %u out of range [-1, %d)", (int)bad, i, m->info.n_vocab);
        }
    *tokens = t;
    *n_tokens = (int32_t)nt;
    return EKV_OK;
}

static enum ekv_status load(struct ekv_context *ctx, struct ekv_rbuf *r, struct ekv_seq **out, int32_t **tokens,
                            int32_t *n_tokens) {
    const struct ekv_model_info *in = &ctx->model->info;
    uint32_t n_sec = 0, i = 0;
    uint64_t fp = 0;
    enum ekv_status s = check_header(ctx->model, r, &n_sec, &fp);
    struct section sq = {0}, tk = {0}, sec = {0};
    int64_t n_seen = 0, rope_delta = 0;
    if (s == EKV_OK) s = want_section(r, &i, n_sec, SEC_SEQ, 0, &sq);
    const bool have_tokens = n_sec == (uint32_t)in->n_layer + 3;
    if (s == EKV_OK && have_tokens) s = want_section(r, &i, n_sec, SEC_TOKENS, 0, &tk);
    if (s == EKV_OK) s = read_seq(ctx, fp, &sq, &tk, have_tokens, &n_seen, &rope_delta, tokens, n_tokens);
    if (s == EKV_OK) s = want_section(r, &i, n_sec, SEC_KV, 0, &sec);
    struct ekv_kv *kv = NULL;
    if (s == EKV_OK) s = ekv_kv_load_head(in->n_layer, in->n_head, in->n_head_kv, in->head_dim, &sec.r, &kv);
    if (s == EKV_OK) kv->rope = ctx->rope; /* before the layers: M-RoPE entries carry three positions */
    if (s == EKV_OK && (sec.r.at != sec.r.n || kv->n_seen != n_seen))
        s = ekv_err(EKV_ERR_FORMAT, "KV: malformed (%zu bytes left, %lld tokens seen of %lld)", sec.r.n - sec.r.at,
                    (long long)kv->n_seen, (long long)n_seen);
    for (int il = 0; il < in->n_layer && s == EKV_OK; il++) {
        s = want_section(r, &i, n_sec, SEC_LAYER, (uint32_t)il, &sec);
        if (s == EKV_OK) s = ekv_kv_load_layer(kv, il, &sec.r);
        if (s == EKV_OK && sec.r.at != sec.r.n)
            s = ekv_err(EKV_ERR_FORMAT, "layer %d: %zu bytes left over", il, sec.r.n - sec.r.at);
    }
    if (s == EKV_OK && r->at != r->n) s = ekv_err(EKV_ERR_FORMAT, "%zu bytes after the last section", r->n - r->at);
    struct ekv_seq *q = NULL;
    if (s == EKV_OK && !(q = calloc(1, sizeof *q))) s = ekv_err(EKV_ERR_NOMEM, "out of memory");
    if (s != EKV_OK) {
        ekv_kv_free(kv);
        if (tokens) {
            free(*tokens);
            *tokens = NULL;
        }
        if (n_tokens) *n_tokens = 0;
        return s;
    }
    q->ctx = ctx;
    q->n_seen = n_seen;
    q->rope_delta = rope_delta;
    q->kv = kv;
    kv->swa_window = in->sliding_window;
    kv->rope = ctx->rope;
    *out = q;
    return EKV_OK;
}

enum ekv_status ekv_seq_load_mem(struct ekv_context *ctx, const void *data, size_t size, struct ekv_seq **out,
                                 int32_t **tokens, int32_t *n_tokens) {
    ekv_err_clear();
    if (!ctx || !out || (!data && size)) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_load_mem: ctx, data and out are required");
    *out = NULL;
    int32_t *tk = NULL, nt = 0;
    if (tokens) *tokens = NULL;
    if (n_tokens) *n_tokens = 0;
    if (ctx->gpu && ctx->gpu_required)
        return ekv_err(EKV_ERR_UNSUPPORTED, "ekv_seq_load: loading a saved cache onto %s is not supported yet (use "
                                            "device cpu or auto: the loaded sequence then runs on the CPU)",
                       ctx->device_name);
    struct ekv_rbuf r = {.p = data, .n = size};
    enum ekv_status s = load(ctx, &r, out, &tk, &nt);
    if (s != EKV_OK) return ekv_err_prefix(s, "saved cache");
    if (tokens) *tokens = tk;
    else free(tk);
    if (n_tokens) *n_tokens = nt;
    return EKV_OK;
}

enum ekv_status ekv_seq_load(struct ekv_context *ctx, const char *path, struct ekv_seq **out, int32_t **tokens,
                             int32_t *n_tokens) {
    ekv_err_clear();
    if (!ctx || !path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_load: ctx, path and out are required");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ekv_err(EKV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > SIZE_MAX) {
        fclose(f);
        return ekv_err(EKV_ERR_IO, "%s: not a regular file", path);
    }
    const size_t n = (size_t)st.st_size;
    void *buf = malloc(n ? n : 1);
    enum ekv_status s = EKV_OK;
    if (!buf) s = ekv_err(EKV_ERR_NOMEM, "%s: out of memory for %zu bytes", path, n);
    else if (fread(buf, 1, n, f) != n) s = ekv_err(EKV_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (s == EKV_OK) {
        s = ekv_seq_load_mem(ctx, buf, n, out, tokens, n_tokens);
        if (s != EKV_OK) s = ekv_err_prefix(s, "%s", path);
    }
    free(buf);
    return s;
}
