/*
 * gputest.h — what the GPU tests (test_gpu.c, test_gpu_policy.c) share:
 * the device under test, a context on a device, and the validation-layer
 * check (any message fails the test).
 */
#ifndef EKV_GPUTEST_H
#define EKV_GPUTEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "testutil.h"

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

#endif
