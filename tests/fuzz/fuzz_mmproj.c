/*
 * fuzz_mmproj.c — libFuzzer target for the vision tower loader (issue 23):
 * arbitrary bytes as an mmproj GGUF through ekv_vision_load, as `ekv run
 * --mmproj` and `ekv serve --mmproj` load it (CLIP/SigLIP metadata, patch
 * and image sizes, projector type, LLaVA-1.6 grid pinpoints, tensor shapes
 * and types that parse but lie must be refused with an error, never read
 * past). A tower that loads and is small then encodes an image (a 3x2 PNG
 * and a JPEG of the committed image corpus: resize, pad, patches, the ViT
 * and the projector; LLaVA-1.6 and Idefics3 tiling through the prompt
 * object's encoder), so a shape the loader let through that the encoder
 * cannot take shows. The input goes to an anonymous in-memory file (memfd)
 * loaded by its /proc path. fuzz_replay.c replays the corpus in every build.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ekv.h"
#include "engine/engine.h"
#include "fuzz_memfd.h"

void ekv_fuzz_cleanup(void) {}

static void encode(const struct ekv_vision *v, const char *image) {
    struct ekv_image_input in = {.path = image};
    int32_t n = 0;
    if (ekv_vision_image_tokens(v, &in, &n) != EKV_OK) return;
    const int64_t cells = (int64_t)n * ekv_vision_n_embd(v);
    /* a large tower would take seconds per input; so would a Qwen2-VL tower at the photo's own
     * resolution (1,040 patches: its quadratic attention took 25 s under the fuzzer's
     * instrumentation), while every tiny seed's image needs at most 128 rows */
    if (n <= 0 || n > 128 || cells <= 0 || cells > (1 << 22)) return;
    float *out = NULL;
    int32_t rows = 0, tile_rows = 0;
    int gx = 0, gy = 0, gw = 0, gh = 0;
    if (ekv_vision_encode_input(v, NULL, &in, 0, &out, &rows, &gx, &gy, &tile_rows, &gw, &gh) == EKV_OK &&
        (int64_t)rows + ekv_idefics3_n_sep(gx, gy) + (gw > 0 ? 2 : 0) != n)
        __builtin_trap(); /* the count the prompt plans with must be what the encoder gives */
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    const int fd = fuzz_memfd("ekv-fuzz-mmproj", data, size, path);
    if (fd < 0) return 0;
    struct ekv_vision *v = NULL;
    if (ekv_vision_load(path, &v) == EKV_OK) {
        encode(v, EKV_SOURCE_DIR "/tests/fuzz/corpus/image/grey_3x2.png");
        if (size && (data[size - 1] & 1)) encode(v, EKV_SOURCE_DIR "/tests/fuzz/corpus/image/astronaut.jpg");
        ekv_vision_free(v);
    }
    close(fd);
    return 0;
}
