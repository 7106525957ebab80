/*
 * mkmodel.c — synthetic GGUF models (`ekv mkmodel`, ekv_mkmodel_write):
 * random weights of real model shapes, laid out as llama.cpp's converters
 * lay them out, so that speed and memory can be measured on LLaVA-1.5-7B,
 * TinyLlama, SmolLM2 or Qwen2 shapes without their weights (which cannot be
 * downloaded here), and so that tests have a tiny vision-language model.
 * The command line (tools/ekv/cmd_mkmodel.c) only parses options.
 *
 * Weights are drawn row by row from a counter-based generator keyed by
 * (seed, tensor, row), so the bytes do not depend on how the GGUF writer
 * chunks its fill calls, and they are streamed: the 7B model never sits in
 * memory. Matrices are normal * 0.02 in the chosen type (falling back to f16
 * when a row does not fill whole quantisation blocks); RMSNorm weights are 1;
 * ViT LayerNorm weights are 1 + 0.05 * normal with biases 0.02 * normal so
 * that tests can tell a weight from a bias. Norms, biases and 1-D tensors
 * stay f32.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "ekv.h"
#include "kernels/kernels.h"
#include "model/gguf.h"

/* ------------------------------------------------------------------ */
/* presets                                                              */
/* ------------------------------------------------------------------ */

struct vit_preset {
    int image_size, patch_size, n_embd, n_layer, n_head, n_ff;
    float eps;
    int n_mm;          /* projector hidden width */
    int proj_dim;      /* CLIP's projection_dim, recorded as metadata only */
    bool use_gelu;     /* false: quick-GELU (CLIP ViT-L) */
    const int32_t *pinpoints; /* LLaVA-1.6 anyres: width, height pairs, or NULL */
    int n_pinpoints;          /* values (twice the pairs) */
    int scale_factor;         /* Idefics3/SmolVLM (SigLIP, pixel shuffle, one linear map); 0: LLaVA */
    int longest_edge;         /* Idefics3: clip.vision.preproc_image_size */
    int spatial_merge;        /* Qwen2-VL: each merge x merge block of patches is one token (0: not Qwen2-VL) */
    int wa_pattern;           /* Qwen2.5-VL: every wa_pattern-th block attends to the whole image, the
                                 others within windows (clip.vision.n_wa_pattern); RMSNorm and SwiGLU.
                                 0: Qwen2-VL (LayerNorm, quick-GELU MLP) */
};

/* Per-dimension RoPE factors a preset carries as tensors. */
enum rope_factors { RF_NONE, RF_LLAMA3, RF_LONGROPE };

/* Architecture details beyond the Llama shape. */
struct lm_details {
    int head_dim;             /* attention.key_length when not n_embd / n_head (Gemma) */
    int sliding_window;       /* attention.sliding_window (Mistral, Phi-3); 0 = none */
    bool fused_qkv;           /* blk.N.attn_qkv instead of attn_q/k/v (Phi-3) */
    bool fused_gate_up;       /* blk.N.ffn_up of 2 n_ff rows, gate first, no ffn_gate (Phi-3) */
    bool norm_jitter;         /* RMSNorm weights 1 + 0.05 normal instead of 1 (Gemma's stored 1 + w) */
    enum rope_factors rf;     /* rope_freqs (Llama 3: factor 32, low 1, high 4 over rope_orig_ctx)
                                 or rope_factors_long/short (Phi-3) */
    int rope_orig_ctx;        /* rope.scaling.original_context_length (0: none written) */
    float rope_attn_factor;   /* rope.scaling.attn_factor (0: none written) */
    const char *chat_template;/* tokenizer.chat_template, or NULL */
    int rope_sections[4];     /* Qwen2-VL M-RoPE: rope.dimension_sections (time, height, width, extra
                                 pairs); all 0 = one position per token */
};

struct lm_preset {
    const char *name;
    const char *arch; /* "llama", "qwen2", "qwen2vl", "phi3" or "gemma" */
    const char *desc;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_base, eps;
    bool qkv_bias, tied;
    const struct vit_preset *vit;
    const struct lm_details *det; /* NULL: plain Llama layout */
};

/* Excerpts of the published chat templates: enough for ekv's (and
 * llama.cpp's) detection of the family. */
