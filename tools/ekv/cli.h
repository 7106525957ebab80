/*
 * cli.h — shared pieces of the ekv sub-commands: the command table entry,
 * the one option table every command parses through (llama.cpp-style names,
 * help generated from the table), default model lookup, timing and error
 * printing.
 *
 * Adding a flag is adding a row to k_opts in common.c (names, value hint,
 * help, the commands that take it, where the value goes) and, when it needs
 * a new place to live, a field in struct cli_params below.
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
extern const struct ekv_cmd ekv_cmd_serve;
extern const struct ekv_cmd ekv_cmd_quantize;
extern const struct ekv_cmd ekv_cmd_tokenize;

/* ------------------------------------------------------------------ */
/* the option table                                                     */
/* ------------------------------------------------------------------ */

/* Which commands take an option (bits of cli_opt.tools). */
enum cli_tool {
    CLI_RUN = 1u << 0,
    CLI_EVAL = 1u << 1,
    CLI_BENCH = 1u << 2,
    CLI_INFO = 1u << 3,
    CLI_MKMODEL = 1u << 4,
    CLI_SERVE = 1u << 5,
    CLI_QUANTIZE = 1u << 6,
    CLI_TOKENIZE = 1u << 7,
};

#define CLI_LIST_MAX 64
#define CLI_OWNED_MAX 16

/* A comma list ("512,2048", "full,h2o", "0.2,0.5"), parsed by the one list
 * parser: every item is range-checked like a single value of its option;
 * duplicates and empty items are refused. Strings point into argv. */
struct cli_list {
    int n;
    long i[CLI_LIST_MAX];
    double d[CLI_LIST_MAX];
    const char *s[CLI_LIST_MAX];
};

/* Every value any command takes. Each command sets its own defaults
 * (cli_params_init), parses, and reads the fields it declared in the table. */
struct cli_params {
    unsigned tool;               /* the command being parsed (enum cli_tool) */
    bool help;                   /* -h/--help was given */
    /* model */
    const char *model;           /* NULL = bundled models/stories260K.gguf */
    const char *tokenizer;       /* llama2.c checkpoints */
    const char *mmproj;          /* vision tower */
    bool no_repack;              /* keep Q8_0/Q4_0 matrices in the file's layout */
    long threads;                /* -1 = the library's default */
    long n_ctx;                  /* 0 = the model's trained context */
    const char *device;          /* --device: NULL = $EKV_DEVICE, else auto */
    /* prompt and generation (run, serve) */
    const char *prompt;
    const char *prompt_file;
    long n_predict;
    bool ignore_eos;
    bool display_prompt;
    const char *chat_template;   /* NULL = by command (run: none / llava-1.5 with an image) */
    bool chat;                   /* run: interactive conversation on stdin (-cnv) */
    const char *system;
    struct cli_list images;      /* run: --image, repeated */
    struct ekv_sampler_params sampling;
    struct cli_list logit_bias;  /* run, serve: -l TOKEN(+|-)BIAS, repeated: i = token, d = bias */
    /* KV cache: one policy (run, serve) or grid axes (eval, bench) */
    struct ekv_kv_params kv;
    struct cli_list kv_policies;
    struct cli_list kv_budgets;
    struct cli_list kv_types;    /* eval, bench: storage types ("T" or "K/V"); empty = kv.type_k/type_v */
    /* output */
    bool json;                   /* run, eval: JSON on stdout */
    const char *json_path;       /* bench: JSON file ('-' = stdout) */
    const char *kv_trace;        /* run */
    const char *kv_save;         /* run: save the sequence at the end (ekv_seq_save) */
    const char *kv_load;         /* run: start from a saved sequence (ekv_seq_load) */
    /* eval */
    const char *data;
    const char *format;
    const char *doc_sep;
    const char *metrics;
    const char *rouge;
    long limit, offset, stride;
    long share;             /* --share N: cells per shared prompt (ekv_eval_cfg.share) */
    const char *out_dir;
    bool plot;
    const char *image_dir;
    const char *per_item;   /* --per-item FILE (JSONL) or NULL */
    const char *compare_to; /* --compare-to POLICY or NULL */
    bool per_type;          /* --per-type: metrics per item "type" too */
    /* bench */
    struct cli_list n_prompt, n_gen, depth, batch, threads_list;
    long reps;
    bool warmup;
    /* info */
    bool tensors, metadata, list_devices;
    /* tokenize */
    bool tok_ids, tok_no_bos, tok_parse_special, tok_show_count;
    /* mkmodel, quantize (output, weight_type) */
    const char *preset, *output, *mmproj_out, *weight_type, *vocab;
    uint64_t weight_seed;
    long mk_n_layer;             /* 0 = the preset's */
    long mk_n_layer_vision;      /* 0 = the preset's */
    const char *rope_scaling;    /* rope.scaling.type to write, or NULL */
    double rope_scale;           /* rope.scaling.factor to write, 0 = none */
    long rope_orig_ctx;          /* 0 = none (longrope presets: theirs) */
    long sliding_window;         /* -1 = the preset's */
    /* serve */
    const char *host;
    long port;
    long parallel;               /* sequences decoded together at most */
    double kv_mem_mib;           /* 0 = no cap */
    double prefix_cache_mib;     /* serve: cached prefixes, 0 = off */
    const char *slot_save_path;  /* serve: /slots save/restore folder */
    long queue;                  /* waiting places */
    const char *api_key;
    const char *cors;            /* serve: the origin allowed to call from a browser (CORS), or NULL */
    long max_body;               /* bytes */
    long timeout;                /* seconds of idle connection */
    long drain;                  /* serve: seconds running requests get at shut-down */
    long prefill_chunk;          /* prompt tokens per engine step */
    const char *alias;           /* model name in /v1/models */
    /* list copies owned by the parse (cli_params_free) */
    char *owned[CLI_OWNED_MAX];
    int n_owned;
};

