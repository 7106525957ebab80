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
 * An image is one block of embedding rows, or (Idefics3/SmolVLM) its tiles
 * and overview with separator tokens between them, as llama.cpp's mtmd
 * splices them, or (Qwen2-VL) one block of grid_h x grid_w rows between
 * <|vision_start|> and <|vision_end|>, the grid giving the rows' M-RoPE
 * positions; the separators belong to the image's span of positions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/engine.h"
#include "model/vocab.h"

struct prompt_image {
    float *embd;     /* [n_rows][n_embd], owned; NULL while unset */
    int32_t n_rows;  /* embedding rows */
    int32_t *sep;    /* separator tokens (Idefics3), owned; NULL for one block */
    int32_t n_sep;
    int gx, gy;      /* Idefics3 tiles (0 without separators) */
    int32_t tile_rows;
    int grid_w, grid_h; /* Qwen2-VL: the rows' M-RoPE grid; sep = {<|vision_start|>, <|vision_end|>} */
};

struct ekv_prompt {
    const struct ekv_model *model;
    int32_t *tokens;              /* all text tokens, pieces back to back */
    int32_t n_tokens;
    int32_t *piece_start;         /* [n_images + 2]: token offset of each piece, and the end */
    int32_t n_images;
    struct prompt_image *images;  /* [n_images] */
    struct ekv_segment *segs;     /* [cap_segs] */
    int32_t n_segs, cap_segs;
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

static int32_t image_segs(const struct prompt_image *im) {
    return im->grid_w > 0 ? 3 : im->sep ? 2 * im->gx * im->gy + 3 : 1;
}
static int32_t image_positions(const struct prompt_image *im) { return im->n_rows + im->n_sep; }

/* An Idefics3 image's segments: per tile its separators (after a row's
 * end, "\n" leads them) then its rows; the overview's opening separators,
 * its rows, the closing separator. width: the model's n_embd. */
static int32_t idefics3_segments(const struct prompt_image *im, size_t width, struct ekv_segment *out) {
    int32_t ns = 0, t = 0;
    const int n_tiles = im->gx * im->gy;
    for (int tile = 0; tile <= n_tiles; tile++) {
        const int32_t n_text = tile == n_tiles || (tile > 0 && tile % im->gx == 0) ? 3 : 2;
        out[ns++] = (struct ekv_segment){.tokens = im->sep + t, .n = n_text, .tag = EKV_TAG_TEXT};
        t += n_text;
        out[ns++] = (struct ekv_segment){.embd = im->embd + (size_t)tile * (size_t)im->tile_rows * width,
                                         .n = im->tile_rows, .tag = EKV_TAG_IMAGE};
    }
    out[ns++] = (struct ekv_segment){.tokens = im->sep + t, .n = 1, .tag = EKV_TAG_TEXT};
    return ns;
}

static enum ekv_status build_segments(struct ekv_prompt *p) {
    int32_t need = p->n_images + 1;
    for (int32_t i = 0; i < p->n_images; i++) need += image_segs(&p->images[i]);
    if (need > p->cap_segs) {
        struct ekv_segment *ns = realloc(p->segs, (size_t)need * sizeof *ns);
        if (!ns) {
            p->n_segs = 0;
            return ekv_err(EKV_ERR_NOMEM, "out of memory for %d prompt segments", (int)need);
        }
        p->segs = ns;
        p->cap_segs = need;
    }
    int32_t ns = 0;
    const size_t width = (size_t)p->model->info.n_embd;
    for (int32_t i = 0; i <= p->n_images; i++) {
        int32_t a = p->piece_start[i], b = p->piece_start[i + 1];
        if (b > a) p->segs[ns++] = (struct ekv_segment){.tokens = p->tokens + a, .n = b - a, .tag = EKV_TAG_TEXT};
        if (i == p->n_images) break;
        const struct prompt_image *im = &p->images[i];
        if (im->grid_w > 0) { /* Qwen2-VL: bracketed grid */
            p->segs[ns++] = (struct ekv_segment){.tokens = im->sep, .n = 1, .tag = EKV_TAG_TEXT};
            p->segs[ns++] = (struct ekv_segment){.embd = im->embd, .n = im->n_rows, .tag = EKV_TAG_IMAGE,
                                                 .grid_w = im->grid_w, .grid_h = im->grid_h};
            p->segs[ns++] = (struct ekv_segment){.tokens = im->sep + 1, .n = 1, .tag = EKV_TAG_TEXT};
            continue;
        }
        if (!im->sep) {
            p->segs[ns++] = (struct ekv_segment){.embd = im->embd, .n = im->n_rows, .tag = EKV_TAG_IMAGE};
            continue;
        }
        ns += idefics3_segments(im, width, p->segs + ns);
    }
    p->n_segs = ns;
    return EKV_OK;
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
    p->cap_segs = 2 * p->n_images + 1;
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
    (void)build_segments(p); /* plain slots: fits the capacity allocated above */
    *out = p;
    return EKV_OK;
}

void ekv_prompt_free(struct ekv_prompt *p) {
    if (!p) return;
    for (int32_t i = 0; p->images && i < p->n_images; i++) free(p->images[i].embd), free(p->images[i].sep);
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

enum ekv_status ekv_sampler_accept_prompt(struct ekv_sampler *s, const struct ekv_prompt *p) {
    if (!s || !p) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_sampler_accept_prompt: NULL argument");
    for (int32_t i = 0; i < p->n_tokens; i++) ekv_sampler_accept(s, p->tokens[i]);
    return EKV_OK;
}

static void clear_image(struct prompt_image *im) {
    free(im->embd);
    free(im->sep);
    *im = (struct prompt_image){0};
}

static void clear_images(struct ekv_prompt *p) {
    for (int32_t i = 0; i < p->n_images; i++) clear_image(&p->images[i]);
    (void)build_segments(p); /* no image: fewer segments than ever allocated */
}

/* The token whose text (special tokens included) is exactly `text`: the
 * stored token of that text, else the lowest id that decodes to it (as
 * llama.cpp's mtmd looks up its image separators, e.g. "\n" in a
 * byte-level BPE vocabulary). */
static enum ekv_status piece_token(const struct ekv_model *m, const char *text, const char *family, int32_t *tok) {
    const size_t tl = strlen(text);
    char buf[64];
    size_t got;
    const int32_t hit = ekv_vocab_lookup(m->vocab, text, tl), n = ekv_vocab_n_tokens(m->vocab);
    for (int32_t t = -1; t < n; t++) {
        const int32_t id = t < 0 ? hit : t;
        if (id >= 0 && ekv_token_to_piece(m, id, true, buf, sizeof buf, &got) == EKV_OK && got == tl &&
            !memcmp(buf, text, tl)) {
            *tok = id;
            return EKV_OK;
        }
    }
    ekv_err_clear();
    char shown[32];
    size_t k = 0;
    for (size_t i = 0; i < tl && k + 3 < sizeof shown; i++) {
        if (text[i] == '\n') shown[k++] = '\\', shown[k++] = 'n';
        else shown[k++] = text[i];
    }
    shown[k] = 0;
    return ekv_err(EKV_ERR_UNSUPPORTED,
                   "the language model's vocabulary has no token \"%s\", which %s mmproj puts around its images: "
                   "is this the language model that goes with the mmproj?",
                   shown, family);
}

/* Fills im->sep for an Idefics3 image of gx x gy tiles (ekv_idefics3_n_sep). */
static enum ekv_status idefics3_separators(const struct ekv_prompt *p, struct prompt_image *im) {
    int32_t fake, nl, nl2, glob;
    enum ekv_status s;
    const char *fam = "an Idefics3 (SmolVLM)";
    if ((s = piece_token(p->model, "<fake_token_around_image>", fam, &fake)) ||
        (s = piece_token(p->model, "\n", fam, &nl)) || (s = piece_token(p->model, "\n\n", fam, &nl2)) ||
        (s = piece_token(p->model, "<global-img>", fam, &glob)))
        return s;
    const int64_t n = ekv_idefics3_n_sep(im->gx, im->gy);
    if (!(im->sep = malloc((size_t)n * sizeof *im->sep))) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    int32_t k = 0;
    for (int y = 0; y < im->gy; y++)
        for (int x = 0; x < im->gx; x++) {
            char rc[48];
            snprintf(rc, sizeof rc, "<row_%d_col_%d>", y + 1, x + 1);
            if (x == 0 && y > 0) im->sep[k++] = nl;
            im->sep[k++] = fake;
            if ((s = piece_token(p->model, rc, fam, &im->sep[k++])) != EKV_OK) return s;
        }
    im->sep[k++] = nl2;
    im->sep[k++] = fake;
    im->sep[k++] = glob;
    im->sep[k++] = fake;
    im->n_sep = k;
    return EKV_OK;
}

/* Fills im->sep for a Qwen2-VL image: <|vision_start|>, <|vision_end|>
 * (llama.cpp mtmd's img_beg / img_end). */
static enum ekv_status qwen2vl_brackets(const struct ekv_prompt *p, struct prompt_image *im) {
    if (!(im->sep = malloc(2 * sizeof *im->sep))) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    im->n_sep = 2;
    enum ekv_status s = piece_token(p->model, "<|vision_start|>", "a Qwen2-VL", &im->sep[0]);
    return s != EKV_OK ? s : piece_token(p->model, "<|vision_end|>", "a Qwen2-VL", &im->sep[1]);
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
        enum ekv_status s = ekv_vision_encode_input(v, ctx, &images[i], i, &im->embd, &im->n_rows, &im->gx, &im->gy,
                                                    &im->tile_rows, &im->grid_w, &im->grid_h);
        if (s == EKV_OK && ctx == NULL && ekv_vision_n_embd(v) != p->model->info.n_embd)
            s = ekv_err(EKV_ERR_INVALID_ARG, "the mmproj projects images to width %d but the language model's width is %d",
                        ekv_vision_n_embd(v), p->model->info.n_embd);
        if (s == EKV_OK && im->gx > 0) s = idefics3_separators(p, im);
        if (s == EKV_OK && im->grid_w > 0) s = qwen2vl_brackets(p, im);
        if (s == EKV_OK && (int64_t)im->n_rows + im->n_sep > INT32_MAX)
            s = ekv_err(EKV_ERR_OVERFLOW, "image %d takes more than %d positions", (int)i, INT32_MAX);
        if (s != EKV_OK) {
            clear_images(p);
            return s;
        }
    }
    enum ekv_status s = build_segments(p);
    if (s != EKV_OK) clear_images(p);
    return s;
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
    clear_image(&p->images[i]);
    p->images[i] = (struct prompt_image){.embd = e, .n_rows = n_rows};
    (void)build_segments(p); /* a plain slot needs no more segments than the tiled one it replaces or the first allocation */
    return EKV_OK;
}

int64_t ekv_prompt_n_positions(const struct ekv_prompt *p) {
    if (!p) return 0;
    int64_t n = p->n_tokens;
    for (int32_t i = 0; i < p->n_images; i++) n += image_positions(&p->images[i]);
    return n;
}

enum ekv_status ekv_prompt_image_span(const struct ekv_prompt *p, int32_t i, int64_t *pos0, int32_t *n_rows) {
    if (!p || i < 0 || i >= p->n_images)
        return ekv_err(EKV_ERR_INVALID_ARG, "image slot %d out of range: the prompt has %d", (int)i,
                       p ? (int)p->n_images : 0);
    int64_t pos = p->piece_start[i + 1];
    for (int32_t j = 0; j < i; j++) pos += image_positions(&p->images[j]);
    if (pos0) *pos0 = pos;
    if (n_rows) *n_rows = image_positions(&p->images[i]);
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
