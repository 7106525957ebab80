/*
 * common.c — the one option layer of the ekv sub-commands (see cli.h), in
 * the manner of llama.cpp's common/arg.cpp: every flag is one row of k_opts
 * (spellings, value hint, help, which commands take it, where its value
 * goes, its range), parsed by one loop, with one comma-list parser and one
 * policy-name check through the library's registry; each command's --help
 * is generated from the rows it takes. A spelling may appear in several rows
 * only for disjoint sets of commands (bench's -p is a list of prompt
 * lengths, run's -p the prompt), which cli_parse checks.
 * The small utilities the commands share (errors, shipped files, clocks,
 * RSS, reading files) are in cli_util.c.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ------------------------------------------------------------------ */
/* rows                                                                 */
/* ------------------------------------------------------------------ */

enum cli_kind {
    K_FLAG,      /* bool = true */
    K_NOFLAG,    /* bool = false */
    K_STR,       /* const char * */
    K_LONG,      /* long in [lo, hi] */
    K_I32,       /* int32_t in [lo, hi] */
    K_U64,       /* uint64_t, any non-negative integer */
    K_F32,       /* float in [lo, hi] */
    K_F64,       /* double in [lo, hi] */
    K_LIST_LONG, /* struct cli_list of integers in [lo, hi] */
    K_LIST_F64,  /* struct cli_list of numbers in [lo, hi] */
    K_LIST_STR,  /* struct cli_list of strings (each passes check) */
    K_APPEND,    /* struct cli_list of strings, one more per occurrence */
    K_FN,        /* custom handler */
};

/* help sections, in print order */
enum cli_group { G_MODEL, G_GEN, G_EVAL, G_BENCH, G_SERVE, G_MKMODEL, G_INFO, G_OUT, G_KV, G_KVTYPE, G_COUNT };

static const char *const k_group_title[G_COUNT] = {
    "model and threads", "prompt, generation and sampling", "evaluation", "benchmark grid", "server",
    "model to write", "listing", "output",
    "KV-cache policy (docs/policies.md gives exact semantics; omitted = the policy's default)",
    "KV-cache storage (independent of the policy; bytes reported are the types' real bytes)",
};

struct cli_opt {
    unsigned tools;      /* enum cli_tool bits */
    enum cli_group group;
    const char *names;   /* spellings shown in help, ", "-separated */
    const char *aliases; /* further accepted spellings, not shown (old names) */
    const char *hint;    /* value placeholder; NULL = takes no value */
    const char *help;    /* '\n' starts an indented continuation line */
    enum cli_kind kind;
    size_t off;          /* offsetof(struct cli_params, field) */
    double lo, hi;
    const char *(*check)(const char *v);                                       /* K_STR, K_LIST_STR */
    bool (*fn)(struct cli_params *p, const char *opt, const char *v, char *err, size_t n); /* K_FN */
    const char *def;     /* default shown: NULL = from the value, "" = none */
    bool hidden;         /* accepted but not listed */
};

#define OFF(f) offsetof(struct cli_params, f)
#define R CLI_RUN
#define E CLI_EVAL
#define B CLI_BENCH
#define I CLI_INFO
#define M CLI_MKMODEL
#define S CLI_SERVE
#define Q CLI_QUANTIZE
#define T CLI_TOKENIZE
#define KVT (R | E | B | S)
#define BIG (1L << 24)
#define HUGE30 (1L << 30)

static const char *check_template(const char *v);
static const char *check_device(const char *v);
static const char *check_rope_scaling(const char *v);
static bool fn_pool(struct cli_params *p, const char *opt, const char *v, char *err, size_t n);
static bool fn_pool_type(struct cli_params *p, const char *opt, const char *v, char *err, size_t n);
static bool fn_compat(struct cli_params *p, const char *opt, const char *v, char *err, size_t n);
static bool fn_eval_seed(struct cli_params *p, const char *opt, const char *v, char *err, size_t n);
static bool fn_kv_type(struct cli_params *p, const char *opt, const char *v, char *err, size_t n);
static bool fn_ngl(struct cli_params *p, const char *opt, const char *v, char *err, size_t n);
static bool fn_logit_bias(struct cli_params *p, const char *opt, const char *v, char *err, size_t n);

