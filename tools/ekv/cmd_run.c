/*
 * cmd_run.c — `ekv run`: generate text from a prompt with a chosen KV-cache
 * policy and budget, llama.cpp-style flags, streaming output on stdout, a
 * one-line report on stderr (tokens, tokens/s per phase, cache bytes against
 * the full cache), optional JSON output and a JSON trace of the kept
 * positions (--kv-trace). With --chat (-cnv) it holds a conversation: one
 * user message per line of stdin, each turn fed as the text the chat
 * template adds since the last turn (run_chat below), on one sequence
 * whose compressed cache lives through the whole conversation.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *const CMD = "run";

static const struct cli_help k_help = {
    "usage: ekv run [options]",
    "Generates text from a prompt with a chosen KV-cache policy and budget: the text on\n"
    "stdout, a report on stderr (cache bytes against the full cache, tokens/s per phase).",
    NULL,
};

/* ---- --kv-trace ---- */

static cJSON *kv_snapshot(const struct ekv_seq *seq, const struct ekv_model_info *mi, const char *when) {
    cJSON *snap = cJSON_CreateObject();
    cJSON_AddStringToObject(snap, "when", when);
    cJSON_AddNumberToObject(snap, "n_seen", (double)ekv_seq_n_seen(seq));
    cJSON *layers = cJSON_AddArrayToObject(snap, "layers");
    for (int32_t l = 0; l < mi->n_layer; l++) {
        cJSON *lo = cJSON_CreateObject();
        cJSON_AddNumberToObject(lo, "layer", l);
        cJSON *heads = cJSON_AddArrayToObject(lo, "heads");
        for (int32_t h = 0; h < mi->n_head_kv; h++) {
            int32_t n = ekv_seq_kv_layer_len(seq, l, h);
            int32_t *pos = malloc(((size_t)n + 1) * sizeof *pos);
            float *w = malloc(((size_t)n + 1) * sizeof *w);
            uint8_t *tag = malloc((size_t)n + 1);
            cJSON *ho = cJSON_CreateObject();
            cJSON_AddNumberToObject(ho, "kv_head", h);
            cJSON_AddNumberToObject(ho, "len", n);
            if (pos && w && tag && ekv_seq_kv_entries(seq, l, h, pos, w, tag) == EKV_OK) {
                cJSON *pa = cJSON_AddArrayToObject(ho, "positions");
                cJSON *wa = cJSON_AddArrayToObject(ho, "weights");
                cJSON *ta = cJSON_AddArrayToObject(ho, "tags");
                static const char *const tag_names[] = {"text", "image", "generated"};
                for (int32_t i = 0; i < n; i++) {
                    cJSON_AddItemToArray(pa, cJSON_CreateNumber(pos[i]));
                    cJSON_AddItemToArray(wa, cJSON_CreateNumber(w[i]));
                    cJSON_AddItemToArray(ta, cJSON_CreateString(tag[i] < 3 ? tag_names[tag[i]] : "?"));
                }
            }
            free(pos);
            free(w);
            free(tag);
            cJSON_AddItemToArray(heads, ho);
        }
        cJSON_AddItemToArray(layers, lo);
    }
    return snap;
}

