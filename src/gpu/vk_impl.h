/*
 * vk_impl.h — what the runtime's two files (vk_device.c: finding and
 * opening; vk_runtime.c: memory, pipelines, recording) share: the device
 * struct. Nothing outside src/gpu/vk_*.c includes it.
 */
#ifndef EKV_GPU_VK_IMPL_H
#define EKV_GPU_VK_IMPL_H

#include <volk.h>

#include "gpu/vk.h"

#define EKV_VK_PROF_MAX 4096

struct ekv_vk {
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    bool f64;                   /* shaderFloat64 enabled */
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkQueryPool timestamps;     /* 2 queries around each submission, or NULL */
    double ns_per_tick;
    /* EKV_VK_PROFILE=1: a timestamp after every dispatch, summed per pipeline */
    VkQueryPool prof_pool;
    uint32_t prof_n;                       /* dispatches timed in the open recording */
    uint8_t prof_pipe[EKV_VK_PROF_MAX];    /* pipeline of each */
    uint64_t prof_ns[EKV_VK_PIPE_COUNT];
    uint64_t prof_calls[EKV_VK_PIPE_COUNT];
    uint64_t last_ns;
    VkPipelineLayout layout;    /* no descriptor sets; 128 bytes of push constants */
    VkPipeline pipes[EKV_VK_PIPE_COUNT];
    VkShaderModule modules[EKV_VK_PIPE_COUNT];
    uint32_t mem_device;        /* memory type indices */
    uint32_t mem_host;
    VkDeviceSize max_alloc;     /* maxMemoryAllocationSize */
    int64_t fail_after;         /* tests: allocations that succeed before each one fails (-1: off) */
    struct ekv_vk_buf staging;  /* host-visible, for uploads and read-backs */
    bool recording;
    enum ekv_status record_status; /* first failure while recording */
    char record_error[256];
    uint64_t bytes, peak_bytes;
    uint64_t n_submits;         /* submissions so far */
    uint64_t n_validation;
    char validation_first[512];
    struct ekv_device_info info;
    char name[300];
};

/* vk_runtime.c: device, queue, pools, pipelines, staging (after pd is set). */
enum ekv_status ekv_vk_device_init(struct ekv_vk *vk);
/* vk_device.c: fills an ekv_device_info. */
void ekv_vk_describe(VkPhysicalDevice pd, int32_t index, struct ekv_device_info *d);

/* The embedded SPIR-V of pipeline p (build/gpu/ekv_vk_shaders.c). */
const uint32_t *ekv_vk_spirv(enum ekv_vk_pipe p, size_t *n_bytes, const char **name);

#endif
