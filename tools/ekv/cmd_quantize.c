/*
 * cmd_quantize.c — `ekv quantize`: converts a GGUF model's matrices to
 * Q8_0, Q4_0 or F16 (llama-quantize's job for the types ekv computes with)
 * through the library call ekv_model_quantize.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *const CMD = "quantize";

static const struct cli_help k_help = {
    "usage: ekv quantize -m IN.gguf -o OUT.gguf [--type q8_0|q4_0|q4_k|q5_k|q6_k|f16]",
    "Converts every matrix of a GGUF model (tensors ending in 'weight' with two or more\n"
    "dimensions) to the given type; norms and other 1-D tensors stay as they are (F32),\n"
    "metadata is kept (general.file_type updated). The input must be F32, F16 or BF16: a\n"
    "quantised model is refused. Matrices whose rows are not a multiple of 32 are written\n"
    "as F16 (for q4_k/q5_k/q6_k: of 256). K-quant types are written pure, every matrix\n"
    "the same type (llama-quantize's Q4_K_M/Q5_K_M mix types by tensor). The output\n"
    "appears only when complete (written to OUT.gguf.tmp, then renamed).",
    NULL,
};

static int quantize_main(int argc, char **argv) {
    struct cli_params p;
    cli_params_init(&p, CLI_QUANTIZE);
    int rc = cli_parse(CMD, argc, argv, &p, &k_help);
    if (rc) return rc == 2 ? 0 : rc;
    if (!p.model || !p.output) return cli_usage_error(CMD, "both -m IN.gguf and -o OUT.gguf are required (see --help)");
    struct ekv_quantize_params qp = ekv_quantize_default_params();
    qp.type = p.weight_type;
    struct ekv_quantize_result res;
    double t0 = cli_now();
    enum ekv_status s = ekv_model_quantize(p.model, p.output, &qp, &res);
    if (s != EKV_OK) return cli_fail(CMD, s);
    printf("%s: %d tensors, %d matrices to %s, %d to f16 (rows not a multiple of the block); %.2f MB -> %.2f MB in %.2f s\n",
           p.output, res.n_tensors, res.n_converted, qp.type, res.n_fallback, (double)res.bytes_in / 1e6,
           (double)res.bytes_out / 1e6, cli_now() - t0);
    return 0;
}

const struct ekv_cmd ekv_cmd_quantize = {
    .name = "quantize",
    .summary = "convert a GGUF model's matrices to q8_0, q4_0, q4_k, q5_k, q6_k or f16",
    .main = quantize_main,
};