/* Writes JSON atomically (tmp + rename): no partial file on failure. */
static bool write_json_file(const char *path, cJSON *root) {
    char *txt = cJSON_Print(root);
    if (!txt) return false;
    size_t plen = strlen(path) + 8;
    char *tmp = malloc(plen);
    bool ok = false;
    if (tmp) {
        snprintf(tmp, plen, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (f) {
            ok = fputs(txt, f) >= 0 && fputc('\n', f) != EOF;
            ok = (fclose(f) == 0) && ok;
            if (ok) ok = rename(tmp, path) == 0;
            if (!ok) remove(tmp);
        }
    }
    free(tmp);
    free(txt);
    return ok;
}

static void print_kv_report(FILE *out, const struct ekv_seq *seq, const struct ekv_model_info *mi,
                            const char *policy, double budget) {
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(seq, &st);
    fprintf(out, "ekv run: kv: policy %s, budget %.3g, entries per layer (mean over %d KV heads):", policy,
            budget, mi->n_head_kv);
    for (int32_t l = 0; l < mi->n_layer; l++) {
        int64_t sum = 0;
        for (int32_t h = 0; h < mi->n_head_kv; h++) sum += ekv_seq_kv_layer_len(seq, l, h);
        if (l < 16 || l == mi->n_layer - 1) fprintf(out, " %.1f", (double)sum / mi->n_head_kv);
        else if (l == 16) fprintf(out, " ...");
    }
    fprintf(out, "\nekv run: kv: %.1f KiB of %.1f KiB full cache (%.1f%%; K %s, V %s; %.1f%% of a full f32 cache), "
                 "%lld tokens seen, %lld evicted, %lld merged (summed over layers and heads)\n",
            st.bytes / 1024.0, st.bytes_full / 1024.0, st.bytes_full ? 100.0 * st.bytes / st.bytes_full : 100.0,
            ekv_kv_type_name(st.type_k), ekv_kv_type_name(st.type_v),
            st.bytes_full_f32 ? 100.0 * st.bytes / st.bytes_full_f32 : 100.0, (long long)st.n_seen,
            (long long)st.evicted, (long long)st.merged);
}


/* Everything one run holds, from set-up to report. */
struct run {
    struct cli_params p;
    struct ekv_model *model;
    struct ekv_context *ctx;
    struct ekv_seq *seq;
    struct ekv_sampler *smp;
    struct ekv_model_info mi;
    int32_t n_threads;
    int32_t ctx_size;
    char *file_text;       /* -f contents */
    const char *prompt;    /* the user's prompt (before the template) */
    char *user_text;       /* the prompt with one image marker per --image in front */
    char *chat;            /* the prompt after the chat template */
    struct ekv_prompt *pr; /* text tokens around the image slots */
    struct ekv_vision *vision;
    int32_t n_img;         /* image positions, all images */
    int64_t n_prompt;      /* positions: tokens + image embeddings */
    long n_predict;
    int32_t *gen;          /* [n_predict] generated tokens */
    long n_gen;
    float *logits;         /* [n_vocab] */
    char *out_text;
    size_t out_len, out_cap;
    const char *stop;
    double t_img, t_start, t0, t1, t2, t_first, t_load;
    cJSON *trace;
    /* --kv-load / --kv-save */
    int32_t *hist;         /* token ids of the positions the sequence holds (-1: not a token) */
    int64_t n_hist, cap_hist;
    bool hist_ok;          /* hist covers every position */
    int64_t n_loaded;      /* positions the loaded sequence held */
    int64_t n_skip;        /* prompt positions the loaded sequence already held */
};

static int run_parse(struct run *r, int argc, char **argv) {
    cli_params_init(&r->p, CLI_RUN);
    int rc = cli_parse(CMD, argc, argv, &r->p, &k_help);
    if (rc) return rc;
    if (r->p.prompt && r->p.prompt_file) return cli_usage_error(CMD, "give either -p or -f, not both");
    if (r->p.images.n && !r->p.mmproj) return cli_usage_error(CMD, "--image needs --mmproj (the vision tower)");
    if (r->p.chat && r->p.prompt_file) return cli_usage_error(CMD, "--chat reads the conversation from stdin; drop -f");
    if (r->p.chat && r->p.kv_trace) return cli_usage_error(CMD, "--kv-trace is not available with --chat");
    if (r->p.chat && (r->p.kv_save || r->p.kv_load))
        return cli_usage_error(CMD, "--kv-save and --kv-load are not available with --chat");
    return 0;
}

/* The prompt through the chat template (images without markers go first,
 * one marker each), then the prompt object: text tokens around the image slots. */
static bool run_build_prompt(struct run *r) {
    const struct cli_params *p = &r->p;
    const int n_images = p->images.n;
    /* with images: the model's own template (SmolVLM's), else LLaVA-1.5's */
    const char *own = n_images && !p->chat_template ? ekv_model_chat_template(r->model) : NULL;
    const char *tmpl = p->chat_template ? p->chat_template : n_images ? (own ? own : "llava-1.5") : "none";
    if (n_images && !strstr(r->prompt, EKV_IMAGE_MARKER)) {
        size_t ml = strlen(EKV_IMAGE_MARKER "\n"), pl = strlen(r->prompt);
        r->user_text = malloc((size_t)n_images * ml + pl + 1);
        if (!r->user_text) return cli_fail(CMD, EKV_ERR_NOMEM), false;
        for (int i = 0; i < n_images; i++) memcpy(r->user_text + (size_t)i * ml, EKV_IMAGE_MARKER "\n", ml);
        memcpy(r->user_text + (size_t)n_images * ml, r->prompt, pl + 1);
    }
    const char *user = r->user_text ? r->user_text : r->prompt;
    size_t len = 0;
    enum ekv_status s = ekv_chat_format(tmpl, p->system, user, false, NULL, 0, &len);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    r->chat = malloc(len + 1);
    if (!r->chat) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    if ((s = ekv_chat_format(tmpl, p->system, user, false, r->chat, len + 1, &len)) != EKV_OK)
        return cli_fail(CMD, s), false;
    if ((s = ekv_prompt_new(r->model, r->chat, len, true, &r->pr)) != EKV_OK) return cli_fail(CMD, s), false;
    if (ekv_prompt_n_images(r->pr) != n_images) {
        cli_usage_error(CMD, "the prompt has %d %s marker(s) but %d --image flag(s) were given",
                        ekv_prompt_n_images(r->pr), EKV_IMAGE_MARKER, n_images);
        return false;
    }
    return true;
}

static bool run_encode_images(struct run *r) {
    const struct cli_params *p = &r->p;
    double ti = cli_now();
    struct ekv_image_input imgs[CLI_LIST_MAX];
    for (int i = 0; i < p->images.n; i++) imgs[i] = (struct ekv_image_input){.path = p->images.s[i]};
    enum ekv_status s = ekv_vision_load(p->mmproj, &r->vision);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    if ((s = ekv_prompt_set_images(r->pr, r->vision, r->ctx, imgs, p->images.n)) != EKV_OK)
        return cli_fail(CMD, s), false;
    r->t_img = cli_now() - ti;
    for (int i = 0; i < p->images.n; i++) {
        int32_t rows = 0;
        ekv_prompt_image_span(r->pr, i, NULL, &rows);
        r->n_img += rows;
        fprintf(stderr, "ekv run: image %s: %d image tokens\n", p->images.s[i], rows);
    }
    fprintf(stderr, "ekv run: %d image(s) encoded in %.3f s on %s\n", p->images.n, r->t_img,
            ekv_vision_encodes_on(r->vision, r->ctx));
    return true;
}

static cJSON *trace_new(const struct run *r) {
    const struct cli_params *p = &r->p;
    cJSON *trace = cJSON_CreateObject();
    cJSON_AddStringToObject(trace, "model", p->model);
    cJSON_AddStringToObject(trace, "policy", p->kv.policy ? p->kv.policy : "full");
    cJSON_AddNumberToObject(trace, "budget", p->kv.budget);
    cJSON_AddNumberToObject(trace, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(trace, "image_tokens", r->n_img);
    int64_t img0 = -1;
    if (p->images.n) ekv_prompt_image_span(r->pr, 0, &img0, NULL);
    cJSON_AddNumberToObject(trace, "image_start", (double)img0);
    cJSON *spans = cJSON_AddArrayToObject(trace, "images");
    for (int i = 0; i < p->images.n; i++) {
        int64_t p0 = 0;
        int32_t rows = 0;
        ekv_prompt_image_span(r->pr, i, &p0, &rows);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "start", (double)p0);
        cJSON_AddNumberToObject(o, "tokens", rows);
        cJSON_AddItemToArray(spans, o);
    }
    cJSON_AddArrayToObject(trace, "snapshots");
    return trace;
}

/* ---- --kv-load / --kv-save ---- */

static bool hist_push(struct run *r, int32_t t) {
    if (r->n_hist == r->cap_hist) {
        const int64_t cap = r->cap_hist ? 2 * r->cap_hist : 256;
        int32_t *nh = realloc(r->hist, (size_t)cap * sizeof *nh);
        if (!nh) return false;
        r->hist = nh;
        r->cap_hist = cap;
    }
    r->hist[r->n_hist++] = t;
    return true;
}

/* The saved sequence, with the token ids it was saved with. */
static bool run_load(struct run *r) {
    r->t_start = cli_now(); /* time to first token counts the load */
    int32_t *tok = NULL, nt = 0;
    enum ekv_status s = ekv_seq_load(r->ctx, r->p.kv_load, &r->seq, &tok, &nt);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    r->t_load = cli_now() - r->t_start;
    r->n_loaded = ekv_seq_n_seen(r->seq);
    r->hist_ok = tok && nt == r->n_loaded;
    for (int32_t i = 0; i < nt && r->hist_ok; i++) r->hist_ok = hist_push(r, tok[i]);
    free(tok);
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(r->seq, &st);
    fprintf(stderr, "ekv run: loaded %s in %.3f s: %lld positions, %lld cache entries (%.1f KiB, K %s, V %s), "
                    "policy %s at budget %g (the file's; --kv-* do not apply)\n",
            r->p.kv_load, r->t_load, (long long)r->n_loaded, (long long)st.entries, st.bytes / 1024.0,
            ekv_kv_type_name(st.type_k), ekv_kv_type_name(st.type_v), st.policy, st.budget);
    return true;
}

/* The prompt's positions as token ids (-1 for image rows) into ids[n]. */
static bool prompt_ids(const struct ekv_prompt *pr, int32_t *ids, int64_t n) {
    const struct ekv_segment *sg = NULL;
    int32_t ns = 0;
    if (ekv_prompt_segments(pr, &sg, &ns) != EKV_OK) return false;
    int64_t at = 0;
    for (int32_t i = 0; i < ns; i++)
        for (int32_t j = 0; j < sg[i].n && at < n; j++) ids[at++] = sg[i].tokens ? sg[i].tokens[j] : -1;
    return at == n;
}

/* A prompt that begins with the saved tokens reads only the rest; any
 * other follows them as a continuation (tokenized without BOS). */
static bool run_match_loaded(struct run *r) {
    const int64_t n = ekv_prompt_n_positions(r->pr);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids || !prompt_ids(r->pr, ids, n)) return free(ids), cli_fail(CMD, EKV_ERR_NOMEM), false;
    bool prefix = r->hist_ok && r->n_loaded <= n;
    for (int64_t i = 0; i < r->n_loaded && prefix; i++) prefix = ids[i] >= 0 && ids[i] == r->hist[i];
    free(ids);
    if (prefix) {
        r->n_skip = r->n_loaded;
        if (r->n_skip == n) {
            fprintf(stderr, "ekv run: error: the prompt is the %lld saved tokens of %s and adds nothing: give the text "
                            "that follows them (e.g. a question)\n", (long long)n, r->p.kv_load);
            return false;
        }
        fprintf(stderr, "ekv run: the prompt begins with the %lld saved tokens: reading its other %lld\n",
                (long long)r->n_skip, (long long)(n - r->n_skip));
        return true;
    }
    /* a continuation: the same text without BOS, images set again */
    struct ekv_prompt *np = NULL;
    enum ekv_status s = ekv_prompt_new(r->model, r->chat, strlen(r->chat), false, &np);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    ekv_prompt_free(r->pr);
    r->pr = np;
    r->n_img = 0;
    if (r->p.images.n && !run_encode_images(r)) return false;
    fprintf(stderr, "ekv run: the prompt follows the %lld saved positions\n", (long long)r->n_loaded);
    return true;
}

