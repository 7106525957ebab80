/*
 * vk_runtime.c — memory, pipelines and command recording on an opened
 * Vulkan device (vk.h).
 *
 * Buffers are addressed by device address (buffer_reference in GLSL), so
 * every pipeline shares one layout: no descriptor sets, 128 bytes of push
 * constants. A forward is one command buffer: dispatches separated by
 * compute-to-compute barriers, one submission, one fence wait. Uploads and
 * read-backs outside a forward go through a host-visible staging buffer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "gpu/vk_impl.h"

static void profile_collect(struct ekv_vk *vk);

#define EKV_VK_STAGING_BYTES ((size_t)16 << 20)
#define EKV_VK_PUSH_BYTES 128u

static enum ekv_status vkfail(VkResult r, const char *what) {
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        return ekv_err(EKV_ERR_NOMEM, "%s: out of %s memory", what,
                       r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host");
    if (r == VK_ERROR_DEVICE_LOST) return ekv_err(EKV_ERR_INTERNAL, "%s: the device was lost", what);
    return ekv_err(EKV_ERR_INTERNAL, "%s failed (VkResult %d)", what, (int)r);
}

static int32_t memory_type(VkPhysicalDevice pd, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) {
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
        if ((f & want) == want && !(f & avoid)) return (int32_t)i;
    }
    return -1;
}

static enum ekv_status create_layout(struct ekv_vk *vk) {
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = EKV_VK_PUSH_BYTES};
    VkPipelineLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                     .pushConstantRangeCount = 1, .pPushConstantRanges = &pr};
    VkResult r = vkCreatePipelineLayout(vk->dev, &li, NULL, &vk->layout);
    return r != VK_SUCCESS ? vkfail(r, "vkCreatePipelineLayout") : EKV_OK;
}

/* Pipelines are built on first use (a model needs few of the variants, and
 * building is slow on CPU-type devices). */
static enum ekv_status create_pipeline(struct ekv_vk *vk, int p) {
    size_t nb = 0;
    const char *name = "";
    const uint32_t *code = ekv_vk_spirv((enum ekv_vk_pipe)p, &nb, &name);
    if (!code || nb == 0) return ekv_err(EKV_ERR_INTERNAL, "shader %d is not embedded in this build", p);
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = nb, .pCode = code};
    VkResult r;
    if (!vk->modules[p] && (r = vkCreateShaderModule(vk->dev, &mi, NULL, &vk->modules[p])) != VK_SUCCESS)
        return ekv_err_prefix(vkfail(r, "vkCreateShaderModule"), "shader %s", name);
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = vk->modules[p], .pName = "main"},
        .layout = vk->layout};
    if ((r = vkCreateComputePipelines(vk->dev, VK_NULL_HANDLE, 1, &ci, NULL, &vk->pipes[p])) != VK_SUCCESS)
        return ekv_err_prefix(vkfail(r, "vkCreateComputePipelines"), "shader %s", name);
    return EKV_OK;
}

