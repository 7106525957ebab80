/*
 * main.c — the `ekv` command: dispatches to one sub-command per file
 * (cmd_<name>.c), each with its own --help.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ekv.h"

static const struct ekv_cmd *const k_cmds[] = {
    &ekv_cmd_run,
    &ekv_cmd_info,
    &ekv_cmd_mkmodel,
    &ekv_cmd_eval,
    &ekv_cmd_bench,
    &ekv_cmd_serve,
    &ekv_cmd_quantize,
    &ekv_cmd_tokenize,
};

static void usage(FILE *out) {
    fprintf(out, "usage: ekv <command> [options]\n\n"
                 "ekv %s: LLM/VLM inference with compressed KV caches.\n\ncommands:\n",
            ekv_version());
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(out, "  %-10s %s\n", k_cmds[i]->name, k_cmds[i]->summary);
    fprintf(out, "\nRun 'ekv <command> --help' for the options of a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 1; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("ekv %s\n", ekv_version()); return 0; }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i]->name)) return k_cmds[i]->main(argc - 1, argv + 1);
    fprintf(stderr, "ekv: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 1;
}
