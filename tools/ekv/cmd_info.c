/*
 * cmd_info.c — `ekv info`: what a model file holds: format, architecture,
 * hyper-parameters, full KV-cache bytes per token, GGUF metadata and the
 * tensors with their types and shapes.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *const CMD = "info";

static const struct cli_help k_help = {
    "usage: ekv info [-m FILE] [--no-tensors] [--no-metadata]\n       ekv info --devices",
    "Describes a GGUF or llama2.c model: hyper-parameters, KV-cache bytes per token,\n"
    "GGUF metadata and tensors (type, shape, bytes). Any GGUF (vocabulary-only files and\n"
    "mmproj files too) is listed.",
    NULL,
};

static int info_gguf(const char *path, bool tensors, bool metadata) {
    struct ekv_gguf_file *f = NULL;
    enum ekv_status s = ekv_gguf_open(path, &f);
    if (s != EKV_OK) return cli_fail(CMD, s);
    struct ekv_gguf_header h;
    ekv_gguf_get_header(f, &h);
    printf("gguf: version %u, %zu metadata keys, %zu tensors, alignment %u, data at byte %zu of %zu\n", h.version,
           h.n_kv, h.n_tensors, h.alignment, h.data_offset, h.file_size);
    if (metadata) {
        printf("metadata:\n");
        char key[256], val[1024];
        for (size_t i = 0; ekv_gguf_kv_text(f, i, key, sizeof key, val, sizeof val); i++)
            printf("  %-45s %s\n", key, val);
    }
    if (tensors) {
        printf("tensors:\n");
        struct ekv_gguf_tensor_desc t;
        for (size_t i = 0; ekv_gguf_tensor_describe(f, i, &t); i++) {
            printf("  %-32s %-7s [", t.name, t.type);
            for (uint32_t d = 0; d < t.n_dims; d++) printf("%s%" PRId64, d ? ", " : "", t.ne[d]);
            printf("] %zu bytes\n", t.nbytes);
        }
    }
    ekv_gguf_close(f);
    return 0;
}

/* ekv info --devices: the CPU, then every Vulkan device with what the
 * backend needs of it. */
static int list_devices(void) {
    struct ekv_device_info d[16];
    int32_t n = 0;
    enum ekv_status s = ekv_devices_list(d, 16, &n);
    if (s != EKV_OK) return cli_fail(CMD, s);
    printf("cpu: the host processor (always available), kernels %s (EKV_ISA=avx2|avxvnni|reference caps them)\n",
           ekv_cpu_kernels());
    if (n == 0) printf("no Vulkan devices%s%s\n", ekv_last_error()[0] ? ": " : "", ekv_last_error());
    for (int32_t i = 0; i < n && i < 16; i++) {
        printf("vulkan:%d: %s (%s), Vulkan %u.%u.%u, driver %s, %.1f GiB device memory, subgroup %u, fp16 %s, "
               "int8 %s, fp64 %s, cooperative matrix %s%s\n",
               (int)d[i].index, d[i].name, d[i].type, d[i].api_version >> 22, (d[i].api_version >> 12) & 0x3ffu,
               d[i].api_version & 0xfffu, d[i].driver[0] ? d[i].driver : "?", d[i].memory_bytes / 1073741824.0,
               d[i].subgroup_size, d[i].fp16 ? "yes" : "no", d[i].int8 ? "yes" : "no",
               d[i].fp64 ? "yes" : "no (no quantised KV cache on this device)", d[i].coopmat ? "yes" : "no",
               d[i].usable ? (strcmp(d[i].type, "cpu") ? "" : " (a CPU device: used only when named, vulkan:N)")
                           : " (not usable: lacks Vulkan 1.2, buffer device addresses or 8/16-bit storage)");
    }
    return 0;
}

