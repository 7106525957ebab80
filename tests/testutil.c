/* testutil.c — see testutil.h. */
#include "testutil.h"

#include "ekv.h"

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
