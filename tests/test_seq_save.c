/*
 * test_seq_save.c — saved caches (ekv_seq_save / ekv_seq_load, issue 22):
 * a sequence saved and loaded goes on exactly as if never stopped, for
 * every policy and storage type: after a prompt and a few decode steps it
 * is saved, loaded, and both decode 64 more tokens (or read a second prompt
 * part first): logits, cache lengths, bytes and tokens seen equal bit for
 * bit. Files are refused with a clear error when corrupt (every byte of a
 * file flipped in turn fails a checksum), truncated (every length), of
 * another format version, of another model (another shape, or the same
 * shape with other weights), or with bytes after the end; no partial file
 * is left by a save. The loader's fuzz target is tests/fuzz/fuzz_kvfile.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "testutil.h"

enum { N_PROMPT = 48, N_PRE = 6, N_MORE = 10, N_STEPS = 64 };

static int32_t g_toks[N_PROMPT + N_PRE + N_MORE + N_STEPS];
static bool g_compat_ref; /* Elastic's reference mode (--kv-compat ref) for the next cases */

static struct ekv_kv_params params(const char *policy, double budget, enum ekv_kv_type tk, enum ekv_kv_type tv) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = policy;
    p.budget = budget;
    p.type_k = tk;
    p.type_v = tv;
    p.seed = 7;
    p.recompress = 8; /* SnapKV & co. re-select during the 64 steps */
    p.compat_ref = g_compat_ref;
    return p;
}


/* A reads the prompt and N_PRE steps, is saved (to memory, or a file with
 * its tokens when via_file) and loaded as B; both go on the same way. */
static void save_case(const struct ekv_model *m, struct ekv_context *c, const char *policy, double budget,
                      enum ekv_kv_type tk, enum ekv_kv_type tv, bool more, bool via_file) {
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    const size_t V = (size_t)mi.n_vocab;
    struct ekv_kv_params kp = params(policy, budget, tk, tv);
    struct ekv_seq *a = NULL, *b = NULL;
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    void *buf = NULL;
    size_t size = 0;
    int32_t *tok = NULL, nt = -1;
    CHECK_OK(ekv_seq_new(c, &kp, &a));
    if (!a || !la || !lb) goto done;
    CHECK_OK(ekv_seq_prefill(a, g_toks, N_PROMPT, NULL));
    for (int i = 0; i < N_PRE; i++) CHECK_OK(ekv_seq_decode(a, g_toks[N_PROMPT + i], NULL));
    if (via_file) {
        char path[96], tmp[104];
        snprintf(path, sizeof path, "/tmp/ekv-test-seq-save-%ld.ekvc", (long)getpid());
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        CHECK_OK(ekv_seq_save(a, g_toks, N_PROMPT + N_PRE, path));
        CHECK_MSG(access(tmp, F_OK) != 0, "%s left behind", tmp);
        CHECK_OK(ekv_seq_load(c, path, &b, &tok, &nt));
        CHECK(nt == N_PROMPT + N_PRE && tok && !memcmp(tok, g_toks, (size_t)nt * sizeof *tok));
        remove(path);
    } else {
        CHECK_OK(ekv_seq_save_mem(a, NULL, 0, &buf, &size));
        if (buf) CHECK_OK(ekv_seq_load_mem(c, buf, size, &b, &tok, &nt));
        CHECK(nt == 0 && tok == NULL);
    }
    if (!b) goto done;
    CHECK(tu_same_kv_shape(m, a, b));
    int bad = 0;
    const int32_t *next = g_toks + N_PROMPT + N_PRE;
    if (more) { /* a second prompt part after loading */
        CHECK_OK(ekv_seq_prefill(a, next, N_MORE, la));
        CHECK_OK(ekv_seq_prefill(b, next, N_MORE, lb));
        bad += memcmp(la, lb, V * sizeof *la) != 0;
    }
    for (int i = 0; i < N_STEPS; i++) {
        CHECK_OK(ekv_seq_decode(a, next[N_MORE + i], la));
        CHECK_OK(ekv_seq_decode(b, next[N_MORE + i], lb));
        bad += memcmp(la, lb, V * sizeof *la) != 0;
    }
    CHECK_MSG(tu_same_kv_shape(m, a, b), "%s %s/%s: cache shapes differ after decoding", policy, ekv_kv_type_name(tk),
              ekv_kv_type_name(tv));
    CHECK_MSG(bad == 0, "%s budget %.2f %s/%s: the loaded sequence's logits differ at %d steps", policy, budget,
              ekv_kv_type_name(tk), ekv_kv_type_name(tv), bad);
done:
    ekv_seq_free(a);
    ekv_seq_free(b);
    free(la), free(lb), free(buf), free(tok);
}

