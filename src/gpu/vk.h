/*
 * vk.h — the Vulkan compute runtime under ekv's GPU backend: finding and
 * opening a device (the loader is reached at run time through volk, so a
 * binary without libvulkan still runs on the CPU), device buffers addressed
 * by their 64-bit device address (VK_KHR_buffer_device_address, core in
 * Vulkan 1.2: shaders take pointers in push constants, so no descriptor
 * sets exist and a tensor may exceed maxStorageBufferRange), uploads and
 * read-backs through one staging buffer, the compute pipelines built from
 * the SPIR-V embedded at build time, and one command buffer that records a
 * whole forward and is submitted once.
 *
 * Everything returns a status with a message naming what failed; nothing
 * prints. The runtime knows no models: src/gpu/backend_vk.c does.
 */
#ifndef EKV_GPU_VK_H
#define EKV_GPU_VK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ekv.h"

struct ekv_vk;       /* an opened device with its queue, pools and pipelines */

/* A device allocation: one VkBuffer bound to its own memory. */
struct ekv_vk_buf {
    void *buffer;      /* VkBuffer */
    void *memory;      /* VkDeviceMemory */
    uint64_t addr;     /* device address of byte 0 */
    size_t bytes;
    void *host;        /* mapped pointer for host-visible buffers, else NULL */
};

/* The compute shaders (src/gpu/shaders/NAME.comp), one pipeline each. */
enum ekv_vk_pipe {
    EKV_VK_RMSNORM = 0,
    /* matvec.comp, 72 variants: ekv_vk_matvec_pipe() */
    EKV_VK_MATVEC_FIRST,
    /* rope_store.comp per key x value row type (4 x 4): ekv_vk_rope_store_pipe() */
    EKV_VK_ROPE_STORE_FIRST = EKV_VK_MATVEC_FIRST + 72,
    /* attn.comp per key type x value type (6 x 6): ekv_vk_attn_pipe() */
    EKV_VK_ATTN_FIRST = EKV_VK_ROPE_STORE_FIRST + 16,
    /* kivi.comp: quantise keys (2, 4 bits), values (2, 4 bits), keep in the ring */
    EKV_VK_KIVI_KEYS2 = EKV_VK_ATTN_FIRST + 36,
    EKV_VK_KIVI_KEYS4,
    EKV_VK_KIVI_VALUES2,
    EKV_VK_KIVI_VALUES4,
    EKV_VK_KIVI_COPY,
    EKV_VK_ATTN_COMBINE,
    EKV_VK_GLU,
    /* attn_stats.comp per key storage type (f32, f16, q8_0, q4_0, kivi2, kivi4): ekv_vk_attn_stats_pipe() */
    EKV_VK_ATTN_STATS_FIRST,
    EKV_VK_KV_COMPACT = EKV_VK_ATTN_STATS_FIRST + 6,
    /* kv_merge.comp per row type: ekv_vk_kv_merge_pipe() */
    EKV_VK_KV_MERGE_FIRST,
    /* the vision tower (backend_vk_clip.c) */
    EKV_VK_LAYERNORM = EKV_VK_KV_MERGE_FIRST + 4,
    EKV_VK_CLIP_ATTN,
    EKV_VK_EW,
    /* kivi_pack.comp: a compressed cache's KIVI keys (2, 4 bits), values (2, 4 bits) */
    EKV_VK_KIVI_PACK_KEYS2,
    EKV_VK_KIVI_PACK_KEYS4,
    EKV_VK_KIVI_PACK_VALUES2,
    EKV_VK_KIVI_PACK_VALUES4,
    /* kv_merge.comp on a compressed KIVI side: keys (2, 4 bits), values (2, 4 bits) */
    EKV_VK_KV_MERGE_KIVI_K2,
    EKV_VK_KV_MERGE_KIVI_K4,
    EKV_VK_KV_MERGE_KIVI_V2,
    EKV_VK_KV_MERGE_KIVI_V4,
    EKV_VK_PIPE_COUNT
};

/* Weight types of matvec.comp, in pipeline order. */
enum ekv_vk_mv_type {
    EKV_VK_W_F32 = 0, EKV_VK_W_F16, EKV_VK_W_BF16, EKV_VK_W_Q8_0, EKV_VK_W_Q4_0, EKV_VK_W_Q4_K, EKV_VK_W_Q5_K,
    EKV_VK_W_Q6_K, EKV_VK_W_COUNT
};
/* Shapes of matvec.comp: decode (up to 8 activation rows per workgroup),
 * prompt (4 weight rows per group, 8 activation rows) and one (a single
 * activation row per workgroup: fewer registers); all add up in the same order, so
 * they give the same bits. */
enum ekv_vk_mv_shape { EKV_VK_MV_DECODE = 0, EKV_VK_MV_PROMPT, EKV_VK_MV_ONE };
/* The matvec pipeline of a weight type, lanes per invocation m (1, 2 or 4:
 * ekv_vk_matvec_m) and shape. The order of src/gpu/shaders.cmake: shape,
 * then m, then type. */