static const struct cli_opt k_opts[] = {
    /* model and threads */
    {R | E | B | I | S | T, G_MODEL, "-m, --model", NULL, "FILE", "GGUF or llama2.c model", K_STR, OFF(model), 0, 0,
     NULL, NULL, "bundled models/stories260K.gguf", false},
    {Q, G_MODEL, "-m, --model", NULL, "FILE", "input GGUF model (F32, F16 or BF16 tensors)", K_STR, OFF(model), 0,
     0, NULL, NULL, "", false},
    {R | E | B | S | T, G_MODEL, "--tokenizer", NULL, "FILE",
     "tokenizer .bin for llama2.c checkpoints (default tok<vocab>.bin beside the model)", K_STR, OFF(tokenizer), 0,
     0, NULL, NULL, "", false},
    {R | E | S, G_MODEL, "--mmproj", NULL, "FILE", "vision tower (llama.cpp-style mmproj GGUF) for images", K_STR,
     OFF(mmproj), 0, 0, NULL, NULL, NULL, false},
    {R | E | B | S, G_MODEL, "--no-repack", NULL, NULL,
     "read the matrices from the file mapping (default: moved to\nanonymous memory at load, Q8_0/Q4_0 interleaved for the int8\nkernels; one copy resident)",
     K_FLAG, OFF(no_repack), 0, 0, NULL, NULL, NULL, false},
    {R | E | S, G_MODEL, "-t, --threads", NULL, "N", "worker threads", K_LONG, OFF(threads), 1, 256, NULL, NULL,
     "online cores, at most 8", false},
    {B, G_MODEL, "-t, --threads", NULL, "LIST", "worker threads", K_LIST_LONG, OFF(threads_list), 1, 256, NULL,
     NULL, NULL, false},
    {R | E | B | S, G_MODEL, "-dev, --device", NULL, "DEV",
     "compute device: auto (the first GPU, else the CPU), cpu, vulkan\n(a GPU or an error) or vulkan:N "
     "(ekv info --devices lists them)", K_STR, OFF(device), 0, 0, check_device, NULL, "$EKV_DEVICE, else auto",
     false},
    {R | E | B | S, G_MODEL, "-ngl, --n-gpu-layers", "--gpu-layers", "N",
     "llama.cpp's flag as a device: 0 = cpu; N > 0 or 'all' = vulkan (every\nlayer: ekv does not split a model "
     "between devices); -1 or 'auto' = auto", K_FN, 0, 0, 0, NULL, fn_ngl, "", false},
    {R | E | B | S, G_MODEL, "-c, --ctx-size", "--ctx", "N", "positions per sequence", K_LONG, OFF(n_ctx), 0, BIG,
     NULL, NULL, "the model's trained context", false},

    /* prompt, generation and sampling */
    {R, G_GEN, "-p, --prompt", NULL, "TEXT", "prompt", K_STR, OFF(prompt), 0, 0, NULL, NULL,
     "\"Once upon a time\"", false},
    {R, G_GEN, "-f, --file", NULL, "FILE", "read the prompt from a file", K_STR, OFF(prompt_file), 0, 0, NULL,
     NULL, NULL, false},
    {R, G_GEN, "-n, --n-predict", NULL, "N", "tokens to generate (-1 = until end of text or context)", K_LONG,
     OFF(n_predict), -1, BIG, NULL, NULL, NULL, false},
    {E, G_GEN, "-n, --n-predict", NULL, "N", "rouge: max new tokens per answer", K_LONG, OFF(n_predict), 1,
     1L << 20, NULL, NULL, NULL, false},
    {S, G_GEN, "-n, --n-predict", NULL, "N",
     "max_tokens of a request that gives none (-1 = until end of text or context)", K_LONG, OFF(n_predict), -1,
     BIG, NULL, NULL, NULL, false},
    {R | S, G_GEN, "--ignore-eos", NULL, NULL, "keep generating after end of text", K_FLAG, OFF(ignore_eos), 0, 0,
     NULL, NULL, NULL, false},
    {R, G_GEN, "--no-display-prompt", NULL, NULL, "do not echo the prompt", K_NOFLAG, OFF(display_prompt), 0, 0,
     NULL, NULL, NULL, false},
    {R, G_GEN, "--image", NULL, "FILE",
     "image (JPEG/PNG) spliced where the prompt says <image>, or before the text\n(needs --mmproj); repeat for "
     "several images (markers filled in order)", K_APPEND, OFF(images), 0, 0, NULL, NULL, "", false},
    {R, G_GEN, "--chat-template", NULL, "T", "chat template (names below; default: with --image the model's own, else llava-1.5; none without)", K_STR,
     OFF(chat_template), 0, 0, check_template, NULL, "", false},
    {E, G_GEN, "--chat-template", NULL, "T",
     "chat template (default: plain system + \"\\n\" + instruction;\nthe model's own, else llava-1.5, for items with an image)", K_STR,
     OFF(chat_template), 0, 0, check_template, NULL, "", false},
    {S, G_GEN, "--chat-template", NULL, "T",
     "chat template of /v1/chat/completions (default: detected from the\nGGUF's tokenizer.chat_template, else none)",
     K_STR, OFF(chat_template), 0, 0, check_template, NULL, "", false},
    {R, G_GEN, "-cnv, --chat", "--conversation", NULL,
     "conversation: one user message per line of stdin (-p gives the first), each\nanswer streamed; the compressed "
     "cache is kept between turns; template:\n--chat-template, else the model's own, else chatml; -n is per turn",
     K_FLAG, OFF(chat), 0, 0, NULL, NULL, NULL, false},
    {R, G_GEN, "--system", NULL, "TEXT", "system prompt for the chat template (default: the template's own)",
     K_STR, OFF(system), 0, 0, NULL, NULL, "", false},
    {R | S, G_GEN, "--temp", NULL, "F", "temperature; 0 = greedy", K_F32, OFF(sampling.temp), 0, 100, NULL, NULL,
     NULL, false},
    {R | S, G_GEN, "--top-k", NULL, "N", "top-k, 0 = off", K_I32, OFF(sampling.top_k), 0, BIG, NULL, NULL, NULL,
     false},
    {R | S, G_GEN, "--top-p", NULL, "F", "top-p, 1 = off", K_F32, OFF(sampling.top_p), 1e-6, 1, NULL, NULL, NULL,
     false},
    {R | S, G_GEN, "--min-p", NULL, "F", "min-p, 0 = off", K_F32, OFF(sampling.min_p), 0, 1, NULL, NULL, NULL,
     false},
    {R | S, G_GEN, "--repeat-penalty", NULL, "F",
     "penalise tokens of the last --repeat-last-n: logit / F (> 0) or x F (<= 0); 1 = off", K_F32,
     OFF(sampling.repeat_penalty), 1e-6, 1e6, NULL, NULL, NULL, false},
    {R | S, G_GEN, "--repeat-last-n", NULL, "N", "tokens the penalties look back over; 0 = off, -1 = the context size",
     K_I32, OFF(sampling.repeat_last_n), -1, 1 << 24, NULL, NULL, NULL, false},
    {R | S, G_GEN, "--frequency-penalty", NULL, "F", "subtracted per occurrence in that window; 0 = off", K_F32,
     OFF(sampling.frequency_penalty), -1e6, 1e6, NULL, NULL, NULL, false},
    {R | S, G_GEN, "--presence-penalty", NULL, "F", "subtracted once from a token in that window; 0 = off", K_F32,
     OFF(sampling.presence_penalty), -1e6, 1e6, NULL, NULL, NULL, false},
    {R | S, G_GEN, "-l, --logit-bias", NULL, "TOKEN(+|-)BIAS",
     "add BIAS to the logit of token id TOKEN before the penalties ('15043+1',\n'15043-inf' bans it); repeat for "
     "several tokens (a token twice: the sum);\nserve: the default of requests without logit_bias", K_FN, 0, 0, 0,
     NULL, fn_logit_bias, "", false},
    {R, G_GEN, "-s, --seed", NULL, "N", "sampling seed", K_U64, OFF(sampling.seed), 0, 0, NULL, NULL, NULL, false},
    {S, G_GEN, "-s, --seed", NULL, "N", "sampling seed of a request that gives none", K_U64, OFF(sampling.seed), 0,
     0, NULL, NULL, "a new one per request", false},
    {E, G_GEN, "-s, --seed", NULL, "N", "", K_FN, 0, 0, 0, NULL, fn_eval_seed, "", true},

    /* evaluation */
    {E, G_EVAL, "-f, --data", NULL, "FILE", "evaluation set", K_STR, OFF(data), 0, 0, NULL, NULL,
     "the bundled data/tinystories_eval.jsonl", false},
    {E, G_EVAL, "--format", NULL, "F", "jsonl | text | auto (auto: .jsonl/.json => jsonl, else text)", K_STR,
     OFF(format), 0, 0, NULL, NULL, NULL, false},
    {E, G_EVAL, "--doc-sep", NULL, "S", "text: split the file into documents at S (default: one document)", K_STR,
     OFF(doc_sep), 0, 0, NULL, NULL, "", false},
    {E, G_EVAL, "--metric", NULL, "LIST", "comma list of ppl,rouge,kl,hitrate,acc (see below)", K_STR, OFF(metrics),
     0, 0, NULL, NULL, NULL, false},
    {E, G_EVAL, "--rouge", NULL, "KIND", "pltrdy (rouge 1.0.1, the ElasticCache protocol) | sentence", K_STR,
     OFF(rouge), 0, 0, NULL, NULL, NULL, false},
    {E, G_EVAL, "--limit", NULL, "N", "evaluate at most N items (0 = all)", K_LONG, OFF(limit), 0, 1e15, NULL,
     NULL, NULL, false},
    {E, G_EVAL, "--offset", NULL, "N", "skip the first N items", K_LONG, OFF(offset), 0, 1e15, NULL, NULL,
     NULL, false},
    {E, G_EVAL, "--stride", NULL, "N", "text ppl: tokens per streamed chunk", K_LONG, OFF(stride), 1, BIG, NULL,
     NULL, NULL, false},
    {E, G_EVAL, "--share", NULL, "N",
     "cells that read each item's prompt in one shared forward (the same\nresults; each holds its cache until its turn;"
     " 1 = each reads its own)", K_LONG, OFF(share), 1, 4096, NULL, NULL, NULL, false},
    {E, G_EVAL, "-o, --out", NULL, "DIR",
     "output directory: results.csv (deterministic), results.json\n(with timings), results.md, <metric>.png", K_STR,
     OFF(out_dir), 0, 0, NULL, NULL, NULL, false},
    {E, G_EVAL, "--no-plot", NULL, NULL, "do not run gnuplot", K_NOFLAG, OFF(plot), 0, 0, NULL, NULL, NULL, false},
    {E, G_EVAL, "--image-dir", NULL, "DIR",
     "relative image paths resolve against DIR (default: the data file's folder)", K_STR, OFF(image_dir), 0, 0,
     NULL, NULL, "", false},
    {E, G_EVAL, "--per-item", NULL, "FILE", "also write every item x cell's measurements to FILE (JSONL)", K_STR,
     OFF(per_item), 0, 0, NULL, NULL, "", false},
    {E, G_EVAL, "--per-type", NULL, NULL,
     "also each quality metric per item type (JSONL \"type\" or \"category\"):\nrows <metric>.<type>, e.g. acc.color",
     K_FLAG, OFF(per_type), 0, 0, NULL, NULL, NULL, false},
    {E, G_EVAL, "--compare-to", NULL, "POLICY",
     "ppl_ratio rows: each cell's PPL over POLICY's (same budget, else its only\ncell) with a paired bootstrap 95%"
     " interval over items (ppl_ratio_lo/hi),\nand acc_diff / rouge_l_f_diff rows (mean difference, same bootstrap);\n'base': each X+merge cell over X's", K_STR, OFF(compare_to), 0, 0, NULL,
     NULL, "", false},

    /* benchmark grid */
    {B, G_BENCH, "-p, --n-prompt", NULL, "LIST", "prompt tokens timed per sequence", K_LIST_LONG, OFF(n_prompt), 0,
     BIG, NULL, NULL, NULL, false},
    {B, G_BENCH, "-n, --n-gen", NULL, "LIST", "decode steps timed", K_LIST_LONG, OFF(n_gen), 0, BIG, NULL, NULL,
     NULL, false},
    {B, G_BENCH, "-d, --depth", NULL, "LIST", "tokens put in the cache before the timed prompt, untimed",
     K_LIST_LONG, OFF(depth), 0, BIG, NULL, NULL, NULL, false},
    {B, G_BENCH, "-b, --batch", NULL, "LIST", "sequences decoded together in one forward", K_LIST_LONG, OFF(batch),
     1, 1024, NULL, NULL, NULL, false},
    {B, G_BENCH, "-r, --repetitions", NULL, "N", "repetitions of every grid point", K_LONG, OFF(reps), 1, 256, NULL,
     NULL, NULL, false},
    {B, G_BENCH, "--no-warmup", NULL, NULL, "skip the untimed warm-up (one decode step, one prompt of the longest -p)", K_NOFLAG,
     OFF(warmup), 0, 0, NULL, NULL, NULL, false},

    /* server */
    {S, G_SERVE, "--host", NULL, "ADDR", "IPv4 address to listen on (0.0.0.0 = every interface)", K_STR, OFF(host),
     0, 0, NULL, NULL, NULL, false},
    {S, G_SERVE, "--port", NULL, "N", "TCP port (0 = any free port, printed at start)", K_LONG, OFF(port), 0, 65535,
     NULL, NULL, NULL, false},
    {S, G_SERVE, "-np, --parallel", NULL, "N", "sequences generating at once (decoded together)", K_LONG,
     OFF(parallel), 1, 1024, NULL, NULL, NULL, false},
    {S, G_SERVE, "--kv-mem", NULL, "MiB",
     "cap on the KV bytes of all sequences together; a request is admitted\nwhen its projected cache fits (0 = no cap)",
     K_F64, OFF(kv_mem_mib), 0, 1 << 30, NULL, NULL, NULL, false},
    {S, G_SERVE, "--prefix-cache", NULL, "MiB",
     "reuse the caches of shared prefixes (every message of a chat but the last: system\nprompt, document, images, "
     "history) up to MiB, least recently used out first;\nthey count against --kv-mem (0 = off)", K_F64,
     OFF(prefix_cache_mib), 0, 1 << 30, NULL, NULL, NULL, false},
    {S, G_SERVE, "--slot-save-path", NULL, "DIR",
     "allow POST /slots/{id}?action=save|restore: cached prefixes to and from files in DIR", K_STR,
     OFF(slot_save_path), 0, 0, NULL, NULL, "", false},
    {S, G_SERVE, "--queue", NULL, "N",
     "requests that may wait for admission; beyond, 503 + Retry-After (0: none waits, a request runs if a slot is "
     "free now)", K_LONG, OFF(queue), 0, 1L << 20, NULL, NULL, NULL, false},
    {S, G_SERVE, "--api-key", NULL, "KEY", "require 'Authorization: Bearer KEY'", K_STR, OFF(api_key), 0, 0, NULL,
     NULL, "", false},
    {S, G_SERVE, "--cors", NULL, "ORIGIN", "let browser pages from ORIGIN (or *) call the API (CORS headers, OPTIONS "
     "preflight)", K_STR, OFF(cors), 0, 0, NULL, NULL, NULL, false},
    {S, G_SERVE, "--max-body", NULL, "BYTES", "largest request body (413 beyond)", K_LONG, OFF(max_body), 1024,
     1L << 30, NULL, NULL, NULL, false},
    {S, G_SERVE, "-to, --timeout", NULL, "N", "seconds an idle connection is kept", K_LONG, OFF(timeout), 1, 86400,
     NULL, NULL, NULL, false},
    {S, G_SERVE, "--drain", NULL, "N", "on SIGTERM/SIGINT: seconds the running requests get to finish (new and waiting "
     "ones: 503; a second signal: at once)", K_LONG, OFF(drain), 0, 86400, NULL, NULL, NULL, false},
    {S, G_SERVE, "--prefill-chunk", NULL, "N", "prompt tokens read per engine step (bounds the stall of streams)",
     K_LONG, OFF(prefill_chunk), 16, 1L << 16, NULL, NULL, NULL, false},
    {S, G_SERVE, "-a, --alias", NULL, "NAME", "model id in /v1/models and responses (default: the file name)",
     K_STR, OFF(alias), 0, 0, NULL, NULL, "", false},

    /* mkmodel */
    {M, G_MKMODEL, "--preset", NULL, "NAME", "model shape (see below)", K_STR, OFF(preset), 0, 0, NULL, NULL, "",
     false},
    {M, G_MKMODEL, "-o, --output", NULL, "FILE", "language-model GGUF to write", K_STR, OFF(output), 0, 0, NULL,
     NULL, "", false},
    {M, G_MKMODEL, "--mmproj-out", NULL, "FILE", "vision-tower GGUF to write (vision presets only)", K_STR,
     OFF(mmproj_out), 0, 0, NULL, NULL, "", false},
    {M, G_MKMODEL, "--type", NULL, "T", "type of weight matrices: f32, f16, q8_0, q4_0", K_STR, OFF(weight_type), 0,
     0, NULL, NULL, NULL, false},
    {M, G_MKMODEL, "--vocab", NULL, "FILE", "copy tokenizer.* from this GGUF (vocabulary size follows it)", K_STR,
     OFF(vocab), 0, 0, NULL, NULL, "", false},
    {Q, G_MKMODEL, "-o, --output", NULL, "FILE", "GGUF to write (must differ from the input)", K_STR, OFF(output), 0,
     0, NULL, NULL, "", false},
    {Q, G_MKMODEL, "--type", NULL, "T", "type of the matrices: q8_0, q4_0, q4_k, q5_k, q6_k or f16", K_STR, OFF(weight_type), 0, 0,
     NULL, NULL, NULL, false},
    {M, G_MKMODEL, "--seed", NULL, "N", "random seed of the weights; same seed, same bytes", K_U64,
     OFF(weight_seed), 0, 0, NULL, NULL, NULL, false},
    {M, G_MKMODEL, "--n-layer", NULL, "N", "blocks to write (small test models of a real width)", K_LONG,
     OFF(mk_n_layer), 1, 4096, NULL, NULL, "the preset's", false},
    {M, G_MKMODEL, "--vision-layers", NULL, "N", "blocks of the vision tower to write (mmproj of a real width, fewer blocks)",
     K_LONG, OFF(mk_n_layer_vision), 1, 4096, NULL, NULL, "the preset's", false},
    {M, G_MKMODEL, "-c, --ctx-size", NULL, "N", "context_length to write", K_LONG, OFF(n_ctx), 1, 1L << 24, NULL,
     NULL, "the preset's", false},
    {M, G_MKMODEL, "--rope-scaling", NULL, "T", "write rope.scaling.type T: none, linear or yarn", K_STR,
     OFF(rope_scaling), 0, 0, check_rope_scaling, NULL, "", false},
    {M, G_MKMODEL, "--rope-scale", NULL, "F", "write rope.scaling.factor F", K_F64, OFF(rope_scale), 1e-3, 1e6, NULL,
     NULL, "", false},
    {M, G_MKMODEL, "--rope-orig-ctx", NULL, "N", "write rope.scaling.original_context_length N", K_LONG,
     OFF(rope_orig_ctx), 1, 1L << 24, NULL, NULL, "", false},
    {M, G_MKMODEL, "--sliding-window", NULL, "N", "write attention.sliding_window N (0: none written)", K_LONG,
     OFF(sliding_window), 0, 1L << 30, NULL, NULL, "the preset's", false},

    /* tokenize */
    {T, G_GEN, "-p, --prompt", NULL, "TEXT", "text to tokenize", K_STR, OFF(prompt), 0, 0, NULL, NULL, "", false},
    {T, G_GEN, "-f, --file", NULL, "FILE", "read the text from a file ('-' = standard input)", K_STR,
     OFF(prompt_file), 0, 0, NULL, NULL, NULL, false},
    {T, G_GEN, "--no-bos", NULL, NULL, "do not add BOS even when the vocabulary asks for it", K_FLAG,
     OFF(tok_no_bos), 0, 0, NULL, NULL, NULL, false},
    {T, G_GEN, "--parse-special", NULL, NULL, "text of special tokens (\"<|endoftext|>\") becomes those tokens",
     K_FLAG, OFF(tok_parse_special), 0, 0, NULL, NULL, NULL, false},
    {T, G_OUT, "--ids", NULL, NULL, "print only the ids, as [1, 2, 3]", K_FLAG, OFF(tok_ids), 0, 0, NULL, NULL,
     NULL, false},
    {T, G_OUT, "--json", NULL, NULL,
     "print {\"n_tokens\": N, \"ids\": [...], \"offsets\": [...], \"n_bytes\": B}; offsets[i]\nis the byte "
     "offset of token i in the detokenised text (the concatenation\nof the pieces; for byte-level BPE the input itself)",
     K_FLAG, OFF(json), 0, 0, NULL, NULL, NULL, false},
    {T, G_OUT, "--show-count", NULL, NULL, "print the number of tokens at the end (plain and --ids output)", K_FLAG,
     OFF(tok_show_count), 0, 0, NULL, NULL, NULL, false},

    /* info */
    {I, G_INFO, "--devices", "--list-devices", NULL, "list the compute devices (Vulkan GPUs and the CPU) and exit",
     K_FLAG, OFF(list_devices), 0, 0, NULL, NULL, NULL, false},
    {I, G_INFO, "--no-tensors", NULL, NULL, "do not list tensors", K_NOFLAG, OFF(tensors), 0, 0, NULL, NULL, NULL,
     false},
    {I, G_INFO, "--no-metadata", NULL, NULL, "do not list metadata", K_NOFLAG, OFF(metadata), 0, 0, NULL, NULL,
     NULL, false},

    /* output */
    {R | E, G_OUT, "--json", NULL, NULL, "print one JSON object instead of text", K_FLAG, OFF(json), 0, 0, NULL,
     NULL, NULL, false},
    {B, G_OUT, "--json", NULL, "FILE", "also write all results as JSON ('-' = stdout, no table)", K_STR,
     OFF(json_path), 0, 0, NULL, NULL, "", false},
    {R, G_OUT, "--kv-trace", NULL, "FILE",
     "write kept positions and merge weights per layer and KV head (JSON)\nafter prefill and at the end", K_STR,
     OFF(kv_trace), 0, 0, NULL, NULL, "", false},
    {R, G_OUT, "--kv-save", NULL, "FILE",
     "save the sequence (compressed cache, policy state, tokens) to FILE at the end,\nfor --kv-load", K_STR,
     OFF(kv_save), 0, 0, NULL, NULL, "", false},
    {R, G_OUT, "--kv-load", NULL, "FILE",
     "start from a sequence saved with --kv-save (its policy and budget): a prompt that\nbegins with the "
     "saved tokens reads only the rest, any other prompt follows them", K_STR, OFF(kv_load), 0, 0, NULL, NULL,
     "", false},

    /* KV-cache policy */
    {R | S, G_KV, "--kv-policy", NULL, "NAME", "policy (list below)", K_STR, OFF(kv.policy), 0, 0,
     cli_check_policy, NULL, NULL, false},
    {E | B, G_KV, "--kv-policy", NULL, "LIST", "comma list of policies (list below)", K_LIST_STR, OFF(kv_policies),
     0, 0, cli_check_policy, NULL, NULL, false},
    {R | S, G_KV, "--kv-budget", NULL, "F", "fraction of tokens seen that is kept, (0,1]", K_F64, OFF(kv.budget),
     1e-6, 1, NULL, NULL, NULL, false},
    {E | B, G_KV, "--kv-budget", NULL, "LIST",
     "comma list of kept fractions in (0,1]; policies x budgets run as a\ngrid, 'full' once at budget 1",
     K_LIST_F64, OFF(kv_budgets), 1e-6, 1, NULL, NULL, NULL, false},
    {KVT, G_KV, "--kv-tokens", NULL, "N", "cap on entries per layer and KV head", K_I32, OFF(kv.max_tokens), 1,
     HUGE30, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-sinks", NULL, "N", "protected first tokens (local 4, roco 4, elastic 1)", K_I32,
     OFF(kv.sinks), 0, HUGE30, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-window", NULL, "N", "protected recent tokens (h2o/scissorhands: half the budget)", K_I32,
     OFF(kv.window), 0, HUGE30, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-obs-window", NULL, "N", "observation window of queries (snapkv/pyramidkv: 32)", K_I32,
     OFF(kv.obs_window), 1, HUGE30, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-pool", NULL, "N", "pooling kernel, odd (snapkv/pyramidkv: 7)", K_FN, 0, 1, 1001, NULL,
     fn_pool, "", false},
    {KVT, G_KV, "--kv-pool-type", NULL, "T", "avg or max", K_FN, 0, 0, 0, NULL, fn_pool_type, "max", false},
    {KVT, G_KV, "--kv-distance", NULL, "N", "Elastic Cache fixed-point distance (default -25)", K_I32,
     OFF(kv.distance), -HUGE30, HUGE30, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-chunk", NULL, "N", "block-wise prefill: compress after every N prompt tokens", K_I32,
     OFF(kv.chunk), 0, HUGE30, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-beta", NULL, "F", "PyramidKV beta (default 20)", K_F64, OFF(kv.beta), 1, 1e6, NULL, NULL, "",
     false},
    {KVT, G_KV, "--kv-sparsity-p", NULL, "F", "VL-Cache threshold p (default 0.01)", K_F64, OFF(kv.sparsity_p), 0,
     1, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-recent-ratio", NULL, "F", "recent share of the budget (vlcache 0.1)", K_F64,
     OFF(kv.recent_ratio), 0, 1, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-recompress", NULL, "N",
     "snapkv/pyramidkv/vlcache: re-select every N generated tokens\n(cache <= budget + N entries; 0 = prompt only; 32)",
     K_I32, OFF(kv.recompress), 0, HUGE30, NULL, NULL, "", false},
    {KVT, G_KV, "--kv-seed", NULL, "N", "seed of the random policy", K_U64, OFF(kv.seed), 0, 0, NULL, NULL, NULL,
     false},
    {KVT, G_KV, "--kv-compat", NULL, "paper|ref", "reproduce the authors' reference code (elastic)", K_FN, 0, 0, 0,
     NULL, fn_compat, "paper", false},

    /* KV-cache storage */
    {R | S, G_KVTYPE, "--kv-type", NULL, "T",
     "storage type of keys and values: f32, f16, q8_0, q4_0, kivi2, kivi4\n(K/V for different types, e.g. q8_0/kivi4)",
     K_FN, 0, 0, 0, NULL, fn_kv_type, "f16", false},
    {E | B, G_KVTYPE, "--kv-type", NULL, "LIST",
     "comma list of storage types (T or K/V, as for run), a grid axis with\npolicies x budgets (default f16)",
     K_LIST_STR, OFF(kv_types), 0, 0, cli_check_kv_type, NULL, "", false},
    {KVT, G_KVTYPE, "-ctk, --kv-type-k", "--cache-type-k", "T", "storage type of keys only (llama.cpp's -ctk)", K_FN,
     0, 0, 0, NULL, fn_kv_type, "", false},
    {KVT, G_KVTYPE, "-ctv, --kv-type-v", "--cache-type-v", "T", "storage type of values only (llama.cpp's -ctv)",
     K_FN, 0, 0, 0, NULL, fn_kv_type, "", false},
    {KVT, G_KVTYPE, "--kv-group", NULL, "G",
     "KIVI group: keys per channel over G entries, values per entry over G\nchannels", K_I32, OFF(kv.kv_group), 1,
     1024, NULL, NULL, "32", false},
    {KVT, G_KVTYPE, "--kv-residual", NULL, "R",
     "KIVI: the newest R entries stay fp16 until a group fills; a multiple\nof G", K_I32, OFF(kv.kv_residual), 0,
     HUGE30, NULL, NULL, "128", false},
};