#define TMPL_LLAMA3                                                                                           \
    "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + " \
    "message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"                  \
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
#define TMPL_MISTRAL                                                                                          \
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"                        \
    "{{ ' [INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'system' %}"               \
    "{{ ' [INST] ' + system_message + '\\n\\n' }}{% else %}{{ ' ' + message['content'] + eos_token }}"      \
    "{% endif %}{% endfor %}"
#define TMPL_PHI3                                                                                             \
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + '\\n' + message['content'] + "         \
    "'<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
#define TMPL_SMOLVLM                                                                                          \
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]"  \
    "['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}"         \
    "{% if line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}"       \
    "{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}"                 \
    "{{ 'Assistant:' }}{% endif %}"
/* Qwen2-VL-Instruct's template (ChatML; an image is
 * <|vision_start|><|image_pad|><|vision_end|> in the user's turn) */
#define TMPL_QWEN2VL                                                                                          \
    "{% set image_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and "          \
    "message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"  \
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"      \
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"      \
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}" \
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"  \
    "{% endif %}"
#define TMPL_GEMMA                                                                                            \
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' + "                    \
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"           \
    "{{'<start_of_turn>model\\n'}}{% endif %}"

static const struct lm_details k_llama32 = {.rf = RF_LLAMA3, .rope_orig_ctx = 8192, .chat_template = TMPL_LLAMA3};
static const struct lm_details k_mistral = {.sliding_window = 4096, .chat_template = TMPL_MISTRAL};
/* Phi-3-mini-128k: attn_factor = sqrt(1 + ln(131072 / 4096) / ln(4096)) as the converter writes it */
static const struct lm_details k_phi3 = {.sliding_window = 262144, .fused_qkv = true, .fused_gate_up = true,
                                         .rf = RF_LONGROPE, .rope_orig_ctx = 4096, .rope_attn_factor = 1.1902380714238083f,
                                         .chat_template = TMPL_PHI3};
static const struct lm_details k_smolvlm = {.chat_template = TMPL_SMOLVLM};
/* Qwen2-VL: M-RoPE over head_dim 128 (16 time, 24 height, 24 width pairs); the tiny one over 16 */
static const struct lm_details k_qwen2vl = {.chat_template = TMPL_QWEN2VL, .rope_sections = {16, 24, 24, 0}};
static const struct lm_details k_tiny_qwen2vl = {.norm_jitter = true, .chat_template = TMPL_QWEN2VL,
                                                 .rope_sections = {2, 3, 3, 0}};
static const struct lm_details k_gemma = {.head_dim = 256, .norm_jitter = true, .chat_template = TMPL_GEMMA};
/* small models with the same details, for tests and agreement checks */
static const struct lm_details k_tiny_llama3 = {.rf = RF_LLAMA3, .rope_orig_ctx = 8192, .norm_jitter = true,
                                                .chat_template = TMPL_LLAMA3};
static const struct lm_details k_tiny_mistral = {.sliding_window = 32, .norm_jitter = true, .chat_template = TMPL_MISTRAL};
static const struct lm_details k_tiny_phi3 = {.sliding_window = 0, .fused_qkv = true, .fused_gate_up = true,
                                              .norm_jitter = true, .rf = RF_LONGROPE, .rope_orig_ctx = 512,
                                              .rope_attn_factor = 1.1547005383792515f, .chat_template = TMPL_PHI3};
static const struct lm_details k_tiny_gemma = {.head_dim = 64, .norm_jitter = true, .chat_template = TMPL_GEMMA};

static const struct vit_preset k_vit_l14_336 = {336, 14, 1024, 24, 16, 4096, 1e-5f, 4096, 768, false, NULL, 0, 0, 0, 0, 0};
static const struct vit_preset k_vit_tiny = {56, 14, 64, 3, 4, 128, 1e-5f, 64, 64, false, NULL, 0, 0, 0, 0, 0};
/* LLaVA-1.6's grid pinpoints (llava-v1.6-vicuna-7b's config) and a small grid for tests */
static const int32_t k_pins_336[] = {336, 672, 672, 336, 672, 672, 1008, 336, 336, 1008};
static const int32_t k_pins_56[] = {112, 56, 56, 112, 112, 112};
static const struct vit_preset k_vit_l14_336_anyres = {336, 14, 1024, 24, 16, 4096, 1e-5f, 4096, 768, false,
                                                        k_pins_336, 10, 0, 0, 0, 0};
static const struct vit_preset k_vit_tiny_anyres = {56, 14, 64, 3, 4, 128, 1e-5f, 64, 64, false, k_pins_56, 6, 0, 0, 0, 0};
/* SmolVLM-256M's SigLIP (base, patch 16, 512 px) with scale factor 4 (64
 * tokens a tile), longest edge 2048; and a small one (32 px tiles of 4
 * tokens, up to 2 x 2 of them) for tests */
static const struct vit_preset k_vit_siglip_512 = {512, 16, 768, 12, 12, 3072, 1e-6f, 0, 0, true, NULL, 0, 4, 2048, 0, 0};
static const struct vit_preset k_vit_tiny_siglip = {32, 8, 64, 3, 4, 128, 1e-6f, 0, 0, true, NULL, 0, 2, 64, 0, 0};
/* Qwen2-VL-2B's tower (patch 14, two temporal conv halves, 2D RoPE, 2 x 2
 * patch merger into an MLP of 4 x 1280) and a small one (patch 8) for tests;
 * image_size is metadata only (the resolution is dynamic) */
static const struct vit_preset k_vit_qwen2vl_2b = {560, 14, 1280, 32, 16, 5120, 1e-6f, 5120, 0, false, NULL, 0, 0, 0, 2, 0};
static const struct vit_preset k_vit_tiny_qwen2vl = {64, 8, 64, 3, 4, 128, 1e-6f, 256, 0, false, NULL, 0, 0, 0, 2, 0};

/* Qwen2.5-VL-3B's tower (32 blocks of 1280, SwiGLU MLP of 3420, full attention
 * every 8th block, windows of 112 px elsewhere) and a small one for tests */
static const struct vit_preset k_vit_qwen25vl_3b = {560, 14, 1280, 32, 16, 3420, 1e-6f, 5120, 0, false, NULL, 0, 0, 0, 2, 8};
static const struct vit_preset k_vit_tiny_qwen25vl = {64, 8, 64, 3, 4, 128, 1e-6f, 256, 0, false, NULL, 0, 0, 0, 2, 2};

static const float k_clip_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
static const float k_clip_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
static const float k_siglip_half[3] = {0.5f, 0.5f, 0.5f};

static const struct lm_preset k_presets[] = {
    {"llava-1.5-7b", "llama", "LLaVA-1.5-7B (Vicuna-7B) + CLIP ViT-L/14-336 mmproj", 4096, 32, 32,
     32, 11008, 32000, 4096, 10000.0f, 1e-5f, false, false, &k_vit_l14_336, NULL},
    {"tiny-vlm", "llama", "stories260K-sized decoder + 56px ViT (16 patches), for tests", 64, 5, 8,
     4, 172, 512, 512, 10000.0f, 1e-5f, false, false, &k_vit_tiny, NULL},
    {"llava-1.6-7b", "llama", "LLaVA-1.6-7B (Vicuna-7B) + CLIP ViT-L/14-336 mmproj with anyres grid pinpoints", 4096,
     32, 32, 32, 11008, 32000, 4096, 10000.0f, 1e-5f, false, false, &k_vit_l14_336_anyres, NULL},
    {"tiny-llava16", "llama", "tiny-vlm with anyres pinpoints 112x56, 56x112, 112x112, for tests", 64, 5, 8, 4, 172,
     512, 2048, 10000.0f, 1e-5f, false, false, &k_vit_tiny_anyres, NULL},
    {"smolvlm-256m", "llama", "SmolVLM-256M-Instruct: SmolLM2-135M-shaped decoder + SigLIP-B/16-512 mmproj "
     "(idefics3: 64 tokens a 512 px tile, up to 4 x 4 tiles and the overview)", 576, 30, 9, 3, 1536, 49280, 8192,
     100000.0f, 1e-5f, false, true, &k_vit_siglip_512, &k_smolvlm},
    {"tiny-smolvlm", "llama", "tiny-vlm's decoder + a 32 px SigLIP-style idefics3 mmproj (4 tokens a tile, up to "
     "2 x 2 tiles and the overview), for tests", 64, 5, 8, 4, 172, 512, 2048, 10000.0f, 1e-5f, false, false,
     &k_vit_tiny_siglip, &k_smolvlm},
    {"qwen2-vl-2b", "qwen2vl", "Qwen2-VL-2B-Instruct: Qwen2-1.5B-shaped decoder with M-RoPE (sections 16/24/24) + "
     "its ViT (patch 14, dynamic resolution, 2 x 2 merger)", 1536, 28, 12, 2, 8960, 151936, 32768, 1000000.0f, 1e-6f,
     true, true, &k_vit_qwen2vl_2b, &k_qwen2vl},
    {"tiny-qwen2vl", "qwen2vl", "a small Qwen2-VL (M-RoPE sections 2/3/3 of head_dim 16) + a patch-8 Qwen2-VL "
     "tower, for tests", 64, 5, 4, 2, 172, 512, 2048, 10000.0f, 1e-6f, true, false, &k_vit_tiny_qwen2vl,
     &k_tiny_qwen2vl},
    {"qwen2.5-vl-3b", "qwen2vl", "Qwen2.5-VL-3B-Instruct: Qwen2.5-3B-shaped decoder with M-RoPE (sections "
     "16/24/24) + its ViT (SwiGLU, RMSNorm, window attention, 2 x 2 merger)", 2048, 36, 16, 2, 11008, 151936, 128000,
     1000000.0f, 1e-6f, true, true, &k_vit_qwen25vl_3b, &k_qwen2vl},
    {"tiny-qwen2.5vl", "qwen2vl", "tiny-qwen2vl's decoder + a patch-8 Qwen2.5-VL tower (windowed blocks 0 and 2), "
     "for tests", 64, 5, 4, 2, 172, 512, 2048, 10000.0f, 1e-6f, true, false, &k_vit_tiny_qwen25vl, &k_tiny_qwen2vl},
    {"tinyllama-1.1b", "llama", "TinyLlama-1.1B", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f,
     1e-5f, false, false, NULL, NULL},
    {"smollm2-135m", "llama", "SmolLM2-135M (tied embeddings)", 576, 30, 9, 3, 1536, 49152, 8192,
     100000.0f, 1e-5f, false, true, NULL, NULL},
    {"qwen2-0.5b", "qwen2", "Qwen2-0.5B (QKV biases, tied embeddings)", 896, 24, 14, 2, 4864,
     151936, 32768, 1000000.0f, 1e-6f, true, true, NULL, NULL},
    {"llama-3.2-1b", "llama", "Llama-3.2-1B (rope_freqs: Llama 3 scaling, tied embeddings)", 2048, 16, 32, 8, 8192,
     128256, 131072, 500000.0f, 1e-5f, false, true, NULL, &k_llama32},
    {"mistral-7b", "llama", "Mistral-7B v0.1 (sliding window 4096)", 4096, 32, 32, 8, 14336, 32000, 32768, 10000.0f,
     1e-5f, false, false, NULL, &k_mistral},
    {"phi-3-mini", "phi3", "Phi-3-mini-128k (fused QKV and gate-up, longrope)", 3072, 32, 32, 32, 8192, 32064, 131072,
     10000.0f, 1e-5f, false, false, NULL, &k_phi3},
    {"gemma-2b", "gemma", "Gemma-2B (head size 256, GeGLU, embeddings scaled by sqrt(n_embd), norms 1+w)", 2048,
     18, 8, 1, 16384, 256000, 8192, 10000.0f, 1e-6f, false, true, NULL, &k_gemma},
    {"tiny-llama3", "llama", "llama-3.2-1b's details at width 256, for tests", 256, 2, 4, 2, 512, 512, 4096, 500000.0f,
     1e-5f, false, true, NULL, &k_tiny_llama3},
    {"tiny-mistral", "llama", "mistral-7b's details at width 128, sliding window 32, for tests", 128, 2, 4, 2, 256,
     512, 2048, 10000.0f, 1e-5f, false, false, NULL, &k_tiny_mistral},
    {"tiny-phi3", "phi3", "phi-3-mini's details at width 128, longrope past 512, for tests", 128, 2, 4, 4, 256, 512,
     4096, 10000.0f, 1e-5f, false, false, NULL, &k_tiny_phi3},
    {"tiny-gemma", "gemma", "gemma-2b's details at width 128 (head size 64), for tests", 128, 2, 4, 1, 256, 512, 2048,
     10000.0f, 1e-6f, false, true, NULL, &k_tiny_gemma},
};

/* ------------------------------------------------------------------ */
/* deterministic random rows                                            */
/* ------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_str(const char *s) { /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Uniform in (0, 1). */
static double uniform01(uint64_t *s) { return ((double)(splitmix64(s) >> 11) + 0.5) / 9007199254740992.0; }

enum init_kind { INIT_NORMAL, INIT_ONES, INIT_ONES_JITTER, INIT_TABLE };

struct gen; /* shared row cache */

struct tspec {
    char name[64];
    enum ekv_dtype type;
    uint32_t n_dims;
    int64_t ne[4];
    enum init_kind init;
    float scale;
    float table[512];        /* INIT_TABLE: the values of a 1-D tensor of at most 512 */
    uint64_t seed;
    size_t row_bytes;
    struct gen *g;
};

struct gen {
    const struct tspec *cur; /* tensor whose row sits in q */
    int64_t row;
    float *f;                /* [ne0] */
    uint8_t *q;              /* [row_bytes] */
    size_t cap_f, cap_q;
};

static enum ekv_status gen_row(struct gen *g, const struct tspec *ts, int64_t row) {
    const int64_t n = ts->ne[0];
    if ((size_t)n > g->cap_f) {
        float *f = realloc(g->f, (size_t)n * sizeof *f);
        if (!f) return ekv_err(EKV_ERR_NOMEM, "mkmodel: row buffer");
        g->f = f;
        g->cap_f = (size_t)n;
    }
    if (ts->row_bytes > g->cap_q) {
        uint8_t *q = realloc(g->q, ts->row_bytes);
        if (!q) return ekv_err(EKV_ERR_NOMEM, "mkmodel: row buffer");
        g->q = q;
        g->cap_q = ts->row_bytes;
    }
    uint64_t st = ts->seed ^ ((uint64_t)row * 0xd1b54a32d192ed03ull);
    splitmix64(&st);
    for (int64_t i = 0; i < n; i += 2) {
        /* Box-Muller: two normals per two uniforms. */
        double u1 = uniform01(&st), u2 = uniform01(&st);
        double r = sqrt(-2.0 * log(u1));
        double z[2] = {r * cos(6.283185307179586 * u2), r * sin(6.283185307179586 * u2)};
        for (int k = 0; k < 2 && i + k < n; k++) {
            float v;
            switch (ts->init) {
            case INIT_ONES: v = 1.0f; break;
            case INIT_ONES_JITTER: v = 1.0f + ts->scale * (float)z[k]; break;
            case INIT_TABLE: v = ts->table[i + k]; break;
            default: v = ts->scale * (float)z[k]; break;
            }
            g->f[i + k] = v;
        }
    }
    if (ts->type == EKV_F32) {
        memcpy(g->q, g->f, (size_t)n * sizeof(float));
    } else if (ts->type == EKV_F16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = ekv_f32_to_fp16(g->f[i]);
            memcpy(g->q + 2 * i, &h, 2);
        }
    } else {
        enum ekv_status s = ekv_quantize_row(ts->type, g->f, g->q, n);
        if (s != EKV_OK) return ekv_err_prefix(s, "mkmodel: tensor %s", ts->name);
    }
    g->cur = ts;
    g->row = row;
    return EKV_OK;
}

