/*
 * test_model_hostile.c — the bundled model file (models/stories260K.gguf)
 * cut short at every offset of its header, metadata and tensor infos, and
 * at a spread of offsets through its tensor data, through the two calls the
 * CLI makes on a model path: ekv_gguf_open (`ekv info`) and ekv_model_load
 * (`ekv run`, `serve`, `eval`, `bench`). Every cut before the end of the
 * last tensor's data must fail with EKV_ERR_FORMAT (or EKV_ERR_IO) and a
 * message naming the file; nothing may crash or leak (ASan/UBSan in CI).
 *
 * This is the in-process half of tests/cli_hostile.sh: one process for
 * thousands of cuts (a process per cut took ~10 minutes under ASan). The
 * script keeps one cut per distinct place in the file through the CLI
 * itself (exit status 1, message on stderr).
 *
 * The file is written once and shortened with ftruncate, longest cut first.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "model/gguf.h"
#include "testutil.h"

static char g_path[] = "/tmp/ekv_model_hostile_XXXXXX";

/* One cut: both calls must refuse the file with a message naming it. */
static int try_cut(size_t cut, size_t *n_checked) {
    int bad = 0;
    struct ekv_gguf_file *g = NULL;
    enum ekv_status s = ekv_gguf_open(g_path, &g);
    if (s == EKV_OK || !strstr(ekv_last_error(), g_path)) {
        fprintf(stderr, "cut at %zu: ekv_gguf_open: %s (%s)\n", cut, ekv_status_str(s), ekv_last_error());
        bad++;
    }
    ekv_gguf_close(g);
    struct ekv_model_params mp = ekv_model_default_params();
    struct ekv_model *m = NULL;
    s = ekv_model_load(g_path, &mp, &m);
    if ((s != EKV_ERR_FORMAT && s != EKV_ERR_IO) || m != NULL || ekv_last_error()[0] == '\0') {
        fprintf(stderr, "cut at %zu: ekv_model_load: %s (%s)\n", cut, ekv_status_str(s), ekv_last_error());
        bad++;
    }
    ekv_model_free(m);
    *n_checked += 1;
    return bad;
}

int main(void) {
    size_t n = 0;
    char *d = tu_read_file(tu_src("models/stories260K.gguf"), &n);
    CHECK(d != NULL && n > 4096);
    if (!d) return test_finish("test_model_hostile");

    /* where the tensor data starts: every cut before it is checked */
    struct ekv_gguf_file *g = NULL;
    CHECK_OK(ekv_gguf_open(tu_src("models/stories260K.gguf"), &g));
    size_t data_off = g ? ekv_gguf_data_offset(g) : 0;
    ekv_gguf_close(g);
    CHECK(data_off > 0 && data_off < n);

    int fd = mkstemp(g_path);
    CHECK(fd >= 0);
    if (fd < 0) { free(d); return test_finish("test_model_hostile"); }
    CHECK(write(fd, d, n) == (ssize_t)n);

    /* the whole file loads (the cuts below fail because of the cut) */
    struct ekv_model_params mp = ekv_model_default_params();
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(g_path, &mp, &m));
    ekv_model_free(m);

    /* cuts, longest first: the last bytes one by one, a spread through the
     * tensor data, then every offset from the data's start down to 0 */
    size_t checked = 0, wrong = 0, prev = n;
    for (size_t k = 1; k <= 64 && k <= n; k++) {
        size_t cut = n - k;
        CHECK(ftruncate(fd, (off_t)cut) == 0);
        wrong += (size_t)try_cut(cut, &checked);
        prev = cut;
    }
    for (size_t cut = prev - 1; cut > data_off; cut = cut > 4099 ? cut - 4099 : 0) {
        if (cut <= data_off) break;
        CHECK(ftruncate(fd, (off_t)cut) == 0);
        wrong += (size_t)try_cut(cut, &checked);
    }
    for (size_t cut = data_off + 1; cut-- > 0;) {
        CHECK(ftruncate(fd, (off_t)cut) == 0);
        wrong += (size_t)try_cut(cut, &checked);
    }
    CHECK_MSG(wrong == 0, "%zu of %zu cuts were not refused cleanly", wrong, checked);
    CHECK(checked > data_off);
    printf("test_model_hostile: %zu cuts (every offset below %zu, a spread above), %zu wrong\n",
           checked, data_off, wrong);
    close(fd);
    remove(g_path);
    free(d);
    return test_finish("test_model_hostile");
}