/* The prompt's positions from n_skip on, as one prompt. */
static enum ekv_status run_eval_rest(struct run *r) {
    const struct ekv_segment *sg = NULL;
    int32_t ns = 0;
    enum ekv_status s = ekv_prompt_segments(r->pr, &sg, &ns);
    if (s != EKV_OK) return s;
    struct ekv_segment *rest = malloc((size_t)(ns ? ns : 1) * sizeof *rest);
    if (!rest) return EKV_ERR_NOMEM;
    int32_t nr = 0;
    int64_t skip = r->n_skip;
    for (int32_t i = 0; i < ns; i++) {
        struct ekv_segment g = sg[i];
        const int32_t k = (int32_t)(skip < g.n ? skip : g.n);
        skip -= k;
        if (k == g.n) continue;
        if (g.tokens) g.tokens += k;
        else g.embd += (size_t)k * (size_t)r->mi.n_embd;
        g.n -= k;
        rest[nr++] = g;
    }
    const struct ekv_input in = {.segs = rest, .n_segs = nr, .is_prompt = true};
    s = ekv_seq_eval(r->seq, &in, r->logits);
    free(rest);
    return s;
}

/* After the prompt: its positions' ids join those the sequence held. */
static bool hist_add_prompt(struct run *r) {
    if (!r->p.kv_load) r->hist_ok = true;
    const int64_t n = ekv_prompt_n_positions(r->pr);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    bool ok = ids && prompt_ids(r->pr, ids, n);
    for (int64_t i = r->n_skip; i < n && ok; i++) ok = hist_push(r, ids[i]);
    free(ids);
    if (!ok) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    return true;
}