static enum ekv_status fill_tensor(void *user, const struct ekv_gguf_tensor *t, uint64_t offset,
                                   void *dst, size_t n) {
    (void)t;
    const struct tspec *ts = user;
    struct gen *g = ts->g;
    uint8_t *out = dst;
    while (n > 0) {
        int64_t row = (int64_t)(offset / ts->row_bytes);
        size_t within = (size_t)(offset % ts->row_bytes);
        if (g->cur != ts || g->row != row) {
            enum ekv_status s = gen_row(g, ts, row);
            if (s != EKV_OK) return s;
        }
        size_t k = EKV_MIN(n, ts->row_bytes - within);
        memcpy(out, g->q + within, k);
        out += k;
        offset += k;
        n -= k;
    }
    return EKV_OK;
}

/* ------------------------------------------------------------------ */
/* building the tensor lists                                            */
/* ------------------------------------------------------------------ */

struct builder {
    struct ekv_gguf_writer *w;
    struct tspec *specs; /* fixed capacity, addresses stay valid for the writer */
    size_t n, cap;
    struct gen *g;
    uint64_t seed;
    enum ekv_dtype mat_type;
};

/* Adds a tensor; 1-D tensors are f32, matrices `type` (or f16 when a row
 * does not fill whole blocks of it). */