#undef R
#undef E
#undef B
#undef I
#undef M
#undef S
#undef Q
#undef T

/* ------------------------------------------------------------------ */
/* checks and custom handlers                                           */
/* ------------------------------------------------------------------ */

/* A check's message lives in a buffer of the calling thread: the server
 * checks each request's "kv" fields with these on its connection threads,
 * at the same time (one static buffer was written by two of them). */

const char *cli_check_policy(const char *name) {
    static _Thread_local char msg[512];
    for (int i = 0; i < ekv_kv_policy_count(); i++)
        if (name && strlen(ekv_kv_policy_name(i)) == strcspn(name, ":+") &&
            !strncmp(name, ekv_kv_policy_name(i), strcspn(name, ":+")))
            return NULL; /* "name" or a spec "name:opt=val:..." (the policy checks its options) */
    size_t used = (size_t)snprintf(msg, sizeof msg, "unknown KV policy '%.64s' (known:", name ? name : "");
    for (int i = 0; i < ekv_kv_policy_count() && used < sizeof msg; i++)
        used += (size_t)snprintf(msg + used, sizeof msg - used, " %s", ekv_kv_policy_name(i));
    if (used < sizeof msg) snprintf(msg + used, sizeof msg - used, ")");
    return msg;
}

static const char *check_rope_scaling(const char *v) {
    static _Thread_local char msg[160];
    if (!strcmp(v, "none") || !strcmp(v, "linear") || !strcmp(v, "yarn")) return NULL;
    snprintf(msg, sizeof msg, "unknown RoPE scaling '%.64s' (known: none, linear, yarn)", v);
    return msg;
}

