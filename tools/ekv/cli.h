/*
 * cli.h — shared pieces of the ekv sub-commands: the command table entry,
 * llama.cpp-style option parsing helpers (model, threads, sampling, KV
 * policy flags), default model lookup, timing and error printing.
 */
#ifndef EKV_CLI_H
#define EKV_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ekv.h"

struct ekv_cmd {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv); /* argv[0] is the command name */
};

extern const struct ekv_cmd ekv_cmd_run;
extern const struct ekv_cmd ekv_cmd_info;
extern const struct ekv_cmd ekv_cmd_mkmodel;
extern const struct ekv_cmd ekv_cmd_eval;
extern const struct ekv_cmd ekv_cmd_bench;

/* Prints "ekv <cmd>: error: <status>: <detail>" to stderr; returns 1. */
int cli_fail(const char *cmd, enum ekv_status s);
/* Prints "ekv <cmd>: <message>" to stderr; returns 1. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A file shipped in the repository (e.g. "data/x.jsonl"): rel itself when
 * it exists from the current directory, else next to the executable
 * (<exe>/../rel, <exe>/rel), else in the source tree; buf holds the result
 * when it is not rel. */
const char *cli_find_file(const char *rel, char *buf, size_t n);
/* The bundled model when -m is not given (models/stories260K.gguf, found
 * with cli_find_file). */
const char *cli_default_model(void);

/* Option value parsing with range checks; false (and a message) on error. */
bool cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, long *out);
bool cli_double(const char *cmd, const char *opt, const char *v, double lo, double hi, double *out);

/* KV-policy flags (--kv-policy, --kv-budget, ...). If argv[*i] is one of
 * them, consumes it (and its value), stores into p and returns 1; returns 0
 * if it is not a KV flag, -1 on a bad value (message printed). */
int cli_parse_kv_opt(const char *cmd, int argc, char **argv, int *i, struct ekv_kv_params *p);
/* Help text for the KV flags. */
void cli_print_kv_help(FILE *out);

/* Monotonic seconds. */
double cli_now(void);
/* Peak resident set size in bytes (0 if unknown). */
uint64_t cli_peak_rss(void);

/* Reads a whole file (text) into a malloc'd NUL-terminated buffer; NULL with message on error. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

#endif
