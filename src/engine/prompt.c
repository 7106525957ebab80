/*
 * prompt.c — prompts with images (ekv_prompt_*): the text is split at each
 * "<image>" marker and every piece tokenized (BOS only before the first),
 * one image slot per marker is filled by the vision tower (or with given
 * embeddings), and the whole is fed to a sequence as text and image
 * segments in order, images tagged EKV_TAG_IMAGE so that modality-aware
 * policies (VL-Cache) see them. The CLI, the evaluation runner and the
 * server all splice images through this one object.
 *
 * Layout: pieces[0] image[0] pieces[1] image[1] ... pieces[n_images]; the
 * segment list skips empty pieces and is rebuilt whenever a slot changes.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/engine.h"

struct prompt_image {
    float *embd;     /* [n_rows][n_embd], owned; NULL while unset */
    int32_t n_rows;
};

struct ekv_prompt {
    const struct ekv_model *model;
    int32_t *tokens;              /* all text tokens, pieces back to back */
    int32_t n_tokens;
    int32_t *piece_start;         /* [n_images + 2]: token offset of each piece, and the end */
    int32_t n_images;
    struct prompt_image *images;  /* [n_images] */
    struct ekv_segment *segs;     /* [2 * n_images + 1] */
    int32_t n_segs;
};

static const char *find_marker(const char *p, size_t n) {
    const size_t ml = sizeof EKV_IMAGE_MARKER - 1;
    for (size_t i = 0; i + ml <= n; i++)
        if (!memcmp(p + i, EKV_IMAGE_MARKER, ml)) return p + i;
    return NULL;
}

/* Appends the tokens of text[0..len) to p->tokens (capacity *cap, grown). */
static enum ekv_status tokenize_piece(struct ekv_prompt *p, const char *text, size_t len, bool bos, size_t *cap) {
    for (int attempt = 0; attempt < 3; attempt++) {
        size_t room = *cap - (size_t)p->n_tokens, got = 0;
        enum ekv_status s = ekv_tokenize(p->model, text, len, bos, true, p->tokens + p->n_tokens, room, &got);
        if (s == EKV_OK) {
            if (got > (size_t)INT32_MAX - (size_t)p->n_tokens)
                return ekv_err(EKV_ERR_OVERFLOW, "prompt of more than %d tokens", INT32_MAX);
            p->n_tokens += (int32_t)got;
            return EKV_OK;
        }
        if (s != EKV_ERR_INVALID_ARG || got <= room) return s;
        size_t want = (size_t)p->n_tokens + got + 16;
        if (want > (size_t)INT32_MAX) return ekv_err(EKV_ERR_OVERFLOW, "prompt of more than %d tokens", INT32_MAX);
        int32_t *nt = realloc(p->tokens, want * sizeof *nt);
        if (!nt) return ekv_err(EKV_ERR_NOMEM, "out of memory for %zu prompt tokens", want);
        p->tokens = nt;
        *cap = want;
    }
    return ekv_err(EKV_ERR_INTERNAL, "tokenizer asked for more room three times");
}

static void build_segments(struct ekv_prompt *p) {
    int32_t ns = 0;
    for (int32_t i = 0; i <= p->n_images; i++) {
        int32_t a = p->piece_start[i], b = p->piece_start[i + 1];
        if (b > a) p->segs[ns++] = (struct ekv_segment){.tokens = p->tokens + a, .n = b - a, .tag = EKV_TAG_TEXT};
        if (i < p->n_images)
            p->segs[ns++] = (struct ekv_segment){.embd = p->images[i].embd, .n = p->images[i].n_rows,
                                                 .tag = EKV_TAG_IMAGE};
    }
    p->n_segs = ns;
}

enum ekv_status ekv_prompt_new(const struct ekv_model *model, const char *text, size_t len, bool add_bos,
                               struct ekv_prompt **out) {
    ekv_err_clear();
    if (!model || !out || (!text && len)) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prompt_new: model, text and out are required");
    *out = NULL;
    if (!text) text = "";
    struct ekv_prompt *p = calloc(1, sizeof *p);
    if (!p) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    p->model = model;
    const size_t ml = sizeof EKV_IMAGE_MARKER - 1;
    for (const char *q = text, *end = text + len, *m; (m = find_marker(q, (size_t)(end - q))); q = m + ml)
        p->n_images++;
    size_t cap = len + 16;
    enum ekv_status s = EKV_OK;
    p->tokens = malloc(cap * sizeof *p->tokens);
    p->piece_start = calloc((size_t)p->n_images + 2, sizeof *p->piece_start);
    p->images = calloc((size_t)p->n_images + 1, sizeof *p->images);
    p->segs = calloc(2 * (size_t)p->n_images + 1, sizeof *p->segs);
    if (!p->tokens || !p->piece_start || !p->images || !p->segs) s = ekv_err(EKV_ERR_NOMEM, "out of memory");
    const char *q = text, *end = text + len;
    for (int32_t i = 0; s == EKV_OK && i <= p->n_images; i++) {
        const char *m = i < p->n_images ? find_marker(q, (size_t)(end - q)) : end;
        p->piece_start[i] = p->n_tokens;
        s = tokenize_piece(p, q, (size_t)(m - q), add_bos && i == 0, &cap);
        q = m + ml;
    }
    if (s != EKV_OK) {
        ekv_prompt_free(p);
        return s;
    }
    p->piece_start[p->n_images + 1] = p->n_tokens;
    build_segments(p);
    *out = p;
    return EKV_OK;
}

void ekv_prompt_free(struct ekv_prompt *p) {
    if (!p) return;
    for (int32_t i = 0; p->images && i < p->n_images; i++) free(p->images[i].embd);
    free(p->images);
    free(p->tokens);
    free(p->piece_start);
    free(p->segs);
    free(p);
}

