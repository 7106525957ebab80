/*
 * ekv.h — the public C API of libekv.
 *
 * libekv runs Llama-family (vision-)language models from GGUF or llama2.c
 * files and keeps their key-value cache small with pluggable compression
 * policies (Elastic Cache, H2O, StreamingLLM, SnapKV, VL-Cache, ...).
 *
 * Conventions
 * - Every handle is opaque. Constructors are `ekv_<noun>_new`/`_load` and
 *   return an `enum ekv_status`; the new handle is written to `*out` and is
 *   owned by the caller, who releases it with the matching `_free`.
 *   `_free(NULL)` does nothing.
 * - The library never prints and never exits. On failure a function returns
 *   a status other than EKV_OK and leaves a human-readable message that names
 *   the offending thing (file, tensor, key, parameter) and the reason;
 *   `ekv_last_error()` returns it for the calling thread.
 * - Parameter structs come with `ekv_*_default_params()`; start from those.
 * - Strings passed in are borrowed for the duration of the call unless a
 *   function says otherwise.
 */
#ifndef EKV_H
#define EKV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Status                                                                     */
/* ------------------------------------------------------------------------ */

enum ekv_status {
    EKV_OK = 0,
    EKV_ERR_INVALID_ARG,   /* a parameter is out of range or inconsistent   */
    EKV_ERR_NOMEM,         /* an allocation failed                          */
    EKV_ERR_IO,            /* a file could not be opened, read or written   */
    EKV_ERR_FORMAT,        /* a file is malformed, truncated or hostile     */
    EKV_ERR_UNSUPPORTED,   /* valid but not supported (type, architecture)  */
    EKV_ERR_OVERFLOW,      /* a size computation would overflow             */
    EKV_ERR_NOT_FOUND,     /* a key, tensor or name does not exist          */
    EKV_ERR_CONTEXT_FULL,  /* the sequence reached its context limit        */
    EKV_ERR_INTERNAL,      /* a bug: an invariant did not hold              */
    EKV_STATUS_COUNT
};

/* Short constant description of a status ("invalid argument", ...). Never NULL. */
const char *ekv_status_str(enum ekv_status s);

/* Detail message of the last failure on the calling thread ("" if none).
 * The string is owned by the library and valid until the next libekv call
 * on this thread. */
const char *ekv_last_error(void);

/* For libraries built on ekv (libekv_eval, a caller's own): record a
 * printf-style message for ekv_last_error() and return s, so that errors
 * read `return ekv_error_set(EKV_ERR_FORMAT, "%s: ...", path);`;
 * ekv_error_prefix puts "context: " before the current message;
 * ekv_error_clear empties it. Messages are per thread, cut at 1,023 bytes. */
#if defined(__GNUC__)
#define EKV_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define EKV_PRINTF_LIKE(f, a)
#endif
enum ekv_status ekv_error_set(enum ekv_status s, const char *fmt, ...) EKV_PRINTF_LIKE(2, 3);
enum ekv_status ekv_error_prefix(enum ekv_status s, const char *fmt, ...) EKV_PRINTF_LIKE(2, 3);
void ekv_error_clear(void);

/* Library version string, e.g. "0.1.0". */
const char *ekv_version(void);

/* The SIMD level of the CPU kernels chosen at run time for this host:
 * "avx512" (AVX-512 F/BW/VL/DQ with VNNI), "avxvnni", "avx2" or
 * "reference" (plain C); the environment variable EKV_ISA caps it. A static
 * string (not to be freed). */
const char *ekv_cpu_kernels(void);

/* ------------------------------------------------------------------------ */
/* Models                                                                     */
/* ------------------------------------------------------------------------ */

struct ekv_model;

struct ekv_model_params {
    const char *tokenizer_path; /* llama2.c checkpoints only: tokenizer .bin;
                                   NULL = tok<vocab>.bin beside the model */
    bool no_repack;             /* read the matrices where the file maps them
                                   (default false: Q8_0/Q4_0 interleaved for
                                   the int8 kernels and F32/F16/BF16 copied,
                                   into anonymous memory, the file's pages
                                   released: one copy resident) */
};

struct ekv_model_params ekv_model_default_params(void);

/* Loads a GGUF (v2/v3) or llama2.c checkpoint; the format is detected from
 * the file's first bytes. The file is memory-mapped (privately: never
 * written); unless params->no_repack, the 2-D matrices move into one
 * anonymous arena at load (Q8_0/Q4_0 rearranged, float types as they are)
 * and their file pages are released; 1-D tensors are copied. On success *out is a new model owned by the caller
 * (free with ekv_model_free). The model may be shared by several contexts,
 * read-only, from several threads. */
enum ekv_status ekv_model_load(const char *path, const struct ekv_model_params *params,
                               struct ekv_model **out);
void ekv_model_free(struct ekv_model *model);

/* Hyper-parameters as read from the file. */
struct ekv_model_info {
    const char *arch;        /* "llama", "qwen2" (owned by the model) */
    const char *name;        /* general.name or "" (owned by the model) */
    const char *format;      /* "gguf" or "llama2c" */
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_ff;
    int32_t n_ctx_train;
    int32_t rope_dim;
    float rope_freq_base;
    float norm_eps;
    bool rope_neox;          /* rotate halves (qwen2) instead of pairs */
    bool tied_output;        /* output projection shares token_embd */
    /* RoPE scaling, read as llama.cpp reads it (<arch>.rope.scaling.* and
     * the factor tensors) */
    const char *rope_scaling;    /* "none", "linear", "yarn" or "longrope" (static) */
    float rope_scale_factor;     /* rope.scaling.factor (or rope.scale_linear); 1 when absent */
    int32_t rope_orig_ctx;       /* rope.scaling.original_context_length; n_ctx_train when absent */
    float rope_attn_factor;      /* rope.scaling.attn_factor; 1 when absent */
    float yarn_beta_fast;        /* rope.scaling.yarn_beta_fast; 32 when absent */
    float yarn_beta_slow;        /* rope.scaling.yarn_beta_slow; 1 when absent */
    float yarn_ext_factor;       /* rope.scaling.yarn_ext_factor; -1 (absent) = 1 for yarn, else 0 */
    float yarn_log_mul;          /* rope.scaling.yarn_log_multiplier; 0 = none */
    bool rope_freqs;             /* per-dimension factors rope_freqs.weight (Llama 3) */
    bool rope_long_short;        /* rope_factors_long/short.weight (Phi-3 longrope): long when the
                                    context is longer than rope_orig_ctx */
    /* architecture details (one forward, a branch per detail) */
    bool fused_qkv;              /* blk.N.attn_qkv holds Q, K and V rows (Phi-3) */
    bool fused_gate_up;          /* blk.N.ffn_up holds gate then up rows (Phi-3) */
    bool ffn_gelu;               /* GeGLU feed-forward (Gemma) instead of SwiGLU */
    float embd_scale;            /* token embeddings are multiplied by it: sqrt(n_embd) for
                                    Gemma, else 1 */
    int32_t sliding_window;      /* <arch>.attention.sliding_window: a query sees the last
                                    sliding_window positions (itself included); 0 = all */
    int32_t rope_sections[4];    /* M-RoPE (Qwen2-VL, arch "qwen2vl"): <arch>.rope.dimension_sections,
                                    rotated pairs per position component (time, height, width,
                                    extra); pair i uses the component of i mod their sum. All 0 =
                                    one position per token (every other architecture) */
    uint64_t n_params;
    uint64_t weight_bytes;
    uint64_t kv_bytes_per_token; /* full-cache bytes per token (K+V, all layers) in the default
                                    storage type (ekv_kv_type_default(); other types: ekv_kv_project) */
};
void ekv_model_get_info(const struct ekv_model *model, struct ekv_model_info *info);
/* 64 bits that tell this model file from others: a hash of the GGUF's
 * header, metadata and tensor infos (llama2.c: config, size and vocabulary)
 * and of the first bytes of every weight matrix. Saved caches carry it
 * (ekv_seq_save) and loading refuses another model's. 0 for NULL. */