static enum ekv_status add(struct builder *b, const char *name, uint32_t n_dims, const int64_t *ne,
                           enum ekv_dtype type, enum init_kind init, float scale) {
    if (b->n == b->cap) return ekv_err(EKV_ERR_INTERNAL, "mkmodel: tensor table full at %s", name);
    struct tspec *ts = &b->specs[b->n];
    memset(ts, 0, sizeof *ts);
    snprintf(ts->name, sizeof ts->name, "%s", name);
    if (n_dims == 1) type = EKV_F32;
    const struct ekv_dtype_info *di = ekv_dtype_get(type);
    if (di && ne[0] % (int64_t)di->block_size != 0) type = EKV_F16;
    ts->type = type;
    ts->n_dims = n_dims;
    for (int d = 0; d < 4; d++) ts->ne[d] = d < (int)n_dims ? ne[d] : 1;
    ts->init = init;
    ts->scale = scale;
    ts->seed = b->seed ^ hash_str(name);
    ts->g = b->g;
    if (!ekv_dtype_row_bytes(type, ne[0], &ts->row_bytes))
        return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: tensor %s: bad row of %lld for %s", name,
                       (long long)ne[0], ekv_dtype_name(type));
    enum ekv_status s = ekv_gguf_writer_add_tensor(b->w, ts->name, type, n_dims, ts->ne, NULL,
                                               fill_tensor, ts);
    if (s == EKV_OK) b->n++;
    return s;
}

static enum ekv_status add_vec(struct builder *b, const char *name, int64_t n, enum init_kind init,
                               float scale) {
    return add(b, name, 1, &n, EKV_F32, init, scale);
}

/* A 1-D f32 tensor with the given values (n <= 512). */
static enum ekv_status add_table(struct builder *b, const char *name, const float *vals, int64_t n) {
    if (n > 512) return ekv_err(EKV_ERR_INTERNAL, "mkmodel: table %s of %lld values", name, (long long)n);
    enum ekv_status s = add(b, name, 1, &n, EKV_F32, INIT_TABLE, 0.0f);
    if (s == EKV_OK) memcpy(b->specs[b->n - 1].table, vals, (size_t)n * sizeof *vals);
    return s;
}

static enum ekv_status add_mat(struct builder *b, const char *name, int64_t in, int64_t out,
                               enum ekv_dtype type) {
    int64_t ne[2] = {in, out};
    return add(b, name, 2, ne, type, INIT_NORMAL, 0.02f);
}

static uint32_t file_type_of(enum ekv_dtype t) {
    switch (t) {
    case EKV_F32: return 0;
    case EKV_F16: return 1;
    case EKV_Q4_0: return 2;
    case EKV_Q8_0: return 7;
    default: return 1;
    }
}

/* Command-line changes to a preset (0 / NULL / -1: the preset's value). */
struct mk_opts {
    int n_layer;
    int n_layer_vision;       /* 0: the preset's */
    int n_ctx;
    const char *rope_scaling; /* "none", "linear", "yarn": writes rope.scaling.type */
    float rope_factor;        /* rope.scaling.factor */
    int rope_orig_ctx;        /* rope.scaling.original_context_length */
    int sliding_window;       /* -1: preset */
};

#define TRY(expr) do { enum ekv_status s_ = (expr); if (s_ != EKV_OK) return s_; } while (0)

/* SmolVLM's added tokens (its chat turns and image separators), put at
 * the end of a generated vocabulary for the idefics3 presets; "\n\n" is a
 * plain piece so that mtmd's separator lookup finds it as in SmolLM2's
 * byte-level BPE vocabulary. */
#define SMOLVLM_N_EXTRA (6 + 36)
static void smolvlm_extra(int i, char *p, size_t n, int32_t *type) {
    static const char *const fixed[6] = {"<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
                                         "<image>", "<global-img>", "\n\n"};
    *type = i == 5 ? 1 : 3;
    if (i < 6) snprintf(p, n, "%s", fixed[i]);
    else snprintf(p, n, "<row_%d_col_%d>", (i - 6) / 6 + 1, (i - 6) % 6 + 1);
}

/* Qwen2-VL's added tokens (ChatML turns, the image brackets); <|im_end|>
 * ends a turn. */
#define QWEN2VL_N_EXTRA 6
static void qwen2vl_extra(int i, char *p, size_t n, int32_t *type) {
    static const char *const fixed[QWEN2VL_N_EXTRA] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                       "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"};
    *type = 3;
    snprintf(p, n, "%s", fixed[i]);
}

/* Which added tokens a generated vocabulary ends with. */
enum vocab_extra { VX_NONE, VX_SMOLVLM, VX_QWEN2VL };

/* A minimal SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens,
 * then "<tok_N>" pieces up to n_vocab; with extras, the family's added
 * tokens last, its end-of-turn token the end of generation and no BOS
 * added (the templates open with <|im_start|>). */