static inline enum ekv_vk_pipe ekv_vk_matvec_pipe(enum ekv_vk_mv_type t, uint32_t m, enum ekv_vk_mv_shape shape) {
    const int mi = m >= 4 ? 2 : m == 2 ? 1 : 0;
    return (enum ekv_vk_pipe)(EKV_VK_MATVEC_FIRST + ((int)shape * 3 + mi) * EKV_VK_W_COUNT + (int)t);
}

/* The shaders' index of a cache storage type: enum ekv_kv_type from
 * EKV_KV_F32 (0 f32, 1 f16, 2 q8_0, 3 q4_0, 4 kivi2, 5 kivi4; kvq.glsl). */
static inline int ekv_vk_kv_index(enum ekv_kv_type t) { return (int)t - (int)EKV_KV_F32; }
/* rope_store.comp for a key and a value storage type (KIVI sides are
 * written as f16 rows into the forward's scratch). */
static inline enum ekv_vk_pipe ekv_vk_rope_store_pipe(enum ekv_kv_type k, enum ekv_kv_type v) {
    const int i = ekv_vk_kv_index(k), j = ekv_vk_kv_index(v);
    return (enum ekv_vk_pipe)(EKV_VK_ROPE_STORE_FIRST + 4 * (i > 3 ? 1 : i) + (j > 3 ? 1 : j));
}
/* attn.comp for a key and a value storage type. */
static inline enum ekv_vk_pipe ekv_vk_attn_pipe(enum ekv_kv_type k, enum ekv_kv_type v) {
    return (enum ekv_vk_pipe)(EKV_VK_ATTN_FIRST + 6 * ekv_vk_kv_index(k) + ekv_vk_kv_index(v));
}
/* attn.comp's workgroups along x: per KV head, one per group of at most 8
 * of its query heads (the shader's GMAX). */
#define EKV_VK_ATTN_GMAX 8u
static inline uint32_t ekv_vk_attn_groups(uint32_t n_head, uint32_t n_head_kv) {
    const uint32_t g = n_head / n_head_kv;
    return n_head_kv * ((g + EKV_VK_ATTN_GMAX - 1) / EKV_VK_ATTN_GMAX);
}

/* attn_stats.comp for a key storage type. */
static inline enum ekv_vk_pipe ekv_vk_attn_stats_pipe(enum ekv_kv_type k) {
    return (enum ekv_vk_pipe)(EKV_VK_ATTN_STATS_FIRST + ekv_vk_kv_index(k));
}

/* kivi_pack.comp for a compressed KIVI side's type (is_v: values). */
static inline enum ekv_vk_pipe ekv_vk_kivi_pack_pipe(enum ekv_kv_type t, bool is_v) {
    return (enum ekv_vk_pipe)(EKV_VK_KIVI_PACK_KEYS2 + (is_v ? 2 : 0) + (t == EKV_KV_KIVI4 ? 1 : 0));
}

/* kv_merge.comp for a row type, or a compressed KIVI side (is_v: values). */
static inline enum ekv_vk_pipe ekv_vk_kv_merge_pipe(enum ekv_kv_type t, bool is_v) {
    if (t == EKV_KV_KIVI2 || t == EKV_KV_KIVI4)
        return (enum ekv_vk_pipe)(EKV_VK_KV_MERGE_KIVI_K2 + (is_v ? 2 : 0) + (t == EKV_KV_KIVI4 ? 1 : 0));
    return (enum ekv_vk_pipe)(EKV_VK_KV_MERGE_FIRST + ekv_vk_kv_index(t));
}

/* Lists the Vulkan devices (ekv_devices_list in ekv.h). */
enum ekv_status ekv_vk_list(struct ekv_device_info *out, int32_t cap, int32_t *n_out);

/* Opens a device: `spec` is "auto" (the first discrete or integrated GPU;
 * never a CPU-type device; *out = NULL and EKV_OK when there is none, so
 * the caller runs on the CPU), "vulkan" (the same, but a clear error when
 * there is none) or "vulkan:N" (device N of ekv_vk_list, any type, e.g.
 * lavapipe in tests). EKV_VK_VALIDATE=1 in the environment enables the
 * Khronos validation layer; every message it gives is counted
 * (ekv_vk_validation_errors). */
enum ekv_status ekv_vk_open(const char *spec, struct ekv_vk **out);
void ekv_vk_close(struct ekv_vk *vk);