uint64_t ekv_model_fingerprint(const struct ekv_model *model);

/* Conversion of a GGUF model to another weight type (`ekv quantize`). */
struct ekv_quantize_params {
    const char *type;   /* "q8_0" (default), "q4_0" or "f16" */
};
struct ekv_quantize_params ekv_quantize_default_params(void);

struct ekv_quantize_result {
    int32_t n_tensors;   /* tensors written */
    int32_t n_converted; /* matrices converted to the requested type */
    int32_t n_fallback;  /* matrices whose rows are not a multiple of the type's
                            block (32): written as F16 instead */
    uint64_t bytes_in;   /* tensor bytes read */
    uint64_t bytes_out;  /* tensor bytes written */
};

/* Converts the GGUF model at in_path (tensors F32, F16 or BF16) into
 * out_path: every matrix (a "*weight" tensor of two or more dimensions)
 * becomes params->type (NULL params = defaults), 1-D tensors (norms,
 * biases) stay as they are, metadata is copied with general.file_type (and
 * general.quantization_version) updated. Errors: an unknown type or output
 * path equal to the input (EKV_ERR_INVALID_ARG), a quantised input
 * (EKV_ERR_UNSUPPORTED, naming the tensor), an unreadable or malformed
 * input (EKV_ERR_IO / EKV_ERR_FORMAT). The output is written to
 * "<out_path>.tmp" and renamed, so no partial file is left on failure.
 * result (may be NULL) receives counts on success. */
enum ekv_status ekv_model_quantize(const char *in_path, const char *out_path, const struct ekv_quantize_params *params,
                                   struct ekv_quantize_result *result);

/* A GGUF file as it is (`ekv info`): the header, metadata and tensor list of
 * any GGUF, also vocabulary-only and mmproj files that are not models.
 * Reading validates every size as ekv_model_load does. */
struct ekv_gguf_file;
/* Opens (memory-maps) and validates path; *out is the caller's, freed with
 * ekv_gguf_close (NULL harmless). Errors: EKV_ERR_IO, EKV_ERR_FORMAT naming
 * the key or tensor at fault. */
enum ekv_status ekv_gguf_open(const char *path, struct ekv_gguf_file **out);
void ekv_gguf_close(struct ekv_gguf_file *f);

struct ekv_gguf_header {
    uint32_t version;   /* 2 or 3 */
    uint32_t alignment; /* of the data section */
    size_t n_kv;        /* metadata keys */
    size_t n_tensors;
    size_t data_offset; /* first byte of the tensor data */
    size_t file_size;
};
void ekv_gguf_get_header(const struct ekv_gguf_file *f, struct ekv_gguf_header *h);

/* The i-th metadata key (cut at 200 bytes) and its value as one line of
 * text into buf (n bytes with the NUL; cut to fit): integers, floats
 * (%g), true/false, strings in double quotes with newlines as \n and
 * control bytes as \xHH (cut at 80 bytes, then "..."), arrays as
 * "[TYPE x N]" followed by up to 4 of their strings. Returns false when i
 * is out of range (buf then holds ""). */
bool ekv_gguf_kv_text(const struct ekv_gguf_file *f, size_t i, char *key, size_t key_n, char *buf, size_t n);

struct ekv_gguf_tensor_desc {
    const char *name;  /* owned by the file handle */
    const char *type;  /* "f32", "q8_0", ... */
    uint32_t n_dims;
    int64_t ne[4];     /* ne[0] is the row length; unused dimensions are 1 */
    size_t nbytes;
};
/* The i-th tensor's description; false when i is out of range. */
bool ekv_gguf_tensor_describe(const struct ekv_gguf_file *f, size_t i, struct ekv_gguf_tensor_desc *out);

/* Synthetic models (`ekv mkmodel`): GGUF files with random weights of a
 * real model's shapes, in llama.cpp's layout, for speed and memory
 * measurements and for tests; never for quality. */
struct ekv_mkmodel_params {
    const char *preset;       /* a name that ekv_mkmodel_preset() lists (required) */
    const char *type;         /* matrices: "f16" (default), "f32", "q8_0", "q4_0" */
    uint64_t seed;            /* weights are a function of (seed, tensor, row); default 1 */
    const char *vocab_path;   /* copy the vocabulary of this GGUF; NULL: a generated one */
    int32_t n_layer;          /* 0: the preset's */
    int32_t n_ctx;            /* 0: the preset's */
    const char *rope_scaling; /* rope.scaling.type to write ("none", "linear", "yarn"), or NULL */
    float rope_factor;        /* rope.scaling.factor to write (needs rope_scaling), 0: none */
    int32_t rope_orig_ctx;    /* rope.scaling.original_context_length, 0: none / the preset's */
    int32_t sliding_window;   /* attention.sliding_window, -1: the preset's */
    int32_t n_layer_vision;   /* blocks of the vision tower (mmproj), 0: the preset's */
};
struct ekv_mkmodel_params ekv_mkmodel_default_params(void);

/* The i-th preset (0-based): its name, and its one-line description and
 * whether it has a vision tower in *desc / *vision (each may be NULL).
 * NULL past the last. The strings are static. */
const char *ekv_mkmodel_preset(int32_t i, const char **desc, bool *vision);