enum ekv_status ekv_vk_device_init(struct ekv_vk *vk) {
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, qf);
    int32_t fam = -1;
    for (uint32_t i = 0; i < nq && fam < 0; i++) /* prefer a compute queue without graphics */
        if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) fam = (int32_t)i;
    for (uint32_t i = 0; i < nq && fam < 0; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) fam = (int32_t)i;
    if (fam < 0) return ekv_err(EKV_ERR_UNSUPPORTED, "no compute queue");
    vk->queue_family = (uint32_t)fam;
    VkPhysicalDeviceVulkan12Features have12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 have = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &have12};
    vkGetPhysicalDeviceFeatures2(vk->pd, &have);
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .bufferDeviceAddress = VK_TRUE, .storageBuffer8BitAccess = VK_TRUE,
                                            .shaderInt8 = VK_TRUE, .shaderFloat16 = VK_TRUE,
                                            .hostQueryReset = have12.hostQueryReset};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12, .storageBuffer16BitAccess = VK_TRUE};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    f2.features.shaderInt64 = have.features.shaderInt64;
    f2.features.shaderInt16 = have.features.shaderInt16;
    f2.features.shaderFloat64 = have.features.shaderFloat64; /* the KV cache's quantisers (kvq_quant.glsl) */
    vk->f64 = have.features.shaderFloat64;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = vk->queue_family, .queueCount = 1, .pQueuePriorities = &prio};
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f2, .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi};
    VkResult r = vkCreateDevice(vk->pd, &di, NULL, &vk->dev);
    if (r != VK_SUCCESS) return vkfail(r, "vkCreateDevice");
    volkLoadDevice(vk->dev);
    vkGetDeviceQueue(vk->dev, vk->queue_family, 0, &vk->queue);
    int32_t md = memory_type(vk->pd, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    int32_t mh = memory_type(vk->pd, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                         VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0);
    if (mh < 0) mh = memory_type(vk->pd, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
    if (md < 0 || mh < 0) return ekv_err(EKV_ERR_UNSUPPORTED, "no device-local or host-visible memory type");
    vk->mem_device = (uint32_t)md;
    vk->mem_host = (uint32_t)mh;
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
    vkGetPhysicalDeviceProperties2(vk->pd, &p2);
    vk->max_alloc = m3.maxMemoryAllocationSize;
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                  .queueFamilyIndex = vk->queue_family};
    if ((r = vkCreateCommandPool(vk->dev, &pi, NULL, &vk->cmd_pool)) != VK_SUCCESS)
        return vkfail(r, "vkCreateCommandPool");
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = vk->cmd_pool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    if ((r = vkAllocateCommandBuffers(vk->dev, &ai, &vk->cmd)) != VK_SUCCESS)
        return vkfail(r, "vkAllocateCommandBuffers");
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = vkCreateFence(vk->dev, &fi, NULL, &vk->fence)) != VK_SUCCESS) return vkfail(r, "vkCreateFence");
    if (qf[vk->queue_family].timestampValidBits > 0 && p2.properties.limits.timestampPeriod > 0) {
        VkQueryPoolCreateInfo qpi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                     .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 2};
        if (vkCreateQueryPool(vk->dev, &qpi, NULL, &vk->timestamps) != VK_SUCCESS) vk->timestamps = VK_NULL_HANDLE;
        vk->ns_per_tick = p2.properties.limits.timestampPeriod;
        const char *e = getenv("EKV_VK_PROFILE");
        qpi.queryCount = EKV_VK_PROF_MAX + 1;
        if (vk->timestamps && e && *e && strcmp(e, "0") != 0 &&
            vkCreateQueryPool(vk->dev, &qpi, NULL, &vk->prof_pool) != VK_SUCCESS)
            vk->prof_pool = VK_NULL_HANDLE;
    }
    enum ekv_status s = create_layout(vk);
    if (s != EKV_OK) return s;
    return ekv_vk_buf_new(vk, EKV_VK_STAGING_BYTES, true, "staging buffer", &vk->staging);
}

void ekv_vk_close(struct ekv_vk *vk) {
    if (!vk) return;
    if (vk->dev) {
        vkDeviceWaitIdle(vk->dev);
        ekv_vk_buf_free(vk, &vk->staging);
        for (int p = 0; p < EKV_VK_PIPE_COUNT; p++) {
            if (vk->pipes[p]) vkDestroyPipeline(vk->dev, vk->pipes[p], NULL);
            if (vk->modules[p]) vkDestroyShaderModule(vk->dev, vk->modules[p], NULL);
        }
        if (vk->layout) vkDestroyPipelineLayout(vk->dev, vk->layout, NULL);
        if (vk->timestamps) vkDestroyQueryPool(vk->dev, vk->timestamps, NULL);
        if (vk->prof_pool) vkDestroyQueryPool(vk->dev, vk->prof_pool, NULL);
        if (vk->fence) vkDestroyFence(vk->dev, vk->fence, NULL);
        if (vk->cmd_pool) vkDestroyCommandPool(vk->dev, vk->cmd_pool, NULL);
        vkDestroyDevice(vk->dev, NULL);
    }
    if (vk->messenger) vkDestroyDebugUtilsMessengerEXT(vk->instance, vk->messenger, NULL);
    if (vk->instance) vkDestroyInstance(vk->instance, NULL);
    free(vk);
}