/* What a command's help says around the generated option list. */
struct cli_help {
    const char *usage;   /* "usage: ekv run [options]" */
    const char *about;   /* paragraph(s) after the usage line */
    const char *epilog;  /* printed after the options, may be NULL */
};

/* Defaults of every field for command `tool` (one of enum cli_tool). */
void cli_params_init(struct cli_params *p, unsigned tool);

/* Frees what parsing allocated (list items); p's strings from lists die. */
void cli_params_free(struct cli_params *p);

/* Parses argv[1..] for command `cmd` through the table. Returns 0 on
 * success, 1 after printing a usage error, 2 after printing the help to
 * stdout (the command then exits 0). */
int cli_parse(const char *cmd, int argc, char **argv, struct cli_params *p, const struct cli_help *help);

/* Prints the command's help: usage, about, its options grouped as in the
 * table with their current values as defaults, the policy list, epilog. */
void cli_print_help(FILE *out, const struct cli_params *p, const struct cli_help *help);

/* One option given by name (any spelling, e.g. "--kv-budget") and value as
 * text, validated exactly as on the command line. The server maps each
 * request's "kv" fields onto these rows. false with a message in err (at
 * most errn bytes, NUL-terminated) when the value is bad or the option
 * unknown to p->tool. String values are stored as given: they must outlive
 * p. */
bool cli_set_option(struct cli_params *p, const char *name, const char *value, char *err, size_t errn);

/* The policy-name check every command uses: NULL when `name` is in the
 * library's registry, else a message listing the known names, in a buffer
 * of the calling thread (valid until its next call there). */
const char *cli_check_policy(const char *name);
/* Storage types: "T" (keys and values) or "K/V"; false with a message in err. */
bool cli_parse_kv_types(const char *v, enum ekv_kv_type *tk, enum ekv_kv_type *tv, char *err, size_t n);
/* cli_parse_kv_types as a K_STR/K_LIST_STR check: NULL or a message in a
 * buffer of the calling thread. */
const char *cli_check_kv_type(const char *v);

/* ------------------------------------------------------------------ */
/* utilities                                                            */
/* ------------------------------------------------------------------ */

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

/* -l's value TOKEN(+|-)BIAS (llama.cpp's): a token id, a sign and a finite
 * number, or TOKEN-inf (a ban: -INFINITY); false when it is not one. */
bool cli_logit_bias_parse(const char *v, long *tok, double *bias);
/* -l TOKEN(+|-)BIAS: false (error printed) when a token is not in [0, n_vocab). */
bool cli_logit_bias_check(const char *cmd, const struct cli_list *l, int32_t n_vocab);
/* The -l list into a sampler (ekv_sampler_set_logit_bias; nothing when empty). */
enum ekv_status cli_logit_bias_set(const struct cli_list *l, struct ekv_sampler *smp);

/* Loads p->model (or the bundled model) with p->tokenizer and makes a
 * context with p->threads and p->n_ctx; prints the error and returns false
 * on failure (*model and *ctx are then NULL). ctx may be NULL (model only). */
bool cli_load_model(const char *cmd, const struct cli_params *p, struct ekv_model **model,
                    struct ekv_context **ctx);

/* Monotonic seconds. */
double cli_now(void);
/* Peak resident set size in bytes (0 if unknown). */
uint64_t cli_peak_rss(void);
/* Resident set size now in bytes (0 if unknown). */
uint64_t cli_rss(void);

/* Reads a whole file (text) into a malloc'd NUL-terminated buffer; NULL with message on error. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

#endif
