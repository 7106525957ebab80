/*
 * serve.h — the pieces of `ekv serve` (docs/architecture.md "Serving") and how they
 * meet:
 *
 *   serve_door.c      accepts connections and relays their bytes to and
 *                     from libmicrohttpd (a socket pair each), refusing with
 *                     the API's JSON error what it would answer itself in
 *                     HTML: every request head, every chunked body
 *   serve_frame.c     the door's screen of those bytes (pure)
 *   serve_http.c      libmicrohttpd: routing, body limits, the API key,
 *                     waiting for a job and streaming it (SSE), noticing
 *                     clients that went away
 *   serve_request.c   OpenAI request JSON -> a validated srv_request
 *                     (messages through the chat template, tokens, sampling,
 *                     stop strings, the per-request KV policy)
 *   serve_engine.c    the engine thread: the one owner of the model's
 *                     context and every sequence; admission by projected KV
 *                     bytes, a FIFO of waiting jobs, prompts read in bounded
 *                     pieces, one batched decode step over all running
 *                     sequences per iteration
 *   serve_native.c    llama-server's native /completion: its request fields
 *                     (n_predict, n_probs, prompts of tokens and text mixed,
 *                     images as multimodal_data) and its answer and stream
 *                     shapes (content, stop_type, completion_probabilities)
 *   serve_response.c  response, chunk, error, /v1/models and /metrics bodies
 *   cmd_serve.c       the command: flags, set-up, signals, shut-down
 *
 * Threads: HTTP threads (one per connection) parse and validate, submit a
 * job and wait on it; the engine thread runs the model. They share `struct
 * srv` under srv->mu: the queue, the lists of jobs, the counters, and each
 * job's output (text, state, statistics), which the engine publishes and
 * the HTTP thread reads. A job is freed when both sides have let go of it
 * (refs).
 */
#ifndef EKV_SERVE_H
#define EKV_SERVE_H

#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "ekv.h"

#define SRV_MAX_STOP 4
#define SRV_MAX_TOP_LOGPROBS 20        /* OpenAI's top_logprobs limit */
#define SRV_MAX_CHOICES 16             /* OpenAI's n (OpenAI allows 128) */
#define SRV_MAX_JOBS 64                /* prompts x choices of one request */
#define SRV_ERR_MAX 512

/* An OpenAI-shaped error: HTTP status, message, type, param, code. */
struct srv_error {
    int status;                 /* 0 = no error */
    char message[SRV_ERR_MAX];
    const char *type;           /* "invalid_request_error", "server_error", ... */
    const char *param;          /* offending field or NULL */
    const char *code;           /* machine-readable code or NULL */
};

