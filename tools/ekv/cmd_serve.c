/*
 * cmd_serve.c — `ekv serve`: an OpenAI-compatible HTTP server whose
 * compressed KV caches become more concurrent users (docs/architecture.md "Serving";
 * the pieces are described in serve.h). This file is the command: flags
 * through the shared option table, set-up (model, context, vision tower,
 * engine thread, HTTP daemon), waiting for SIGINT/SIGTERM, and an orderly
 * shut-down (waiting requests get 503, running ones end, then the daemon).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

static const char *const CMD = "serve";

static const struct cli_help k_help = {
    "usage: ekv serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [options]",
    "Serves the model over HTTP with OpenAI's API: POST /v1/chat/completions,\n"
    "POST /v1/completions (both with \"stream\": true as Server-Sent Events), GET /v1/models,\n"
    "GET /health and GET /metrics (Prometheus). Each request may choose its own KV policy:\n"
    "\"kv\": {\"policy\": \"elastic\", \"budget\": 0.2, ...} with the names of the --kv-* flags\n"
    "(or top-level \"kv_policy\", \"kv_budget\", ...); the --kv-* flags below are the default.\n"
    "Requests are admitted while their projected KV cache (prompt + max_tokens under their\n"
    "own policy) fits --kv-mem; others wait in a queue of --queue places, beyond which the\n"
    "answer is 503 with Retry-After. Responses add usage.kv (cache bytes kept against the\n"
    "full cache, entries evicted and merged) and timings.",
    "Example:\n"
    "  ekv serve -m model.gguf --kv-mem 512 --kv-policy elastic --kv-budget 0.2 &\n"
    "  curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
    "    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 32}'",
};

static volatile sig_atomic_t g_signal;

static volatile sig_atomic_t g_signal_again; /* a second signal: no more draining */

static void on_signal(int sig) {
    if (g_signal) g_signal_again = 1;
    g_signal = sig;
}

/* The device: a named one (--device vulkan[:N], cpu) as asked; under auto
 * the CPU. A GPU runs every policy with every storage type, but not every
 * cache (a cap on entries, --kv-tokens; quantised types on a device
 * without shaderFloat64), and a server takes each request's cache
 * settings: under auto, such requests would fall back to the CPU one by one
 * and batches mixing the two decode sequence by sequence, so auto keeps the
 * server on the CPU. With a named GPU a request whose cache the GPU cannot
 * run gets the reason. */
static bool serve_device(const struct cli_params *p, struct cli_params *q) {
    *q = *p;
    const char *dev = p->device ? p->device : getenv("EKV_DEVICE");
    if (!dev || !*dev || !strcmp(dev, "auto")) q->device = "cpu";
    return true;
}

static bool serve_setup(struct srv *srv, const struct cli_params *p) {
    struct cli_params q;
    if (!serve_device(p, &q) || !cli_load_model(CMD, &q, &srv->model, &srv->ctx)) return false;
    ekv_model_get_info(srv->model, &srv->mi);
    struct srv_config *c = &srv->cfg;
    c->n_ctx = p->n_ctx > 0 ? (int32_t)p->n_ctx : srv->mi.n_ctx_train;
    c->n_threads = p->threads > 0 ? (int32_t)p->threads : ekv_context_default_params().n_threads;
    if (!cli_logit_bias_check(CMD, &p->logit_bias, srv->mi.n_vocab)) return false;
    c->chat_template = p->chat_template ? p->chat_template : ekv_model_chat_template(srv->model);
    if (!c->chat_template) c->chat_template = "none";
    /* the default policy must be one the library accepts */
    struct ekv_kv_projection pr;
    enum ekv_status s = ekv_kv_project(srv->model, &c->kv, 1, 1, &pr);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    if (p->mmproj && (s = ekv_vision_load(p->mmproj, &srv->vision)) != EKV_OK) return cli_fail(CMD, s), false;
    /* on a GPU the request threads encode images there too, on a device handle of the
     * tower's own (one image at a time; the engine's context is the engine thread's) */
    if (srv->vision && strcmp(ekv_context_device(srv->ctx), "cpu") != 0) {
        s = ekv_vision_set_device(srv->vision, q.device);
        if (s == EKV_ERR_UNSUPPORTED)
            fprintf(stderr, "ekv serve: the vision tower runs on the CPU: %s\n", ekv_last_error());
        else if (s != EKV_OK)
            return cli_fail(CMD, s), false;
    }
    if (pthread_mutex_init(&srv->mu, NULL) || pthread_cond_init(&srv->engine_cv, NULL)) {
        fprintf(stderr, "ekv serve: error: cannot create locks\n");
        return false;
    }
    srv->locks = true;
    srv->t_start = cli_now();
    srv->t_epoch = (long long)time(NULL);
    if ((s = srv_engine_start(srv)) != EKV_OK) {
        fprintf(stderr, "ekv serve: error: cannot start the engine thread\n");
        return false;
    }
    return true;
}