/* types: 0 = the float types (any head_dim), 1 = the quantised ones (head_dim 64) */
static void test_policies(const struct ekv_model *m, struct ekv_context *c, int types_set) {
    static const char *pols[] = {"full",   "random", "local",      "h2o",  "scissorhands", "tova",
                                 "roco",   "snapkv", "pyramidkv",  "vlcache", "elastic",   "elastic-v2",
                                 "elastic-v2:bias=1:key=rotate"};
    const enum ekv_kv_type types[2][3][2] = {
        {{EKV_KV_F32, EKV_KV_F32}, {EKV_KV_F16, EKV_KV_F32}, {EKV_KV_F16, EKV_KV_F16}},
        {{EKV_KV_Q8_0, EKV_KV_Q4_0}, {EKV_KV_KIVI4, EKV_KV_KIVI4}, {EKV_KV_KIVI2, EKV_KV_Q8_0}}};
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++)
        for (size_t ti = 0; ti < 3; ti++)
            save_case(m, c, pols[pi], pi == 0 ? 1.0 : 0.3, types[types_set][ti][0], types[types_set][ti][1], ti == 1,
                      ti == 2);
    if (types_set) return;
    g_compat_ref = true; /* its fixed points move with the compressed length */
    save_case(m, c, "elastic", 0.3, EKV_KV_F32, EKV_KV_F32, false, false);
    save_case(m, c, "elastic", 0.5, EKV_KV_F16, EKV_KV_F16, true, true);
    g_compat_ref = false;
}

/* A load that must fail with EKV_ERR_FORMAT and a message holding `what`. */
static int refused(struct ekv_context *c, const void *buf, size_t n, const char *what) {
    struct ekv_seq *s = (struct ekv_seq *)&n;
    int32_t *tok = (int32_t *)&n;
    const enum ekv_status st = ekv_seq_load_mem(c, buf, n, &s, &tok, NULL);
    const bool ok = st == EKV_ERR_FORMAT && s == NULL && tok == NULL && (!what || strstr(ekv_last_error(), what));
    if (!ok) fprintf(stderr, "  load of %zu bytes: status %d, '%s' (wanted '%s')\n", n, (int)st, ekv_last_error(),
                     what ? what : "");
    if (st == EKV_OK) ekv_seq_free(s);
    return ok ? 0 : 1;
}

