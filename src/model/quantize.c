/*
 * quantize.c — ekv_model_quantize (include/ekv.h): llama-quantize's job for
 * the weight types ekv computes with. A GGUF model whose tensors are F32,
 * F16 or BF16 is rewritten with every matrix ("*weight" tensors of two or
 * more dimensions, llama.cpp's rule) converted to Q8_0, Q4_0, Q4_K, Q5_K,
 * Q6_K or F16; 1-D
 * tensors (norms, biases) stay as they are (F32), and so does every
 * metadata key except general.file_type (set to llama.cpp's file-type
 * number) and general.quantization_version (2 for quantised outputs).
 *
 * Every matrix gets the requested type ("pure" in llama-quantize's terms:
 * no per-tensor mixing such as Q6_K for the output matrix). A matrix whose
 * rows are not a multiple of the type's block (32; 256 for the K-quants)
 * falls back to F16,
 * counted in the result. Tensors are converted row by row while the file is
 * written (never the whole model in memory), through the GGUF writer, which
 * writes "<out>.tmp" and renames it, so a failure leaves no output file.
 *
 * A quantised input is refused: requantising compounds rounding errors,
 * and the F16/F32 original is what a user should convert from.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/util.h"
#include "kernels/kernels.h"
#include "model/gguf.h"

struct ekv_quantize_params ekv_quantize_default_params(void) {
    struct ekv_quantize_params p = {.type = "q8_0"};
    return p;
}

/* Types a model can be converted to: name, dtype, llama.cpp file type. */
static const struct {
    const char *name;
    enum ekv_dtype type;
    uint32_t ftype;
} k_targets[] = {
    {"q8_0", EKV_Q8_0, 7},
    {"q4_0", EKV_Q4_0, 2},
    {"q4_k", EKV_Q4_K, 14}, /* llama.cpp's MOSTLY_Q4_K_S, 15 and 17 being its mixes */
    {"q5_k", EKV_Q5_K, 16}, /* MOSTLY_Q5_K_S */
    {"q6_k", EKV_Q6_K, 18}, /* MOSTLY_Q6_K */
    {"f16", EKV_F16, 1},
};

/* Source of one converted tensor. */
struct qtensor {
    const struct ekv_gguf_tensor *src;
    enum ekv_dtype to;
    size_t src_row_bytes, dst_row_bytes;
    float *row;       /* [ne0] scratch */
    uint8_t *rowbuf;  /* [dst_row_bytes] scratch for rows cut by a chunk edge */
};

/* The writer asks for bytes [offset, offset + n) of the converted tensor:
 * convert the rows that cover them. */
static enum ekv_status fill_converted(void *user, const struct ekv_gguf_tensor *t, uint64_t offset, void *dst,
                                      size_t n) {
    struct qtensor *q = user;
    const int64_t ne0 = q->src->ne[0];
    uint8_t *out = dst;
    while (n > 0) {
        const uint64_t r = offset / q->dst_row_bytes, in_row = offset % q->dst_row_bytes;
        const char *src = (const char *)q->src->data + (size_t)r * q->src_row_bytes;
        enum ekv_status s = ekv_dequantize_row(q->src->type, src, q->row, ne0);
        if (s != EKV_OK) return s;
        const size_t take = EKV_MIN(n, q->dst_row_bytes - (size_t)in_row);
        if (in_row == 0 && take == q->dst_row_bytes) {
            s = ekv_quantize_row(q->to, q->row, out, ne0);
        } else {
            s = ekv_quantize_row(q->to, q->row, q->rowbuf, ne0);
            if (s == EKV_OK) memcpy(out, q->rowbuf + in_row, take);
        }
        if (s != EKV_OK) return ekv_err_prefix(s, "%s row %llu", t->name, (unsigned long long)r);
        out += take;
        offset += take;
        n -= take;
    }
    return EKV_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (strcmp(a, b) == 0) return true;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Plans the conversion of every tensor into w (qs: [n_tensors] sources). */
static enum ekv_status plan_tensors(const struct ekv_gguf_file *f, struct ekv_gguf_writer *w, enum ekv_dtype to,
                                    struct qtensor *qs, struct ekv_quantize_result *res) {
    const size_t nt = ekv_gguf_n_tensors(f);
    for (size_t i = 0; i < nt; i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        res->bytes_in += t->nbytes;
        if (t->type != EKV_F32 && t->type != EKV_F16 && t->type != EKV_BF16)
            return ekv_err(EKV_ERR_UNSUPPORTED,
                           "tensor '%s' is %s: the input is already quantised (convert from the F16/F32 original)",
                           t->name, ekv_dtype_name(t->type));
    }
    for (size_t i = 0; i < nt; i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        struct qtensor *q = &qs[i];
        q->src = t;
        enum ekv_dtype out = t->type;
        if (t->n_dims >= 2 && ends_with(t->name, "weight")) {
            const struct ekv_dtype_info *ti = ekv_dtype_get((uint32_t)to);
            out = (uint64_t)t->ne[0] % ti->block_size == 0 ? to : EKV_F16;
            if (out != to) res->n_fallback++;
            else res->n_converted++;
        }
        enum ekv_status s;
        int64_t ne[GGUF_MAX_DIMS];
        for (uint32_t d = 0; d < t->n_dims; d++) ne[d] = t->ne[d];
        if (out == t->type) {
            s = ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, NULL, NULL);
            res->bytes_out += t->nbytes;
        } else {
            q->to = out;
            if (!ekv_dtype_row_bytes(t->type, t->ne[0], &q->src_row_bytes) ||
                !ekv_dtype_row_bytes(out, t->ne[0], &q->dst_row_bytes) || q->dst_row_bytes == 0)
                return ekv_err(EKV_ERR_FORMAT, "tensor '%s': bad row length %lld", t->name, (long long)t->ne[0]);
            q->row = malloc((size_t)t->ne[0] * sizeof(float));
            q->rowbuf = malloc(q->dst_row_bytes);
            if (!q->row || !q->rowbuf) return ekv_err(EKV_ERR_NOMEM, "tensor '%s': row scratch", t->name);
            s = ekv_gguf_writer_add_tensor(w, t->name, out, t->n_dims, ne, NULL, fill_converted, q);
            size_t rows = t->nbytes / q->src_row_bytes;
            res->bytes_out += rows * q->dst_row_bytes;
        }
        if (s != EKV_OK) return s;
        res->n_tensors++;
    }
    return EKV_OK;
}