enum ekv_status ekv_vk_buf_new(struct ekv_vk *vk, size_t bytes, bool host_visible, const char *what,
                               struct ekv_vk_buf *b) {
    memset(b, 0, sizeof *b);
    size_t n = bytes ? bytes : 1;
    n = (n + 255) & ~(size_t)255;
    if (vk->max_alloc && n > vk->max_alloc)
        return ekv_err(EKV_ERR_NOMEM, "%s: %zu bytes exceed the device's largest allocation (%llu)", what, n,
                       (unsigned long long)vk->max_alloc);
    if (vk->fail_after == 0) return ekv_err(EKV_ERR_NOMEM, "%s: out of device memory (%zu bytes; injected)", what, n);
    if (vk->fail_after > 0) vk->fail_after--;
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = n,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkBuffer buf;
    VkResult r = vkCreateBuffer(vk->dev, &bi, NULL, &buf);
    if (r != VK_SUCCESS) return ekv_err_prefix(vkfail(r, "vkCreateBuffer"), "%s (%zu bytes)", what, n);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(vk->dev, buf, &req);
    uint32_t type = host_visible ? vk->mem_host : vk->mem_device;
    if (!(req.memoryTypeBits & (1u << type))) {
        vkDestroyBuffer(vk->dev, buf, NULL);
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: no suitable memory type", what);
    }
    VkMemoryAllocateFlagsInfo fl = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                    .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = &fl,
                               .allocationSize = req.size, .memoryTypeIndex = type};
    VkDeviceMemory mem;
    if ((r = vkAllocateMemory(vk->dev, &ai, NULL, &mem)) != VK_SUCCESS) {
        vkDestroyBuffer(vk->dev, buf, NULL);
        return ekv_err_prefix(vkfail(r, "vkAllocateMemory"), "%s (%zu bytes)", what, n);
    }
    if ((r = vkBindBufferMemory(vk->dev, buf, mem, 0)) != VK_SUCCESS) {
        vkFreeMemory(vk->dev, mem, NULL);
        vkDestroyBuffer(vk->dev, buf, NULL);
        return ekv_err_prefix(vkfail(r, "vkBindBufferMemory"), "%s", what);
    }
    void *host = NULL;
    if (host_visible && (r = vkMapMemory(vk->dev, mem, 0, VK_WHOLE_SIZE, 0, &host)) != VK_SUCCESS) {
        vkFreeMemory(vk->dev, mem, NULL);
        vkDestroyBuffer(vk->dev, buf, NULL);
        return ekv_err_prefix(vkfail(r, "vkMapMemory"), "%s", what);
    }
    VkBufferDeviceAddressInfo adi = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = buf};
    b->buffer = buf;
    b->memory = mem;
    b->addr = vkGetBufferDeviceAddress(vk->dev, &adi);
    b->bytes = bytes;
    b->host = host;
    if (!host_visible) {
        vk->bytes += req.size;
        if (vk->bytes > vk->peak_bytes) vk->peak_bytes = vk->bytes;
    }
    return EKV_OK;
}

void ekv_vk_fail_allocs_after(struct ekv_vk *vk, int64_t n) { vk->fail_after = n < 0 ? -1 : n; }

void ekv_vk_buf_free(struct ekv_vk *vk, struct ekv_vk_buf *b) {
    if (!vk || !b || !b->buffer) return;
    if (!b->host) {
        VkMemoryRequirements req;
        vkGetBufferMemoryRequirements(vk->dev, (VkBuffer)b->buffer, &req);
        vk->bytes -= EKV_MIN(vk->bytes, (uint64_t)req.size);
    }
    vkDestroyBuffer(vk->dev, (VkBuffer)b->buffer, NULL);
    vkFreeMemory(vk->dev, (VkDeviceMemory)b->memory, NULL);
    memset(b, 0, sizeof *b);
}

/* One copy command, submitted and waited for (staging transfers). */
static enum ekv_status copy_now(struct ekv_vk *vk, VkBuffer src, size_t so, VkBuffer dst, size_t d_off, size_t n) {
    enum ekv_status s = ekv_vk_begin(vk);
    if (s != EKV_OK) return s;
    VkBufferCopy c = {.srcOffset = so, .dstOffset = d_off, .size = n};
    vkCmdCopyBuffer(vk->cmd, src, dst, 1, &c);
    return ekv_vk_submit(vk);
}

enum ekv_status ekv_vk_upload(struct ekv_vk *vk, struct ekv_vk_buf *dst, size_t off, const void *src, size_t n) {
    if (off > dst->bytes || n > dst->bytes - off)
        return ekv_err(EKV_ERR_INTERNAL, "upload of %zu bytes at %zu into a buffer of %zu", n, off, dst->bytes);
    if (dst->host) {
        memcpy((char *)dst->host + off, src, n);
        return EKV_OK;
    }
    for (size_t done = 0; done < n;) {
        size_t k = EKV_MIN(n - done, EKV_VK_STAGING_BYTES);
        memcpy(vk->staging.host, (const char *)src + done, k);
        enum ekv_status s = copy_now(vk, vk->staging.buffer, 0, dst->buffer, off + done, k);
        if (s != EKV_OK) return s;
        done += k;
    }
    return EKV_OK;
}