static void test_refused(const struct ekv_model *m, const char *m_path, struct ekv_context *c, const char *other_path) {
    struct ekv_kv_params kp = params("h2o", 0.5, EKV_KV_F16, EKV_KV_F16);
    struct ekv_seq *s = NULL;
    void *buf = NULL;
    size_t n = 0;
    CHECK_OK(ekv_seq_new(c, &kp, &s));
    if (!s) return;
    CHECK_OK(ekv_seq_prefill(s, g_toks, 20, NULL));
    CHECK_OK(ekv_seq_save_mem(s, g_toks, 20, &buf, &n));
    if (!buf) goto out;
    uint8_t *b = buf, *cp = malloc(n + 8);
    if (!cp) goto out;
    /* every byte flipped: a checksum (or the magic, version, shape) refuses it */
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(cp, b, n);
        cp[i] ^= 0x20;
        bad += refused(c, cp, n, NULL);
    }
    CHECK_MSG(bad == 0, "%d of %zu one-byte corruptions were not refused", bad, n);
    /* every truncation */
    bad = 0;
    for (size_t len = 0; len < n; len++) bad += refused(c, b, len, NULL);
    CHECK_MSG(bad == 0, "%d of %zu truncations were not refused", bad, n);
    memcpy(cp, b, n);
    cp[n] = 0;
    CHECK(refused(c, cp, n + 1, "after the last section") == 0);
    memcpy(cp, b, n);
    cp[8] = 2; /* version 2 */
    CHECK(refused(c, cp, n, "format version 2; this ekv reads version 1") == 0);
    memcpy(cp, b, n);
    cp[n / 2] ^= 1;
    CHECK(refused(c, cp, n, "checksum mismatch") == 0);
    CHECK(refused(c, "GGUF\3\0\0\0", 8, "not a saved ekv cache") == 0);
    /* another model: same shape, other weights (mkmodel --seed 2) */
    struct ekv_model *om = NULL;
    CHECK_OK(ekv_model_load(other_path, NULL, &om));
    CHECK(om && ekv_model_fingerprint(om) != ekv_model_fingerprint(m) && ekv_model_fingerprint(m) != 0);
    struct ekv_context *oc = NULL;
    struct ekv_context_params cpar = ekv_context_default_params();
    cpar.device = "cpu";
    if (om) CHECK_OK(ekv_context_new(om, &cpar, &oc));
    if (oc) CHECK(refused(oc, b, n, "saved for another model") == 0);
    ekv_context_free(oc);
    ekv_model_free(om);
    /* the same model loaded again is the same model */
    struct ekv_model *m2 = NULL;
    CHECK_OK(ekv_model_load(m_path, NULL, &m2));
    CHECK(m2 && ekv_model_fingerprint(m2) == ekv_model_fingerprint(m));
    ekv_model_free(m2);
    /* a save cannot leave a partial file; an unwritable place is an I/O error */
    CHECK(ekv_seq_save(s, NULL, 0, "/nonexistent-dir/x.ekvc") == EKV_ERR_IO &&
          strstr(ekv_last_error(), "/nonexistent-dir/x.ekvc.tmp"));
    CHECK(ekv_seq_save(s, g_toks, 21, "/tmp/x") == EKV_ERR_INVALID_ARG); /* more tokens than positions */
    struct ekv_seq *none = (struct ekv_seq *)&n;
    CHECK(ekv_seq_load(c, "/nonexistent-dir/x.ekvc", &none, NULL, NULL) == EKV_ERR_IO && none == NULL);
    free(cp);
out:
    ekv_seq_free(s);
    free(buf);
}

static void on_model(const char *path, int types_set, const char *other) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m) return;
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    for (size_t i = 0; i < sizeof g_toks / sizeof g_toks[0]; i++) g_toks[i] = 1 + ((int)i * 37 + 11) % (mi.n_vocab - 1);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_ctx = 256;
    cp.device = "cpu";
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    if (c) test_policies(m, c, types_set);
    if (c && other) test_refused(m, path, c, other);
    ekv_context_free(c);
    ekv_model_free(m);
}

int main(void) {
    char path[96], other[96], cmd[600];
    snprintf(path, sizeof path, "/tmp/ekv-test-seq-save-%ld.gguf", (long)getpid());
    snprintf(other, sizeof other, "/tmp/ekv-test-seq-save-%ld-b.gguf", (long)getpid());
    snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset tiny-llama3 --type f32 -o '%s' > /dev/null 2>&1 && "
             "'%s/ekv' mkmodel --preset tiny-llama3 --type f32 --seed 2 -o '%s' > /dev/null 2>&1", tu_bin(), path,
             tu_bin(), other);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    on_model(tu_src("models/stories260K.gguf"), 0, NULL);
    on_model(path, 1, other);
    remove(path);
    remove(other);
    return test_finish("test_seq_save");
}