static const char *check_device(const char *v) {
    if (!strcmp(v, "auto") || !strcmp(v, "cpu") || !strcmp(v, "vulkan")) return NULL;
    if (!strncmp(v, "vulkan:", 7) && v[7] >= '0' && v[7] <= '9' && strspn(v + 7, "0123456789") == strlen(v + 7) &&
        strlen(v + 7) <= 4)
        return NULL;
    return "expected auto, cpu, vulkan or vulkan:N";
}

static const char *check_template(const char *v) {
    static _Thread_local char msg[512];
    size_t n;
    if (ekv_chat_apply(v, NULL, 0, false, NULL, 0, &n) == EKV_OK) return NULL; /* a name or an alias */
    size_t used = (size_t)snprintf(msg, sizeof msg, "unknown chat template '%.64s' (known:", v);
    for (int i = 0; i < ekv_chat_template_count() && used < sizeof msg; i++)
        used += (size_t)snprintf(msg + used, sizeof msg - used, " %s", ekv_chat_template_name(i));
    if (used < sizeof msg) snprintf(msg + used, sizeof msg - used, ")");
    return msg;
}

/* A row bound as long (bounds are doubles; LONG_MAX does not survive the trip). */
static long dlong(double x) {
    if (x >= (double)LONG_MAX) return LONG_MAX;
    if (x <= (double)LONG_MIN) return LONG_MIN;
    return (long)x;
}