static int cmd_info_main(int argc, char **argv) {
    struct cli_params p;
    cli_params_init(&p, CLI_INFO);
    int rc = cli_parse(CMD, argc, argv, &p, &k_help);
    if (rc) return rc == 2 ? 0 : rc;
    if (p.list_devices) return list_devices();
    const char *path = p.model ? p.model : cli_default_model();
    const bool tensors = p.tensors, metadata = p.metadata;
    printf("file: %s\n", path);

    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "ekv info: error: cannot open '%s'\n", path);
        return 1;
    }
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, fp);
    fclose(fp);
    bool is_gguf = got == 4 && !memcmp(magic, "GGUF", 4);

    /* hyper-parameters when the file is a loadable language model */
    struct ekv_model *m = NULL;
    enum ekv_status s = ekv_model_load(path, NULL, &m);
    if (s == EKV_OK) {
        struct ekv_model_info mi;
        ekv_model_get_info(m, &mi);
        printf("model: %s, format %s, arch %s\n", mi.name[0] ? mi.name : "(unnamed)", mi.format, mi.arch);
        printf("  n_vocab %d, n_embd %d, n_layer %d, n_head %d, n_head_kv %d (GQA group %d), head_dim %d, n_ff %d\n",
               mi.n_vocab, mi.n_embd, mi.n_layer, mi.n_head, mi.n_head_kv, mi.n_head / mi.n_head_kv, mi.head_dim,
               mi.n_ff);
        printf("  context %d, rope dim %d base %g (%s), norm eps %g, output %s\n", mi.n_ctx_train, mi.rope_dim,
               (double)mi.rope_freq_base, mi.rope_neox ? "neox" : "normal", (double)mi.norm_eps,
               mi.tied_output ? "tied to token_embd" : "separate");
        printf("  rope scaling %s", mi.rope_scaling);
        if (strcmp(mi.rope_scaling, "none"))
            printf(": factor %g, original context %d, attn factor %g", (double)mi.rope_scale_factor, mi.rope_orig_ctx,
                   (double)mi.rope_attn_factor);
        if (!strcmp(mi.rope_scaling, "yarn") || mi.yarn_ext_factor > 0.0f)
            printf(", yarn beta fast %g slow %g, ext factor %g%s, log multiplier %g", (double)mi.yarn_beta_fast,
                   (double)mi.yarn_beta_slow, (double)mi.yarn_ext_factor, mi.yarn_ext_factor < 0.0f ? " (auto: 1)" : "",
                   (double)mi.yarn_log_mul);
        if (mi.rope_freqs) printf(", per-dimension factors rope_freqs.weight");
        if (mi.rope_long_short)
            printf(", long/short factors (long used when the context exceeds %d)", mi.rope_orig_ctx);
        printf("\n");
        if (mi.rope_sections[0] || mi.rope_sections[1] || mi.rope_sections[2])
            printf("  M-RoPE: pairs per position component time %d, height %d, width %d, extra %d (images take a "
                   "grid of positions)\n", mi.rope_sections[0], mi.rope_sections[1], mi.rope_sections[2],
                   mi.rope_sections[3]);
        if (mi.sliding_window > 0) printf("  attention: sliding window of %d positions\n", mi.sliding_window);
        else printf("  attention: full causal\n");
        printf("  layout: %s, %s, %s feed-forward%s\n", mi.fused_qkv ? "fused attn_qkv" : "attn_q/k/v",
               mi.fused_gate_up ? "fused gate-up (ffn_up)" : "ffn_gate + ffn_up", mi.ffn_gelu ? "GeGLU" : "SwiGLU",
               mi.embd_scale != 1.0f ? ", token embeddings scaled by sqrt(n_embd)" : "");
        const char *tmpl = ekv_model_chat_template(m);
        printf("  chat template: %s\n", tmpl ? tmpl : "none recognised (ekv run --chat-template NAME chooses one)");
        printf("  parameters %.3f M, weights %.2f MiB\n", mi.n_params / 1e6, mi.weight_bytes / 1048576.0);
        printf("  CPU kernels on this host: %s (EKV_ISA=avx2|avxvnni|reference caps them; GPUs: ekv info --devices)\n",
               ekv_cpu_kernels());
        printf("  KV cache: %" PRIu64 " bytes per token (K+V, %s, %d layers x %d KV heads x %d dims x 2); "
               "full context %.2f MiB\n",
               mi.kv_bytes_per_token, ekv_kv_type_name(ekv_kv_type_default()), mi.n_layer, mi.n_head_kv, mi.head_dim,
               (double)mi.kv_bytes_per_token * mi.n_ctx_train / 1048576.0);
        printf("  KV cache at full context by --kv-type:");
        for (int t = EKV_KV_F32; t < EKV_KV_TYPE_COUNT; t++) {
            struct ekv_kv_params kp = ekv_kv_default_params();
            kp.type_k = kp.type_v = (enum ekv_kv_type)t;
            struct ekv_kv_projection pr;
            const uint64_t b = ekv_kv_project(m, &kp, mi.n_ctx_train, 0, &pr) == EKV_OK ? pr.bytes_full : 0;
            if (b) printf(" %s %.2f MiB%s", ekv_kv_type_name((enum ekv_kv_type)t), b / 1048576.0, t + 1 < EKV_KV_TYPE_COUNT ? "," : "");
            else printf(" %s -%s", ekv_kv_type_name((enum ekv_kv_type)t), t + 1 < EKV_KV_TYPE_COUNT ? "," : "");
        }
        printf("\n");
        printf("  tokenizer: BOS %d, EOS %d\n", ekv_token_bos(m), ekv_token_eos(m));
        ekv_model_free(m);
    } else if (!is_gguf) {
        return cli_fail(CMD, s);
    } else {
        printf("model: not a loadable language model (%s: %s)\n", ekv_status_str(s), ekv_last_error());
    }
    if (is_gguf) return info_gguf(path, tensors, metadata);
    return 0;
}

const struct ekv_cmd ekv_cmd_info = {"info", "describe a model file: metadata, tensors, KV bytes per token",
                                     cmd_info_main};
