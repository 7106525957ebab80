/*
 * gputest.h — what the GPU tests (test_gpu.c, test_gpu_kv.c,
 * test_gpu_policy.c) share: the device under test, a context on a device,
 * the validation-layer check (any message fails the test), random values,
 * the greedy token and a prompt's logits on two devices.
 */
#ifndef EKV_GPUTEST_H
#define EKV_GPUTEST_H

#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ekv_eval.h"
#include "engine/engine.h"
#include "gpu/vk.h"
#include "testutil.h"

/* Uniform in [-1, 1) (xorshift; each test file has its own sequence). */
static uint64_t gt_xs = 88172645463325252ull;
static inline float gt_frand(void) {
    gt_xs ^= gt_xs << 13, gt_xs ^= gt_xs >> 7, gt_xs ^= gt_xs << 17;
    return (float)((gt_xs >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* The greedy token (the project's own argmax, src/eval/metrics.c); -1 on NaN logits. */
static inline int32_t gt_argmax(const float *x, int32_t n) {
    size_t i = 0;
    return ekv_argmax(x, (size_t)n, &i) == EKV_OK ? (int32_t)i : -1;
}

/* Both sequences read the same N-token prompt with every row's logits
 * (lg from sg, lc from sc, [N][V] each); the largest |lg - lc| over them,
 * and *maxv the largest |lc|. */
static inline double gt_prompt_diff(struct ekv_seq *sg, struct ekv_seq *sc, const int32_t *toks, int32_t N, int32_t V,
                                    float *lg, float *lc, double *maxv) {
    struct ekv_segment seg = {.tokens = toks, .n = N, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &seg, .n_segs = 1, .is_prompt = true, .logits_all = true};
    CHECK_OK(ekv_seq_eval(sg, &in, lg));
    CHECK_OK(ekv_seq_eval(sc, &in, lc));
    double maxd = 0.0;
    *maxv = 0.0;
    for (size_t i = 0; i < (size_t)V * N; i++) maxd = fmax(maxd, fabs(lg[i] - lc[i])), *maxv = fmax(*maxv, fabs(lc[i]));
    return maxd;
}

/* The device under test into dev: $EKV_TEST_DEVICE, else the first usable
 * Vulkan device (printed). */
static inline bool gt_pick_device(char *dev, size_t cap) {
    const char *e = getenv("EKV_TEST_DEVICE");
    if (e && *e) {
        snprintf(dev, cap, "%s", e);
        return true;
    }
    struct ekv_device_info d[8];
    int32_t n = 0;
    if (ekv_devices_list(d, 8, &n) != EKV_OK) return false;
    for (int32_t i = 0; i < n && i < 8; i++)
        if (d[i].usable) {
            snprintf(dev, cap, "vulkan:%d", (int)d[i].index);
            printf("device under test: %s = %s (%s)\n", dev, d[i].name, d[i].type);
            return true;
        }
    return false;
}

/* A context of n_ctx positions on dev (checked). */
static inline struct ekv_context *gt_ctx_on(const struct ekv_model *m, const char *dev, int32_t n_ctx) {
    struct ekv_context_params cp = ekv_context_default_params();
    cp.device = dev;
    cp.n_ctx = n_ctx;
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    return c;
}

/* No validation-layer message so far on c's device. */
static inline void gt_check_validation(struct ekv_context *c) {
    const char *first = "";
    uint64_t n = c ? ekv_vk_ctx_validation(c->gpu, &first) : 0;
    CHECK_MSG(n == 0, "%llu validation messages, first: %s", (unsigned long long)n, first);
}

/* EKV_GPU_TEST_ONLY=name[,name...] runs only those parts of a GPU test. */
static inline bool gt_only(const char *name) {
    const char *e = getenv("EKV_GPU_TEST_ONLY");
    return !e || !*e || strstr(e, name) != NULL;
}

/* A GPU test's start: the validation layer on, lavapipe kept loaded until
 * exit (so that LeakSanitizer names its frames and tests/lsan_gpu.supp can
 * suppress the driver's own blocks; the handle is left open on purpose),
 * the device under test into dev and opened once. False (and one failure
 * counted) when there is none or it cannot be opened. */
static inline bool gt_start(const char *test, char *dev, size_t cap) {
    setenv("EKV_VK_VALIDATE", "1", 0);
    (void)dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_GLOBAL);
    if (!gt_pick_device(dev, cap)) {
        fprintf(stderr, "%s: no usable Vulkan device (scripts/setup.sh --test installs lavapipe, "
                        "mesa-vulkan-drivers): %s\n", test, ekv_last_error());
        tu_fail++;
        return false;
    }
    struct ekv_vk *probe = NULL; /* no validation layer, a failing driver: one clear failure, not a cascade */
    if (ekv_vk_open(dev, &probe) != EKV_OK || !probe) {
        fprintf(stderr, "%s: device %s cannot be opened: %s\n", test, dev, ekv_last_error());
        tu_fail++;
        return false;
    }
    ekv_vk_close(probe);
    return true;
}

#endif