static bool parse_long(const char *opt, const char *v, long lo, long hi, long *out, char *err, size_t n) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        snprintf(err, n, "%s expects an integer in [%ld, %ld], got '%.64s'", opt, lo, hi, v ? v : "(nothing)");
        return false;
    }
    *out = x;
    return true;
}

static bool parse_double(const char *opt, const char *v, double lo, double hi, double *out, char *err, size_t n) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        snprintf(err, n, "%s expects a number in [%g, %g], got '%.64s'", opt, lo, hi, v ? v : "(nothing)");
        return false;
    }
    *out = x;
    return true;
}

static bool parse_u64(const char *opt, const char *v, uint64_t *out, char *err, size_t n) {
    char *end;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || v[0] == '-' || v[0] == '+' || v[0] == ' ') {
        snprintf(err, n, "%s expects a non-negative integer, got '%.64s'", opt, v ? v : "(nothing)");
        return false;
    }
    *out = x;
    return true;
}

static bool fn_pool(struct cli_params *p, const char *opt, const char *v, char *err, size_t n) {
    long x;
    if (!parse_long(opt, v, 1, 1001, &x, err, n)) return false;
    if (x % 2 == 0) {
        snprintf(err, n, "%s must be odd, got %ld", opt, x);
        return false;
    }
    p->kv.pool = (int32_t)x;
    return true;
}