static bool run_save(struct run *r) {
    const double t = cli_now();
    const bool with = r->hist_ok && r->n_hist == ekv_seq_n_seen(r->seq);
    enum ekv_status s = ekv_seq_save(r->seq, with ? r->hist : NULL, with ? (int32_t)r->n_hist : 0, r->p.kv_save);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    FILE *f = fopen(r->p.kv_save, "rb");
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (f) fclose(f);
    fprintf(stderr, "ekv run: saved %lld positions to %s (%.1f KiB) in %.3f s\n", (long long)ekv_seq_n_seen(r->seq),
            r->p.kv_save, size / 1024.0, cli_now() - t);
    return true;
}

/* Model, context, sequence, sampler, prompt, images, buffers. */
static bool run_setup(struct run *r) {
    struct cli_params *p = &r->p;
    if (p->prompt_file) {
        if (!(r->file_text = cli_read_file(CMD, p->prompt_file, NULL))) return false;
        r->prompt = r->file_text;
    } else {
        r->prompt = p->prompt ? p->prompt : "Once upon a time";
    }
    if (!p->model) p->model = cli_default_model();
    if (!cli_load_model(CMD, p, &r->model, &r->ctx)) return false;
    ekv_model_get_info(r->model, &r->mi);
    r->n_threads = p->threads > 0 ? (int32_t)p->threads : ekv_context_default_params().n_threads;
    r->ctx_size = p->n_ctx > 0 ? (int32_t)p->n_ctx : r->mi.n_ctx_train;
    enum ekv_status s;
    if (p->kv_load) {
        if (!run_load(r)) return false;
    } else if ((s = ekv_seq_new(r->ctx, &p->kv, &r->seq)) != EKV_OK) {
        return cli_fail(CMD, s), false;
    }
    struct ekv_sampler_params sp = p->sampling;
    if (sp.repeat_last_n < 0) sp.repeat_last_n = r->ctx_size; /* -1: the context */
    if ((s = ekv_sampler_new(&sp, &r->smp)) != EKV_OK) return cli_fail(CMD, s), false;
    if (!cli_logit_bias_check(CMD, &p->logit_bias, r->mi.n_vocab)) return false;
    if ((s = cli_logit_bias_set(&p->logit_bias, r->smp)) != EKV_OK) return cli_fail(CMD, s), false;
    if (p->chat) { /* run_chat builds each turn's prompt */
        r->logits = malloc((size_t)r->mi.n_vocab * sizeof *r->logits);
        r->out_cap = 256;
        if (!r->logits || !(r->out_text = malloc(r->out_cap))) return cli_fail(CMD, EKV_ERR_NOMEM), false;
        r->out_text[0] = 0;
        return true;
    }
    if (!run_build_prompt(r)) return false;
    if (!p->kv_load) r->t_start = cli_now(); /* time to first token counts image encoding (and loading) */
    if (p->images.n && !run_encode_images(r)) return false;
    if (ekv_prompt_n_tokens(r->pr) == 0 && r->n_img == 0) return cli_usage_error(CMD, "the prompt is empty"), false;
    if (p->kv_load && !run_match_loaded(r)) return false;
    r->n_prompt = ekv_prompt_n_positions(r->pr) - r->n_skip; /* the positions read now */
    const int64_t held = r->n_loaded + r->n_prompt;
    if (held >= r->ctx_size) {
        fprintf(stderr, "ekv run: error: prompt of %lld positions does not fit the context of %d\n", (long long)held,
                r->ctx_size);
        return false;
    }
    r->n_predict = p->n_predict;
    if (r->n_predict < 0 || held + r->n_predict > r->ctx_size) r->n_predict = r->ctx_size - (long)held;
    r->gen = malloc(((size_t)r->n_predict + 1) * sizeof *r->gen);
    r->logits = malloc((size_t)r->mi.n_vocab * sizeof *r->logits);
    r->out_cap = 256;
    r->out_text = malloc(r->out_cap);
    if (!r->gen || !r->logits || !r->out_text) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    r->out_text[0] = 0;
    if (p->kv_trace && !(r->trace = trace_new(r))) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    return true;
}

