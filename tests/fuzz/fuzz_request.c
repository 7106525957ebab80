/*
 * fuzz_request.c — the server's request parsing, from body bytes to
 * validated options, without HTTP (issue 23): srv_request_parse for
 * /v1/completions, /v1/chat/completions and llama-server's native
 * /completion (JSON syntax, fields, sampling,
 * the per-request KV options through the CLI's option rows, the chat
 * template, tokenization with stories260K), srv_tokenize_json,
 * srv_detokenize_json and srv_apply_template_json; and the front door's
 * screen of a connection's bytes (serve_frame.c: heads, bodies, chunks,
 * whole and cut in pieces). The first byte
 * picks the endpoint (modulo 7: completions, chat, tokenize, door,
 * detokenize, apply-template, native completion), the rest is the body or
 * the connection's bytes.
 *
 * Built two ways: a libFuzzer target (clang, -DEKV_FUZZ=ON: fuzz_request)
 * and, always, with fuzz_replay.c's driver (fuzz_request_replay FILE|DIR...)
 * that ctest runs over the committed corpus (tests/fuzz/corpus/request) in
 * every build, sanitizers included, so inputs that once crashed stay fixed;
 * a file named ok_* must be taken and bad_* refused.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "serve.h"

static struct srv g_srv;
static struct cli_params g_cli;

static int setup(void) {
    static int done;
    if (done) return done > 0 ? 0 : -1;
    done = -1;
    cli_params_init(&g_cli, CLI_SERVE);
    const char *env = getenv("EKV_FUZZ_MODEL");
    g_cli.model = env && *env ? env : EKV_SOURCE_DIR "/models/stories260K.gguf";
    g_cli.n_ctx = 256;
    if (!srv_config_init(&g_srv, &g_cli)) return -1;
    if (ekv_model_load(g_cli.model, NULL, &g_srv.model) != EKV_OK) {
        fprintf(stderr, "fuzz_request: %s\n", ekv_last_error());
        return -1;
    }
    ekv_model_get_info(g_srv.model, &g_srv.mi);
    g_srv.cfg.n_ctx = 256;
    g_srv.cfg.chat_template = ekv_model_chat_template(g_srv.model);
    if (!g_srv.cfg.chat_template) g_srv.cfg.chat_template = "chatml"; /* a real template to render */
    done = 1;
    return 0;
}

/* The front door's screen of a connection's bytes (serve_frame.c): fed whole, then in pieces cut where
 * the bytes themselves say (as the network may cut them), with libmicrohttpd's completions arriving
 * late; both must pass the same bytes and give the same verdict. Taken = whole requests only. */
static int door_one(const char *b, size_t n, struct srv_error *e) {
    struct srv_frame f;
    srv_frame_init(&f);
    long v = 0; /* whole: each call opens one head (libmicrohttpd completes each request at once) */
    for (size_t at = 0;;) {
        const long k = srv_frame_screen(&f, b + at, n - at, true, e);
        if (k < -1 || k > (long)(n - at)) abort();
        if (k < 0) {
            v = -1;
            break;
        }
        at += (size_t)k;
        v = (long)at;
        if (k == 0 || at == n) break;
    }
    if (v < 0 && (!e->message[0] || !e->code || (e->status != 400 && e->status != 413 && e->status != 431 &&
                                                 e->status != 501 && e->status != 505)))
        abort(); /* a refusal without its status, code or message */
    /* in pieces: the door holds what did not pass and screens it again with the next piece */
    struct srv_frame g;
    srv_frame_init(&g);
    struct srv_error e2 = {0};
    size_t have = 0, passed = 0;
    long w = 0;
    unsigned h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)b[i]) * 16777619u;
    while (w >= 0 && have < n) {
        h = h * 1103515245u + 12345u;
        const size_t piece = 1 + (h >> 8) % 97;
        have = have + piece < n ? have + piece : n;
        bool may_open = (h >> 20) & 1; /* libmicrohttpd's completion of the last request: now or late */
        for (;;) {
            w = srv_frame_screen(&g, b + passed, have - passed, may_open, &e2);
            if (w < 0) break;
            passed += (size_t)w;
            if ((w == 0 && may_open) || passed == have) break;
            may_open = true; /* it came: a held head goes on */
        }
    }
    if (w < 0) w = -1;
    else w = (long)passed;
    if ((v < 0) != (w < 0) || (v >= 0 && v != w) || (v < 0 && e->status != e2.status) || f.heads != g.heads ||
        f.ends != g.ends)
        abort(); /* the cut changed the verdict */
    return v == (long)n && f.ends == f.heads && f.heads > 0;
}

/* 1: the request was taken, 0: refused (a 4xx with its message) */
static int run_one(const uint8_t *data, size_t size) {
    if (setup() != 0) abort(); /* the harness itself is broken: say so loudly */
    if (size < 1) return 0;
    const int which = data[0] % 7;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    struct srv_error e;
    memset(&e, 0, sizeof e);
    if (which == 3) return door_one(body, len, &e);
    if (which == 2 || which == 4 || which == 5) {
        char *out = (which == 2 ? srv_tokenize_json : which == 4 ? srv_detokenize_json : srv_apply_template_json)(
            &g_srv, body, len, &e);
        if (!out && (!e.message[0] || e.status < 400)) abort(); /* a refusal without its status or message */
        free(out);
        return out != NULL;
    }
    struct srv_request r;
    const bool ok = srv_request_parse(&g_srv, which == 0 ? SRV_COMPLETION : which == 6 ? SRV_NATIVE : SRV_CHAT, body,
                                      len, &r, &e);
    srv_request_free(&r);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run_one(data, size);
    return 0;
}

#ifdef EKV_FUZZ_REPLAY
/* fuzz_replay.c's check of one input: a name starting "ok_" must be taken,
 * "bad_" refused (others: any outcome, no crash). 1 on a problem. */
int ekv_fuzz_replay_one(const char *path, const uint8_t *data, size_t n) {
    const int got = run_one(data, n);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const int want = !strncmp(base, "ok_", 3) ? 1 : !strncmp(base, "bad_", 4) ? 0 : got;
    if (got != want) fprintf(stderr, "fuzz_request_replay: %s was %s\n", path, got ? "taken" : "refused");
    return got != want;
}

void ekv_fuzz_cleanup(void) { ekv_model_free(g_srv.model); }
#endif