int32_t ekv_prompt_n_images(const struct ekv_prompt *p) { return p ? p->n_images : 0; }
int32_t ekv_prompt_n_tokens(const struct ekv_prompt *p) { return p ? p->n_tokens : 0; }

void ekv_prompt_tokens(const struct ekv_prompt *p, int32_t *tokens) {
    if (p && tokens && p->n_tokens) memcpy(tokens, p->tokens, (size_t)p->n_tokens * sizeof *tokens);
}

static void clear_images(struct ekv_prompt *p) {
    for (int32_t i = 0; i < p->n_images; i++) {
        free(p->images[i].embd);
        p->images[i] = (struct prompt_image){0};
    }
    build_segments(p);
}

enum ekv_status ekv_prompt_set_images(struct ekv_prompt *p, const struct ekv_vision *v, struct ekv_context *ctx,
                                      const struct ekv_image_input *images, int32_t n) {
    ekv_err_clear();
    if (!p || (n > 0 && (!v || !images)) || n < 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prompt_set_images: prompt, vision tower and images are required");
    if (n != p->n_images)
        return ekv_err(EKV_ERR_INVALID_ARG, "the prompt has %d %s marker%s but %d image%s %s given", (int)p->n_images,
                       EKV_IMAGE_MARKER, p->n_images == 1 ? "" : "s", (int)n, n == 1 ? "" : "s",
                       n == 1 ? "was" : "were");
    if (ctx && ctx->model != p->model)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prompt_set_images: the context belongs to another model");
    clear_images(p);
    for (int32_t i = 0; i < n; i++) {
        struct prompt_image *im = &p->images[i];
        enum ekv_status s = ekv_vision_encode_input(v, ctx, &images[i], i, &im->embd, &im->n_rows);
        if (s == EKV_OK && ctx == NULL && ekv_vision_n_embd(v) != p->model->info.n_embd)
            s = ekv_err(EKV_ERR_INVALID_ARG, "the mmproj projects images to width %d but the language model's width is %d",
                        ekv_vision_n_embd(v), p->model->info.n_embd);
        if (s != EKV_OK) {
            clear_images(p);
            return s;
        }
    }
    build_segments(p);
    return EKV_OK;
}

enum ekv_status ekv_prompt_set_image_embd(struct ekv_prompt *p, int32_t i, const float *embd, int32_t n_rows) {
    ekv_err_clear();
    if (!p || !embd || n_rows <= 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prompt_set_image_embd: prompt, embeddings and a positive row count are required");
    if (i < 0 || i >= p->n_images)
        return ekv_err(EKV_ERR_INVALID_ARG, "image slot %d out of range: the prompt has %d", (int)i, (int)p->n_images);
    size_t cells;
    if (!ekv_mul_ok((size_t)n_rows, (size_t)p->model->info.n_embd, &cells) || !ekv_mul_ok(cells, sizeof(float), &cells))
        return ekv_err(EKV_ERR_OVERFLOW, "image slot %d: %d rows", (int)i, (int)n_rows);
    float *e = malloc(cells);
    if (!e) return ekv_err(EKV_ERR_NOMEM, "out of memory for image slot %d", (int)i);
    memcpy(e, embd, cells);
    free(p->images[i].embd);
    p->images[i] = (struct prompt_image){.embd = e, .n_rows = n_rows};
    build_segments(p);
    return EKV_OK;
}

int64_t ekv_prompt_n_positions(const struct ekv_prompt *p) {
    if (!p) return 0;
    int64_t n = p->n_tokens;
    for (int32_t i = 0; i < p->n_images; i++) n += p->images[i].n_rows;
    return n;
}

enum ekv_status ekv_prompt_image_span(const struct ekv_prompt *p, int32_t i, int64_t *pos0, int32_t *n_rows) {
    if (!p || i < 0 || i >= p->n_images)
        return ekv_err(EKV_ERR_INVALID_ARG, "image slot %d out of range: the prompt has %d", (int)i,
                       p ? (int)p->n_images : 0);
    int64_t pos = p->piece_start[i + 1];
    for (int32_t j = 0; j < i; j++) pos += p->images[j].n_rows;
    if (pos0) *pos0 = pos;
    if (n_rows) *n_rows = p->images[i].n_rows;
    return EKV_OK;
}

enum ekv_status ekv_prompt_segments(const struct ekv_prompt *p, const struct ekv_segment **segs, int32_t *n_segs) {
    if (!p || !segs || !n_segs) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prompt_segments: NULL argument");
    *segs = NULL;
    *n_segs = 0;
    for (int32_t i = 0; i < p->n_images; i++)
        if (!p->images[i].embd)
            return ekv_err(EKV_ERR_INVALID_ARG, "image %d of the prompt has not been set (%d marker%s, give as many images)",
                           (int)i, (int)p->n_images, p->n_images == 1 ? "" : "s");
    *segs = p->segs;
    *n_segs = p->n_segs;
    return EKV_OK;
}

enum ekv_status ekv_seq_eval_prompt(struct ekv_seq *seq, const struct ekv_prompt *p, float *logits) {
    ekv_err_clear();
    if (!seq || !p) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_eval_prompt: sequence and prompt are required");
    if (seq->ctx->model != p->model)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_eval_prompt: the prompt was made for another model");
    const struct ekv_segment *segs;
    int32_t ns;
    enum ekv_status s = ekv_prompt_segments(p, &segs, &ns);
    if (s != EKV_OK) return s;
    if (ns == 0) return ekv_err(EKV_ERR_INVALID_ARG, "the prompt is empty");
    struct ekv_input in = {.segs = segs, .n_segs = ns, .is_prompt = true};
    return ekv_seq_eval(seq, &in, logits);
}