static bool run_prefill(struct run *r) {
    enum ekv_status s;
    if (r->p.kv_load) s = run_eval_rest(r);
    else s = ekv_seq_eval_prompt(r->seq, r->pr, r->logits);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    return r->p.kv_save ? hist_add_prompt(r) : true;
}

static bool append_text(struct run *r, const char *piece, size_t pn) {
    if (r->out_len + pn + 1 > r->out_cap) {
        size_t cap = (r->out_len + pn + 1) * 2;
        char *nb = realloc(r->out_text, cap);
        if (!nb) return false;
        r->out_text = nb;
        r->out_cap = cap;
    }
    memcpy(r->out_text + r->out_len, piece, pn);
    r->out_len += pn;
    r->out_text[r->out_len] = 0;
    return true;
}

/* Prefill, then sample and decode until -n tokens or end of text. */
static bool run_generate(struct run *r) {
    const struct cli_params *p = &r->p;
    if (p->display_prompt && !p->json) {
        fputs(r->prompt, stdout);
        fflush(stdout);
    }
    r->t0 = cli_now();
    if (!run_prefill(r)) return false;
    ekv_sampler_accept_prompt(r->smp, r->pr); /* the penalties' window */
    r->t1 = cli_now();
    if (r->trace) {
        cJSON_AddNumberToObject(r->trace, "window_start", (double)ekv_seq_kv_window_start(r->seq));
        cJSON_AddItemToArray(cJSON_GetObjectItem(r->trace, "snapshots"), kv_snapshot(r->seq, &r->mi, "prefill"));
    }
    r->stop = "length";
    while (r->n_gen < r->n_predict) {
        int32_t t = ekv_sampler_sample(r->smp, r->logits, r->mi.n_vocab);
        if (!p->ignore_eos && ekv_token_is_eog(r->model, t)) {
            r->stop = "eos";
            break;
        }
        r->gen[r->n_gen++] = t;
        ekv_sampler_accept(r->smp, t);
        if (r->n_gen == 1) r->t_first = cli_now();
        char piece[256];
        size_t pn = 0;
        if (ekv_token_to_piece(r->model, t, false, piece, sizeof piece, &pn) != EKV_OK) pn = 0;
        if (!append_text(r, piece, pn)) return cli_fail(CMD, EKV_ERR_NOMEM), false;
        if (!p->json) {
            fwrite(piece, 1, pn, stdout);
            fflush(stdout);
        }
        if (r->n_gen == r->n_predict) break;
        enum ekv_status s = ekv_seq_decode(r->seq, t, r->logits);
        if (s != EKV_OK) return cli_fail(CMD, s), false;
        if (r->p.kv_save && !hist_push(r, t)) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    }
    r->t2 = cli_now();
    if (r->p.kv_save && !run_save(r)) return false;
    if (!p->json) {
        printf("\n");
        fflush(stdout); /* before the report on stderr */
    }
    if (r->trace) {
        cJSON_AddItemToArray(cJSON_GetObjectItem(r->trace, "snapshots"), kv_snapshot(r->seq, &r->mi, "end"));
        if (!write_json_file(p->kv_trace, r->trace)) {
            fprintf(stderr, "ekv run: error: cannot write --kv-trace file '%s'\n", p->kv_trace);
            return false;
        }
    }
    return true;
}

/* ---- --chat: a conversation on one sequence ---- */

struct chat {
    struct ekv_chat_msg *msgs;
    char **owned;          /* contents we allocated, [n_msgs] (NULL where borrowed) */
    size_t n_msgs, cap;
    const char *tmpl;
    char *closing;         /* template text after the last answer (e.g. "<|im_end|>\n") */
    cJSON *turns;
};

static bool chat_push(struct chat *c, const char *role, const char *content, bool copy) {
    if (c->n_msgs == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        struct ekv_chat_msg *m = realloc(c->msgs, cap * sizeof *m);
        if (m) c->msgs = m;
        char **o = realloc(c->owned, cap * sizeof *o);
        if (o) c->owned = o;
        if (!m || !o) return false;
        c->cap = cap;
    }
    char *own = NULL;
    if (copy && !(own = strdup(content))) return false;
    c->owned[c->n_msgs] = own;
    c->msgs[c->n_msgs++] = (struct ekv_chat_msg){role, own ? own : content};
    return true;
}

/* ekv_chat_apply into a malloc'd string. */
static char *chat_render(const char *tmpl, const struct ekv_chat_msg *m, size_t n, bool add) {
    size_t len = 0;
    if (ekv_chat_apply(tmpl, m, n, add, NULL, 0, &len) != EKV_OK) return NULL;
    char *s = malloc(len + 1);
    if (s && ekv_chat_apply(tmpl, m, n, add, s, len + 1, &len) != EKV_OK) {
        free(s);
        s = NULL;
    }
    return s;
}

/* The text a turn feeds: all of it the first time; later, what follows the
 * previous answer in the template (c->closing) and what the new user
 * message adds to the rendered history. */