enum ekv_status ekv_vk_download(struct ekv_vk *vk, const struct ekv_vk_buf *src, size_t off, void *dst, size_t n) {
    if (off > src->bytes || n > src->bytes - off)
        return ekv_err(EKV_ERR_INTERNAL, "download of %zu bytes at %zu from a buffer of %zu", n, off, src->bytes);
    if (src->host) {
        memcpy(dst, (const char *)src->host + off, n);
        return EKV_OK;
    }
    for (size_t done = 0; done < n;) {
        size_t k = EKV_MIN(n - done, EKV_VK_STAGING_BYTES);
        enum ekv_status s = copy_now(vk, src->buffer, off + done, vk->staging.buffer, 0, k);
        if (s != EKV_OK) return s;
        memcpy((char *)dst + done, vk->staging.host, k);
        done += k;
    }
    return EKV_OK;
}

enum ekv_status ekv_vk_begin(struct ekv_vk *vk) {
    if (vk->recording) return ekv_err(EKV_ERR_INTERNAL, "a recording is already open on %s", vk->name);
    VkResult r = vkResetCommandBuffer(vk->cmd, 0);
    if (r != VK_SUCCESS) return vkfail(r, "vkResetCommandBuffer");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    if ((r = vkBeginCommandBuffer(vk->cmd, &bi)) != VK_SUCCESS) return vkfail(r, "vkBeginCommandBuffer");
    if (vk->timestamps) {
        vkCmdResetQueryPool(vk->cmd, vk->timestamps, 0, 2);
        vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, vk->timestamps, 0);
    }
    vk->prof_n = 0;
    if (vk->prof_pool) {
        vkCmdResetQueryPool(vk->cmd, vk->prof_pool, 0, EKV_VK_PROF_MAX + 1);
        vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->prof_pool, 0);
    }
    vk->recording = true;
    vk->record_status = EKV_OK;
    vk->record_error[0] = '\0';
    return EKV_OK;
}

static void barrier(struct ekv_vk *vk) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(vk->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, NULL,
                         0, NULL);
}

/* The first failure of a recording, reported by ekv_vk_submit. */
static void record_fail_as(struct ekv_vk *vk, enum ekv_status s, const char *what) {
    if (vk->record_status != EKV_OK) return;
    vk->record_status = s;
    snprintf(vk->record_error, sizeof vk->record_error, "%s", what);
}

static void record_fail(struct ekv_vk *vk, const char *what) { record_fail_as(vk, EKV_ERR_INTERNAL, what); }

enum ekv_status ekv_vk_prepare(struct ekv_vk *vk, enum ekv_vk_pipe p) {
    if ((unsigned)p >= EKV_VK_PIPE_COUNT) return ekv_err(EKV_ERR_INTERNAL, "bad pipeline %d", (int)p);
    return vk->pipes[p] ? EKV_OK : create_pipeline(vk, (int)p);
}

static void dispatch(struct ekv_vk *vk, enum ekv_vk_pipe p, const void *push, uint32_t push_bytes, uint32_t gx,
                     uint32_t gy, uint32_t gz, bool with_barrier) {
    if (!vk->recording) return record_fail(vk, "dispatch outside a recording");
    if ((unsigned)p >= EKV_VK_PIPE_COUNT || push_bytes > EKV_VK_PUSH_BYTES)
        return record_fail(vk, "bad pipeline or push constants too large");
    if (gx == 0 || gy == 0 || gz == 0) return; /* nothing to do */
    if (gx > 65535 || gy > 65535 || gz > 65535) return record_fail(vk, "dispatch grid over 65535");
    if (ekv_vk_prepare(vk, p) != EKV_OK) return record_fail_as(vk, EKV_ERR_UNSUPPORTED, ekv_last_error());
    vkCmdBindPipeline(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, vk->pipes[p]);
    if (push_bytes) vkCmdPushConstants(vk->cmd, vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    vkCmdDispatch(vk->cmd, gx, gy, gz);
    if (with_barrier) barrier(vk);
    if (vk->prof_pool && vk->prof_n < EKV_VK_PROF_MAX) {
        vk->prof_pipe[vk->prof_n++] = (uint8_t)p;
        vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->prof_pool, vk->prof_n);
    }
}

void ekv_vk_dispatch(struct ekv_vk *vk, enum ekv_vk_pipe p, const void *push, uint32_t push_bytes, uint32_t gx,
                     uint32_t gy, uint32_t gz) {
    dispatch(vk, p, push, push_bytes, gx, gy, gz, true);
}

void ekv_vk_dispatch_nb(struct ekv_vk *vk, enum ekv_vk_pipe p, const void *push, uint32_t push_bytes, uint32_t gx,
                        uint32_t gy, uint32_t gz) {
    dispatch(vk, p, push, push_bytes, gx, gy, gz, false);
}