enum ekv_status ekv_model_quantize(const char *in_path, const char *out_path, const struct ekv_quantize_params *params,
                                   struct ekv_quantize_result *result) {
    ekv_err_clear();
    struct ekv_quantize_result res;
    memset(&res, 0, sizeof res);
    if (result) *result = res;
    if (!in_path || !out_path) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_model_quantize: input and output paths are required");
    struct ekv_quantize_params p = params ? *params : ekv_quantize_default_params();
    int ti = -1;
    for (size_t i = 0; i < EKV_ARRAY_LEN(k_targets) && p.type; i++)
        if (strcasecmp(p.type, k_targets[i].name) == 0) ti = (int)i; /* q4_K or q4_k */
    if (ti < 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "unknown quantisation type '%s' (known: q8_0, q4_0, q4_k, q5_k, q6_k, f16)",
                       p.type ? p.type : "(null)");
    if (same_file(in_path, out_path))
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: the output would overwrite the input", out_path);

    struct ekv_gguf_file *f = NULL;
    enum ekv_status s = ekv_gguf_open(in_path, &f);
    if (s != EKV_OK) return s;
    const size_t nt = ekv_gguf_n_tensors(f);
    struct ekv_gguf_writer *w = NULL;
    struct qtensor *qs = calloc(nt ? nt : 1, sizeof *qs);
    if (!qs) s = ekv_err(EKV_ERR_NOMEM, "quantize: %zu tensors", nt);
    if (s == EKV_OK && nt == 0) s = ekv_err(EKV_ERR_FORMAT, "%s: the file holds no tensors", in_path);
    if (s == EKV_OK) s = ekv_gguf_writer_new(&w);
    for (size_t i = 0; s == EKV_OK && i < ekv_gguf_n_kv(f); i++) {
        const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(f, i);
        if (ekv_gguf_str_eq(kv->key, "general.file_type") || ekv_gguf_str_eq(kv->key, "general.quantization_version"))
            continue;
        s = ekv_gguf_writer_copy_kv(w, kv);
    }
    if (s == EKV_OK) s = ekv_gguf_writer_set_u32(w, "general.file_type", k_targets[ti].ftype);
    if (s == EKV_OK && k_targets[ti].type != EKV_F16) s = ekv_gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (s == EKV_OK) s = plan_tensors(f, w, k_targets[ti].type, qs, &res);
    if (s == EKV_OK) s = ekv_gguf_writer_write(w, out_path);
    if (s != EKV_OK) s = ekv_err_prefix(s, "quantize %s", in_path);
    else if (result) *result = res;
    for (size_t i = 0; qs && i < nt; i++) {
        free(qs[i].row);
        free(qs[i].rowbuf);
    }
    free(qs);
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
    return s;
}
