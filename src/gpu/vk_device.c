/*
 * vk_device.c — finding, describing and opening Vulkan devices (vk.h).
 *
 * The loader is opened at run time (volk), once per process; a machine
 * without it lists no device and `auto` falls back to the CPU. `auto`
 * never takes a CPU-type device (lavapipe): those are for tests, by index.
 * A device is usable when it has what every shader needs: Vulkan 1.2,
 * buffer device addresses, 16-bit storage and subgroup arithmetic; the
 * rest (fp16 arithmetic, int8, cooperative matrices) is reported.
 *
 * With EKV_VK_VALIDATE=1 the Khronos validation layer is enabled and each
 * warning or error it reports is counted, so tests fail on any of them.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "gpu/vk_impl.h"

static pthread_once_t ekv_vk_once = PTHREAD_ONCE_INIT;
static VkResult ekv_vk_init_result = VK_ERROR_INITIALIZATION_FAILED;

static void ekv_vk_load(void) { ekv_vk_init_result = volkInitialize(); }

static enum ekv_status loader_ready(void) {
    pthread_once(&ekv_vk_once, ekv_vk_load);
    if (ekv_vk_init_result != VK_SUCCESS)
        return ekv_err(EKV_ERR_UNSUPPORTED, "no Vulkan loader (libvulkan.so.1) could be opened");
    return EKV_OK;
}

static VKAPI_ATTR VkBool32 VKAPI_CALL on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                                   VkDebugUtilsMessageTypeFlagsEXT type,
                                                   const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)type;
    struct ekv_vk *vk = user;
    if (!(sev & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)))
        return VK_FALSE;
    if (vk) {
        if (vk->n_validation++ == 0 && data && data->pMessage)
            snprintf(vk->validation_first, sizeof vk->validation_first, "%s", data->pMessage);
    }
    return VK_FALSE;
}

static bool want_validation(void) {
    const char *e = getenv("EKV_VK_VALIDATE");
    return e && *e && strcmp(e, "0") != 0;
}

static bool has_layer(const char *name) {
    uint32_t n = 0;
    if (vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) return false;
    VkLayerProperties *ls = calloc(n, sizeof *ls);
    bool found = false;
    if (ls && vkEnumerateInstanceLayerProperties(&n, ls) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(ls[i].layerName, name) == 0;
    free(ls);
    return found;
}

/* An instance (with the validation layer and a messenger reporting to vk
 * when asked and vk is not NULL). */
