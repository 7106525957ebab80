/*
 * stb_decode.c — the only translation unit that instantiates stb_image
 * (Debian's header, 2.27; JPEG and PNG, from memory), behind four calls
 * (stb_decode.h). image.c checks every file before it gets here and
 * refuses what this version mishandles.
 *
 * One defect of 2.27 cannot be refused beforehand: a JPEG whose
 * entropy-coded data ends before its Huffman codes do (a truncated or
 * corrupt scan) drives the decoder's bit count below zero, and the next
 * refill shifts a zero byte by 32 or more (stb_image.h:2065, found by
 * fuzz_image, tests/fuzz/corpus/image/crash_jpeg_bits_run_out; stb_image
 * 2.28 stops reading at that point instead). The shifted value is always
 * zero (the decoder has met a marker and feeds zeros from then on), so the
 * image decodes to the same pixels whatever the shift gives, but the shift
 * itself is undefined behaviour that UBSan reports. CMakeLists.txt builds
 * this file, and only this file, with -fno-sanitize=shift-exponent (clang;
 * GCC 12 ignores that one under -fsanitize=undefined and gets
 * -fno-sanitize=shift); every other check of the sanitizer builds stays on
 * here, and ekv's own code keeps them all.
 */
#include "vision/stb_decode.h"

#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmisleading-indentation"
#pragma GCC diagnostic ignored "-Wtype-limits"
#include "stb_image.h"
#pragma GCC diagnostic pop
/* STB_IMAGE_STATIC keeps stbi_* out of the library's global names (so libekv links
 * beside ggml's copy); GCC reports the static prototypes it never defines at the end
 * of the file, after the pop above. */
#pragma GCC diagnostic ignored "-Wunused-function"

int ekv_stb_info(const unsigned char *data, int n, int *w, int *h, int *comp) {
    return stbi_info_from_memory(data, n, w, h, comp);
}

unsigned char *ekv_stb_load(const unsigned char *data, int n, int *w, int *h, int *comp, int want) {
    return stbi_load_from_memory(data, n, w, h, comp, want);
}

void ekv_stb_free(unsigned char *px) { stbi_image_free(px); }

const char *ekv_stb_failure(void) { return stbi_failure_reason(); }