static char *chat_turn_text(struct run *r, struct chat *c) {
    char *full = chat_render(c->tmpl, c->msgs, c->n_msgs, true);
    if (!full || c->n_msgs == 1 || !c->closing) return full;
    char *hist = chat_render(c->tmpl, c->msgs, c->n_msgs - 1, false);
    size_t hl = hist ? strlen(hist) : 0;
    char *out = NULL;
    if (hist && !strncmp(full, hist, hl)) {
        size_t cl = strlen(c->closing), rest = strlen(full + hl);
        if ((out = malloc(cl + rest + 1))) {
            memcpy(out, c->closing, cl);
            memcpy(out + cl, full + hl, rest + 1);
        }
    } else {
        fprintf(stderr, "ekv run: error: template %s does not extend the conversation it rendered before\n", c->tmpl);
    }
    (void)r;
    free(hist);
    free(full);
    return out;
}

/* After an answer: the template text that follows it (found by rendering
 * the answer as a sentinel byte). */
static bool chat_closing(struct chat *c) {
    struct ekv_chat_msg *last = &c->msgs[c->n_msgs - 1];
    const char *saved = last->content;
    last->content = "\x01";
    char *s = chat_render(c->tmpl, c->msgs, c->n_msgs, false);
    last->content = saved;
    if (!s) return false;
    char *mark = strrchr(s, '\x01');
    free(c->closing);
    c->closing = strdup(mark ? mark + 1 : "");
    free(s);
    return c->closing != NULL;
}

/* One user message: feed the turn, generate the answer until end of turn,
 * -n tokens or the end of the context. */
static bool chat_turn(struct run *r, struct chat *c, const char *user, int turn) {
    const struct cli_params *p = &r->p;
    char *with_images = NULL;
    if (turn == 0 && p->images.n && !strstr(user, EKV_IMAGE_MARKER)) {
        size_t ml = strlen(EKV_IMAGE_MARKER "\n"), ul = strlen(user);
        if (!(with_images = malloc((size_t)p->images.n * ml + ul + 1))) return cli_fail(CMD, EKV_ERR_NOMEM), false;
        for (int i = 0; i < p->images.n; i++) memcpy(with_images + (size_t)i * ml, EKV_IMAGE_MARKER "\n", ml);
        memcpy(with_images + (size_t)p->images.n * ml, user, ul + 1);
    }
    bool ok = chat_push(c, "user", with_images ? with_images : user, true);
    free(with_images);
    if (!ok) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    char *text = chat_turn_text(r, c);
    if (!text) return false;
    enum ekv_status s = ekv_prompt_new(r->model, text, strlen(text), turn == 0, &r->pr);
    if (s == EKV_OK && ekv_prompt_n_images(r->pr) != (turn == 0 ? p->images.n : 0)) {
        cli_usage_error(CMD, "turn %d has %d %s marker(s) for %d image(s) (images go with the first message)",
                        turn + 1, ekv_prompt_n_images(r->pr), EKV_IMAGE_MARKER, turn == 0 ? p->images.n : 0);
        s = EKV_ERR_INVALID_ARG;
    }
    if (s == EKV_OK && turn == 0 && p->images.n && !run_encode_images(r)) s = EKV_ERR_INVALID_ARG;
    const int64_t n_fed = s == EKV_OK ? ekv_prompt_n_positions(r->pr) : 0;
    if (s == EKV_OK && ekv_seq_n_seen(r->seq) + n_fed + 1 > r->ctx_size) {
        fprintf(stderr, "ekv run: the conversation reached the context of %d positions\n", r->ctx_size);
        s = EKV_ERR_CONTEXT_FULL;
    }
    if (s == EKV_OK) s = ekv_seq_eval_prompt(r->seq, r->pr, r->logits);
    if (s == EKV_OK) ekv_sampler_accept_prompt(r->smp, r->pr);
    ekv_prompt_free(r->pr);
    r->pr = NULL;
    if (s != EKV_OK) {
        free(text);
        if (s != EKV_ERR_INVALID_ARG && s != EKV_ERR_CONTEXT_FULL) cli_fail(CMD, s);
        return false;
    }
    r->n_gen = 0;
    r->out_len = 0;
    r->out_text[0] = 0;
    r->stop = "length";
    long max = r->n_predict;
    while (r->n_gen < max) {
        int32_t t = ekv_sampler_sample(r->smp, r->logits, r->mi.n_vocab);
        if (!p->ignore_eos && ekv_token_is_eog(r->model, t)) {
            r->stop = "eos";
            break;
        }
        r->gen[r->n_gen++] = t;
        ekv_sampler_accept(r->smp, t);
        char piece[256];
        size_t pn = 0;
        if (ekv_token_to_piece(r->model, t, false, piece, sizeof piece, &pn) != EKV_OK) pn = 0;
        if (!append_text(r, piece, pn)) return free(text), cli_fail(CMD, EKV_ERR_NOMEM), false;
        if (!p->json) {
            fwrite(piece, 1, pn, stdout);
            fflush(stdout);
        }
        if (ekv_seq_n_seen(r->seq) + 2 > r->ctx_size) {
            r->stop = "context";
            break;
        }
        if (r->n_gen == max) break;
        if ((s = ekv_seq_decode(r->seq, t, r->logits)) != EKV_OK) return free(text), cli_fail(CMD, s), false;
    }
    /* the answer as the history holds it; its last token is not in the cache
     * yet when generation stopped on the length: it comes with the closing */
    if (r->n_gen > 0 && strcmp(r->stop, "eos") && ekv_seq_decode(r->seq, r->gen[r->n_gen - 1], NULL) != EKV_OK) {
        free(text);
        return cli_fail(CMD, EKV_ERR_CONTEXT_FULL), false;
    }
    const char *answer = r->out_text;
    while (*answer == ' ') answer++; /* the template puts its own space before an answer */
    ok = chat_push(c, "assistant", answer, true) && chat_closing(c);
    if (!p->json) {
        printf("\n");
        fflush(stdout);
    } else {
        struct ekv_kv_stats st;
        ekv_seq_kv_stats(r->seq, &st);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "turn", turn + 1);
        cJSON_AddStringToObject(o, "user", user);
        cJSON_AddStringToObject(o, "fed_text", text);
        cJSON_AddNumberToObject(o, "fed_positions", (double)n_fed);
        cJSON_AddStringToObject(o, "text", r->out_text);
        cJSON *ga = cJSON_AddArrayToObject(o, "tokens");
        for (long i = 0; i < r->n_gen; i++) cJSON_AddItemToArray(ga, cJSON_CreateNumber(r->gen[i]));
        cJSON_AddStringToObject(o, "stop", r->stop);
        cJSON_AddNumberToObject(o, "n_seen", (double)st.n_seen);
        cJSON *kvo = cJSON_AddObjectToObject(o, "kv");
        cJSON_AddNumberToObject(kvo, "entries", (double)st.entries);
        cJSON_AddNumberToObject(kvo, "entries_full", (double)st.entries_full);
        cJSON_AddNumberToObject(kvo, "bytes", (double)st.bytes);
        cJSON_AddNumberToObject(kvo, "bytes_full", (double)st.bytes_full);
        char *js = cJSON_PrintUnformatted(o);
        if (js) puts(js);
        free(js);
        cJSON_Delete(o);
        fflush(stdout);
    }
    free(text);
    if (!ok) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    return true;
}