static bool fn_pool_type(struct cli_params *p, const char *opt, const char *v, char *err, size_t n) {
    if (!strcmp(v, "avg")) p->kv.pool_kind = EKV_POOL_AVG;
    else if (!strcmp(v, "max")) p->kv.pool_kind = EKV_POOL_MAX;
    else {
        snprintf(err, n, "%s expects avg or max, got '%.64s'", opt, v);
        return false;
    }
    return true;
}

/* -ngl N: llama.cpp's layer count, mapped onto --device (the last of the
 * two on a command line wins). */
static bool fn_ngl(struct cli_params *p, const char *opt, const char *v, char *err, size_t n) {
    if (!strcmp(v, "auto") || !strcmp(v, "all")) {
        p->device = v[1] == 'u' ? "auto" : "vulkan";
        return true;
    }
    char *end = NULL;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < -1) {
        snprintf(err, n, "%s expects a number of layers (0 = the CPU, N > 0: the GPU), 'all', 'auto' or -1, got '%.64s'",
                 opt, v);
        return false;
    }
    p->device = x == 0 ? "cpu" : x > 0 ? "vulkan" : "auto";
    return true;
}

static bool fn_logit_bias(struct cli_params *p, const char *opt, const char *v, char *err, size_t n) {
    struct cli_list *l = &p->logit_bias;
    long tok;
    double b;
    if (!cli_logit_bias_parse(v, &tok, &b)) {
        snprintf(err, n, "%s expects TOKEN+BIAS or TOKEN-BIAS (a token id and a finite number, or TOKEN-inf), got "
                 "'%.64s'", opt, v);
        return false;
    }
    if (l->n == CLI_LIST_MAX) {
        snprintf(err, n, "%s: at most %d", opt, CLI_LIST_MAX);
        return false;
    }
    l->i[l->n] = tok;
    l->d[l->n++] = b;
    return true;
}

static bool fn_compat(struct cli_params *p, const char *opt, const char *v, char *err, size_t n) {
    if (!strcmp(v, "ref")) p->kv.compat_ref = true;
    else if (!strcmp(v, "paper")) p->kv.compat_ref = false;
    else {
        snprintf(err, n, "%s expects 'paper' or 'ref', got '%.64s'", opt, v);
        return false;
    }
    return true;
}

/* "T" or "K/V" storage types (a --kv-type value or list item). */
bool cli_parse_kv_types(const char *v, enum ekv_kv_type *tk, enum ekv_kv_type *tv, char *err, size_t n) {
    char buf[64];
    const char *slash = v ? strchr(v, '/') : NULL;
    if (!v || strlen(v) >= sizeof buf) {
        snprintf(err, n, "expected a storage type (f32, f16, q8_0, q4_0, kivi2, kivi4) or K/V");
        return false;
    }
    snprintf(buf, sizeof buf, "%.*s", slash ? (int)(slash - v) : (int)strlen(v), v);
    if (ekv_kv_type_parse(buf, tk) != EKV_OK || ekv_kv_type_parse(slash ? slash + 1 : buf, tv) != EKV_OK) {
        snprintf(err, n, "%s", ekv_last_error());
        return false;
    }
    return true;
}

const char *cli_check_kv_type(const char *v) {
    static _Thread_local char msg[256];
    enum ekv_kv_type a, b;
    return cli_parse_kv_types(v, &a, &b, msg, sizeof msg) ? NULL : msg;
}

static bool fn_kv_type(struct cli_params *p, const char *opt, const char *v, char *err, size_t n) {
    enum ekv_kv_type tk, tv;
    char why[192];
    const size_t ol = strlen(opt);
    const bool side_k = !strcmp(opt, "-ctk") || (ol > 2 && !strcmp(opt + ol - 2, "-k"));
    const bool side_v = !strcmp(opt, "-ctv") || (ol > 2 && !strcmp(opt + ol - 2, "-v"));
    if (side_k || side_v) {
        if (strchr(v, '/') || !cli_parse_kv_types(v, &tk, &tv, why, sizeof why)) {
            snprintf(err, n, "%s: %s", opt, strchr(v, '/') ? "expects one type" : why);
            return false;
        }
        if (side_k) p->kv.type_k = tk;
        else p->kv.type_v = tv;
        return true;
    }
    if (!cli_parse_kv_types(v, &tk, &tv, why, sizeof why)) {
        snprintf(err, n, "%s: %s", opt, why);
        return false;
    }
    p->kv.type_k = tk;
    p->kv.type_v = tv;
    return true;
}

/* -s is the sampling seed in every command; eval decodes greedily. */
static bool fn_eval_seed(struct cli_params *p, const char *opt, const char *v, char *err, size_t n) {
    (void)p;
    (void)v;
    snprintf(err, n,
             "%s is the sampling seed, and eval decodes greedily; the random policy's seed is --kv-seed", opt);
    return false;
}

/* ------------------------------------------------------------------ */
/* the one list parser                                                  */
/* ------------------------------------------------------------------ */

