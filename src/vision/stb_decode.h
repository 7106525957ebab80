/*
 * stb_decode.h — the calls of stb_image (Debian's header) that image.c
 * makes, through the one translation unit that instantiates it
 * (stb_decode.c), so that the sanitizer exception its upstream defect
 * needs (stb_decode.c's opening comment) covers stb's code and nothing of
 * ekv's.
 */
#ifndef EKV_VISION_STB_DECODE_H
#define EKV_VISION_STB_DECODE_H

/* stbi_info_from_memory: 1 with the header's size and channels, else 0. */
int ekv_stb_info(const unsigned char *data, int n, int *w, int *h, int *comp);
/* stbi_load_from_memory: pixels (ekv_stb_free) or NULL. */
unsigned char *ekv_stb_load(const unsigned char *data, int n, int *w, int *h, int *comp, int want);
void ekv_stb_free(unsigned char *px);
/* stbi_failure_reason: a static string or NULL. */
const char *ekv_stb_failure(void);

#endif