static void serve_banner(const struct srv *srv, const struct cli_params *p, int port) {
    const struct srv_config *c = &srv->cfg;
    fprintf(stderr,
            "ekv serve: %s (%s, %d layers, context %d, %.1f KiB of KV per token), device %s, %d threads, template %s\n"
            "ekv serve: default policy %s at budget %g; --kv-mem %s%.1f MiB, --parallel %d, --queue %ld, "
            "prefill %d tokens per step, prefix cache %.1f MiB%s%s%s%s\n",
            c->model_id, srv->mi.arch, srv->mi.n_layer, c->n_ctx, srv->mi.kv_bytes_per_token / 1024.0,
            ekv_context_device(srv->ctx), c->n_threads,
            c->chat_template, c->kv_policy, c->kv.budget, c->kv_mem ? "" : "unlimited, ", c->kv_mem / 1048576.0,
            c->parallel, c->queue, c->prefill_chunk, c->prefix_cache / 1048576.0,
            c->slot_save_path ? ", slots saved in " : "", c->slot_save_path ? c->slot_save_path : "",
            srv->vision ? ", vision tower on " : "", srv->vision ? ekv_vision_device(srv->vision) : "");
    /* the one line tests and scripts wait for (stdout, flushed) */
    printf("ekv serve: listening on http://%s:%d\n", p->host, port);
    fflush(stdout);
}

static void serve_wait(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    while (!g_signal) pause();
}

static int cmd_serve_main(int argc, char **argv) {
    struct cli_params p;
    cli_params_init(&p, CLI_SERVE);
    p.sampling.seed = UINT64_MAX; /* a new seed per request unless -s is given */
    int rc = cli_parse(CMD, argc, argv, &p, &k_help);
    if (rc) return rc == 2 ? 0 : rc;
    struct srv *srv = calloc(1, sizeof *srv);
    if (!srv) return cli_fail(CMD, EKV_ERR_NOMEM);
    struct srv_http *http = NULL;
    int port = 0;
    rc = 1;
    signal(SIGPIPE, SIG_IGN);
    if (srv_config_init(srv, &p) && serve_setup(srv, &p) &&
        srv_http_start(srv, p.host, (int)p.port, &http, &port) == EKV_OK) {
        serve_banner(srv, &p, port);
        serve_wait();
        fprintf(stderr, "ekv serve: signal %d: shutting down (running requests get up to %ld s; a second signal "
                        "ends them)\n", (int)g_signal, p.drain);
        srv_engine_drain(srv, (double)p.drain, &g_signal_again);
        rc = 0;
    }
    srv_shutdown(srv, http);
    ekv_vision_free(srv->vision);
    ekv_context_free(srv->ctx);
    ekv_model_free(srv->model);
    free(srv);
    cli_params_free(&p);
    return rc;
}

const struct ekv_cmd ekv_cmd_serve = {"serve", "OpenAI-compatible HTTP server; compressed caches admit more users",
                                      cmd_serve_main};
