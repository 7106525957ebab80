/*
 * cmd_mkmodel.c — `ekv mkmodel`: the command line of the synthetic model
 * writer (ekv_mkmodel_write, src/model/mkmodel.c): GGUF files with random
 * weights of real model shapes, for speed and memory measurements and for
 * tests. Options are parsed here; the presets and the weights are the
 * library's.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void list_presets(FILE *o) {
    fprintf(o, "presets:\n");
    const char *name, *desc;
    for (int32_t i = 0; (name = ekv_mkmodel_preset(i, &desc, NULL)) != NULL; i++) fprintf(o, "  %-15s %s\n", name, desc);
}

static const struct cli_help k_help = {
    "usage: ekv mkmodel --preset NAME -o FILE [--mmproj-out FILE] [--type f32|f16|q8_0|q4_0]\n"
    "                   [--vocab VOCAB.gguf] [--seed N]",
    "Writes a GGUF model with random weights of a real model's shapes (llama.cpp layout).\n"
    "Vision-language presets also write the vision tower (mmproj); without --mmproj-out it\n"
    "goes beside FILE as <FILE minus .gguf>.mmproj.gguf.\n\n"
    "Weights are random: use these files for speed and memory, never for quality.",
    NULL,
};

static int cmd_main(int argc, char **argv) {
    struct cli_params cp;
    cli_params_init(&cp, CLI_MKMODEL);
    int rc = cli_parse("mkmodel", argc, argv, &cp, &k_help);
    if (rc == 2) list_presets(stdout);
    if (rc) return rc == 2 ? 0 : rc;
    if (!cp.preset || !cp.output) {
        fprintf(stderr, "ekv mkmodel: %s is required\n", cp.preset ? "-o FILE" : "--preset");
        if (!cp.preset) list_presets(stderr);
        return 1;
    }
    struct ekv_mkmodel_params mp = ekv_mkmodel_default_params();
    mp.preset = cp.preset;
    mp.type = cp.weight_type;
    mp.seed = cp.weight_seed;
    mp.vocab_path = cp.vocab;
    mp.n_layer = (int32_t)cp.mk_n_layer;
    mp.n_layer_vision = (int32_t)cp.mk_n_layer_vision;
    mp.n_ctx = (int32_t)cp.n_ctx;
    mp.rope_scaling = cp.rope_scaling;
    mp.rope_factor = (float)cp.rope_scale;
    mp.rope_orig_ctx = (int32_t)cp.rope_orig_ctx;
    mp.sliding_window = (int32_t)cp.sliding_window;
    struct ekv_mkmodel_result r;
    enum ekv_status s = ekv_mkmodel_write(&mp, cp.output, cp.mmproj_out, &r);
    if (s != EKV_OK) {
        fprintf(stderr, "ekv mkmodel: %s: %s\n", ekv_status_str(s), ekv_last_error());
        if (strstr(ekv_last_error(), "unknown preset")) list_presets(stderr);
        return 1;
    }
    printf("wrote %s: %s, %d tensors, %s weights (random)\n", cp.output, cp.preset, (int)r.n_tensors, cp.weight_type);
    if (r.n_tensors_mmproj) {
        if (cp.mmproj_out) {
            printf("wrote %s: %s vision tower, %d tensors (random)\n", cp.mmproj_out, cp.preset, (int)r.n_tensors_mmproj);
        } else {
            const size_t n = strlen(cp.output);
            const int keep = (int)(n >= 5 && !strcmp(cp.output + n - 5, ".gguf") ? n - 5 : n);
            printf("wrote %.*s.mmproj.gguf: %s vision tower, %d tensors (random)\n", keep, cp.output, cp.preset,
                   (int)r.n_tensors_mmproj);
        }
    }
    return 0;
}

const struct ekv_cmd ekv_cmd_mkmodel = {"mkmodel", "write a GGUF with random weights of a real model's shape",
                                        cmd_main};