struct ekv_mkmodel_result {
    int32_t n_tensors;        /* tensors in the language model's file */
    int32_t n_tensors_mmproj; /* in the vision tower's file; 0 without one */
};

/* Writes the language model of params->preset to path and, for a
 * vision-language preset, its vision tower (mmproj) to mmproj_path, or,
 * when that is NULL, beside path as "<path minus .gguf>.mmproj.gguf".
 * Errors name the option: an unknown preset, a type that is not one of the
 * four, an mmproj_path for a preset without a vision tower, rope_factor or
 * rope_orig_ctx without rope_scaling (EKV_ERR_INVALID_ARG); an unreadable
 * vocab_path or an unwritable path (EKV_ERR_IO, EKV_ERR_FORMAT). Each file
 * is written to "<name>.tmp" and renamed; when the vision tower fails, the
 * language model written before it is removed, so no partial output is
 * left. result (may be NULL) receives the counts on success. */
enum ekv_status ekv_mkmodel_write(const struct ekv_mkmodel_params *params, const char *path, const char *mmproj_path,
                                  struct ekv_mkmodel_result *result);

/* ------------------------------------------------------------------------ */
/* Tokenizer                                                                  */
/* ------------------------------------------------------------------------ */

int32_t ekv_token_bos(const struct ekv_model *model); /* -1 if none */
int32_t ekv_token_eos(const struct ekv_model *model); /* -1 if none */
/* True for end-of-generation tokens (EOS, <|im_end|>, ...). */
bool ekv_token_is_eog(const struct ekv_model *model, int32_t token);

/* Tokenizes `len` bytes of UTF-8 `text`. add_special: prepend BOS when the
 * vocabulary asks for it. parse_special: text of special/control tokens
 * ("<s>", "<|im_start|>") becomes those tokens. Writes at most `n_max` ids
 * to `tokens` and the full count to *n_out; returns EKV_ERR_INVALID_ARG with
 * *n_out set to the count needed when n_max is too small. */
enum ekv_status ekv_tokenize(const struct ekv_model *model, const char *text, size_t len,
                             bool add_special, bool parse_special, int32_t *tokens,
                             size_t n_max, size_t *n_out);

/* Bytes of one token as text (byte-fallback tokens give their byte, SPM's
 * U+2581 gives a space, GPT-2 byte mapping is undone). Control tokens give
 * "" unless `special` is set. Writes at most `n` bytes, no terminator; the
 * full length goes to *n_out (EKV_ERR_INVALID_ARG when n is too small). */
enum ekv_status ekv_token_to_piece(const struct ekv_model *model, int32_t token, bool special,
                                   char *buf, size_t n, size_t *n_out);

/* Decodes a whole token sequence into `buf` (NUL-terminated when it fits).
 * remove_leading_space drops the space SPM puts before the first word.
 * *n_out gets the length without the terminator. */
enum ekv_status ekv_detokenize(const struct ekv_model *model, const int32_t *tokens, size_t n_tokens,
                               bool special, bool remove_leading_space, char *buf, size_t n,
                               size_t *n_out);

/* ------------------------------------------------------------------------ */
/* KV-cache policies                                                          */
/* ------------------------------------------------------------------------ */

/* Modality of a cached token, for modality-aware policies (VL-Cache). */
enum ekv_tag {
    EKV_TAG_TEXT = 0,      /* system prompt or user text */
    EKV_TAG_IMAGE = 1,     /* image embedding positions */
    EKV_TAG_GENERATED = 2  /* tokens produced (or teacher-forced) after the prompt */
};

enum ekv_pool_kind { EKV_POOL_AVG = 0, EKV_POOL_MAX = 1 };

/* Storage type of cached keys or values (--kv-type, --kv-type-k/-ctk,
 * --kv-type-v/-ctv), independent of the policy. Bytes reported anywhere
 * (ekv_kv_stats, ekv_kv_project) are the real bytes of the types.
 *   f32, f16: one float / half per element;
 *   q8_0, q4_0: GGML's blocks of 32 (8.5 and 4.5 bits per element; head_dim % 32 == 0);
 *   kivi2, kivi4: KIVI (docs/policies.md "KIVI storage"): keys per channel over groups of
 *     kv_group entries, values per entry over groups of kv_group channels
 *     (head_dim % kv_group == 0), asymmetric (fp16 scale and minimum), the
 *     most recent kv_residual entries in fp16 until a group fills. */
enum ekv_kv_type {
    EKV_KV_DEFAULT = 0,    /* the library's default storage type */
    EKV_KV_F32,
    EKV_KV_F16,
    EKV_KV_Q8_0,
    EKV_KV_Q4_0,
    EKV_KV_KIVI2,
    EKV_KV_KIVI4,
    EKV_KV_TYPE_COUNT
};
/* "f32", "f16", "q8_0", "q4_0", "kivi2", "kivi4" ("default" for
 * EKV_KV_DEFAULT, "unknown" otherwise); static strings. */
const char *ekv_kv_type_name(enum ekv_kv_type t);
/* Parses a type name (case-insensitive); EKV_ERR_INVALID_ARG naming the
 * known types when it is not one. */
enum ekv_status ekv_kv_type_parse(const char *name, enum ekv_kv_type *out);
/* What EKV_KV_DEFAULT stands for. */
enum ekv_kv_type ekv_kv_type_default(void);

/* Policy selection and parameters. A value of -1 (or NaN for floats) means
 * "the policy's default" (docs/policies.md "Each policy's exact rule"). */
struct ekv_kv_params {
    const char *policy;     /* "full", "random", "local", "h2o", "scissorhands", "tova",
                               "roco", "snapkv", "pyramidkv", "vlcache", "elastic", "elastic-v2";
                               or a spec "name:key=value:..." for a policy with options
                               (elastic-v2, see src/kv/elastic_v2.c) */
    double budget;          /* fraction of tokens seen that is kept, (0, 1]; 1 = keep all */
    int32_t max_tokens;     /* absolute cap of entries per layer and head; 0 = none */
    int32_t sinks;          /* protected first tokens */
    int32_t window;         /* protected recent tokens (H2O, ScissorHands, local) */
    int32_t obs_window;     /* observation window of queries (SnapKV, PyramidKV) */
    int32_t pool;           /* pooling kernel size (SnapKV, PyramidKV), odd */
    enum ekv_pool_kind pool_kind;
    int32_t distance;       /* Elastic Cache fixed-point distance (default -25) */
    int32_t chunk;          /* block-wise prefill: tokens per chunk; 0 = whole prompt */
    double beta;            /* PyramidKV beta (default 20) */
    double sparsity_p;      /* VL-Cache threshold p (default 0.01) */
    double recent_ratio;    /* VL-Cache/RoCo recent share of the budget */
    int32_t recompress;     /* SnapKV, PyramidKV, VL-Cache: after the prompt, re-select with the
                               policy's own scores every N generated tokens, so the cache stays
                               within N entries of the budget; 0 = never (the papers: the cache
                               grows by one entry per token); -1 = default (32) */
    uint64_t seed;          /* random policy */
    bool compat_ref;        /* reproduce the authors' reference code (Elastic, --kv-compat ref) */
    enum ekv_kv_type type_k;  /* storage type of keys (EKV_KV_DEFAULT: ekv_kv_type_default()) */
    enum ekv_kv_type type_v;  /* storage type of values */
    int32_t kv_group;       /* KIVI group G (default 32; <= 0 = default) */
    int32_t kv_residual;    /* KIVI full-precision recent entries R, a multiple of G (default 128; -1 = default) */
};
struct ekv_kv_params ekv_kv_default_params(void);