static enum ekv_status gen_vocab(struct ekv_gguf_writer *w, int n_vocab, enum vocab_extra vx) {
    const int n_extra = vx == VX_SMOLVLM ? SMOLVLM_N_EXTRA : vx == VX_QWEN2VL ? QWEN2VL_N_EXTRA : 0;
    if (n_vocab < 3 + 256 + n_extra)
        return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: vocabulary of %d is too small", n_vocab);
    char **strs = calloc((size_t)n_vocab, sizeof *strs);
    char *pool = malloc((size_t)n_vocab * 32);
    float *scores = malloc((size_t)n_vocab * sizeof *scores);
    int32_t *types = malloc((size_t)n_vocab * sizeof *types);
    enum ekv_status s = EKV_OK;
    if (!strs || !pool || !scores || !types) {
        s = ekv_err(EKV_ERR_NOMEM, "mkmodel: vocabulary");
        goto out;
    }
    for (int i = 0; i < n_vocab; i++) {
        char *p = pool + (size_t)i * 32;
        strs[i] = p;
        if (i == 0) { strcpy(p, "<unk>"); types[i] = 2; scores[i] = 0.0f; }
        else if (i == 1) { strcpy(p, "<s>"); types[i] = 3; scores[i] = 0.0f; }
        else if (i == 2) { strcpy(p, "</s>"); types[i] = 3; scores[i] = 0.0f; }
        else if (i < 3 + 256) { snprintf(p, 32, "<0x%02X>", i - 3); types[i] = 6; scores[i] = 0.0f; }
        else if (i >= n_vocab - n_extra) {
            if (vx == VX_SMOLVLM) smolvlm_extra(i - (n_vocab - n_extra), p, 32, &types[i]);
            else qwen2vl_extra(i - (n_vocab - n_extra), p, 32, &types[i]);
            scores[i] = 0.0f;
        }
        else { snprintf(p, 32, "<tok_%d>", i); types[i] = 1; scores[i] = -(float)(i - 259); }
    }
    /* <end_of_utterance> (SmolVLM), <|im_end|> (Qwen2-VL) */
    const uint32_t eos = vx == VX_NONE ? 2u : (uint32_t)(n_vocab - n_extra + (vx == VX_SMOLVLM ? 1 : 2));
    if ((s = ekv_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama")) ||
        (s = ekv_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)strs, (uint64_t)n_vocab)) ||
        (s = ekv_gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)n_vocab)) ||
        (s = ekv_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n_vocab)) ||
        (s = ekv_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
        (s = ekv_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
        (s = ekv_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", eos)) ||
        (s = ekv_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", vx == VX_NONE)) ||
        (s = ekv_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false)))
        goto out;
out:
    free(strs);
    free(pool);
    free(scores);
    free(types);
    return s;
}

/* Copies every tokenizer.* key from a vocabulary GGUF; *n_vocab gets the
 * token count. */
static enum ekv_status copy_vocab(struct ekv_gguf_writer *w, const struct ekv_gguf_file *vf,
                                  const char *path, int *n_vocab) {
    const struct ekv_gguf_value *toks;
    enum ekv_status s = ekv_gguf_get_arr(vf, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s", path);
    if (toks->v.arr.n < 1 || toks->v.arr.n > (1u << 24))
        return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", path,
                       (unsigned long long)toks->v.arr.n);
    *n_vocab = (int)toks->v.arr.n;
    for (size_t i = 0; i < ekv_gguf_n_kv(vf); i++) {
        const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(vf, i);
        if (kv->key.len >= 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0)
            TRY(ekv_gguf_writer_copy_kv(w, kv));
    }
    return EKV_OK;
}

/* Llama 3's rope_freqs as llama.cpp's converter computes them (factor 32,
 * low_freq_factor 1, high_freq_factor 4, over the original context). */
static void llama3_factors(int hd, double base, int orig_ctx, float *out) {
    const double factor = 32.0, lo = 1.0, hi = 4.0;
    const double lo_wavelen = orig_ctx / lo, hi_wavelen = orig_ctx / hi;
    for (int i = 0; i < hd / 2; i++) {
        double freq = 1.0 / pow(base, 2.0 * i / hd), wavelen = 2.0 * M_PI / freq;
        if (wavelen < hi_wavelen) out[i] = 1.0f;
        else if (wavelen > lo_wavelen) out[i] = (float)factor;
        else {
            double smooth = (orig_ctx / wavelen - lo) / (hi - lo);
            out[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
}

/* Longrope factors shaped like Phi-3-mini-128k's: short ones near 1, long
 * ones growing from 1 to about 60 over the dimensions. */
static void longrope_factors(int hd, bool lng, float *out) {
    const int n = hd / 2;
    for (int i = 0; i < n; i++) {
        double t = n > 1 ? (double)i / (n - 1) : 0.0;
        out[i] = (float)(lng ? 1.0 + 59.0 * t * t : 1.0 + 0.1 * t);
    }
}

static enum ekv_status build_lm(struct builder *b, const struct lm_preset *p, int n_vocab, const struct mk_opts *o) {
    struct ekv_gguf_writer *w = b->w;
    char key[128], name[160];
    const char *a = p->arch;
    static const struct lm_details plain = {0};
    const struct lm_details *d = p->det ? p->det : &plain;
    const int hd = d->head_dim ? d->head_dim : p->n_embd / p->n_head;
    const int n_layer = o->n_layer ? o->n_layer : p->n_layer;
    const int n_ctx = o->n_ctx ? o->n_ctx : p->n_ctx;
    const int swa = o->sliding_window >= 0 ? o->sliding_window : d->sliding_window;
    const enum init_kind norm_init = d->norm_jitter ? INIT_ONES_JITTER : INIT_ONES;
    TRY(ekv_gguf_writer_set_str(w, "general.architecture", a));
    snprintf(name, sizeof name, "ekv-mkmodel %s (random weights)", p->name);
    TRY(ekv_gguf_writer_set_str(w, "general.name", name));
    TRY(ekv_gguf_writer_set_u32(w, "general.file_type", file_type_of(b->mat_type)));
    if (b->mat_type == EKV_Q4_0 || b->mat_type == EKV_Q8_0)
        TRY(ekv_gguf_writer_set_u32(w, "general.quantization_version", 2));
#define SETU(suffix, v) do { snprintf(key, sizeof key, "%s." suffix, a); TRY(ekv_gguf_writer_set_u32(w, key, (uint32_t)(v))); } while (0)
#define SETF(suffix, v) do { snprintf(key, sizeof key, "%s." suffix, a); TRY(ekv_gguf_writer_set_f32(w, key, (v))); } while (0)
    SETU("context_length", n_ctx);
    SETU("embedding_length", p->n_embd);
    SETU("block_count", n_layer);
    SETU("feed_forward_length", p->n_ff);
    SETU("attention.head_count", p->n_head);
    SETU("attention.head_count_kv", p->n_head_kv);
    SETF("attention.layer_norm_rms_epsilon", p->eps);
    SETF("rope.freq_base", p->rope_base);
    SETU("rope.dimension_count", hd);
    SETU("vocab_size", n_vocab);
    if (d->head_dim) {
        SETU("attention.key_length", hd);
        SETU("attention.value_length", hd);
    }
    if (swa > 0) SETU("attention.sliding_window", swa);
    if (d->rope_sections[0] || d->rope_sections[1] || d->rope_sections[2]) {
        snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
        TRY(ekv_gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, d->rope_sections, 4));
    }
    if (d->rf == RF_LONGROPE) {
        SETU("rope.scaling.original_context_length", o->rope_orig_ctx ? o->rope_orig_ctx : d->rope_orig_ctx);
        SETF("rope.scaling.attn_factor", d->rope_attn_factor);
    }
    if (o->rope_scaling) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        TRY(ekv_gguf_writer_set_str(w, key, o->rope_scaling));
        if (o->rope_factor > 0.0f) SETF("rope.scaling.factor", o->rope_factor);
        if (o->rope_orig_ctx > 0 && d->rf != RF_LONGROPE) SETU("rope.scaling.original_context_length", o->rope_orig_ctx);
    }
    if (d->chat_template) TRY(ekv_gguf_writer_set_str(w, "tokenizer.chat_template", d->chat_template));
#undef SETU
#undef SETF
    const int64_t E = p->n_embd, KV = (int64_t)p->n_head_kv * hd, Q = (int64_t)p->n_head * hd;
    TRY(add_mat(b, "token_embd.weight", E, n_vocab, b->mat_type));
    float fac[512];
    if (d->rf == RF_LLAMA3) {
        llama3_factors(hd, p->rope_base, d->rope_orig_ctx, fac);
        TRY(add_table(b, "rope_freqs.weight", fac, hd / 2));
    } else if (d->rf == RF_LONGROPE) {
        longrope_factors(hd, true, fac);
        TRY(add_table(b, "rope_factors_long.weight", fac, hd / 2));
        longrope_factors(hd, false, fac);
        TRY(add_table(b, "rope_factors_short.weight", fac, hd / 2));
    }
    for (int il = 0; il < n_layer; il++) {
#define NM(fmt) (snprintf(name, sizeof name, "blk.%d." fmt, il), name)
        TRY(add_vec(b, NM("attn_norm.weight"), E, norm_init, 0.05f));
        if (d->fused_qkv) {
            TRY(add_mat(b, NM("attn_qkv.weight"), E, Q + 2 * KV, b->mat_type));
        } else {
            TRY(add_mat(b, NM("attn_q.weight"), E, Q, b->mat_type));
            TRY(add_mat(b, NM("attn_k.weight"), E, KV, b->mat_type));
            TRY(add_mat(b, NM("attn_v.weight"), E, KV, b->mat_type));
        }
        if (p->qkv_bias) {
            TRY(add_vec(b, NM("attn_q.bias"), Q, INIT_NORMAL, 0.02f));
            TRY(add_vec(b, NM("attn_k.bias"), KV, INIT_NORMAL, 0.02f));
            TRY(add_vec(b, NM("attn_v.bias"), KV, INIT_NORMAL, 0.02f));
        }
        TRY(add_mat(b, NM("attn_output.weight"), Q, E, b->mat_type));
        TRY(add_vec(b, NM("ffn_norm.weight"), E, norm_init, 0.05f));
        if (d->fused_gate_up) {
            TRY(add_mat(b, NM("ffn_up.weight"), E, 2 * (int64_t)p->n_ff, b->mat_type));
        } else {
            TRY(add_mat(b, NM("ffn_gate.weight"), E, p->n_ff, b->mat_type));
            TRY(add_mat(b, NM("ffn_up.weight"), E, p->n_ff, b->mat_type));
        }
        TRY(add_mat(b, NM("ffn_down.weight"), p->n_ff, E, b->mat_type));
#undef NM
    }
    TRY(add_vec(b, "output_norm.weight", E, norm_init, 0.05f));
    if (!p->tied) TRY(add_mat(b, "output.weight", E, n_vocab, b->mat_type));
    return EKV_OK;
}

static enum ekv_status build_mmproj(struct builder *b, const struct lm_preset *p, const struct mk_opts *o) {
    struct ekv_gguf_writer *w = b->w;
    const struct vit_preset *v = p->vit;
    const int n_vlayer = o->n_layer_vision ? o->n_layer_vision : v->n_layer;
    char name[160];
    /* Small tensors (patch and position embeddings) stay f16 as the
     * converter writes them; f32 when everything is f32. */
    const enum ekv_dtype small = b->mat_type == EKV_F32 ? EKV_F32 : EKV_F16;
    TRY(ekv_gguf_writer_set_str(w, "general.architecture", "clip"));
    snprintf(name, sizeof name, "ekv-mkmodel %s mmproj (random weights)", p->name);
    TRY(ekv_gguf_writer_set_str(w, "general.name", name));
    const bool idefics3 = v->scale_factor > 0, qwen2vl = v->spatial_merge > 0, qwen25 = qwen2vl && v->wa_pattern > 0;
    TRY(ekv_gguf_writer_set_str(w, "general.description", idefics3 ? "image encoder for SmolVLM"
                                                          : qwen25 ? "image encoder for Qwen2.5-VL"
                                                          : qwen2vl ? "image encoder for Qwen2-VL"
                                                                    : "image encoder for LLaVA"));
    TRY(ekv_gguf_writer_set_u32(w, "general.file_type", file_type_of(b->mat_type)));
    TRY(ekv_gguf_writer_set_bool(w, "clip.has_text_encoder", false));
    TRY(ekv_gguf_writer_set_bool(w, "clip.has_vision_encoder", true));
    if (qwen2vl) {
        TRY(ekv_gguf_writer_set_str(w, "clip.projector_type", qwen25 ? "qwen2.5vl_merger" : "qwen2vl_merger"));
        TRY(ekv_gguf_writer_set_u32(w, "clip.vision.spatial_merge_size", (uint32_t)v->spatial_merge));
        if (qwen25) { /* what the converter writes for Qwen2.5-VL: SiLU (SwiGLU) and the window pattern */
            TRY(ekv_gguf_writer_set_bool(w, "clip.use_silu", true));
            TRY(ekv_gguf_writer_set_u32(w, "clip.vision.n_wa_pattern", (uint32_t)v->wa_pattern));
        }
    } else if (idefics3) {
        TRY(ekv_gguf_writer_set_str(w, "clip.projector_type", "idefics3"));
        TRY(ekv_gguf_writer_set_u32(w, "clip.vision.projector.scale_factor", (uint32_t)v->scale_factor));
        TRY(ekv_gguf_writer_set_u32(w, "clip.vision.preproc_image_size", (uint32_t)v->longest_edge));
    } else {
        TRY(ekv_gguf_writer_set_bool(w, "clip.has_llava_projector", true));
        TRY(ekv_gguf_writer_set_str(w, "clip.projector_type", "mlp"));
    }
    TRY(ekv_gguf_writer_set_u32(w, "clip.vision.image_size", (uint32_t)v->image_size));
    TRY(ekv_gguf_writer_set_u32(w, "clip.vision.patch_size", (uint32_t)v->patch_size));
    TRY(ekv_gguf_writer_set_u32(w, "clip.vision.embedding_length", (uint32_t)v->n_embd));
    TRY(ekv_gguf_writer_set_u32(w, "clip.vision.feed_forward_length", (uint32_t)v->n_ff));
    /* llama.cpp's converter writes the language model's width for SigLIP towers */
    TRY(ekv_gguf_writer_set_u32(w, "clip.vision.projection_dim", (uint32_t)(idefics3 || qwen2vl ? p->n_embd : v->proj_dim)));
    TRY(ekv_gguf_writer_set_u32(w, "clip.vision.attention.head_count", (uint32_t)v->n_head));
    TRY(ekv_gguf_writer_set_f32(w, "clip.vision.attention.layer_norm_epsilon", v->eps));
    TRY(ekv_gguf_writer_set_u32(w, "clip.vision.block_count", (uint32_t)n_vlayer));
    TRY(ekv_gguf_writer_set_arr(w, "clip.vision.image_mean", GGUF_TYPE_FLOAT32, idefics3 ? k_siglip_half : k_clip_mean, 3));
    TRY(ekv_gguf_writer_set_arr(w, "clip.vision.image_std", GGUF_TYPE_FLOAT32, idefics3 ? k_siglip_half : k_clip_std, 3));
    if (!qwen25) TRY(ekv_gguf_writer_set_bool(w, "clip.use_gelu", v->use_gelu));
    if (v->pinpoints) {
        TRY(ekv_gguf_writer_set_arr(w, "clip.vision.image_grid_pinpoints", GGUF_TYPE_INT32, v->pinpoints,
                                    (uint64_t)v->n_pinpoints));
        TRY(ekv_gguf_writer_set_str(w, "clip.vision.mm_patch_merge_type", "spatial_unpad"));
    }

    const int64_t E = v->n_embd, grid = v->image_size / v->patch_size;
    int64_t pne[4] = {v->patch_size, v->patch_size, 3, E};
    TRY(add(b, "v.patch_embd.weight", 4, pne, small, INIT_NORMAL, 0.02f));
    if (qwen2vl) {
        /* the Conv3D's two temporal halves (a still image feeds both), no
         * bias, no class token, no position table (2D RoPE); the merger's
         * LayerNorm, then its MLP over 2 x 2 patches */
        TRY(add(b, "v.patch_embd.weight.1", 4, pne, small, INIT_NORMAL, 0.02f));
        TRY(add_vec(b, "v.post_ln.weight", E, INIT_ONES_JITTER, 0.05f));
        if (!qwen25) TRY(add_vec(b, "v.post_ln.bias", E, INIT_NORMAL, 0.02f)); /* RMSNorm: no bias */
        const int64_t M = (int64_t)v->spatial_merge * v->spatial_merge;
        TRY(add_mat(b, "mm.0.weight", E * M, v->n_mm, b->mat_type));
        TRY(add_vec(b, "mm.0.bias", v->n_mm, INIT_NORMAL, 0.02f));
        TRY(add_mat(b, "mm.2.weight", v->n_mm, p->n_embd, b->mat_type));
        TRY(add_vec(b, "mm.2.bias", p->n_embd, INIT_NORMAL, 0.02f));
    } else if (idefics3) {
        /* SigLIP: patch bias, no class token, no pre-layernorm; post-layernorm; the
         * connector's linear map from the shuffled width, no bias */
        TRY(add_vec(b, "v.patch_embd.bias", E, INIT_NORMAL, 0.02f));
        int64_t posne[2] = {E, grid * grid};
        TRY(add(b, "v.position_embd.weight", 2, posne, small, INIT_NORMAL, 0.02f));
        TRY(add_vec(b, "v.post_ln.weight", E, INIT_ONES_JITTER, 0.05f));
        TRY(add_vec(b, "v.post_ln.bias", E, INIT_NORMAL, 0.02f));
        TRY(add_mat(b, "mm.model.fc.weight", E * v->scale_factor * v->scale_factor, p->n_embd, b->mat_type));
    } else {
        TRY(add_mat(b, "mm.0.weight", E, v->n_mm, b->mat_type));
        TRY(add_vec(b, "mm.0.bias", v->n_mm, INIT_NORMAL, 0.02f));
        TRY(add_mat(b, "mm.2.weight", v->n_mm, p->n_embd, b->mat_type));
        TRY(add_vec(b, "mm.2.bias", p->n_embd, INIT_NORMAL, 0.02f));
        TRY(add_vec(b, "v.class_embd", E, INIT_NORMAL, 0.02f));
        int64_t posne[2] = {E, grid * grid + 1};
        TRY(add(b, "v.position_embd.weight", 2, posne, small, INIT_NORMAL, 0.02f));
        TRY(add_vec(b, "v.pre_ln.weight", E, INIT_ONES_JITTER, 0.05f));
        TRY(add_vec(b, "v.pre_ln.bias", E, INIT_NORMAL, 0.02f));
    }
    for (int il = 0; il < n_vlayer; il++) {
#define NM(fmt) (snprintf(name, sizeof name, "v.blk.%d." fmt, il), name)
        static const char *const att[4] = {"attn_k", "attn_v", "attn_q", "attn_out"};
        for (int k = 0; k < 4; k++) {
            char wn[96], bn[96];
            snprintf(wn, sizeof wn, "v.blk.%d.%s.weight", il, att[k]);
            snprintf(bn, sizeof bn, "v.blk.%d.%s.bias", il, att[k]);
            TRY(add_mat(b, wn, E, E, b->mat_type));
            TRY(add_vec(b, bn, E, INIT_NORMAL, 0.02f));
        }
        TRY(add_vec(b, NM("ln1.weight"), E, INIT_ONES_JITTER, 0.05f));
        if (!qwen25) TRY(add_vec(b, NM("ln1.bias"), E, INIT_NORMAL, 0.02f));
        if (qwen25) { /* SwiGLU: the gate beside up, both with biases */
            TRY(add_mat(b, NM("ffn_gate.weight"), E, v->n_ff, b->mat_type));
            TRY(add_vec(b, NM("ffn_gate.bias"), v->n_ff, INIT_NORMAL, 0.02f));
        }
        /* fc1 is "ffn_down" and fc2 "ffn_up" in llama.cpp's LLaVA converter;
         * its current converter (SigLIP) names them the other way round */
        const char *fc1 = idefics3 || qwen2vl ? "ffn_up" : "ffn_down", *fc2 = idefics3 || qwen2vl ? "ffn_down" : "ffn_up";
        char wn[96], bn[96];
        snprintf(wn, sizeof wn, "v.blk.%d.%s.weight", il, fc1);
        snprintf(bn, sizeof bn, "v.blk.%d.%s.bias", il, fc1);
        TRY(add_mat(b, wn, E, v->n_ff, b->mat_type));
        TRY(add_vec(b, bn, v->n_ff, INIT_NORMAL, 0.02f));
        snprintf(wn, sizeof wn, "v.blk.%d.%s.weight", il, fc2);
        snprintf(bn, sizeof bn, "v.blk.%d.%s.bias", il, fc2);
        TRY(add_mat(b, wn, v->n_ff, E, b->mat_type));
        TRY(add_vec(b, bn, E, INIT_NORMAL, 0.02f));
        TRY(add_vec(b, NM("ln2.weight"), E, INIT_ONES_JITTER, 0.05f));
        if (!qwen25) TRY(add_vec(b, NM("ln2.bias"), E, INIT_NORMAL, 0.02f));
#undef NM
    }
    return EKV_OK;
}

/* Writes one file: the language model (mmproj false) or the vision tower. */
static enum ekv_status write_file(const struct lm_preset *p, bool mmproj, enum ekv_dtype type,
                                  uint64_t seed, const char *vocab_path, const char *out,
                                  const struct mk_opts *o, size_t *n_tensors) {
    struct gen g = {0};
    struct builder b = {0};
    struct ekv_gguf_file *vf = NULL;
    enum ekv_status s = ekv_gguf_writer_new(&b.w);
    if (s != EKV_OK) return s;
    b.cap = 64 + (size_t)(mmproj ? (o->n_layer_vision ? o->n_layer_vision : p->vit->n_layer)
                                 : (o->n_layer ? o->n_layer : p->n_layer)) * 20;
    b.specs = calloc(b.cap, sizeof *b.specs);
    b.g = &g;
    b.seed = seed * 0x9e3779b97f4a7c15ull + (mmproj ? 0x5bd1e995u : 0);
    b.mat_type = type;
    if (!b.specs) {
        s = ekv_err(EKV_ERR_NOMEM, "mkmodel: tensor table");
        goto done;
    }
    if (mmproj) {
        s = build_mmproj(&b, p, o);
    } else {
        int n_vocab = p->n_vocab;
        if (vocab_path) {
            if ((s = ekv_gguf_open(vocab_path, &vf)) != EKV_OK) goto done;
            if ((s = copy_vocab(b.w, vf, vocab_path, &n_vocab)) != EKV_OK) goto done;
        } else if ((s = gen_vocab(b.w, n_vocab,
                                  !p->vit                        ? VX_NONE
                                  : p->vit->scale_factor > 0     ? VX_SMOLVLM
                                  : p->vit->spatial_merge > 0    ? VX_QWEN2VL
                                                                 : VX_NONE)) != EKV_OK) {
            goto done;
        }
        s = build_lm(&b, p, n_vocab, o);
    }
    if (s == EKV_OK) s = ekv_gguf_writer_write(b.w, out);
    if (s == EKV_OK) *n_tensors = b.n;
done:
    ekv_gguf_writer_free(b.w);
    ekv_gguf_close(vf);
    free(b.specs);
    free(g.f);
    free(g.q);
    return s;
}


/* ------------------------------------------------------------------ */
/* public entry points                                                  */
/* ------------------------------------------------------------------ */

struct ekv_mkmodel_params ekv_mkmodel_default_params(void) {
    return (struct ekv_mkmodel_params){.type = "f16", .seed = 1, .sliding_window = -1};
}

const char *ekv_mkmodel_preset(int32_t i, const char **desc, bool *vision) {
    if (i < 0 || (size_t)i >= EKV_ARRAY_LEN(k_presets)) return NULL;
    if (desc) *desc = k_presets[i].desc;
    if (vision) *vision = k_presets[i].vit != NULL;
    return k_presets[i].name;
}

/* Checks the parameters and finds the preset and the matrix type. */
static enum ekv_status mk_check(const struct ekv_mkmodel_params *p, const char *path, const char *mmproj_path,
                                const struct lm_preset **preset, enum ekv_dtype *type) {
    if (!p || !p->preset) return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: a preset is required");
    if (!path || !path[0]) return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: an output path is required");
    *preset = NULL;
    for (size_t i = 0; i < EKV_ARRAY_LEN(k_presets); i++)
        if (!strcmp(p->preset, k_presets[i].name)) *preset = &k_presets[i];
    if (!*preset) return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: unknown preset '%s'", p->preset);
    const char *t = p->type ? p->type : "f16";
    if (!ekv_dtype_from_name(t, type) || (*type != EKV_F32 && *type != EKV_F16 && *type != EKV_Q8_0 && *type != EKV_Q4_0))
        return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: type '%s' is not one of f32, f16, q8_0, q4_0", t);
    if (mmproj_path && !(*preset)->vit)
        return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: preset %s has no vision tower (no mmproj path)", p->preset);
    const bool longrope = (*preset)->det && (*preset)->det->rf == RF_LONGROPE;
    if ((p->rope_factor > 0.0f || p->rope_orig_ctx > 0) && !p->rope_scaling && !longrope)
        return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: rope factor and original context need a rope scaling type");
    if (p->n_layer_vision && !(*preset)->vit)
        return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: preset %s has no vision tower (--vision-layers)", p->preset);
    if (p->n_layer_vision < 0 || p->n_layer_vision > 4096 || p->n_layer < 0 || p->n_layer > 4096 || p->n_ctx < 0 || p->rope_orig_ctx < 0 || p->rope_factor < 0.0f)
        return ekv_err(EKV_ERR_INVALID_ARG, "mkmodel: n_layer %d, n_ctx %d, rope factor %g or original context %d "
                                            "out of range", (int)p->n_layer, (int)p->n_ctx, (double)p->rope_factor,
                       (int)p->rope_orig_ctx);
    return EKV_OK;
}

enum ekv_status ekv_mkmodel_write(const struct ekv_mkmodel_params *params, const char *path, const char *mmproj_path,
                                  struct ekv_mkmodel_result *result) {
    const struct lm_preset *p = NULL;
    enum ekv_dtype type = EKV_F16;
    enum ekv_status s = mk_check(params, path, mmproj_path, &p, &type);
    if (s != EKV_OK) return s;
    char *derived = NULL;
    if (p->vit && !mmproj_path) {
        size_t n = strlen(path);
        if (n >= 5 && !strcmp(path + n - 5, ".gguf")) n -= 5;
        if (!(derived = malloc(n + 13))) return ekv_err(EKV_ERR_NOMEM, "mkmodel: no memory for the mmproj path");
        memcpy(derived, path, n);
        memcpy(derived + n, ".mmproj.gguf", 13);
        mmproj_path = derived;
    }
    const struct mk_opts o = {.n_layer = params->n_layer, .n_ctx = params->n_ctx, .rope_scaling = params->rope_scaling,
                              .rope_factor = params->rope_factor, .rope_orig_ctx = params->rope_orig_ctx,
                              .sliding_window = params->sliding_window, .n_layer_vision = params->n_layer_vision};
    size_t nt = 0, nt_mm = 0;
    s = write_file(p, false, type, params->seed, params->vocab_path, path, &o, &nt);
    if (s == EKV_OK && p->vit) {
        s = write_file(p, true, type, params->seed, NULL, mmproj_path, &o, &nt_mm);
        if (s != EKV_OK) (void)remove(path); /* no half of a model pair */
    }
    free(derived);
    if (s == EKV_OK && result) *result = (struct ekv_mkmodel_result){(int32_t)nt, (int32_t)nt_mm};
    return s;
}
