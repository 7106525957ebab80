/*
 * cmd_quantize.c — `ekv quantize`: converts a GGUF model's matrices to
 * Q8_0, Q4_0 or F16 (llama-quantize's job for the types ekv computes with)
 * through the library call ekv_model_quantize.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *const CMD = "quantize";

static void help(void) {
    printf("usage: ekv quantize -m IN.gguf -o OUT.gguf [--type q8_0|q4_0|f16]\n\n"
           "Converts every matrix of a GGUF model (tensors ending in 'weight' with two or more\n"
           "dimensions) to the given type; norms and other 1-D tensors stay F32, metadata is\n"
           "kept (general.file_type updated). The input must be F32, F16 or BF16: a quantised\n"
           "model is refused. Matrices whose rows are not a multiple of 32 are written as F16.\n"
           "The output appears only when complete (written to OUT.gguf.tmp, then renamed).\n\n"
           "  -m, --model FILE   input model (GGUF)\n"
           "  -o, --output FILE  output model (GGUF); must differ from the input\n"
           "      --type T       q8_0 (default), q4_0 or f16\n"
           "  -h, --help         this help\n");
}

static int quantize_main(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    struct ekv_quantize_params qp = ekv_quantize_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help();
            return 0;
        }
        const char **dst = !strcmp(a, "-m") || !strcmp(a, "--model")    ? &in
                           : !strcmp(a, "-o") || !strcmp(a, "--output") ? &out
                           : !strcmp(a, "--type")                       ? &qp.type
                                                                        : NULL;
        if (!dst) return cli_usage_error(CMD, "unknown option '%s' (see ekv quantize --help)", a);
        if (!v) return cli_usage_error(CMD, "%s needs a value", a);
        *dst = v;
        i++;
    }
    if (!in || !out) return cli_usage_error(CMD, "both -m IN.gguf and -o OUT.gguf are required (see --help)");
    struct ekv_quantize_result res;
    double t0 = cli_now();
    enum ekv_status s = ekv_model_quantize(in, out, &qp, &res);
    if (s != EKV_OK) return cli_fail(CMD, s);
    printf("%s: %d tensors, %d matrices to %s, %d to f16 (rows not a multiple of 32); %.2f MB -> %.2f MB in %.2f s\n",
           out, res.n_tensors, res.n_converted, qp.type, res.n_fallback, (double)res.bytes_in / 1e6,
           (double)res.bytes_out / 1e6, cli_now() - t0);
    return 0;
}

const struct ekv_cmd ekv_cmd_quantize = {
    .name = "quantize",
    .summary = "convert a GGUF model's matrices to q8_0, q4_0 or f16",
    .main = quantize_main,
};