/* Number of registered policies and the name/summary of the i-th (static strings). */
int ekv_kv_policy_count(void);
const char *ekv_kv_policy_name(int i);
const char *ekv_kv_policy_summary(int i);

/* ------------------------------------------------------------------------ */
/* Contexts and sequences                                                     */
/* ------------------------------------------------------------------------ */

/* A context owns the worker threads and scratch memory for one model; a
 * sequence owns one KV cache with its policy. Several sequences of one
 * context can be decoded together (ekv_decode_batch). A context and its
 * sequences must be used from one thread at a time. */
struct ekv_context;
struct ekv_seq;

/* Compute devices. The CPU is always there; GPUs are reached through
 * Vulkan (the loader is opened at run time: a machine without libvulkan
 * simply lists none). */
struct ekv_device_info {
    int32_t index;          /* N in "vulkan:N" */
    char name[256];
    const char *type;       /* "discrete", "integrated", "virtual", "cpu" or "other" (static) */
    uint32_t api_version;   /* Vulkan version the device supports (VK_MAKE_API_VERSION) */
    uint32_t driver_version;/* vendor-encoded */
    char driver[256];       /* driver name and info, "" when the device does not say */
    uint64_t memory_bytes;  /* device-local memory (largest device-local heap) */
    uint32_t subgroup_size;
    bool fp16;              /* shaderFloat16 */
    bool int8;              /* shaderInt8 + 8-bit storage */
    bool coopmat;           /* VK_KHR_cooperative_matrix */
    bool fp64;              /* shaderFloat64: needed for the quantised KV cache types (q8_0, q4_0,
                               KIVI) on the device, which round as the CPU does */
    bool usable;            /* has what ekv's shaders need (Vulkan 1.2, buffer device
                               addresses, 16-bit storage, subgroup arithmetic) */
};
/* Writes up to cap devices into out and their count into *n_out (which may
 * exceed cap). No Vulkan loader or no device: EKV_OK with *n_out = 0 and
 * ekv_last_error() saying why. */
enum ekv_status ekv_devices_list(struct ekv_device_info *out, int32_t cap, int32_t *n_out);

struct ekv_context_params {
    int32_t n_threads;  /* worker threads for matmuls (default: online cores, max 8) */
    int32_t n_ctx;      /* positions per sequence; 0 = the model's trained context */
    const char *device; /* "auto", "cpu", "vulkan" or "vulkan:N"; NULL = $EKV_DEVICE, else
                           "auto". auto: the first discrete/integrated GPU, else the CPU
                           (never a CPU-type Vulkan device such as lavapipe); vulkan:
                           a GPU or an error. Borrowed for the call. */
};
struct ekv_context_params ekv_context_default_params(void);

/* The model must outlive the context. *out is owned by the caller. */
enum ekv_status ekv_context_new(const struct ekv_model *model, const struct ekv_context_params *params,
                                struct ekv_context **out);
void ekv_context_free(struct ekv_context *ctx);

/* The model a context runs (borrowed from the caller of ekv_context_new)
 * and its positions per sequence (the resolved n_ctx). */
const struct ekv_model *ekv_context_model(const struct ekv_context *ctx);
int32_t ekv_context_n_ctx(const struct ekv_context *ctx);
/* Where a context runs: "cpu" or "vulkan:N (device name)" (owned by the
 * context); the device memory it holds (weights, caches, scratch) now and
 * at most, 0 on the CPU. */
const char *ekv_context_device(const struct ekv_context *ctx);
uint64_t ekv_context_device_bytes(const struct ekv_context *ctx);
uint64_t ekv_context_device_peak_bytes(const struct ekv_context *ctx);
/* Device time (ns) of the context's last GPU forward, from the device's own
 * timestamps; 0 on the CPU or when the device has no timestamps. */
uint64_t ekv_context_device_last_ns(const struct ekv_context *ctx);
/* With EKV_VK_PROFILE=1 in the environment when the context was made: the
 * device time of every shader summed over the context's forwards, as text
 * (one line per shader: name, dispatches, total ms, mean us, share),
 * written to buf (cap bytes, NUL-terminated, cut to fit). EKV_ERR_UNSUPPORTED
 * on the CPU or without profiling. */
enum ekv_status ekv_context_device_profile(const struct ekv_context *ctx, char *buf, size_t cap);
/* Starts those sums again from zero (a no-op on the CPU or without profiling). */
void ekv_context_device_profile_reset(struct ekv_context *ctx);
/* True when a sequence runs on the context's GPU (its policy and cache
 * type are supported there); false on the CPU. */
bool ekv_seq_on_device(const struct ekv_seq *seq);

/* New empty sequence with the given KV policy (NULL = full cache). The
 * context must outlive the sequence. *out is owned by the caller. */
enum ekv_status ekv_seq_new(struct ekv_context *ctx, const struct ekv_kv_params *kv,
                            struct ekv_seq **out);
void ekv_seq_free(struct ekv_seq *seq);
/* A new sequence in src's context that holds what src holds: its cache
 * (entries per layer and head, storage, merge weights, statistics), the
 * policy's state and the positions seen, on src's device; fed the same
 * tokens afterwards it gives the same logits as src, bit for bit. Use it
 * to read a shared prefix (a document, a system prompt, an image) once and
 * answer from several copies. src is not changed; it must not be reading a
 * prompt in pieces. *out is owned by the caller (ekv_seq_free). */
enum ekv_status ekv_seq_copy(const struct ekv_seq *src, struct ekv_seq **out);