/* Sets e (first error wins) and returns false, for `return srv_fail(...)`. */
bool srv_fail(struct srv_error *e, int status, const char *type, const char *param, const char *code,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* /v1/chat/completions, /v1/completions, and llama-server's native /completion */
enum srv_kind { SRV_CHAT, SRV_COMPLETION, SRV_NATIVE };

/* A validated request; everything owned by it (srv_request_free). */
struct srv_request {
    enum srv_kind kind;
    struct ekv_prompt *prompt;    /* text tokens and image slots (images set), or NULL: */
    int32_t *tokens;              /* the prompt as token ids (completions with a token array) */
    int32_t n_tokens;             /* positions of the prompt (tokens + image rows) */
    long max_tokens;              /* -1: until end of text or context; 0 (native n_predict 0): the
                                     prompt is read, nothing generated */
    struct ekv_sampler_params sampling;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    bool stream;
    bool include_usage;           /* stream_options.include_usage */
    bool ignore_eos;
    int32_t logprobs;             /* -1: none; else each token's logprob and its n most likely, 0..20 */
    struct ekv_kv_params kv;
    char kv_policy[32];           /* kv.policy points here */
    /* prefix reuse (--prefix-cache, serve_prefix.c): a chat prompt read message by message,
       each part a prompt of its own, so that any conversation so far can be reused: bounds
       are the positions where messages 2..n start (increasing, inside the prompt); the
       last one ends the shared prefix (every message but the last: system prompt,
       document, images, history) */
    int32_t *bounds;              /* [n_bounds] owned, or NULL: the prompt is read whole */
    int32_t n_bounds;
    bool cache_prompt;            /* the request's "cache_prompt" (default true) */
    /* logit_bias: given, the request's list (even empty) replaces the server's -l list */
    bool lb_given;
    int32_t *lb_tok;              /* [n_lb] owned token ids */
    float *lb_val;                /* [n_lb] owned biases (-INFINITY: banned) */
    int32_t n_lb;
    bool to_ctx_end;              /* max_tokens is the room left in the context (srv_submit) */
    int32_t n_choices;            /* OpenAI's n: each prompt runs as n jobs (SRV_MAX_CHOICES at most) */
    int32_t n_prompts;            /* /v1/completions' prompts in the body (a batch), 1 otherwise */
    int32_t prompt_at;            /* which of them this job reads */
    int32_t choice;               /* its index in the answer, prompt_at * n_choices + c; choice c of
                                     a prompt samples with seed + c */
    /* native /completion only */
    bool return_tokens;           /* "tokens" in the answer (streams always carry them) */
    bool timings_per_token;       /* "timings" in every streamed event */
};

void srv_request_free(struct srv_request *r);

/* Settings of the server (from the command line). */
struct srv_config {
    const char *model_path;
    const char *model_id;         /* in /v1/models and responses */
    const char *chat_template;    /* for /v1/chat/completions */
    long n_predict;               /* default max_tokens (-1 = until end) */
    bool ignore_eos;
    bool seed_fixed;              /* default sampling seed given with -s */
    struct ekv_sampler_params sampling;
    int32_t lb_tok[CLI_LIST_MAX]; /* -l: the logit biases of requests without logit_bias */
    float lb_val[CLI_LIST_MAX];
    int32_t n_lb;
    struct ekv_kv_params kv;      /* default policy */
    char kv_policy[32];
    int32_t n_ctx;
    int32_t n_threads;
    int32_t parallel;
    uint64_t kv_mem;              /* bytes; 0 = no cap */
    long queue;
    const char *api_key;
    const char *cors;             /* --cors ORIGIN, or NULL */
    size_t max_body;
    unsigned timeout;
    int32_t prefill_chunk;
    uint64_t prefix_cache;        /* bytes of cached prefixes (--prefix-cache MiB); 0 = no prefix reuse */
    const char *slot_save_path;   /* --slot-save-path DIR, or NULL (no /slots save/restore) */
    const struct cli_params *cli; /* the parsed flags (request kv options parse through them) */
};

enum srv_state { JOB_QUEUED, JOB_PREFILL, JOB_RUNNING, JOB_DONE };

/* What identifies a cached prefix besides the KV parameters: its
 * positions as token ids (-1 for image rows) and a hash of its image
 * embeddings (serve_prefix.c). */
struct srv_pkey {
    int32_t *ids;                 /* [n] owned */
    int32_t n;
    uint64_t img;                 /* FNV-1a of the image rows' embeddings, 0 without images */
    uint64_t hash;                /* of ids and img, for a quick compare */
};

/* One cached prefix (serve_prefix.c): the sequence after reading it, under
 * the resolved KV parameters it was read with. The list is changed by the
 * engine thread only, under srv->mu; the engine reads `seq` without the
 * lock (nobody else touches it). */
struct srv_prefix {
    uint64_t id;                  /* slot id in /slots */
    struct srv_pkey key;
    struct ekv_kv_params kv;      /* resolved; kv.policy points to spec */
    char spec[256];
    struct ekv_seq *seq;
    uint64_t bytes;               /* bytes its cache allocated */
    uint64_t hits;
    double t_used;
    struct srv_prefix *next;      /* most recently used first */
};

/* A /slots action waiting for the engine thread (serve_prefix.c). */
struct srv_ctl {
    int action;                   /* SRV_SLOT_SAVE, _RESTORE, _ERASE */
    uint64_t id;
    char path[4096];
    char filename[256];
    bool done;
    char *body;                   /* answer (malloc'd JSON) when it succeeded */
    struct srv_error err;
    pthread_cond_t cv;            /* signalled when done */
    struct srv_ctl *next;
};
enum { SRV_SLOT_SAVE = 1, SRV_SLOT_RESTORE, SRV_SLOT_ERASE };

/* One request in flight. Fields marked (engine) are the engine thread's
 * alone; (shared) ones are read and written under srv->mu. */
struct srv_job {
    struct srv_request req;
    uint64_t id;
    const struct srv_job *lead;   /* (HTTP) the request's first choice (its id and time in every
                                     answer), or NULL: this one */
    double t_arrive;
    int refs;                     /* (shared) 2 while both sides hold it */
    enum srv_state state;         /* (shared) */
    bool cancel;                  /* (shared) set by HTTP when the client went away */
    pthread_cond_t cv;            /* signalled when the output changes */
    /* output (shared) */
    char *text;                   /* generated text so far (stop strings cut) */
    size_t text_len, text_cap;
    size_t ready;                 /* bytes of text safe to send (whole UTF-8, no stop prefix) */
    size_t *tok_end;              /* [n_tok_end] text length after each generated token (streams
                                     send one event per token) */
    int32_t *toks;                /* [cap_tok_end] the generated tokens' ids */
    size_t n_tok_end, cap_tok_end;
    struct ekv_token_logprob *lp; /* with req.logprobs >= 0: [cap_tok_end][1 + req.logprobs], per
                                     token of tok_end: its own, then the most likely tokens */
    long n_gen;                   /* tokens generated */
    const char *finish;           /* "stop" or "length" once done */
    int stop_hit;                 /* the stop string that ended the text, or -1 */
    struct srv_error err;         /* set when the job failed */
    struct ekv_kv_stats kv_stats; /* at the end */
    uint64_t reserve;             /* bytes reserved for admission */
    double t_admit, t_prompt_done, t_first, t_done;
    /* engine side (engine) */
    struct ekv_kv_projection proj;
    struct ekv_seq *seq;
    struct ekv_prefill *prefill;
    struct ekv_sampler *smp;
    struct srv_pkey pkey;         /* prefix reuse: the prefix being read (cached when read), or empty */
    int32_t n_cached;             /* prompt positions that came from a cached prefix */
    int32_t part;                 /* the next bound a part of the prompt reads up to */
    int32_t next;                 /* token to feed at the next decode step */
    struct srv_job *next_in_list; /* (shared) queue / active list link */
};

/* Counters for /metrics (shared). */
struct srv_stats {
    uint64_t requests[6];         /* by status class: 0 = other, 2 = 2xx, 4 = 4xx, 5 = 5xx */
    uint64_t rejected_busy;       /* 503 because the queue was full */
    uint64_t prompt_tokens, completion_tokens;
    uint64_t evicted, merged;     /* summed over finished jobs */
    uint64_t decode_steps, decode_rows;
    double prompt_seconds, decode_seconds;
    double engine_decode_seconds;  /* engine time in batched decode steps */
    double engine_prefill_seconds; /* engine time reading prompts */
    int running_max;              /* most sequences admitted at once */
    uint64_t prefix_hits, prefix_misses, prefix_hit_tokens, prefix_evicted;
    uint64_t cancelled;
    uint64_t streams_stalled;     /* streams dropped: the client took no bytes for --timeout seconds */
    uint64_t device_bytes, device_peak_bytes; /* the context's GPU memory (0 on the CPU), set by the engine */
};

struct srv {
    struct srv_config cfg;
    struct ekv_model *model;
    struct ekv_model_info mi;
    struct ekv_context *ctx;      /* the engine thread's */
    bool on_gpu;                  /* ctx runs on a GPU: --kv-mem counts the device's buffers */
    struct ekv_vision *vision;    /* --mmproj, or NULL (read-only, shared by HTTP threads) */
    bool locks;                   /* mu and engine_cv initialised */
    long long t_epoch;            /* Unix time at start ("created" fields) */
    pthread_mutex_t mu;
    pthread_cond_t engine_cv;     /* wakes the engine */
    bool stop;                    /* (shared) shut-down */
    bool draining;                /* (shared) shutting down: new requests 503, running ones finish */
    struct srv_job *queue_head, *queue_tail; /* (shared) waiting, FIFO */
    long n_queued;
    struct srv_job *active;       /* (shared) admitted: prefill and running */
    int n_active;
    uint64_t kv_used;             /* (shared) K/V bytes of all sequences now */
    uint64_t kv_reserved;         /* (shared) */
    uint64_t kv_alloc;            /* (shared) bytes allocated by the caches */
    uint64_t next_id;
    long n_live;                  /* (shared) jobs not yet freed by both sides */
    struct srv_stats st;
    struct srv_prefix *prefixes;  /* (shared, changed by the engine) cached prefixes, LRU order */
    uint64_t pc_bytes;            /* (shared) their bytes */
    int pc_n;
    uint64_t pc_next_id;
    struct srv_ctl *ctl_head;     /* (shared) /slots actions for the engine */
    double t_start;
    pthread_t engine;
    bool engine_started;
};

/* ---- serve_request.c ---- */

/* The server's settings from the parsed flags (the model's own facts come
 * later, once it is loaded); p must outlive srv. */
bool srv_config_init(struct srv *srv, const struct cli_params *p);
/* Parses and validates a request body for `kind` into r (zeroed first).
 * false with e set (4xx) on any problem. Tokenizes with srv's model. */
bool srv_request_parse(const struct srv *srv, enum srv_kind kind, const char *body, size_t len,
                       struct srv_request *r, struct srv_error *e);
/* The same for the nth prompt of a /v1/completions batch ("prompt": ["a", [1, 2], ...]; r->n_prompts
 * says how many there are). */
bool srv_request_parse_nth(const struct srv *srv, enum srv_kind kind, const char *body, size_t len, int32_t nth,
                           struct srv_request *r, struct srv_error *e);
/* POST /tokenize (llama.cpp's): {"content": "...", "add_special": true} ->
 * {"tokens": [...]}; NULL with e set on a bad request. */
char *srv_tokenize_json(const struct srv *srv, const char *body, size_t len, struct srv_error *e);
/* POST /detokenize (llama-server's): {"tokens": [...]} -> {"content": "..."}
 * (control tokens as their text); NULL with e set on a bad request. */
char *srv_detokenize_json(const struct srv *srv, const char *body, size_t len, struct srv_error *e);
/* POST /apply-template (llama-server's): {"messages": [...]} -> {"prompt":
 * "..."}, the text the chat template makes of them (as /v1/chat/completions
 * would read it); NULL with e set on a bad request. */
char *srv_apply_template_json(const struct srv *srv, const char *body, size_t len, struct srv_error *e);
/* Typed fields of a request object, shared with serve_native.c: the field
 * (NULL when absent or JSON null); a number in [lo, hi]; an integer in
 * [lo, hi]; a boolean. Absent: *out unchanged and true; wrong: false, e set
 * (400 naming the field). */
const cJSON *srv_field(const cJSON *o, const char *name);
bool srv_get_number(struct srv_error *e, const cJSON *o, const char *name, double lo, double hi, double *out);
bool srv_get_int(struct srv_error *e, const cJSON *o, const char *name, double lo, double hi, long long *out);
bool srv_get_bool(struct srv_error *e, const cJSON *o, const char *name, bool *out);
/* Images of a request, decoded from base64 (owned: srv_images_free). */
#define SRV_MAX_IMAGES 16
struct srv_images {
    unsigned char *data[SRV_MAX_IMAGES];
    size_t size[SRV_MAX_IMAGES];
    int n;
};
void srv_images_free(struct srv_images *im);
/* One more image from n bytes of base64 (not a data: URI); false with e set
 * (400 naming param; no vision tower, bad base64, too many images). */
bool srv_images_add_b64(const struct srv *srv, const char *b64, size_t n, struct srv_images *im, const char *param,
                        struct srv_error *e);
/* r's prompt from text with EKV_IMAGE_MARKER markers for im's images (BOS
 * as the model wants); false with e set (400 naming param). */
bool srv_prompt_from_text(const struct srv *srv, const char *text, size_t len, struct srv_images *im,
                          struct srv_request *r, const char *param, struct srv_error *e);

/* ---- serve_native.c ---- */

/* The native /completion's own fields of root (the prompt in its shapes,
 * return_tokens, timings_per_token, llama-server's sampler switches, which
 * ekv takes only at the values that turn them off) into r; false with e
 * set. srv_request_parse calls it for SRV_NATIVE. */
bool srv_native_parse(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e);
/* The answer to a native request once done: {"content", "tokens", "stop":
 * true, "stop_type", "stopping_word", "tokens_predicted", "timings",
 * "completion_probabilities" (with n_probs), ...}; NULL on out of memory. */
char *srv_native_json(const struct srv *srv, const struct srv_job *job);
/* One native stream event "data: {...}\n\n": text delta[0..n) and the
 * job's tokens [tok_from, tok_to) ("stop": false); final: the whole
 * answer's fields with empty content ("stop": true). NULL on out of memory. */
char *srv_native_chunk_sse(const struct srv *srv, const struct srv_job *job, const char *delta, size_t n,
                           bool final, size_t tok_from, size_t tok_to);

/* RFC 8259 syntax of s[0..n) (serve_json.c); false with the byte offset and
 * a static reason. *values (may be NULL) gets the number of values and
 * object keys, which cJSON would spend ~100 bytes each on. */
bool srv_json_strict(const char *s, size_t n, size_t *at, const char **why, size_t *values);
/* The most values and keys a body of n bytes may have (its parse memory
 * then stays within a few times n plus ~6.5 MB). */
size_t srv_json_max_values(size_t n);
/* Is s[0..n) valid UTF-8 (no overlongs, no surrogates)? */
bool srv_utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that ends on a whole UTF-8 character. */
size_t srv_utf8_whole(const char *s, size_t n);

/* ---- serve_engine.c ---- */

enum ekv_status srv_engine_start(struct srv *srv);
/* Graceful shut-down: new and waiting requests get 503, the running ones
 * up to `seconds` to finish (*interrupt becoming non-zero ends the wait at
 * once); then srv_engine_stop ends what is left. */
void srv_engine_drain(struct srv *srv, double seconds, volatile sig_atomic_t *interrupt);
/* After srv_engine_stop: waits (at most `seconds`) until the connection
 * threads have sent every job's answer and let go of it, so that stopping
 * the HTTP daemon does not cut an answer off. */
void srv_engine_wait_released(struct srv *srv, double seconds);
void srv_engine_stop(struct srv *srv);
/* Submits a job (takes ownership of req). Returns the job (caller holds one
 * reference) or NULL with e set (503 when the queue is full, 400 when the
 * request can never fit --kv-mem or the context). */
struct srv_job *srv_submit(struct srv *srv, struct srv_request *req, struct srv_error *e);
/* Drops the caller's reference; a job not done yet is cancelled (its cache
 * is freed by the engine at once). */
void srv_release(struct srv *srv, struct srv_job *job);

/* ---- serve_prefix.c ---- */

/* The key of the first n positions of a prompt into k (owned: srv_pkey_free); false on out of memory. */
bool srv_pkey_make(const struct srv *srv, const struct ekv_prompt *p, int32_t n, struct srv_pkey *k);
void srv_pkey_free(struct srv_pkey *k);
/* Engine thread: a copy of the cached prefix with key k read under fresh's
 * resolved KV parameters into *out (NULL when there is none). */
enum ekv_status srv_prefix_take(struct srv *srv, const struct srv_pkey *k, const struct ekv_seq *fresh,
                                struct ekv_seq **out);
/* Counts a request's lookup: a hit of n_cached positions, or a miss (0). */
void srv_prefix_count(struct srv *srv, int32_t n_cached);
/* Engine thread: caches a copy of seq under key k (k moved into the cache),
 * evicting the least recently used prefixes beyond --prefix-cache. */
void srv_prefix_put(struct srv *srv, struct srv_pkey *k, const struct ekv_seq *seq);
/* Engine thread, locked: drops the least recently used prefix; false when none. */
bool srv_prefix_evict_locked(struct srv *srv);
/* Engine thread, at exit: drops them all. */
void srv_prefix_free_all(struct srv *srv);
/* Engine thread, locked: runs the waiting /slots actions (without the lock while they work). */
void srv_ctl_run_locked(struct srv *srv);
/* Engine thread, locked, at shut-down: fails the waiting /slots actions. */
void srv_ctl_fail_locked(struct srv *srv);
/* HTTP thread: GET /slots (JSON array of the cached prefixes). */
char *srv_slots_json(struct srv *srv);
/* HTTP thread: POST /slots/{id}?action=save|restore|erase with body {"filename": "..."}: the
 * answer body, or NULL with e set. */
char *srv_slot_action(struct srv *srv, const char *id, const char *action, const char *body, size_t len,
                      struct srv_error *e);

/* ---- serve_response.c ---- */

/* Bodies, malloc'd NUL-terminated strings (NULL on out of memory). */
char *srv_error_json(const struct srv_error *e);
/* The answer to a request of n choices (jobs[i] is choice i). */
char *srv_response_json(const struct srv *srv, struct srv_job *const *jobs, int n);
/* One SSE event "data: {...}\n\n" with `delta` text (first: with the role;
 * final: finish_reason and, when asked, usage) and, with logprobs asked,
 * those of tokens [lp_from, lp_to) (null when none). */
char *srv_chunk_sse(const struct srv *srv, const struct srv_job *job, const char *delta, size_t n, bool first,
                    bool final, size_t lp_from, size_t lp_to);
/* How many of a job's tokens (job->tok_end) have their text in the first
 * `upto` bytes: those that end there, and once the job is done and upto is
 * the whole text, the one a stop string cut; counted on from `from` (tokens
 * known to be in: a stream's earlier answer). */
size_t srv_lp_upto(const struct srv_job *job, size_t from, size_t upto);
char *srv_usage_chunk_sse(const struct srv *srv, struct srv_job *const *jobs, int n);
/* Helpers shared with serve_native.c: s[0..n) with bytes that are not
 * UTF-8 as U+FFFD (malloc'd); llama.cpp-style timings of a job; a token's
 * logprob entry {["id",] "token", "logprob", "bytes"[, "top_logprobs": n
 * entries of top]} (NULL on out of memory). */
char *srv_text_clean(const char *s, size_t n);
/* o printed (NULL when o is NULL or on out of memory), o freed; the same as
 * one SSE event "data: <json>\n\n". */
char *srv_json_take(cJSON *o);
char *srv_sse_take(cJSON *o);
cJSON *srv_timings_json(const struct srv_job *job);
/* ekv's cache statistics of a request's finished jobs (usage.kv; n choices: summed). */
cJSON *srv_kv_json(struct srv_job *const *jobs, int n);
/* The settings a job runs with, as llama-server's generation_settings. */
cJSON *srv_job_settings_json(const struct srv *srv, const struct srv_job *job);
cJSON *srv_lp_entry(const struct srv *srv, const struct ekv_token_logprob *t, const struct ekv_token_logprob *top,
                    int n, bool with_id);
char *srv_models_json(const struct srv *srv);
/* GET /v1/models/{id} of the served model. */
char *srv_model_json(const struct srv *srv);
char *srv_metrics_text(struct srv *srv); /* takes srv->mu */
/* GET /props (llama-server's): the defaults a request gets, slots, model, template. */
char *srv_props_json(const struct srv *srv);
char *srv_health_json(struct srv *srv);  /* takes srv->mu */

/* ---- serve_http.c ---- */

struct srv_http;
/* Starts listening (host:port; port 0 = any); *port_out gets the port. */
enum ekv_status srv_http_start(struct srv *srv, const char *host, int port, struct srv_http **out, int *port_out);
/* Waits (at most `seconds`) until no connection is open: the answers
 * queued last have gone out (they close their connections). */
void srv_http_wait_idle(struct srv_http *h, double seconds);
void srv_http_stop(struct srv_http *h);
/* The end of a server's life after its engine and HTTP side ran (either
 * may be unstarted; http may be NULL): the engine stops (every job ends),
 * the answers queued go out, the daemon and the door stop, the locks go.
 * srv's model, context and vision tower stay the caller's. */
void srv_shutdown(struct srv *srv, struct srv_http *http);

/* ---- serve_frame.c ---- */

/* A request head that passed the screen. */
struct srv_head {
    size_t len;              /* its bytes, the empty line (and empty lines before it) included */
    uint64_t content_length; /* 0 without the header */
    bool chunked;            /* Transfer-Encoding: chunked */
};
/* Screens the bytes of one request head at buf[0, n): 1 = a whole head
 * that libmicrohttpd may have (*h filled when h is not NULL), 0 = not
 * complete yet, -1 = refused (e set: 400, 413, 431, 501 or 505). */
int srv_door_screen(const char *buf, size_t n, struct srv_head *h, struct srv_error *e);

/* Where a connection's byte stream is: in a head, a body, a chunk... */
struct srv_frame {
    int state;
    uint64_t left;   /* bytes to go of a body or a chunk's data */
    size_t trailer;  /* bytes of the trailer section so far */
    uint64_t heads;  /* request heads passed */
    uint64_t ends;   /* requests passed whole (head and body) */
};
void srv_frame_init(struct srv_frame *f);
/* True between requests (the next byte starts a head). */
bool srv_frame_at_head(const struct srv_frame *f);
/* Screens buf[0, n), the connection's bytes from where the last call's
 * passed bytes ended: returns how many of them passed (heads whole, bodies
 * and chunk data as they come, chunk lines whole), stopping early at a
 * line or head not complete yet and before a request's head unless
 * may_open (then before the second: one head per call); -1 = refused (e set: the statuses above, or 400
 * malformed_chunked_body), f then says where. */
long srv_frame_screen(struct srv_frame *f, const char *buf, size_t n, bool may_open, struct srv_error *e);

/* ---- serve_door.c ---- */

/* Takes libmicrohttpd's end of a connection (a socket pair; the callee
 * owns fd) whose first request head passed; addr is the client's. False:
 * refused (fd closed). */
typedef bool (*srv_door_pass_fn)(void *cls, int fd, const struct sockaddr *addr, socklen_t alen);
/* Told the status of each answer the door gave itself (for /metrics). */
typedef void (*srv_door_answered_fn)(void *cls, int status);
struct srv_door_params {
    double timeout;  /* seconds a connection may take to send its first head, or an answer to go out */
    srv_door_pass_fn pass;
    srv_door_answered_fn answered; /* or NULL */
    void *cls;
    const char *cors; /* --cors origin for the door's answers, or NULL (borrowed) */
};
struct srv_door;
/* Listens on addr (port 0: any; *port_out gets it) and starts the door's
 * thread; errno tells why on EKV_ERR_IO. Free with srv_door_stop. */
enum ekv_status srv_door_start(const struct sockaddr_in *addr, const struct srv_door_params *p, struct srv_door **out,
                               int *port_out);
/* libmicrohttpd finished a request on its end fd of a pair (any thread):
 * the door may pass the connection's next request on. */
void srv_door_completed(struct srv_door *d, int fd);
/* Stops accepting and closes the connections that have not passed a head
 * yet; returns once the door will pass nothing more (then libmicrohttpd may
 * stop). NULL is harmless. */
void srv_door_quiesce(struct srv_door *d);
/* Relays what libmicrohttpd still sends (a few seconds at most), then
 * closes every connection and frees d; NULL is harmless. */
void srv_door_stop(struct srv_door *d);

#endif