void ekv_vk_copy(struct ekv_vk *vk, const struct ekv_vk_buf *src, size_t src_off, struct ekv_vk_buf *dst,
                 size_t dst_off, size_t n) {
    if (!vk->recording) return record_fail(vk, "copy outside a recording");
    if (n == 0) return;
    if (src_off > src->bytes || n > src->bytes - src_off || dst_off > dst->bytes || n > dst->bytes - dst_off)
        return record_fail(vk, "copy out of a buffer's bounds");
    VkBufferCopy c = {.srcOffset = src_off, .dstOffset = dst_off, .size = n};
    vkCmdCopyBuffer(vk->cmd, (VkBuffer)src->buffer, (VkBuffer)dst->buffer, 1, &c);
    barrier(vk);
}

void ekv_vk_fill(struct ekv_vk *vk, struct ekv_vk_buf *dst, size_t off, size_t n, uint32_t value) {
    if (!vk->recording) return record_fail(vk, "fill outside a recording");
    if (n == 0) return;
    if (off % 4 || n % 4 || off > dst->bytes || n > dst->bytes - off) return record_fail(vk, "fill out of a buffer's bounds");
    vkCmdFillBuffer(vk->cmd, (VkBuffer)dst->buffer, off, n, value);
    barrier(vk);
}

enum ekv_status ekv_vk_submit(struct ekv_vk *vk) {
    if (!vk->recording) return ekv_err(EKV_ERR_INTERNAL, "submit without a recording");
    vk->recording = false;
    vk->n_submits++;
    if (vk->timestamps) vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->timestamps, 1);
    VkResult r = vkEndCommandBuffer(vk->cmd);
    if (r != VK_SUCCESS) return vkfail(r, "vkEndCommandBuffer");
    if (vk->record_status != EKV_OK) return ekv_err(vk->record_status, "recording on %s: %s", vk->name, vk->record_error);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &vk->cmd};
    if ((r = vkQueueSubmit(vk->queue, 1, &si, vk->fence)) != VK_SUCCESS) return vkfail(r, "vkQueueSubmit");
    r = vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX);
    vkResetFences(vk->dev, 1, &vk->fence);
    if (r != VK_SUCCESS) return vkfail(r, "vkWaitForFences");
    vk->last_ns = 0;
    if (vk->timestamps) {
        uint64_t t[2];
        if (vkGetQueryPoolResults(vk->dev, vk->timestamps, 0, 2, sizeof t, t, sizeof t[0],
                                  VK_QUERY_RESULT_64_BIT) == VK_SUCCESS && t[1] >= t[0])
            vk->last_ns = (uint64_t)((double)(t[1] - t[0]) * vk->ns_per_tick);
    }
    profile_collect(vk);
    return EKV_OK;
}

void ekv_vk_abort(struct ekv_vk *vk) {
    if (!vk || !vk->recording) return;
    vk->recording = false;
    vkEndCommandBuffer(vk->cmd);
}

/* Adds the timed dispatches of the last submission to the per-pipeline sums. */
static void profile_collect(struct ekv_vk *vk) {
    if (!vk->prof_pool || vk->prof_n == 0) return;
    uint64_t *t = malloc(sizeof *t * (vk->prof_n + 1));
    if (t && vkGetQueryPoolResults(vk->dev, vk->prof_pool, 0, vk->prof_n + 1, sizeof *t * (vk->prof_n + 1), t,
                                   sizeof *t, VK_QUERY_RESULT_64_BIT) == VK_SUCCESS)
        for (uint32_t i = 0; i < vk->prof_n; i++) {
            vk->prof_ns[vk->prof_pipe[i]] += t[i + 1] > t[i] ? (uint64_t)((double)(t[i + 1] - t[i]) * vk->ns_per_tick) : 0;
            vk->prof_calls[vk->prof_pipe[i]]++;
        }
    free(t);
    vk->prof_n = 0;
}

void ekv_vk_profile_reset(struct ekv_vk *vk) {
    if (!vk) return;
    memset(vk->prof_ns, 0, sizeof vk->prof_ns);
    memset(vk->prof_calls, 0, sizeof vk->prof_calls);
}

bool ekv_vk_profile(const struct ekv_vk *vk, uint64_t *ns, uint64_t *calls) {
    if (!vk || !vk->prof_pool) return false;
    memcpy(ns, vk->prof_ns, sizeof vk->prof_ns);
    memcpy(calls, vk->prof_calls, sizeof vk->prof_calls);
    return true;
}

const char *ekv_vk_pipe_name(enum ekv_vk_pipe p) {
    size_t n;
    const char *name = "?";
    ekv_vk_spirv(p, &n, &name);
    return name;
}

uint64_t ekv_vk_last_submit_ns(const struct ekv_vk *vk) { return vk->last_ns; }