/* Saved caches (`ekv run --kv-save/--kv-load`, the server's slots): a
 * sequence's whole state — its cache per (layer, KV head) in its storage
 * types bit for bit, merge weights, positions, statistics, the policy spec,
 * parameters and state, tokens seen — so that a loaded sequence, fed the
 * same tokens, gives the same logits as the saved one would have, bit for
 * bit. File format (docs/kv-files.md): a versioned header with the model's
 * fingerprint, then sections each with its CRC-32C.
 *
 * ekv_seq_save writes "<path>.tmp" and renames it to path, so a reader
 * never sees a partial file; tokens[n_tokens] (optional: NULL, 0) are the
 * token ids of the first n_tokens positions, -1 for a position that was
 * not a token (an image row), so that a later caller can match a prompt
 * against them (n_tokens <= the positions seen). The sequence must not be
 * reading a prompt in pieces; a cache held on a GPU cannot be saved yet
 * (EKV_ERR_UNSUPPORTED). ekv_seq_save_mem gives the same bytes in *data
 * (malloc'd, the caller frees it with free()).
 *
 * ekv_seq_load makes a new sequence in ctx (owned by the caller) from a
 * file; *tokens (malloc'd, free() it; NULL when none were saved) and
 * *n_tokens get the saved token ids (both pointers may be NULL: not
 * wanted). It refuses with a clear message: another model (fingerprint),
 * another format version, a bad checksum, a truncated or inconsistent file
 * (EKV_ERR_FORMAT), and a sequence that would not fit ctx's n_ctx. The
 * sequence runs on the CPU (a context on a GPU too, unless its device was
 * required: then EKV_ERR_UNSUPPORTED). ekv_seq_load_mem reads size bytes
 * of data (borrowed for the call). */
enum ekv_status ekv_seq_save(const struct ekv_seq *seq, const int32_t *tokens, int32_t n_tokens, const char *path);
enum ekv_status ekv_seq_save_mem(const struct ekv_seq *seq, const int32_t *tokens, int32_t n_tokens, void **data,
                                 size_t *size);
enum ekv_status ekv_seq_load(struct ekv_context *ctx, const char *path, struct ekv_seq **out, int32_t **tokens,
                             int32_t *n_tokens);
enum ekv_status ekv_seq_load_mem(struct ekv_context *ctx, const void *data, size_t size, struct ekv_seq **out,
                                 int32_t **tokens, int32_t *n_tokens);

/* A run of positions with one modality: tokens, or embeddings (n x n_embd
 * floats, e.g. projected image patches) when `tokens` is NULL. */
struct ekv_segment {
    const int32_t *tokens;
    const float *embd;
    int32_t n;
    enum ekv_tag tag;
    /* M-RoPE models (ekv_model_info.rope_sections set): an image's rows laid
     * out as grid_h rows of grid_w (grid_w * grid_h == n, row-major) take
     * the positions (t, t + row, t + col) for (time, height, width), t the
     * segment's first position, and the positions after the segment
     * advance by max(grid_w, grid_h) instead of n (Qwen2-VL, llama.cpp's
     * mtmd). 0 = one position per row, as text. Ignored by other models. */
    int32_t grid_w, grid_h;
};

/* Input of one ekv_seq_eval call: segments in order. A prompt (is_prompt)
 * is compressed by the policy when it has been read (block-wise when the
 * policy's `chunk` is set); otherwise the positions are decode steps. */
struct ekv_input {
    const struct ekv_segment *segs;
    int32_t n_segs;
    bool is_prompt;
    bool logits_all;       /* logits for every position, not only the last */
};

/* Runs the model over `in`, appending to the sequence's cache and applying
 * its policy. Writes n_vocab logits (n_positions x n_vocab with logits_all)
 * to `logits` when it is not NULL (caller-owned buffer). */
enum ekv_status ekv_seq_eval(struct ekv_seq *seq, const struct ekv_input *in, float *logits);

/* Reads one prompt into n new sequences of one context at once (an
 * evaluation's policies on the same item; ekv eval's shared prefill): the
 * model runs over the prompt once and every sequence's cache gets the
 * prompt's entries, the statistics its own policy collects and its own
 * policy's compression, exactly as ekv_seq_eval(seqs[i], in, ...) alone
 * would leave it, bit for bit. Needs: n >= 1 distinct sequences that have
 * read nothing yet, on the CPU, with the same storage types (K and V types,
 * KIVI group and residual) and no block-wise prefill (chunk 0); `in` a
 * prompt (is_prompt, not logits_all). Policies, budgets and parameters may
 * all differ. Writes the last position's n_vocab logits to `logits` when
 * not NULL (the same for every sequence: a prompt's logits come out
 * before any policy acts). On failure the sequences that read part of the
 * prompt must be freed (they refuse further input). */
enum ekv_status ekv_seq_eval_shared(struct ekv_seq *const *seqs, int32_t n, const struct ekv_input *in, float *logits);
/* Whether a and b (which may be the same sequence) can read a prompt
 * together in ekv_seq_eval_shared, by its conditions above. */
bool ekv_seq_can_share(const struct ekv_seq *a, const struct ekv_seq *b);

/* Convenience: the whole prompt as one text-tagged input (chunked when the
 * policy asks for it); logits of the last token. */
enum ekv_status ekv_seq_prefill(struct ekv_seq *seq, const int32_t *tokens, int32_t n, float *logits);
/* Convenience: one generated token; logits of the next. */
enum ekv_status ekv_seq_decode(struct ekv_seq *seq, int32_t token, float *logits);

/* Decodes one token for each of n sequences of one context in a single
 * forward step (weights read once). logits: n x n_vocab, caller-owned. */
enum ekv_status ekv_decode_batch(struct ekv_context *ctx, struct ekv_seq *const *seqs,
                                 const int32_t *tokens, int32_t n, float *logits);

/* A prompt read in bounded pieces, so that a server can run other
 * sequences' decode steps between them (ekv serve's continuous batching).
 * The prompt is read layer by layer: its rows go through layer 0 in pieces
 * of `rows` rows, then the policy compresses layer 0 (as in ekv_seq_eval,
 * layer by layer, right after the layer's attention), then layer 1, ... So
 * the cache and the logits equal those of one ekv_seq_eval of the prompt
 * (bit for bit with batch-invariant kernels), and the peak holds one layer
 * at full length. With the policy's `chunk` (block-wise compression) each
 * block is read this way in turn.
 *
 * ekv_prefill_new copies the input's embeddings (in[...] need not outlive
 * the call; in->is_prompt and in->logits_all are ignored: it is a prompt
 * and only the last position's logits come out). Until the prompt is done,
 * the sequence takes no other input (ekv_seq_eval and ekv_decode_batch
 * refuse it). *out is owned by the caller; free it before its sequence or
 * after (a freed sequence cuts it off). Freeing it before it is done leaves
 * the sequence unusable (its layers hold different lengths): free that too.
 *
 * A sequence on a GPU (ekv_seq_on_device) reads the prompt in chunks of
 * `rows` rows through all layers instead, n_layer units per chunk (a step
 * runs at least one chunk); the result is the same. With KIVI storage there
 * the whole prompt is one chunk (KIVI quantises after each forward). */