static bool parse_list(struct cli_params *p, const struct cli_opt *o, const char *opt, const char *v,
                       struct cli_list *out, char *err, size_t n) {
    struct cli_list l;
    memset(&l, 0, sizeof l);
    /* string items point into a copy owned by p (cli_params_free) */
    if (p->n_owned == CLI_OWNED_MAX) {
        snprintf(err, n, "%s: too many list options", opt);
        return false;
    }
    char *buf = strdup(v);
    if (!buf) {
        snprintf(err, n, "%s: out of memory", opt);
        return false;
    }
    bool ok = true;
    const char *s = buf;
    while (ok) {
        char *comma = strchr(s, ',');
        if (comma) *comma = 0;
        if (!*s) {
            snprintf(err, n, "%s: empty item in the list '%.64s'", opt, v);
            ok = false;
            break;
        }
        if (l.n == CLI_LIST_MAX) {
            snprintf(err, n, "%s: more than %d values", opt, CLI_LIST_MAX);
            ok = false;
            break;
        }
        if (o->kind == K_LIST_LONG) {
            ok = parse_long(opt, s, dlong(o->lo), dlong(o->hi), &l.i[l.n], err, n);
            l.d[l.n] = (double)l.i[l.n];
        } else if (o->kind == K_LIST_F64) {
            ok = parse_double(opt, s, o->lo, o->hi, &l.d[l.n], err, n);
        } else {
            const char *msg = o->check ? o->check(s) : NULL;
            if (msg) {
                snprintf(err, n, "%s: %s", opt, msg);
                ok = false;
            }
        }
        l.s[l.n] = s;
        for (int j = 0; ok && j < l.n; j++) {
            bool dup = o->kind == K_LIST_STR ? !strcmp(l.s[j], s) : l.d[j] == l.d[l.n];
            if (dup) {
                snprintf(err, n, "%s: '%.64s' appears twice in the list", opt, s);
                ok = false;
            }
        }
        if (ok) l.n++;
        if (!comma) break;
        s = comma + 1;
    }
    if (!ok) {
        free(buf);
        return false;
    }
    p->owned[p->n_owned++] = buf;
    *out = l;
    return true;
}

/* ------------------------------------------------------------------ */
/* parsing                                                              */
/* ------------------------------------------------------------------ */

/* Does `spell` appear in the ", "-separated list `names`? */
static bool has_spelling(const char *names, const char *spell, size_t len) {
    if (!names) return false;
    const char *s = names;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == len && !strncmp(s, spell, len)) return true;
        if (!e) break;
        s = e + 1;
        while (*s == ' ') s++;
    }
    return false;
}

static const struct cli_opt *find_opt(unsigned tool, const char *spell, size_t len) {
    for (size_t i = 0; i < sizeof k_opts / sizeof k_opts[0]; i++) {
        const struct cli_opt *o = &k_opts[i];
        if ((o->tools & tool) && (has_spelling(o->names, spell, len) || has_spelling(o->aliases, spell, len)))
            return o;
    }
    return NULL;
}

/* Stores v into the row's field of p. */
static bool apply(struct cli_params *p, const struct cli_opt *o, const char *opt, const char *v, char *err,
                  size_t n) {
    char *base = (char *)p + o->off;
    long x;
    double d;
    switch (o->kind) {
    case K_FLAG: *(bool *)base = true; return true;
    case K_NOFLAG: *(bool *)base = false; return true;
    case K_STR: {
        const char *msg = o->check ? o->check(v) : NULL;
        if (msg) {
            snprintf(err, n, "%s: %s", opt, msg);
            return false;
        }
        *(const char **)base = v;
        return true;
    }
    case K_LONG:
        if (!parse_long(opt, v, dlong(o->lo), dlong(o->hi), &x, err, n)) return false;
        *(long *)base = x;
        return true;
    case K_I32:
        if (!parse_long(opt, v, dlong(o->lo), dlong(o->hi), &x, err, n)) return false;
        *(int32_t *)base = (int32_t)x;
        return true;
    case K_U64: return parse_u64(opt, v, (uint64_t *)base, err, n);
    case K_F32:
        if (!parse_double(opt, v, o->lo, o->hi, &d, err, n)) return false;
        *(float *)base = (float)d;
        return true;
    case K_F64:
        if (!parse_double(opt, v, o->lo, o->hi, &d, err, n)) return false;
        *(double *)base = d;
        return true;
    case K_LIST_LONG:
    case K_LIST_F64:
    case K_LIST_STR: return parse_list(p, o, opt, v, (struct cli_list *)base, err, n);
    case K_APPEND: {
        struct cli_list *l = (struct cli_list *)base;
        if (l->n == CLI_LIST_MAX) {
            snprintf(err, n, "%s: at most %d", opt, CLI_LIST_MAX);
            return false;
        }
        l->s[l->n++] = v;
        return true;
    }
    case K_FN: return o->fn(p, opt, v, err, n);
    }
    snprintf(err, n, "%s: internal error (option kind)", opt);
    return false;
}

/* Two rows with a common spelling must not share a command. */
static const char *table_conflict(void) {
    static _Thread_local char msg[160];
    const size_t n = sizeof k_opts / sizeof k_opts[0];
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (!(k_opts[i].tools & k_opts[j].tools)) continue;
            const char *s = k_opts[j].names;
            while (*s) {
                const char *e = strchr(s, ',');
                size_t len = e ? (size_t)(e - s) : strlen(s);
                if (has_spelling(k_opts[i].names, s, len) || has_spelling(k_opts[i].aliases, s, len)) {
                    snprintf(msg, sizeof msg, "option table: '%.*s' is declared twice for one command", (int)len, s);
                    return msg;
                }
                if (!e) break;
                s = e + 1;
                while (*s == ' ') s++;
            }
        }
    return NULL;
}

bool cli_set_option(struct cli_params *p, const char *name, const char *value, char *err, size_t errn) {
    const struct cli_opt *o = find_opt(p->tool, name, strlen(name));
    if (!o) {
        snprintf(err, errn, "unknown option %.64s", name);
        return false;
    }
    if (o->hint && !value) {
        snprintf(err, errn, "%.64s needs a value (%s)", name, o->hint);
        return false;
    }
    return apply(p, o, name, value, err, errn);
}

int cli_parse(const char *cmd, int argc, char **argv, struct cli_params *p, const struct cli_help *help) {
    const char *conflict = table_conflict();
    if (conflict) return cli_usage_error(cmd, "internal error: %s", conflict);
    char err[640];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            p->help = true;
            cli_print_help(stdout, p, help);
            return 2;
        }
        /* --name=value as well as --name value */
        size_t len = strlen(a);
        const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        if (eq) len = (size_t)(eq - a);
        const struct cli_opt *o = find_opt(p->tool, a, len);
        if (!o) return cli_usage_error(cmd, "unknown option: %.*s", (int)len, a);
        const char *v = NULL;
        if (o->hint) {
            if (eq) v = eq + 1;
            else if (i + 1 < argc) v = argv[++i];
            else return cli_usage_error(cmd, "%s needs a value (%s)", a, o->hint);
        } else if (eq) {
            return cli_usage_error(cmd, "%.*s takes no value", (int)len, a);
        }
        char opt[64];
        snprintf(opt, sizeof opt, "%.*s", (int)(len < 63 ? len : 63), a);
        if (!apply(p, o, opt, v, err, sizeof err)) return cli_usage_error(cmd, "%s", err);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* defaults                                                             */
/* ------------------------------------------------------------------ */

static void list_set(struct cli_list *l, const long *iv, const double *dv, int n) {
    memset(l, 0, sizeof *l);
    l->n = n;
    for (int k = 0; k < n; k++) {
        if (iv) l->i[k] = iv[k], l->d[k] = (double)iv[k];
        if (dv) l->d[k] = dv[k];
    }
}

void cli_params_free(struct cli_params *p) {
    for (int k = 0; k < p->n_owned; k++) free(p->owned[k]);
    p->n_owned = 0;
}