/* Reads user messages (one per line; "/exit" or end of input stops) and
 * answers each; -p, when given, is the first message. */
static bool run_chat(struct run *r) {
    const struct cli_params *p = &r->p;
    struct chat c = {0};
    c.tmpl = p->chat_template ? p->chat_template : ekv_model_chat_template(r->model);
    if (!c.tmpl) {
        c.tmpl = "chatml";
        fprintf(stderr, "ekv run: the model's chat template is not recognised (or absent): using chatml "
                        "(--chat-template chooses)\n");
    }
    fprintf(stderr, "ekv run: chat template %s, policy %s, budget %.3g; one message per line, /exit or end of "
                    "input ends\n", c.tmpl, p->kv.policy ? p->kv.policy : "full", p->kv.budget);
    r->n_predict = p->n_predict < 0 ? r->ctx_size : p->n_predict;
    free(r->gen);
    if (!(r->gen = malloc(((size_t)r->n_predict + 1) * sizeof *r->gen))) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    bool ok = !p->system || chat_push(&c, "system", p->system, false);
    const bool tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t cap = 0;
    r->t0 = cli_now();
    for (int turn = 0; ok; turn++) {
        const char *user = NULL;
        if (turn == 0 && p->prompt) {
            user = p->prompt;
        } else {
            if (tty) {
                printf("> ");
                fflush(stdout);
            }
            ssize_t n = getline(&line, &cap, stdin);
            if (n < 0) break;
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
            if (!strcmp(line, "/exit")) break;
            if (n == 0) {
                turn--;
                continue;
            }
            user = line;
        }
        ok = chat_turn(r, &c, user, turn);
    }
    r->t2 = cli_now();
    free(line);
    for (size_t i = 0; i < c.n_msgs; i++) free(c.owned[i]);
    free(c.owned);
    free(c.msgs);
    free(c.closing);
    if (ok) {
        print_kv_report(stderr, r->seq, &r->mi, p->kv.policy ? p->kv.policy : "full", p->kv.budget);
        fprintf(stderr, "ekv run: conversation of %lld positions in %.3f s, threads %d, peak RSS %.1f MiB\n",
                (long long)ekv_seq_n_seen(r->seq), r->t2 - r->t0, r->n_threads, cli_peak_rss() / 1048576.0);
    }
    return ok;
}