struct ekv_prefill;
enum ekv_status ekv_prefill_new(struct ekv_seq *seq, const struct ekv_input *in, int32_t rows,
                                struct ekv_prefill **out);
/* Runs at most max_units units (a unit: up to `rows` rows through one
 * layer; a whole forward of `rows` tokens is n_layer units; on a GPU at
 * least one such forward). *done is set
 * once the whole prompt has been read; the last position's n_vocab logits
 * are then written to logits (caller-owned) when it is not NULL. After an
 * error the prompt cannot go on. */
enum ekv_status ekv_prefill_step(struct ekv_prefill *p, int32_t max_units, float *logits, bool *done);
/* Units left to read (0 when done). */
int64_t ekv_prefill_units_left(const struct ekv_prefill *p);
void ekv_prefill_free(struct ekv_prefill *p);

/* K/V bytes a sequence will hold under a policy, for admission control
 * (ekv serve --kv-mem): after n_prompt prompt positions and n_gen
 * generated tokens, and at most at any time on the way (while a prompt is
 * read with ekv_prefill_*, or with ekv_seq_eval, the layers not compressed
 * yet hold it whole). Entries follow each policy's budget rule (kept =
 * min(seen, ceil(budget * seen), kv tokens cap) per layer and KV head;
 * prompt-only policies keep that of the prompt and then grow by one entry
 * per token); bytes are those of the cache's storage type. A projection,
 * not a bound: PyramidKV's per-layer rounding may exceed it by a few
 * entries per layer, so admission should also count the bytes in use. The
 * parameters are validated as ekv_seq_new does (same errors). */
struct ekv_kv_projection {
    uint64_t bytes_final;     /* after n_prompt + n_gen positions */
    uint64_t bytes_peak;      /* the most at any time (>= bytes_final) */
    uint64_t bytes_full;      /* a full cache of n_prompt + n_gen positions */
    uint64_t bytes_per_token; /* a full cache's bytes per position */
};
enum ekv_status ekv_kv_project(const struct ekv_model *model, const struct ekv_kv_params *kv, int64_t n_prompt,
                               int64_t n_gen, struct ekv_kv_projection *out);

/* Tokens seen so far (prompt plus fed tokens). */
int64_t ekv_seq_n_seen(const struct ekv_seq *seq);

/* Cache statistics of a sequence. */
struct ekv_kv_stats {
    int64_t n_seen;          /* tokens seen */
    int64_t entries;         /* cached entries summed over layers and KV heads */
    int64_t entries_full;    /* what a full cache would hold (n_seen x layers x heads) */
    uint64_t bytes;          /* bytes of the cached K/V entries now, in their storage types */
    uint64_t bytes_full;     /* bytes a full cache of the same types would hold now */
    uint64_t bytes_full_f32; /* bytes a full f32 cache would hold now (the 1x of type x policy ratios) */
    uint64_t bytes_alloc;    /* bytes allocated for entries and statistics */
    uint64_t peak_bytes_alloc;
    int64_t evicted;         /* tokens dropped (summed over layers and heads) */
    int64_t merged;          /* tokens merged into another entry (summed) */
    enum ekv_kv_type type_k; /* storage types of keys and values (resolved, never DEFAULT) */
    enum ekv_kv_type type_v;
    const char *policy;      /* the policy spec ("snapkv", "elastic-v2:bias=1"; owned by the sequence) */
    double budget;           /* its budget */
};
void ekv_seq_kv_stats(const struct ekv_seq *seq, struct ekv_kv_stats *st);
/* The sequence's KV parameters with every default resolved (what its
 * policy runs with); out->policy points to the policy spec, owned by the
 * sequence. Two sequences with equal resolved parameters compress alike. */
void ekv_seq_kv_params(const struct ekv_seq *seq, struct ekv_kv_params *out);


/* Entries of one layer (0 if out of range). */
int32_t ekv_seq_kv_layer_len(const struct ekv_seq *seq, int32_t layer, int32_t kv_head);

/* Copies the kept original positions, merge weights and tags of one
 * (layer, KV head) into caller buffers of at least ekv_seq_kv_layer_len
 * entries each; any may be NULL. */
enum ekv_status ekv_seq_kv_entries(const struct ekv_seq *seq, int32_t layer, int32_t kv_head,
                                   int32_t *positions, float *weights, uint8_t *tags);

/* ------------------------------------------------------------------------ */
/* Chat templates and images                                                  */
/* ------------------------------------------------------------------------ */

/* Where an image goes in a prompt. */
#define EKV_IMAGE_MARKER "<image>"

/* Known templates (docs/chat-templates.md gives each rendering):
 * "none" (contents one per line), "llava-1.5" and "vicuna" (FastChat's
 * "SYSTEM USER: q ASSISTANT: a</s>USER: ..."), "chatml" (Qwen2, SmolLM),
 * "llama-2", "llama-3", "mistral-v1", "mistral-v3", "mistral-v3-tekken",
 * "mistral-v7", "phi-3", "zephyr", "gemma". llama.cpp's spellings
 * ("llama2", "llama3", "phi3") are accepted wherever a name is taken.
 * Rendered texts never start with BOS (the tokenizer adds it); BOS/EOS
 * texts inside a history ("</s><s>[INST]") are meant to be tokenized with
 * special tokens parsed. */
int ekv_chat_template_count(void);
const char *ekv_chat_template_name(int i);

/* Formats one user turn. system NULL = the template's default system
 * prompt. with_image puts EKV_IMAGE_MARKER before the text unless the text
 * already has one. Writes a NUL-terminated string to buf (may be NULL to
 * ask for the size); *n_out gets the length without the terminator. */
enum ekv_status ekv_chat_format(const char *tmpl, const char *system, const char *user, bool with_image,
                                char *buf, size_t n, size_t *n_out);

/* One message of a conversation. role: "system", "user" or "assistant";
 * content: UTF-8 text (may hold EKV_IMAGE_MARKER). Both borrowed. */
struct ekv_chat_msg {
    const char *role;
    const char *content;
};

/* Renders a whole conversation with template tmpl (a name from
 * ekv_chat_template_name; NULL = "none"). add_assistant ends the text with
 * the template's assistant prefix so that generation continues as the
 * assistant. A template that has a default system prompt uses it when the
 * first message is not "system". Buffer rules as in ekv_chat_format. */