/* "vulkan:0 (NVIDIA H200)" etc.; validation messages so far. */
const char *ekv_vk_name(const struct ekv_vk *vk);
uint64_t ekv_vk_validation_errors(const struct ekv_vk *vk);
/* The first validation message (for test output), "" when none. */
const char *ekv_vk_validation_first(const struct ekv_vk *vk);
/* Device-local bytes allocated now and at most. */
uint64_t ekv_vk_bytes(const struct ekv_vk *vk);
uint64_t ekv_vk_peak_bytes(const struct ekv_vk *vk);
/* Submissions so far (tests: what a forward costs in round trips). */
uint64_t ekv_vk_submits(const struct ekv_vk *vk);
/* The device's subgroup size (informative: shaders do not assume it). */
uint32_t ekv_vk_subgroup_size(const struct ekv_vk *vk);
/* matvec.comp's lanes per invocation: 32 / subgroup size for subgroups of
 * 8 and 16, 1 for 32 or more; 0 for smaller ones (no matvec variant). Its
 * workgroups hold 128 / (32 / M) weight-row groups. */
uint32_t ekv_vk_matvec_m(const struct ekv_vk *vk);
/* Whether shaders may use doubles (shaderFloat64): the quantising KV
 * cache types need them to round exactly as the CPU does. */
bool ekv_vk_has_f64(const struct ekv_vk *vk);
/* Builds a pipeline now (they are built on first use otherwise), so that a
 * failure shows where it can be reported. */
enum ekv_status ekv_vk_prepare(struct ekv_vk *vk, enum ekv_vk_pipe p);

/* Buffers. Device-local unless host_visible (then host-coherent and mapped
 * at ->host). bytes 0 is allowed (one byte is allocated). A failed
 * allocation leaves *b zeroed; freeing a zeroed buffer does nothing. */
enum ekv_status ekv_vk_buf_new(struct ekv_vk *vk, size_t bytes, bool host_visible, const char *what,
                               struct ekv_vk_buf *b);
void ekv_vk_buf_free(struct ekv_vk *vk, struct ekv_vk_buf *b);
/* Tests: the next n buffer allocations succeed, every later one fails with
 * EKV_ERR_NOMEM as out of device memory would (n < 0: off). */
void ekv_vk_fail_allocs_after(struct ekv_vk *vk, int64_t n);

/* Copies host bytes into / out of a device buffer at an offset, through
 * the staging buffer (waits for completion; not for the hot path). */
enum ekv_status ekv_vk_upload(struct ekv_vk *vk, struct ekv_vk_buf *dst, size_t off, const void *src, size_t n);
enum ekv_status ekv_vk_download(struct ekv_vk *vk, const struct ekv_vk_buf *src, size_t off, void *dst, size_t n);

/* Recording: begin a command buffer, add dispatches (push constants of at
 * most 128 bytes; each dispatch is followed by a compute-to-compute memory
 * barrier, so dispatches run in order), then submit and wait. One
 * recording at a time per device. */
enum ekv_status ekv_vk_begin(struct ekv_vk *vk);
void ekv_vk_dispatch(struct ekv_vk *vk, enum ekv_vk_pipe p, const void *push, uint32_t push_bytes, uint32_t gx,
                     uint32_t gy, uint32_t gz);
/* The same without the barrier after it: for a dispatch whose results the
 * next dispatch does not read (Q, K and V projections; gate and up), so the
 * device may run them together. */
void ekv_vk_dispatch_nb(struct ekv_vk *vk, enum ekv_vk_pipe p, const void *push, uint32_t push_bytes, uint32_t gx,
                        uint32_t gy, uint32_t gz);
/* Copies bytes between buffers inside the recording (followed by a barrier). */
void ekv_vk_copy(struct ekv_vk *vk, const struct ekv_vk_buf *src, size_t src_off, struct ekv_vk_buf *dst,
                 size_t dst_off, size_t n);
/* Fills n bytes (multiples of 4) with a 32-bit value inside the recording (followed by a barrier). */
void ekv_vk_fill(struct ekv_vk *vk, struct ekv_vk_buf *dst, size_t off, size_t n, uint32_t value);
/* Submits what was recorded and waits for it. Also returns an error when
 * a dispatch could not be recorded (bad pipeline, push too large). */
enum ekv_status ekv_vk_submit(struct ekv_vk *vk);

/* Closes an open recording without running it (after a failure). */
void ekv_vk_abort(struct ekv_vk *vk);

/* Per-pipeline device time summed over every submission since the device
 * was opened, when EKV_VK_PROFILE=1 was set then (a timestamp after each
 * dispatch; false otherwise). ns, calls: [EKV_VK_PIPE_COUNT]. */
bool ekv_vk_profile(const struct ekv_vk *vk, uint64_t *ns, uint64_t *calls);
/* Zeroes the sums ekv_vk_profile reports. */
void ekv_vk_profile_reset(struct ekv_vk *vk);
const char *ekv_vk_pipe_name(enum ekv_vk_pipe p);

/* Device-side timing of the last submission (ns), 0 when unknown. */
uint64_t ekv_vk_last_submit_ns(const struct ekv_vk *vk);

#endif
