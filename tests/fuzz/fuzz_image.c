/*
 * fuzz_image.c — libFuzzer target for image decoding and LLaVA's
 * preprocessing (src/vision/image.c over stb_image): arbitrary bytes as an
 * encoded image, as `ekv run --image` and the server's data: URIs hand them
 * over (ekv_image_probe_memory for the header, ekv_image_load_memory), then
 * pad to square, bicubic resize and normalise at a small size. Beyond "no
 * crash": the decoded size is the size the header claimed, within the
 * loader's limits. fuzz_replay.c replays the corpus in every build
 * (README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vision/image.h"

#define CHECK(c)                                                                                                   \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

void ekv_fuzz_cleanup(void) {}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1); /* exact size: a read past the end hits the redzone */
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    int px = 0, py = 0;
    const enum ekv_status sp = ekv_image_probe_memory(copy, size, "fuzz", &px, &py);
    struct ekv_image img = {0};
    if (ekv_image_load_memory(copy, size, "fuzz", &img) == EKV_OK) {
        CHECK(sp == EKV_OK && img.nx == px && img.ny == py);
        CHECK(img.nx >= 1 && img.ny >= 1 && img.nx <= EKV_IMAGE_MAX_SIDE && img.ny <= EKV_IMAGE_MAX_SIDE);
        CHECK((uint64_t)img.nx * (uint64_t)img.ny <= EKV_IMAGE_MAX_PIXELS);
        /* the pipeline at 24 x 24, for images of up to 64K pixels (any aspect
         * ratio the loader takes): the resampler's cost grows with the pixels
         * and its arithmetic does not depend on them (test_vision runs it on
         * real photos); 1M pixels made it a quarter of the target's time */
        if ((uint64_t)img.nx * (uint64_t)img.ny <= (1u << 16)) {
            static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
            static const float sd[3] = {0.26862954f, 0.26130258f, 0.27577711f};
            float out[3 * 24 * 24];
            CHECK(ekv_image_preprocess_llava(&img, 24, mean, sd, out) == EKV_OK);
        }
        ekv_image_free(&img);
    }
    free(copy);
    return 0;
}
