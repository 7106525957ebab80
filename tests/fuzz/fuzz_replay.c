/*
 * fuzz_replay.c — the driver that replays a libFuzzer target's corpus in
 * every build (gcc, the sanitizer build), so that inputs that once failed
 * stay fixed without clang: each file named on the command line, or in a
 * folder named there, goes through LLVMFuzzerTestOneInput once. Linked with
 * one target (tests/CMakeLists.txt); the target's ekv_fuzz_cleanup frees
 * what it keeps between inputs, so LeakSanitizer sees a clean exit, and
 * its ekv_fuzz_replay_one, when it has one, checks each input's outcome.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void ekv_fuzz_cleanup(void);
int ekv_fuzz_replay_one(const char *path, const uint8_t *data, size_t n);

/* One input through the target; a target may check the outcome by the
 * file's name (fuzz_request.c: ok_* taken, bad_* refused) with its own
 * definition. 1 on a problem. */
__attribute__((weak)) int ekv_fuzz_replay_one(const char *path, const uint8_t *data, size_t n) {
    (void)path;
    (void)LLVMFuzzerTestOneInput(data, n);
    return 0;
}

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        uint8_t *nb = cap < ((size_t)64 << 20) ? realloc(buf, cap * 2) : NULL;
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "fuzz replay: %s: out of memory or larger than 64 MiB\n", path);
        return 1;
    }
    /* an exact-size copy, as libFuzzer hands inputs over */
    uint8_t *in = malloc(n ? n : 1);
    int bad = in == NULL;
    if (in) {
        for (size_t i = 0; i < n; i++) in[i] = buf[i];
        bad = ekv_fuzz_replay_one(path, in, n);
    }
    free(in);
    free(buf);
    return bad;
}

int main(int argc, char **argv) {
    int fails = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            fails += replay_file(argv[i]);
            files++;
            continue;
        }
        struct dirent *de;
        char path[4096];
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
            fails += replay_file(path);
            files++;
        }
        closedir(d);
    }
    ekv_fuzz_cleanup();
    printf("%s: %d inputs replayed, %d unreadable or not as their names say\n", argv[0], files, fails);
    return fails || files == 0;
}