enum ekv_status ekv_chat_apply(const char *tmpl, const struct ekv_chat_msg *msgs, size_t n_msgs,
                               bool add_assistant, char *buf, size_t n, size_t *n_out);

/* The template family of a model, detected from its GGUF
 * `tokenizer.chat_template` by distinctive substrings (no Jinja engine),
 * as a name from ekv_chat_template_name; NULL when the file has no template
 * or none is recognised. Static string. */
const char *ekv_model_chat_template(const struct ekv_model *model);

/* The same detection on a template text; NULL when not recognised. */
const char *ekv_chat_template_detect(const char *jinja);

/* Tokenizes a prompt that may hold one EKV_IMAGE_MARKER: the text before it
 * gets BOS, the text after it continues; *image_at is the token index where
 * the image embeddings go (-1 without a marker). Buffer rules as in
 * ekv_tokenize. */
enum ekv_status ekv_tokenize_prompt(const struct ekv_model *model, const char *text, size_t len, int32_t *tokens,
                                    size_t n_max, size_t *n_out, int32_t *image_at);

/* A vision tower (CLIP/SigLIP ViT + LLaVA projector) from a llama.cpp-style
 * mmproj GGUF. Read-only once loaded. */
struct ekv_vision;

/* Loads an mmproj file; *out owned by the caller (ekv_vision_free). */
enum ekv_status ekv_vision_load(const char *mmproj_path, struct ekv_vision **out);
void ekv_vision_free(struct ekv_vision *v);
/* Embeddings one image (or one tile of a tiling tower) becomes (576 for
 * CLIP ViT-L/14-336, 64 for SmolVLM's tiles; 0 for a Qwen2-VL tower, whose
 * count depends on each image: ekv_vision_image_tokens) and their width
 * (the language model's n_embd). */
int32_t ekv_vision_n_tokens(const struct ekv_vision *v);
int32_t ekv_vision_n_embd(const struct ekv_vision *v);
/* Where the tower runs from now on, whatever context encodes with it:
 * "cpu" (or NULL: the context's threads, or the context's GPU when the
 * context is on one), "auto" (the first GPU, else as "cpu") or "vulkan" /
 * "vulkan:N" (a device of the tower's own: a clear error when there is
 * none or the tower cannot run there — LLaVA's CLIP and Qwen2-VL's
 * towers do, Idefics3's does not in this version). A device of its own holds the tower's
 * weights and lets threads without a context (a server's request threads)
 * encode on the GPU, one at a time. */
enum ekv_status ekv_vision_set_device(struct ekv_vision *v, const char *device);
/* The tower's own device ("vulkan:0 (NVIDIA H100 ...)"), or "cpu" without one. */
const char *ekv_vision_device(const struct ekv_vision *v);
/* Where images encoded with context ctx (may be NULL) run: the tower's own
 * device, else the context's GPU when the tower runs there, else "cpu". */
const char *ekv_vision_encodes_on(const struct ekv_vision *v, const struct ekv_context *ctx);
/* Decodes (JPEG/PNG), preprocesses and encodes an image file into
 * out [n_tokens][n_embd] (caller-owned). With a context on a GPU the tower
 * runs there when it can (LLaVA's: CLIP with the mlp projector; its
 * weights then stay on the device until the context meets another tower or
 * is freed), else on ctx's threads (ctx may be NULL: one thread). A context
 * runs one thing at a time: do not encode with it while another thread
 * evaluates with it. */
enum ekv_status ekv_vision_encode_file(const struct ekv_vision *v, struct ekv_context *ctx, const char *path,
                                       float *out);

/* An image for a prompt: a file, or encoded bytes (JPEG or PNG) in memory,
 * e.g. the decoded payload of a data: URI. All fields borrowed. */
struct ekv_image_input {
    const char *path;     /* file to read; NULL when the bytes are given */
    const void *data;     /* encoded image bytes, used when path is NULL */
    size_t size;          /* bytes at data */
};

/* Positions the image will take in a prompt with this tower:
 * ekv_vision_n_tokens for a fixed-size tower, more for a LLaVA-1.6
 * "anyres" or an Idefics3/SmolVLM tower (tiles and an overview, depending
 * on the image's size; Idefics3 also puts separator tokens between the
 * tiles, counted here), or a Qwen2-VL tower (its grid at the image's own
 * resolution and the <|vision_start|> <|vision_end|> pair around it).
 * Reads only the image's header. */
enum ekv_status ekv_vision_image_tokens(const struct ekv_vision *v, const struct ekv_image_input *img,
                                        int32_t *n_tokens);

/* A prompt with images: the text split at each EKV_IMAGE_MARKER and
 * tokenized, and one image slot per marker that the vision tower fills
 * with embeddings. It is fed to a sequence as text and image segments in
 * order (images tagged EKV_TAG_IMAGE). Shared by the CLI, the evaluation
 * runner and the server. A prompt is read-only while it is evaluated, so
 * one prompt may be fed to several sequences (one thread at a time). */
struct ekv_prompt;

/* Tokenizes `len` bytes of text, splitting at every EKV_IMAGE_MARKER; text
 * of special tokens ("<|im_start|>") becomes those tokens. The first piece
 * gets BOS when add_bos is set and the vocabulary asks for it (set it for
 * the start of a sequence, clear it for a later turn of a conversation);
 * the other pieces continue without one. *out is owned by the caller
 * (ekv_prompt_free). */
enum ekv_status ekv_prompt_new(const struct ekv_model *model, const char *text, size_t len, bool add_bos,
                               struct ekv_prompt **out);
void ekv_prompt_free(struct ekv_prompt *p);

/* Image markers in the text (= image slots). */
int32_t ekv_prompt_n_images(const struct ekv_prompt *p);
/* Text tokens (all pieces together). */
int32_t ekv_prompt_n_tokens(const struct ekv_prompt *p);
/* Copies the text tokens, in order, into tokens (at least n_tokens ids). */
void ekv_prompt_tokens(const struct ekv_prompt *p, int32_t *tokens);

/* Decodes, preprocesses and encodes images[0..n) with the vision tower
 * into the slots in order (n must equal ekv_prompt_n_images; images set
 * before are replaced). ctx (may be NULL) lends its threads and must
 * belong to a model whose width is the tower's output width. An error
 * names the image (its path, or "image i (N bytes in memory)") and the
 * reason; the slots are then all unset. */
enum ekv_status ekv_prompt_set_images(struct ekv_prompt *p, const struct ekv_vision *v, struct ekv_context *ctx,
                                      const struct ekv_image_input *images, int32_t n);