void cli_params_init(struct cli_params *p, unsigned tool) {
    memset(p, 0, sizeof *p);
    p->tool = tool;
    p->threads = -1;
    p->n_predict = 128;
    p->display_prompt = true;
    p->sampling = ekv_sampler_default_params();
    p->kv = ekv_kv_default_params();
    p->format = "auto";
    p->metrics = "ppl,rouge,kl";
    p->rouge = "pltrdy";
    p->stride = 96;
    p->share = 16;
    p->out_dir = "eval-out";
    p->plot = true;
    p->reps = 3;
    p->warmup = true;
    p->tensors = p->metadata = true;
    p->weight_type = "f16";
    p->weight_seed = 1;
    p->sliding_window = -1;
    p->host = "127.0.0.1";
    p->port = 8080;
    p->parallel = 32;
    p->queue = 64;
    p->max_body = 8L << 20;
    p->timeout = 60;
    p->drain = 30;
    p->prefill_chunk = 256;
    if (tool == CLI_SERVE) p->n_predict = -1;
    if (tool == CLI_QUANTIZE) p->weight_type = "q8_0";
    if (tool == CLI_EVAL) {
        static const char *const pol[] = {"full", "local", "h2o", "elastic"};
        static const double bud[] = {0.2, 0.5, 1.0};
        p->kv_policies.n = 4;
        for (int k = 0; k < 4; k++) p->kv_policies.s[k] = pol[k];
        list_set(&p->kv_budgets, NULL, bud, 3);
    } else {
        static const double one[] = {1.0};
        p->kv_policies.n = 1;
        p->kv_policies.s[0] = "full";
        list_set(&p->kv_budgets, NULL, one, 1);
    }
    static const long np[] = {512}, ng[] = {128}, zero[] = {0}, b1[] = {1};
    list_set(&p->n_prompt, np, NULL, 1);
    list_set(&p->n_gen, ng, NULL, 1);
    list_set(&p->depth, zero, NULL, 1);
    list_set(&p->batch, b1, NULL, 1);
    long t = ekv_context_default_params().n_threads;
    list_set(&p->threads_list, &t, NULL, 1);
}

/* ------------------------------------------------------------------ */
/* help                                                                 */
/* ------------------------------------------------------------------ */

/* The row's current value as text for "(default: ...)"; "" when none. */
static void default_text(const struct cli_opt *o, const struct cli_params *p, char *buf, size_t n) {
    buf[0] = 0;
    if (o->def) {
        snprintf(buf, n, "%s", o->def);
        return;
    }
    const char *base = (const char *)p + o->off;
    switch (o->kind) {
    case K_STR: {
        const char *s = *(const char *const *)base;
        if (s) snprintf(buf, n, "%s", s);
        break;
    }
    case K_LONG: snprintf(buf, n, "%ld", *(const long *)base); break;
    case K_I32: snprintf(buf, n, "%d", (int)*(const int32_t *)base); break;
    case K_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)base); break;
    case K_F32: snprintf(buf, n, "%g", (double)*(const float *)base); break;
    case K_F64: snprintf(buf, n, "%g", *(const double *)base); break;
    case K_LIST_LONG:
    case K_LIST_F64:
    case K_LIST_STR: {
        const struct cli_list *l = (const struct cli_list *)base;
        size_t used = 0;
        for (int k = 0; k < l->n && used < n; k++) {
            int w;
            if (o->kind == K_LIST_STR) w = snprintf(buf + used, n - used, "%s%s", k ? "," : "", l->s[k]);
            else if (o->kind == K_LIST_LONG) w = snprintf(buf + used, n - used, "%s%ld", k ? "," : "", l->i[k]);
            else w = snprintf(buf + used, n - used, "%s%g", k ? "," : "", l->d[k]);
            if (w < 0) break;
            used += (size_t)w;
        }
        break;
    }
    default: break;
    }
}

static void print_row(FILE *out, const struct cli_opt *o, const struct cli_params *p) {
    char left[96], def[256];
    const bool has_short = o->names[0] == '-' && o->names[1] != '-';
    snprintf(left, sizeof left, "%s%s%s%s", has_short ? "" : "    ", o->names, o->hint ? " " : "",
             o->hint ? o->hint : "");
    default_text(o, p, def, sizeof def);
    const int col = 24;
    fprintf(out, "  %-*s", col, left);
    if ((int)strlen(left) > col) fprintf(out, "\n  %-*s", col, "");
    const char *h = o->help;
    while (*h) {
        const char *nl = strchr(h, '\n');
        int len = nl ? (int)(nl - h) : (int)strlen(h);
        fprintf(out, " %.*s", len, h);
        if (!nl) break;
        fprintf(out, "\n  %-*s", col, "");
        h = nl + 1;
    }
    if (def[0]) fprintf(out, " (default: %s)", def);
    fputc('\n', out);
}

void cli_print_help(FILE *out, const struct cli_params *p, const struct cli_help *help) {
    fprintf(out, "%s\n\n", help->usage);
    if (help->about && help->about[0]) fprintf(out, "%s\n\n", help->about);
    bool kv = false;
    for (int g = 0; g < G_COUNT; g++) {
        bool any = false;
        for (size_t i = 0; i < sizeof k_opts / sizeof k_opts[0]; i++) {
            const struct cli_opt *o = &k_opts[i];
            if (o->group != (enum cli_group)g || !(o->tools & p->tool) || o->hidden) continue;
            if (!any) fprintf(out, "%s:\n", k_group_title[g]);
            any = true;
            print_row(out, o, p);
        }
        if (any) fputc('\n', out);
        if (any && g == G_KV) kv = true;
    }
    fprintf(out, "  -h, --help               this help\n\n");
    if (kv) {
        fprintf(out, "policies:\n");
        for (int i = 0; i < ekv_kv_policy_count(); i++)
            fprintf(out, "  %-13s %s\n", ekv_kv_policy_name(i), ekv_kv_policy_summary(i));
        fprintf(out, "  NAME+merge    any policy, its evicted entries merged into kept ones instead of dropped\n"
                     "                (options merge_to=key|pos, merge_sim=F (0.7), merge_key=mean|anchor|rotate,\n"
                     "                merge_bias=1|0, merge_stats=1|0, merge_at=all|prompt; e.g.\n"
                     "                snapkv+merge:merge_sim=0.8; docs/policies.md)\n"
                     "  NAME+adakv    head-wise budgets (Ada-KV) for snapkv, pyramidkv, h2o, scissorhands, vlcache,\n"
                     "                roco: a layer's budget shared by its heads' scores (option ada_floor=F (0.2);\n"
                     "                composes with +merge)\n");
        fputc('\n', out);
    }
    if (p->tool & (CLI_RUN | CLI_EVAL | CLI_SERVE)) {
        fprintf(out, "chat templates (--chat-template; docs/chat-templates.md):\n ");
        for (int i = 0; i < ekv_chat_template_count(); i++) fprintf(out, " %s", ekv_chat_template_name(i));
        fprintf(out, "\n\n");
    }
    if (help->epilog && help->epilog[0]) fprintf(out, "%s\n", help->epilog);
}