static enum ekv_status instance_new(struct ekv_vk *vk, VkInstance *out, VkDebugUtilsMessengerEXT *msgr) {
    enum ekv_status s = loader_ready();
    if (s != EKV_OK) return s;
    uint32_t ver = 0;
    if (!vkEnumerateInstanceVersion || vkEnumerateInstanceVersion(&ver) != VK_SUCCESS ||
        ver < VK_API_VERSION_1_2)
        return ekv_err(EKV_ERR_UNSUPPORTED, "the Vulkan loader is older than 1.2");
    const char *layer = "VK_LAYER_KHRONOS_validation";
    const char *ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    bool validate = vk && want_validation();
    if (validate && !has_layer(layer))
        return ekv_err(EKV_ERR_UNSUPPORTED, "EKV_VK_VALIDATE is set but %s is not installed", layer);
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "ekv",
                             .pEngineName = "ekv", .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    if (validate) {
        ci.enabledLayerCount = 1;
        ci.ppEnabledLayerNames = &layer;
        ci.enabledExtensionCount = 1;
        ci.ppEnabledExtensionNames = &ext;
    }
    VkResult r = vkCreateInstance(&ci, NULL, out);
    if (r != VK_SUCCESS) return ekv_err(EKV_ERR_UNSUPPORTED, "vkCreateInstance failed (VkResult %d)", (int)r);
    volkLoadInstanceOnly(*out);
    *msgr = VK_NULL_HANDLE;
    if (validate) {
        VkDebugUtilsMessengerCreateInfoEXT mi = {
            .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            .pfnUserCallback = on_validation,
            .pUserData = vk};
        if (vkCreateDebugUtilsMessengerEXT(*out, &mi, NULL, msgr) != VK_SUCCESS) *msgr = VK_NULL_HANDLE;
    }
    return EKV_OK;
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

static bool has_device_ext(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *es = calloc(n, sizeof *es);
    bool found = false;
    if (es && vkEnumerateDeviceExtensionProperties(pd, NULL, &n, es) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(es[i].extensionName, name) == 0;
    free(es);
    return found;
}

void ekv_vk_describe(VkPhysicalDevice pd, int32_t index, struct ekv_device_info *d) {
    memset(d, 0, sizeof *d);
    d->index = index;
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
                                            .pNext = &sg};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    snprintf(d->name, sizeof d->name, "%s", p2.properties.deviceName);
    d->type = type_name(p2.properties.deviceType);
    d->api_version = p2.properties.apiVersion;
    d->driver_version = p2.properties.driverVersion;
    if (p2.properties.apiVersion >= VK_API_VERSION_1_2)
        snprintf(d->driver, sizeof d->driver, "%.120s%s%.120s", drv.driverName, drv.driverInfo[0] ? " " : "",
                 drv.driverInfo);
    d->subgroup_size = sg.subgroupSize;
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if ((mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[i].size > d->memory_bytes)
            d->memory_bytes = mp.memoryHeaps[i].size;
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    if (p2.properties.apiVersion >= VK_API_VERSION_1_2) vkGetPhysicalDeviceFeatures2(pd, &f2);
    d->fp16 = f12.shaderFloat16;
    d->int8 = f12.shaderInt8 && f12.storageBuffer8BitAccess;
    d->coopmat = has_device_ext(pd, "VK_KHR_cooperative_matrix");
    d->fp64 = f2.features.shaderFloat64;
    bool sg_ok = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                 (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                 (sg.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
    d->usable = p2.properties.apiVersion >= VK_API_VERSION_1_2 && f12.bufferDeviceAddress &&
                f11.storageBuffer16BitAccess && f12.storageBuffer8BitAccess && f12.shaderInt8 &&
                f12.shaderFloat16 && sg_ok;
}

static enum ekv_status physical_devices(VkInstance inst, VkPhysicalDevice **pds, uint32_t *n) {
    *pds = NULL;
    *n = 0;
    if (vkEnumeratePhysicalDevices(inst, n, NULL) != VK_SUCCESS) {
        *n = 0;
        return EKV_OK;
    }
    if (*n == 0) return EKV_OK;
    *pds = calloc(*n, sizeof **pds);
    if (!*pds) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    if (vkEnumeratePhysicalDevices(inst, n, *pds) < 0) *n = 0;
    return EKV_OK;
}

enum ekv_status ekv_vk_list(struct ekv_device_info *out, int32_t cap, int32_t *n_out) {
    *n_out = 0;
    VkInstance inst;
    VkDebugUtilsMessengerEXT msgr;
    enum ekv_status s = instance_new(NULL, &inst, &msgr);
    if (s != EKV_OK) return EKV_OK; /* no loader: no devices (the message stays) */
    VkPhysicalDevice *pds;
    uint32_t n;
    if ((s = physical_devices(inst, &pds, &n)) == EKV_OK) {
        for (uint32_t i = 0; i < n && (int32_t)i < cap && out; i++) ekv_vk_describe(pds[i], (int32_t)i, &out[i]);
        *n_out = (int32_t)n;
    }
    free(pds);
    vkDestroyInstance(inst, NULL);
    return s;
}

enum ekv_status ekv_devices_list(struct ekv_device_info *out, int32_t cap, int32_t *n_out) {
    ekv_err_clear();
    if (!n_out || cap < 0 || (cap > 0 && !out))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_devices_list: n_out and (for cap > 0) out are required");
    return ekv_vk_list(out, cap, n_out);
}

/* Parses "auto" / "vulkan" / "vulkan:N": *index = -1 for the first GPU. */
static enum ekv_status parse_spec(const char *spec, int32_t *index, bool *required) {
    *index = -1;
    *required = true;
    if (!strcmp(spec, "auto")) {
        *required = false;
        return EKV_OK;
    }
    if (!strcmp(spec, "vulkan") || !strcmp(spec, "gpu")) return EKV_OK;
    if (!strncmp(spec, "vulkan:", 7)) {
        char *end = NULL;
        long v = strtol(spec + 7, &end, 10);
        if (end != spec + 7 && *end == '\0' && v >= 0 && v < 1024) {
            *index = (int32_t)v;
            return EKV_OK;
        }
    }
    return ekv_err(EKV_ERR_INVALID_ARG, "device '%s': expected auto, cpu, vulkan or vulkan:N", spec);
}

/* The device a spec names among n (its index), or -1. */
static int32_t choose(VkPhysicalDevice *pds, uint32_t n, int32_t want, struct ekv_device_info *info) {
    for (uint32_t i = 0; i < n; i++) {
        ekv_vk_describe(pds[i], (int32_t)i, info);
        if (want >= 0) {
            if ((int32_t)i == want) return (int32_t)i;
            continue;
        }
        if ((!strcmp(info->type, "discrete") || !strcmp(info->type, "integrated")) && info->usable)
            return (int32_t)i;
    }
    return -1;
}

enum ekv_status ekv_vk_open(const char *spec, struct ekv_vk **out) {
    *out = NULL;
    int32_t want;
    bool required;
    enum ekv_status s = parse_spec(spec, &want, &required);
    if (s != EKV_OK) return s;
    struct ekv_vk *vk = calloc(1, sizeof *vk);
    if (vk) vk->fail_after = -1;
    if (!vk) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    s = instance_new(vk, &vk->instance, &vk->messenger);
    if (s != EKV_OK) {
        free(vk);
        if (!required) {
            ekv_err_clear();
            return EKV_OK;
        }
        return ekv_err_prefix(s, "device '%s'", spec);
    }
    VkPhysicalDevice *pds = NULL;
    uint32_t n = 0;
    if ((s = physical_devices(vk->instance, &pds, &n)) != EKV_OK) {
        ekv_vk_close(vk);
        return s;
    }
    int32_t idx = choose(pds, n, want, &vk->info);
    if (idx < 0) {
        free(pds);
        ekv_vk_close(vk);
        if (!required) return EKV_OK;
        if (want >= 0) return ekv_err(EKV_ERR_NOT_FOUND, "device '%s': there are %u Vulkan devices", spec, n);
        return ekv_err(EKV_ERR_NOT_FOUND, "device '%s': no usable Vulkan GPU (%u Vulkan devices, none a GPU "
                                          "with Vulkan 1.2, buffer device addresses and 8/16-bit storage)", spec, n);
    }
    vk->pd = pds[idx];
    free(pds);
    /* each error message is made before vk is closed: it names vk->info.name */
    if (!vk->info.usable) {
        s = ekv_err(EKV_ERR_UNSUPPORTED, "device '%s' (%s) lacks what ekv's shaders need (Vulkan 1.2, buffer "
                                         "device addresses, 8/16-bit storage, fp16, int8, subgroup arithmetic)",
                    spec, vk->info.name);
        ekv_vk_close(vk);
        return s;
    }
    snprintf(vk->name, sizeof vk->name, "vulkan:%d (%s)", (int)idx, vk->info.name);
    if ((s = ekv_vk_device_init(vk)) != EKV_OK) {
        s = ekv_err_prefix(s, "device '%s' (%s)", spec, vk->info.name);
        ekv_vk_close(vk);
        return s;
    }
    *out = vk;
    return EKV_OK;
}

const char *ekv_vk_name(const struct ekv_vk *vk) { return vk->name; }
uint64_t ekv_vk_validation_errors(const struct ekv_vk *vk) { return vk ? vk->n_validation : 0; }
const char *ekv_vk_validation_first(const struct ekv_vk *vk) { return vk ? vk->validation_first : ""; }
uint64_t ekv_vk_bytes(const struct ekv_vk *vk) { return vk ? vk->bytes : 0; }
uint64_t ekv_vk_peak_bytes(const struct ekv_vk *vk) { return vk ? vk->peak_bytes : 0; }
uint32_t ekv_vk_subgroup_size(const struct ekv_vk *vk) { return vk->info.subgroup_size; }
uint64_t ekv_vk_submits(const struct ekv_vk *vk) { return vk->n_submits; }
bool ekv_vk_has_f64(const struct ekv_vk *vk) { return vk->f64; }
uint32_t ekv_vk_matvec_m(const struct ekv_vk *vk) {
    const uint32_t sg = vk->info.subgroup_size;
    return sg >= 32 ? 1 : sg == 16 ? 2 : sg == 8 ? 4 : 0;
}