/* Sets slot i from embeddings computed elsewhere: n_rows x n_embd floats
 * (n_embd of the prompt's model), copied. */
enum ekv_status ekv_prompt_set_image_embd(struct ekv_prompt *p, int32_t i, const float *embd, int32_t n_rows);

/* Positions the prompt takes: its text tokens plus the rows of the images
 * set so far. */
int64_t ekv_prompt_n_positions(const struct ekv_prompt *p);

/* Where image i sits: its first position within the prompt and its rows
 * (0 while unset). */
enum ekv_status ekv_prompt_image_span(const struct ekv_prompt *p, int32_t i, int64_t *pos0, int32_t *n_rows);

/* The prompt as segments in order (empty text pieces left out), pointing
 * into the prompt: valid until the prompt is changed or freed. Fails with
 * EKV_ERR_INVALID_ARG, naming the slot, while an image is unset. */
enum ekv_status ekv_prompt_segments(const struct ekv_prompt *p, const struct ekv_segment **segs, int32_t *n_segs);

/* Feeds the whole prompt to seq as one prompt (the policy compresses it
 * when read; block-wise when the policy's chunk is set); logits of its
 * last position to `logits` when not NULL. Every image must be set. */
enum ekv_status ekv_seq_eval_prompt(struct ekv_seq *seq, const struct ekv_prompt *p, float *logits);

/* Recording of the latest query's attention, on top of what the policy
 * collects (for cache hit rates and diagnostics; costs one float per cached
 * entry). Off by default; takes effect from the next forward. */
enum ekv_status ekv_seq_kv_record_attention(struct ekv_seq *seq, bool on);

/* After a forward with recording on: the attention of its last query over
 * the entries of one (layer, KV head), in entry order (as
 * ekv_seq_kv_entries), averaged over the query heads that read the KV head.
 * Writes at most n floats to out (caller-owned) and the entry count to
 * *n_out; EKV_ERR_INVALID_ARG when n is too small (with *n_out set), the
 * layer or head is out of range, or recording is off. */
enum ekv_status ekv_seq_kv_last_attention(const struct ekv_seq *seq, int32_t layer, int32_t kv_head, float *out,
                                          size_t n, size_t *n_out);

/* First position whose queries feed the policy's observation-window
 * statistics (VL-Cache's post-vision window, SnapKV's window); -1 if the
 * policy uses none. */
int64_t ekv_seq_kv_window_start(const struct ekv_seq *seq);

/* ------------------------------------------------------------------------ */
/* Sampling                                                                   */
/* ------------------------------------------------------------------------ */

struct ekv_sampler;

struct ekv_sampler_params {
    float temp;       /* <= 0: greedy (default 0.8) */
    int32_t top_k;    /* 0 = off (default 40) */
    float top_p;      /* 1 = off (default 0.95) */
    float min_p;      /* 0 = off (default 0.05) */
    uint64_t seed;    /* default 0xEC0 */
    /* Penalties, as llama.cpp applies them before every other step (greedy
     * included), over the last repeat_last_n tokens given to
     * ekv_sampler_accept: a token seen c > 0 times there has its logit l
     * divided by repeat_penalty (l > 0) or multiplied by it (l <= 0), then
     * c * frequency_penalty + presence_penalty subtracted. */
    float repeat_penalty;    /* > 0; 1 = off (default 1) */
    int32_t repeat_last_n;   /* tokens looked back over, 0 .. 2^24; 0 = off (default 64) */
    float frequency_penalty; /* per occurrence, finite; 0 = off (default 0) */
    float presence_penalty;  /* once, finite; 0 = off (default 0) */
};
struct ekv_sampler_params ekv_sampler_default_params(void);

/* A sampler (owned by the caller: ekv_sampler_free). params NULL = the
 * defaults; out of range values are refused (EKV_ERR_INVALID_ARG). */
enum ekv_status ekv_sampler_new(const struct ekv_sampler_params *params, struct ekv_sampler **out);
void ekv_sampler_free(struct ekv_sampler *s);

/* Picks the next token from n_vocab logits (not modified): logit biases,
 * then penalties, then greedy or top-k / top-p / min-p / temperature / draw.
 * Banned tokens (bias -INFINITY) are never drawn; when every token is
 * banned the result is token 0. */
int32_t ekv_sampler_sample(struct ekv_sampler *s, const float *logits, int32_t n_vocab);

/* Logit biases, as llama.cpp's logit-bias sampler (first in its chain,
 * before the penalties) and OpenAI's logit_bias: bias[i] is added to the
 * logit of token tokens[i] at every step; a token listed twice gets the
 * sum; -INFINITY bans a token. Replaces any earlier list; n = 0 clears it.
 * Tokens must be >= 0 and biases finite or -INFINITY (else
 * EKV_ERR_INVALID_ARG naming the entry, the sampler unchanged); tokens at or
 * past the vocabulary passed to ekv_sampler_sample are ignored there (front
 * ends check them against the model). Copies both arrays (the caller keeps
 * them); EKV_ERR_NOMEM leaves the sampler unchanged. */
enum ekv_status ekv_sampler_set_logit_bias(struct ekv_sampler *s, const int32_t *tokens, const float *bias,
                                           int32_t n);

/* A token and its log-probability. */
struct ekv_token_logprob {
    int32_t token;
    float logprob;
};

/* Log-probabilities of the model's distribution (the log-softmax of the
 * raw logits: before biases, penalties and temperature, as OpenAI and
 * llama-server report them): *lp gets that of `token` (in [0, n_vocab)),
 * top[0 .. n_top) the n_top most likely tokens, most likely first (ties:
 * the lower id). n_top in [0, n_vocab]; top may be NULL when n_top is 0.
 * Allocates nothing. */
enum ekv_status ekv_logprobs(const float *logits, int32_t n_vocab, int32_t token, int32_t n_top,
                             struct ekv_token_logprob *top, float *lp);

/* Gives the penalties a token of the text (the prompt's tokens and each
 * token sampled, in order; ids outside the vocabulary are never
 * penalised). Keeps the last repeat_last_n; nothing when no penalty is on.
 * Allocates nothing (the window is made by ekv_sampler_new). */
enum ekv_status ekv_sampler_accept(struct ekv_sampler *s, int32_t token);
/* ekv_sampler_accept for each text token of a prompt, in order (image
 * slots have none); allocates nothing. */
struct ekv_prompt;
enum ekv_status ekv_sampler_accept_prompt(struct ekv_sampler *s, const struct ekv_prompt *p);

#ifdef __cplusplus
}
#endif

#endif /* EKV_H */