static void run_print_json(const struct run *r, const char *pol, double budget) {
    const double pp_s = r->t1 - r->t0, tg_s = r->t2 - r->t1;
    const long n_dec = r->n_gen > 1 ? r->n_gen - 1 : 0;
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(r->seq, &st);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", r->p.model);
    cJSON_AddStringToObject(o, "prompt", r->prompt);
    cJSON_AddStringToObject(o, "text", r->out_text);
    cJSON *ga = cJSON_AddArrayToObject(o, "tokens");
    for (long i = 0; i < r->n_gen; i++) cJSON_AddItemToArray(ga, cJSON_CreateNumber(r->gen[i]));
    cJSON_AddStringToObject(o, "stop", r->stop);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)r->n_prompt);
    if (r->p.kv_load) {
        cJSON_AddNumberToObject(o, "kv_loaded_positions", (double)r->n_loaded);
        cJSON_AddNumberToObject(o, "kv_reused_prompt_tokens", (double)r->n_skip);
        cJSON_AddNumberToObject(o, "kv_load_seconds", r->t_load);
    }
    cJSON_AddNumberToObject(o, "image_tokens", r->n_img);
    cJSON_AddNumberToObject(o, "image_encode_seconds", r->t_img);
    cJSON_AddNumberToObject(o, "generated_tokens", (double)r->n_gen);
    cJSON_AddNumberToObject(o, "prefill_seconds", pp_s);
    cJSON_AddNumberToObject(o, "prefill_tokens_per_second", pp_s > 0 ? r->n_prompt / pp_s : 0);
    cJSON_AddNumberToObject(o, "time_to_first_token_seconds", r->n_gen ? r->t_first - r->t_start : 0);
    cJSON_AddNumberToObject(o, "decode_seconds", tg_s);
    cJSON_AddNumberToObject(o, "decode_tokens_per_second", tg_s > 0 ? n_dec / tg_s : 0);
    cJSON *kvo = cJSON_AddObjectToObject(o, "kv");
    cJSON_AddStringToObject(kvo, "policy", pol);
    cJSON_AddNumberToObject(kvo, "budget", budget);
    cJSON_AddNumberToObject(kvo, "bytes", (double)st.bytes);
    cJSON_AddNumberToObject(kvo, "bytes_full", (double)st.bytes_full);
    cJSON_AddNumberToObject(kvo, "bytes_full_f32", (double)st.bytes_full_f32);
    cJSON_AddStringToObject(kvo, "type_k", ekv_kv_type_name(st.type_k));
    cJSON_AddStringToObject(kvo, "type_v", ekv_kv_type_name(st.type_v));
    cJSON_AddNumberToObject(kvo, "entries", (double)st.entries);
    cJSON_AddNumberToObject(kvo, "evicted", (double)st.evicted);
    cJSON_AddNumberToObject(kvo, "merged", (double)st.merged);
    cJSON *lens = cJSON_AddArrayToObject(kvo, "entries_per_layer");
    for (int32_t l = 0; l < r->mi.n_layer; l++) {
        int64_t sum = 0;
        for (int32_t h = 0; h < r->mi.n_head_kv; h++) sum += ekv_seq_kv_layer_len(r->seq, l, h);
        cJSON_AddItemToArray(lens, cJSON_CreateNumber((double)sum / r->mi.n_head_kv));
    }
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)cli_peak_rss());
    char *txt = cJSON_Print(o);
    if (txt) puts(txt);
    free(txt);
    cJSON_Delete(o);
}

static void run_report(const struct run *r) {
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(r->seq, &st); /* a loaded sequence has its own policy */
    if (r->p.json) run_print_json(r, st.policy, st.budget);
    print_kv_report(stderr, r->seq, &r->mi, st.policy, st.budget);
    const double pp_s = r->t1 - r->t0, tg_s = r->t2 - r->t1;
    /* decode time excludes the first token (it comes from the prefill logits) */
    const long n_dec = r->n_gen > 1 ? r->n_gen - 1 : 0;
    fprintf(stderr,
            "ekv run: prompt %lld tokens in %.3f s (%.1f tok/s), generated %ld tokens in %.3f s (%.1f tok/s), "
            "first token after %.3f s, stop: %s, threads %d, peak RSS %.1f MiB\n",
            (long long)r->n_prompt, pp_s, pp_s > 0 ? r->n_prompt / pp_s : 0.0, r->n_gen, tg_s,
            tg_s > 0 ? n_dec / tg_s : 0.0, r->n_gen ? r->t_first - r->t_start : 0.0, r->stop, r->n_threads,
            cli_peak_rss() / 1048576.0);
    if (ekv_seq_on_device(r->seq))
        fprintf(stderr, "ekv run: device %s, %.1f MiB of device memory (peak %.1f), last forward %.3f ms on the device\n",
                ekv_context_device(r->ctx), ekv_context_device_bytes(r->ctx) / 1048576.0,
                ekv_context_device_peak_bytes(r->ctx) / 1048576.0, ekv_context_device_last_ns(r->ctx) / 1e6);
    char prof[2048];
    if (ekv_seq_on_device(r->seq) && ekv_context_device_profile(r->ctx, prof, sizeof prof) == EKV_OK)
        fprintf(stderr, "ekv run: device time by shader (EKV_VK_PROFILE), all forwards:\n%s", prof);
}

static void run_free(struct run *r) {
    cJSON_Delete(r->trace);
    ekv_vision_free(r->vision);
    ekv_prompt_free(r->pr);
    free(r->user_text);
    free(r->chat);
    free(r->out_text);
    free(r->logits);
    free(r->gen);
    free(r->hist);
    ekv_sampler_free(r->smp);
    ekv_seq_free(r->seq);
    ekv_context_free(r->ctx);
    ekv_model_free(r->model);
    free(r->file_text);
    cli_params_free(&r->p);
}

static int cmd_run_main(int argc, char **argv) {
    struct run r;
    memset(&r, 0, sizeof r);
    int rc = run_parse(&r, argc, argv);
    if (rc == 0) {
        rc = 1;
        if (run_setup(&r) && (r.p.chat ? run_chat(&r) : run_generate(&r))) {
            if (!r.p.chat) run_report(&r);
            rc = 0;
        }
    } else if (rc == 2) {
        rc = 0; /* --help */
    }
    run_free(&r);
    return rc;
}

const struct ekv_cmd ekv_cmd_run = {"run", "generate text from a prompt with a chosen KV-cache policy", cmd_run_main};
