/*
 * cmd_run.c — `ekv run`: generate text from a prompt with a chosen KV-cache
 * policy and budget, llama.cpp-style flags, streaming output on stdout, a
 * one-line report on stderr (tokens, tokens/s per phase, cache bytes against
 * the full cache), optional JSON output and a JSON trace of the kept
 * positions (--kv-trace).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *const CMD = "run";

#define EKV_RUN_MAX_IMAGES 64

static void help(void) {
    printf("usage: ekv run [options]\n\n"
           "Generates text from a prompt.\n\n"
           "  -m, --model FILE      GGUF or llama2.c model (default: bundled models/stories260K.gguf)\n"
           "      --tokenizer FILE  tokenizer .bin for llama2.c checkpoints (default tok<vocab>.bin beside it)\n"
           "  -p, --prompt TEXT     prompt (default \"Once upon a time\")\n"
           "  -f, --file FILE       read the prompt from a file\n"
           "  -n, --n-predict N     tokens to generate (default 128; -1 = until end of text or context)\n"
           "  -t, --threads N       worker threads (default: online cores, at most 8)\n"
           "  -c, --ctx-size N      context size (default: the model's trained context)\n"
           "      --temp F          temperature; 0 = greedy (default 0.8)\n"
           "      --top-k N         top-k, 0 = off (default 40)\n"
           "      --top-p F         top-p, 1 = off (default 0.95)\n"
           "      --min-p F         min-p, 0 = off (default 0.05)\n"
           "  -s, --seed N          sampling seed (default 3776)\n"
           "      --ignore-eos      keep generating after end of text\n"
           "      --no-display-prompt  do not echo the prompt\n"
           "      --mmproj FILE     vision tower (llama.cpp-style mmproj GGUF) for --image\n"
           "      --image FILE      image (JPEG/PNG) spliced where the prompt says <image>, or before the text;\n"
           "                        repeat for several images (markers filled in order)\n"
           "      --chat-template T none, llava-1.5 or chatml (default: llava-1.5 with --image, else none)\n"
           "      --system TEXT     system prompt for the chat template (default: the template's own)\n"
           "      --json            print one JSON object (text, tokens, timings, cache) instead of text\n"
           "      --kv-trace FILE   write kept positions and merge weights per layer and KV head (JSON)\n"
           "                        after prefill and at the end\n"
           "  -h, --help            this help\n\n");
    cli_print_kv_help(stdout);
}

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
    fprintf(out, "\nekv run: kv: %.1f KiB of %.1f KiB full cache (%.1f%%), %lld tokens seen, %lld evicted, "
                 "%lld merged (summed over layers and heads)\n",
            st.bytes / 1024.0, st.bytes_full / 1024.0, st.bytes_full ? 100.0 * st.bytes / st.bytes_full : 100.0,
            (long long)st.n_seen, (long long)st.evicted, (long long)st.merged);
}

static int cmd_run_main(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *prompt = NULL, *prompt_file = NULL, *trace_path = NULL;
    const char *mmproj_path = NULL, *chat_tmpl = NULL, *system_prompt = NULL;
    const char *image_paths[EKV_RUN_MAX_IMAGES];
    int n_images = 0;
    long n_predict = 128, threads = -1, n_ctx = 0;
    bool json = false, ignore_eos = false, display_prompt = true;
    struct ekv_sampler_params sp = ekv_sampler_default_params();
    struct ekv_kv_params kvp = ekv_kv_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        double d;
        int kv = cli_parse_kv_opt(CMD, argc, argv, &i, &kvp);
        if (kv < 0) return 1;
        if (kv > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { help(); return 0; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--no-display-prompt")) display_prompt = false;
        else if (!v) return cli_usage_error(CMD, "unknown option or missing value: %s", a);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { model_path = v; i++; }
        else if (!strcmp(a, "--tokenizer")) { tok_path = v; i++; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { prompt = v; i++; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { prompt_file = v; i++; }
        else if (!strcmp(a, "--kv-trace")) { trace_path = v; i++; }
        else if (!strcmp(a, "--mmproj")) { mmproj_path = v; i++; }
        else if (!strcmp(a, "--image")) {
            if (n_images == EKV_RUN_MAX_IMAGES)
                return cli_usage_error(CMD, "at most %d --image flags", EKV_RUN_MAX_IMAGES);
            image_paths[n_images++] = v;
            i++;
        }
        else if (!strcmp(a, "--chat-template")) { chat_tmpl = v; i++; }
        else if (!strcmp(a, "--system")) { system_prompt = v; i++; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!cli_int(CMD, a, v, -1, 1L << 24, &n_predict)) return 1;
            i++;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_int(CMD, a, v, 1, 256, &threads)) return 1;
            i++;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!cli_int(CMD, a, v, 0, 1L << 24, &n_ctx)) return 1;
            i++;
        } else if (!strcmp(a, "--temp")) {
            if (!cli_double(CMD, a, v, 0.0, 100.0, &d)) return 1;
            sp.temp = (float)d;
            i++;
        } else if (!strcmp(a, "--top-k")) {
            if (!cli_int(CMD, a, v, 0, 1L << 24, &x)) return 1;
            sp.top_k = (int32_t)x;
            i++;
        } else if (!strcmp(a, "--top-p")) {
            if (!cli_double(CMD, a, v, 1e-6, 1.0, &d)) return 1;
            sp.top_p = (float)d;
            i++;
        } else if (!strcmp(a, "--min-p")) {
            if (!cli_double(CMD, a, v, 0.0, 1.0, &d)) return 1;
            sp.min_p = (float)d;
            i++;
        } else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
            if (!cli_int(CMD, a, v, 0, __LONG_MAX__, &x)) return 1;
            sp.seed = (uint64_t)x;
            i++;
        } else return cli_usage_error(CMD, "unknown option: %s", a);
    }
    if (prompt && prompt_file) return cli_usage_error(CMD, "give either -p or -f, not both");
    if (n_images && !mmproj_path) return cli_usage_error(CMD, "--image needs --mmproj (the vision tower)");

    int rc = 1;
    char *file_text = NULL;
    struct ekv_model *model = NULL;
    struct ekv_context *ctx = NULL;
    struct ekv_seq *seq = NULL;
    struct ekv_sampler *smp = NULL;
    int32_t *gen = NULL;
    float *logits = NULL;
    char *out_text = NULL, *chat = NULL, *user_text = NULL;
    struct ekv_prompt *pr = NULL;
    int32_t n_img = 0;
    struct ekv_vision *vision = NULL;
    cJSON *trace = NULL;
    enum ekv_status s;

    if (prompt_file) {
        file_text = cli_read_file(CMD, prompt_file, NULL);
        if (!file_text) goto done;
        prompt = file_text;
    }
    if (!prompt) prompt = "Once upon a time";
    if (!model_path) model_path = cli_default_model();

    struct ekv_model_params mp = ekv_model_default_params();
    mp.tokenizer_path = tok_path;
    if ((s = ekv_model_load(model_path, &mp, &model)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    struct ekv_model_info mi;
    ekv_model_get_info(model, &mi);
    struct ekv_context_params cp = ekv_context_default_params();
    if (threads > 0) cp.n_threads = (int32_t)threads;
    cp.n_ctx = (int32_t)n_ctx;
    if ((s = ekv_context_new(model, &cp, &ctx)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    if ((s = ekv_seq_new(ctx, &kvp, &seq)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    if ((s = ekv_sampler_new(&sp, &smp)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    int32_t ctx_size = n_ctx > 0 ? (int32_t)n_ctx : mi.n_ctx_train;

    /* chat template (images without markers go first, one marker each),
     * then the prompt object: text tokens around the image slots */
    if (!chat_tmpl) chat_tmpl = n_images ? "llava-1.5" : "none";
    if (n_images && !strstr(prompt, EKV_IMAGE_MARKER)) {
        size_t ml = strlen(EKV_IMAGE_MARKER "\n"), pl = strlen(prompt);
        user_text = malloc((size_t)n_images * ml + pl + 1);
        if (!user_text) { fprintf(stderr, "ekv run: out of memory\n"); goto done; }
        for (int i = 0; i < n_images; i++) memcpy(user_text + (size_t)i * ml, EKV_IMAGE_MARKER "\n", ml);
        memcpy(user_text + (size_t)n_images * ml, prompt, pl + 1);
    }
    const char *user = user_text ? user_text : prompt;
    size_t chat_len = 0;
    if ((s = ekv_chat_format(chat_tmpl, system_prompt, user, false, NULL, 0, &chat_len)) != EKV_OK) {
        cli_fail(CMD, s);
        goto done;
    }
    chat = malloc(chat_len + 1);
    if (!chat || (s = ekv_chat_format(chat_tmpl, system_prompt, user, false, chat, chat_len + 1, &chat_len)) != EKV_OK) {
        cli_fail(CMD, chat ? s : EKV_ERR_NOMEM);
        goto done;
    }
    if ((s = ekv_prompt_new(model, chat, chat_len, true, &pr)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    if (ekv_prompt_n_images(pr) != n_images) {
        cli_usage_error(CMD, "the prompt has %d %s marker(s) but %d --image flag(s) were given", ekv_prompt_n_images(pr),
                        EKV_IMAGE_MARKER, n_images);
        goto done;
    }
    double t_img = 0, t_start = cli_now(); /* time to first token counts image encoding */
    if (n_images) {
        double ti = cli_now();
        struct ekv_image_input imgs[EKV_RUN_MAX_IMAGES];
        for (int i = 0; i < n_images; i++) imgs[i] = (struct ekv_image_input){.path = image_paths[i]};
        if ((s = ekv_vision_load(mmproj_path, &vision)) != EKV_OK) { cli_fail(CMD, s); goto done; }
        if ((s = ekv_prompt_set_images(pr, vision, ctx, imgs, n_images)) != EKV_OK) { cli_fail(CMD, s); goto done; }
        t_img = cli_now() - ti;
        for (int i = 0; i < n_images; i++) {
            int32_t rows = 0;
            ekv_prompt_image_span(pr, i, NULL, &rows);
            n_img += rows;
            fprintf(stderr, "ekv run: image %s: %d image tokens\n", image_paths[i], rows);
        }
        fprintf(stderr, "ekv run: %d image(s) encoded in %.3f s\n", n_images, t_img);
    }
    if (ekv_prompt_n_tokens(pr) == 0 && n_img == 0) { cli_usage_error(CMD, "the prompt is empty"); goto done; }
    const int64_t n_prompt = ekv_prompt_n_positions(pr);
    if (n_prompt >= ctx_size) {
        fprintf(stderr, "ekv run: error: prompt of %lld positions does not fit the context of %d\n",
                (long long)n_prompt, ctx_size);
        goto done;
    }
    if (n_predict < 0 || n_prompt + n_predict > ctx_size) n_predict = ctx_size - (long)n_prompt;
    gen = malloc(((size_t)n_predict + 1) * sizeof *gen);
    logits = malloc((size_t)mi.n_vocab * sizeof *logits);
    if (!gen || !logits) { fprintf(stderr, "ekv run: out of memory\n"); goto done; }
    if (trace_path) {
        trace = cJSON_CreateObject();
        cJSON_AddStringToObject(trace, "model", model_path);
        cJSON_AddStringToObject(trace, "policy", kvp.policy ? kvp.policy : "full");
        cJSON_AddNumberToObject(trace, "budget", kvp.budget);
        cJSON_AddNumberToObject(trace, "prompt_tokens", (double)n_prompt);
        cJSON_AddNumberToObject(trace, "image_tokens", n_img);
        int64_t img0 = -1;
        if (n_images) ekv_prompt_image_span(pr, 0, &img0, NULL);
        cJSON_AddNumberToObject(trace, "image_start", (double)img0);
        cJSON *spans = cJSON_AddArrayToObject(trace, "images");
        for (int i = 0; i < n_images; i++) {
            int64_t p0 = 0;
            int32_t rows = 0;
            ekv_prompt_image_span(pr, i, &p0, &rows);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "start", (double)p0);
            cJSON_AddNumberToObject(o, "tokens", rows);
            cJSON_AddItemToArray(spans, o);
        }
        cJSON_AddArrayToObject(trace, "snapshots");
    }

    if (display_prompt && !json) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    double t0 = cli_now();
    if ((s = ekv_seq_eval_prompt(seq, pr, logits)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    double t1 = cli_now();
    if (trace) {
        cJSON_AddNumberToObject(trace, "window_start", (double)ekv_seq_kv_window_start(seq));
        cJSON_AddItemToArray(cJSON_GetObjectItem(trace, "snapshots"), kv_snapshot(seq, &mi, "prefill"));
    }
    long n_gen = 0;
    double t_first = 0;
    const char *stop = "length";
    size_t out_cap = 256, out_len = 0;
    out_text = malloc(out_cap);
    if (!out_text) goto done;
    while (n_gen < n_predict) {
        int32_t t = ekv_sampler_sample(smp, logits, mi.n_vocab);
        if (!ignore_eos && ekv_token_is_eog(model, t)) { stop = "eos"; break; }
        gen[n_gen++] = t;
        if (n_gen == 1) t_first = cli_now();
        char piece[256];
        size_t pn = 0;
        if (ekv_token_to_piece(model, t, false, piece, sizeof piece, &pn) != EKV_OK) pn = 0;
        if (out_len + pn + 1 > out_cap) {
            out_cap = (out_len + pn + 1) * 2;
            char *nb = realloc(out_text, out_cap);
            if (!nb) goto done;
            out_text = nb;
        }
        memcpy(out_text + out_len, piece, pn);
        out_len += pn;
        if (!json) {
            fwrite(piece, 1, pn, stdout);
            fflush(stdout);
        }
        if (n_gen == n_predict) break;
        if ((s = ekv_seq_decode(seq, t, logits)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    }
    double t2 = cli_now();
    out_text[out_len] = 0;
    if (!json) {
        printf("\n");
        fflush(stdout); /* before the report on stderr */
    }
    if (trace) {
        cJSON_AddItemToArray(cJSON_GetObjectItem(trace, "snapshots"), kv_snapshot(seq, &mi, "end"));
        if (!write_json_file(trace_path, trace)) {
            fprintf(stderr, "ekv run: error: cannot write --kv-trace file '%s'\n", trace_path);
            goto done;
        }
    }
    double pp_s = t1 - t0, tg_s = t2 - t1;
    /* decode time excludes the first token (it comes from the prefill logits) */
    long n_dec = n_gen > 1 ? n_gen - 1 : 0;
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(seq, &st);
    const char *pol = kvp.policy ? kvp.policy : "full";
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", model_path);
        cJSON_AddStringToObject(o, "prompt", prompt);
        cJSON_AddStringToObject(o, "text", out_text);
        cJSON *ga = cJSON_AddArrayToObject(o, "tokens");
        for (long i = 0; i < n_gen; i++) cJSON_AddItemToArray(ga, cJSON_CreateNumber(gen[i]));
        cJSON_AddStringToObject(o, "stop", stop);
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)n_prompt);
        cJSON_AddNumberToObject(o, "image_tokens", n_img);
        cJSON_AddNumberToObject(o, "image_encode_seconds", t_img);
        cJSON_AddNumberToObject(o, "generated_tokens", (double)n_gen);
        cJSON_AddNumberToObject(o, "prefill_seconds", pp_s);
        cJSON_AddNumberToObject(o, "prefill_tokens_per_second", pp_s > 0 ? n_prompt / pp_s : 0);
        cJSON_AddNumberToObject(o, "time_to_first_token_seconds", n_gen ? t_first - t_start : 0);
        cJSON_AddNumberToObject(o, "decode_seconds", tg_s);
        cJSON_AddNumberToObject(o, "decode_tokens_per_second", tg_s > 0 ? n_dec / tg_s : 0);
        cJSON *kvo = cJSON_AddObjectToObject(o, "kv");
        cJSON_AddStringToObject(kvo, "policy", pol);
        cJSON_AddNumberToObject(kvo, "budget", kvp.budget);
        cJSON_AddNumberToObject(kvo, "bytes", (double)st.bytes);
        cJSON_AddNumberToObject(kvo, "bytes_full", (double)st.bytes_full);
        cJSON_AddNumberToObject(kvo, "entries", (double)st.entries);
        cJSON_AddNumberToObject(kvo, "evicted", (double)st.evicted);
        cJSON_AddNumberToObject(kvo, "merged", (double)st.merged);
        cJSON *lens = cJSON_AddArrayToObject(kvo, "entries_per_layer");
        for (int32_t l = 0; l < mi.n_layer; l++) {
            int64_t sum = 0;
            for (int32_t h = 0; h < mi.n_head_kv; h++) sum += ekv_seq_kv_layer_len(seq, l, h);
            cJSON_AddItemToArray(lens, cJSON_CreateNumber((double)sum / mi.n_head_kv));
        }
        cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)cli_peak_rss());
        char *txt = cJSON_Print(o);
        if (txt) puts(txt);
        free(txt);
        cJSON_Delete(o);
    }
    print_kv_report(stderr, seq, &mi, pol, kvp.budget);
    fprintf(stderr,
            "ekv run: prompt %lld tokens in %.3f s (%.1f tok/s), generated %ld tokens in %.3f s (%.1f tok/s), "
            "first token after %.3f s, stop: %s, threads %d, peak RSS %.1f MiB\n",
            (long long)n_prompt, pp_s, pp_s > 0 ? n_prompt / pp_s : 0.0, n_gen, tg_s, tg_s > 0 ? n_dec / tg_s : 0.0, n_gen ? t_first - t_start : 0.0, stop,
            cp.n_threads, cli_peak_rss() / 1048576.0);
    rc = 0;
done:
    cJSON_Delete(trace);
    ekv_vision_free(vision);
    ekv_prompt_free(pr);
    free(user_text);
    free(chat);
    free(out_text);
    free(logits);
    free(gen);
    ekv_sampler_free(smp);
    ekv_seq_free(seq);
    ekv_context_free(ctx);
    ekv_model_free(model);
    free(file_text);
    return rc;
}

const struct ekv_cmd ekv_cmd_run = {"run", "generate text from a prompt with a chosen KV-cache policy", cmd_run_main};
