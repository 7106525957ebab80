/* testutil.c — see testutil.h. */
#include "testutil.h"

#include "ekv.h"
#include "kv/kv.h"

#include <stdlib.h>

int tu_pass, tu_fail;

static const char *join(const char *dir, const char *rel) {
    static char bufs[8][4096];
    static int slot;
    char *b = bufs[slot++ & 7];
    snprintf(b, 4096, "%s/%s", dir, rel);
    return b;
}

/* $EKV_TEST_SOURCE_DIR / $EKV_TEST_BINARY_DIR, when set, stand for the
 * checkout and the build folder (a test binary run on another machine,
 * e.g. bench/gpu/ab.sh on the GPU machine) */
static const char *dir_or(const char *env, const char *dflt) {
    const char *e = getenv(env);
    return e && *e ? e : dflt;
}
const char *tu_src(const char *rel) { return join(dir_or("EKV_TEST_SOURCE_DIR", EKV_SOURCE_DIR), rel); }
const char *tu_bin(void) { return dir_or("EKV_TEST_BINARY_DIR", EKV_BINARY_DIR); }

int tu_mkmodel(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel %s > /dev/null", tu_bin(), args);
    return system(cmd);
}
const char *tu_shared(const char *rel) { return join(EKV_SHARED_DIR, rel); }

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; if (len) *len = (size_t)n; }
    return buf;
}

int test_finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}

bool tu_same_kv_shape(const struct ekv_model *m, const struct ekv_seq *a, const struct ekv_seq *b) {
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    for (int32_t il = 0; il < mi.n_layer; il++)
        for (int32_t hk = 0; hk < mi.n_head_kv; hk++)
            if (ekv_seq_kv_layer_len(a, il, hk) != ekv_seq_kv_layer_len(b, il, hk)) return false;
    struct ekv_kv_stats sa, sb;
    ekv_seq_kv_stats(a, &sa);
    ekv_seq_kv_stats(b, &sb);
    return sa.bytes == sb.bytes && sa.entries == sb.entries && sa.evicted == sb.evicted && sa.merged == sb.merged &&
           ekv_seq_n_seen(a) == ekv_seq_n_seen(b);
}

enum ekv_status tu_run_forced(struct ekv_context *ctx, int32_t n_vocab, const struct ekv_kv_params *kv,
                              const int32_t *toks, int n_prompt, int n_gen, float *lg, tu_step_fn step, void *ud) {
    struct ekv_seq *seq = NULL;
    const size_t V = (size_t)n_vocab;
    float *tmp = malloc(V * sizeof *tmp);
    enum ekv_status s = tmp ? ekv_seq_new(ctx, kv, &seq) : EKV_ERR_NOMEM;
    if (s == EKV_OK) s = ekv_seq_prefill(seq, toks, n_prompt, lg ? lg : tmp);
    if (s == EKV_OK && step) step(seq, 0, ud);
    for (int t = 1; s == EKV_OK && t <= n_gen; t++) {
        s = ekv_seq_decode(seq, toks[n_prompt + t - 1], lg ? lg + (size_t)t * V : tmp);
        if (s == EKV_OK && step) step(seq, t, ud);
    }
    ekv_seq_free(seq);
    free(tmp);
    return s;
}

enum ekv_status tu_kv_prompt(struct ekv_kv *kv, int T, const float *q, const float *k, const float *v, float *out) {
    struct ekv_kv_step step = {.is_prompt = true, .last_chunk = true, .pos0 = 0, .n_new = T, .prompt_pos0 = 0,
                               .prompt_len = T};
    enum ekv_status st = ekv_kv_begin(kv, &step);
    if (st == EKV_OK) st = ekv_kv_layer_forward(kv, NULL, 0, &step, q, k, v, out);
    if (st == EKV_OK) st = ekv_kv_end(kv, &step);
    return st;
}

bool tu_load_stories(struct ekv_model **m, struct ekv_context **ctx, int32_t **toks, size_t *n_toks) {
    *m = NULL, *ctx = NULL, *toks = NULL, *n_toks = 0;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, m));
    if (!*m) return false;
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    CHECK_OK(ekv_context_new(*m, &cp, ctx));
    size_t len = 0;
    char *text = tu_read_file(tu_src("data/tinystories_eval.jsonl"), &len);
    *toks = text ? malloc((len + 64) * sizeof **toks) : NULL;
    bool ok = *ctx && *toks;
    if (ok) CHECK_OK(ekv_tokenize(*m, text, len, true, false, *toks, len + 64, n_toks));
    free(text);
    return ok;
}
