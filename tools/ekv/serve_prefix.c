/*
 * serve_prefix.c — prefix reuse in `ekv serve` (issue 22): requests that
 * share a prefix (a system prompt, a document, an image, a conversation's
 * history) read it once; later ones start from a copy of its compressed
 * cache (ekv_seq_copy) and read only their last message.
 *
 * With --prefix-cache MiB a chat prompt of two or more messages is read
 * message by message, each a prompt of its own; after every message but the
 * last (the shared prefix) the sequence is cached. A request starts from the
 * longest cached prefix that ends at one of its message boundaries. Hits
 * and misses read at the same boundaries, so a request's answer does not
 * depend on what was cached (compressing policies see the prefix without
 * the question: KVzip's query-agnostic compression; "cache_prompt": false
 * reads it whole). A prefix is found by its positions (token ids, image
 * rows by a hash of their embeddings) and the resolved KV parameters it was
 * read under. The
 * cache is an LRU within --prefix-cache; its bytes count against --kv-mem,
 * and admission evicts prefixes before it makes a request wait.
 *
 * The cached prefixes are llama-server's "slots" here: GET /slots lists
 * them, POST /slots/{id}?action=save|restore|erase writes one to a file in
 * --slot-save-path (ekv_seq_save's format), reads one back, or drops it.
 * Sequences belong to the engine thread (a context is used from one thread
 * at a time): the HTTP thread queues a /slots action and waits for it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "serve.h"

/* ---- keys ---- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void key_hash(struct srv_pkey *k) {
    uint64_t h = fnv(0xcbf29ce484222325ull, k->ids, (size_t)k->n * sizeof *k->ids);
    k->hash = fnv(h, &k->img, sizeof k->img);
}

bool srv_pkey_make(const struct srv *srv, const struct ekv_prompt *p, int32_t n, struct srv_pkey *k) {
    memset(k, 0, sizeof *k);
    const struct ekv_segment *sg = NULL;
    int32_t ns = 0;
    if (n < 0 || n > ekv_prompt_n_positions(p) || ekv_prompt_segments(p, &sg, &ns) != EKV_OK) return false;
    if (!(k->ids = malloc((size_t)(n ? n : 1) * sizeof *k->ids))) return false;
    uint64_t img = 0xcbf29ce484222325ull;
    bool any = false;
    for (int32_t i = 0; i < ns && k->n < n; i++) {
        const int32_t m = sg[i].n < n - k->n ? sg[i].n : n - k->n;
        for (int32_t j = 0; j < m; j++) k->ids[k->n + j] = sg[i].tokens ? sg[i].tokens[j] : -1;
        k->n += m;
        if (!sg[i].tokens) {
            img = fnv(img, sg[i].embd, (size_t)m * (size_t)srv->mi.n_embd * sizeof(float));
            any = true;
        }
    }
    k->img = any ? img | 1 : 0;
    key_hash(k);
    return true;
}

void srv_pkey_free(struct srv_pkey *k) {
    free(k->ids);
    memset(k, 0, sizeof *k);
}

static bool key_eq(const struct srv_pkey *a, const struct srv_pkey *b) {
    return a->hash == b->hash && a->n == b->n && a->img == b->img &&
           !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids);
}

static bool same_real(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* Resolved parameters that compress alike. */
static bool params_eq(const struct ekv_kv_params *a, const struct ekv_kv_params *b) {
    return !strcmp(a->policy, b->policy) && a->budget == b->budget && a->max_tokens == b->max_tokens &&
           a->sinks == b->sinks && a->window == b->window && a->obs_window == b->obs_window && a->pool == b->pool &&
           a->pool_kind == b->pool_kind && a->distance == b->distance && a->chunk == b->chunk &&
           same_real(a->beta, b->beta) && same_real(a->sparsity_p, b->sparsity_p) &&
           same_real(a->recent_ratio, b->recent_ratio) && a->recompress == b->recompress && a->seed == b->seed &&
           a->compat_ref == b->compat_ref && a->type_k == b->type_k && a->type_v == b->type_v &&
           a->kv_group == b->kv_group && a->kv_residual == b->kv_residual;
}

/* ---- the cache (engine thread) ---- */

static void prefix_free(struct srv_prefix *e) {
    if (!e) return;
    srv_pkey_free(&e->key);
    ekv_seq_free(e->seq);
    free(e);
}

/* Unlinks e (locked). */
static void unlink_locked(struct srv *srv, struct srv_prefix *e) {
    for (struct srv_prefix **p = &srv->prefixes; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            e->next = NULL;
            srv->pc_bytes -= e->bytes;
            srv->pc_n--;
            return;
        }
}

static struct srv_prefix *find_locked(struct srv *srv, const struct srv_pkey *k, const struct ekv_kv_params *kv) {
    for (struct srv_prefix *e = srv->prefixes; e; e = e->next)
        if (key_eq(&e->key, k) && params_eq(&e->kv, kv)) return e;
    return NULL;
}

enum ekv_status srv_prefix_take(struct srv *srv, const struct srv_pkey *k, const struct ekv_seq *fresh,
                                struct ekv_seq **out) {
    *out = NULL;
    struct ekv_kv_params kv;
    ekv_seq_kv_params(fresh, &kv);
    pthread_mutex_lock(&srv->mu);
    struct srv_prefix *e = find_locked(srv, k, &kv);
    if (e) { /* most recently used first */
        unlink_locked(srv, e);
        e->next = srv->prefixes;
        srv->prefixes = e;
        srv->pc_bytes += e->bytes;
        srv->pc_n++;
        e->hits++;
        e->t_used = cli_now();
    }
    pthread_mutex_unlock(&srv->mu);
    /* only this thread frees entries: e stays valid without the lock */
    return e ? ekv_seq_copy(e->seq, out) : EKV_OK;
}

/* Inserts e first (locked) and evicts the least recently used others beyond
 * the cap into *gone (freed by the caller without the lock). */
static void insert_locked(struct srv *srv, struct srv_prefix *e, struct srv_prefix **gone) {
    struct srv_prefix *same = find_locked(srv, &e->key, &e->kv);
    if (same) {
        unlink_locked(srv, same);
        same->next = *gone;
        *gone = same;
    }
    e->next = srv->prefixes;
    srv->prefixes = e;
    srv->pc_bytes += e->bytes;
    srv->pc_n++;
    while (srv->pc_bytes > srv->cfg.prefix_cache && srv->prefixes->next) {
        struct srv_prefix *last = srv->prefixes;
        while (last->next) last = last->next;
        unlink_locked(srv, last);
        last->next = *gone;
        *gone = last;
        srv->st.prefix_evicted++;
    }
}

static void free_list(struct srv_prefix *e) {
    while (e) {
        struct srv_prefix *n = e->next;
        prefix_free(e);
        e = n;
    }
}

/* A new entry holding seq (taken) under key k (moved). */
static struct srv_prefix *entry_new(struct srv_pkey *k, struct ekv_seq *seq) {
    struct srv_prefix *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->key = *k;
    memset(k, 0, sizeof *k);
    e->seq = seq;
    ekv_seq_kv_params(seq, &e->kv);
    snprintf(e->spec, sizeof e->spec, "%s", e->kv.policy);
    e->kv.policy = e->spec;
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(seq, &st);
    e->bytes = st.bytes_alloc > st.bytes ? st.bytes_alloc : st.bytes;
    e->t_used = cli_now();
    return e;
}

void srv_prefix_count(struct srv *srv, int32_t n_cached) {
    pthread_mutex_lock(&srv->mu);
    if (n_cached > 0) {
        srv->st.prefix_hits++;
        srv->st.prefix_hit_tokens += (uint64_t)n_cached;
    } else {
        srv->st.prefix_misses++;
    }
    pthread_mutex_unlock(&srv->mu);
}

void srv_prefix_put(struct srv *srv, struct srv_pkey *k, const struct ekv_seq *seq) {
    struct ekv_seq *copy = NULL;
    if (!srv->cfg.prefix_cache || ekv_seq_copy(seq, &copy) != EKV_OK) {
        srv_pkey_free(k);
        return;
    }
    struct srv_prefix *e = entry_new(k, copy);
    if (!e) {
        ekv_seq_free(copy);
        srv_pkey_free(k);
        return;
    }
    if (e->bytes > srv->cfg.prefix_cache) { /* larger than the whole cache */
        prefix_free(e);
        return;
    }
    struct srv_prefix *gone = NULL;
    pthread_mutex_lock(&srv->mu);
    e->id = srv->pc_next_id++;
    insert_locked(srv, e, &gone);
    pthread_mutex_unlock(&srv->mu);
    free_list(gone);
}

bool srv_prefix_evict_locked(struct srv *srv) {
    if (!srv->prefixes) return false;
    struct srv_prefix *last = srv->prefixes;
    while (last->next) last = last->next;
    unlink_locked(srv, last);
    srv->st.prefix_evicted++;
    prefix_free(last); /* the engine thread, which owns the sequences */
    return true;
}

void srv_prefix_free_all(struct srv *srv) {
    pthread_mutex_lock(&srv->mu);
    struct srv_prefix *all = srv->prefixes;
    srv->prefixes = NULL;
    srv->pc_bytes = 0;
    srv->pc_n = 0;
    pthread_mutex_unlock(&srv->mu);
    free_list(all);
}

/* ---- /slots ---- */

#define FAIL(c, st, code, ...) srv_fail(&(c)->err, st, (st) >= 500 ? "server_error" : "invalid_request_error", \
                                        NULL, code, __VA_ARGS__)

static struct srv_prefix *by_id_locked(struct srv *srv, uint64_t id) {
    for (struct srv_prefix *e = srv->prefixes; e; e = e->next)
        if (e->id == id) return e;
    return NULL;
}

static char *answer(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* Writes entry e to c->path (engine thread, unlocked). */
static void slot_save(struct srv_ctl *c, const struct srv_prefix *e) {
    for (int32_t i = 0; i < e->key.n; i++)
        if (e->key.ids[i] < 0) {
            FAIL(c, 400, "slot_has_images", "slot %llu holds image rows, which a file cannot match again",
                 (unsigned long long)c->id);
            return;
        }
    const double t0 = cli_now();
    enum ekv_status s = ekv_seq_save(e->seq, e->key.ids, e->key.n, c->path);
    if (s != EKV_OK) {
        FAIL(c, 500, "slot_save_failed", "cannot save slot %llu to %s: %s", (unsigned long long)c->id, c->filename,
             ekv_last_error());
        return;
    }
    struct stat stt;
    const double size = stat(c->path, &stt) == 0 ? (double)stt.st_size : 0;
    cJSON *o = cJSON_CreateObject(), *t = NULL;
    cJSON_AddNumberToObject(o, "id_slot", (double)c->id);
    cJSON_AddStringToObject(o, "filename", c->filename);
    cJSON_AddNumberToObject(o, "n_saved", e->key.n);
    cJSON_AddNumberToObject(o, "n_written", size);
    if ((t = cJSON_AddObjectToObject(o, "timings"))) cJSON_AddNumberToObject(t, "save_ms", (cli_now() - t0) * 1e3);
    if (!(c->body = answer(o))) FAIL(c, 500, NULL, "out of memory");
}

/* Reads c->path into a new entry with id c->id (engine thread, unlocked;
 * the list changes under the lock). */
static void slot_restore(struct srv *srv, struct srv_ctl *c) {
    const double t0 = cli_now();
    struct ekv_seq *seq = NULL;
    int32_t *tok = NULL, nt = 0;
    enum ekv_status s = ekv_seq_load(srv->ctx, c->path, &seq, &tok, &nt);
    if (s != EKV_OK) {
        FAIL(c, s == EKV_ERR_IO ? 404 : 400, "slot_restore_failed", "cannot restore %s: %s", c->filename,
             ekv_last_error());
        return;
    }
    bool ok = tok && nt == ekv_seq_n_seen(seq);
    for (int32_t i = 0; i < nt && ok; i++) ok = tok[i] >= 0;
    struct srv_pkey k = {.ids = tok, .n = nt};
    key_hash(&k);
    struct srv_prefix *e = ok ? entry_new(&k, seq) : NULL;
    if (!e) {
        if (ok) FAIL(c, 500, NULL, "out of memory");
        else FAIL(c, 400, "slot_restore_failed", "%s holds no token ids for its %lld positions: it cannot serve as a "
                  "prefix", c->filename, (long long)ekv_seq_n_seen(seq));
        srv_pkey_free(&k);
        ekv_seq_free(seq);
        return;
    }
    if (e->bytes > srv->cfg.prefix_cache) {
        FAIL(c, 400, "prefix_cache_full", "%s holds %.2f MiB of cache, more than --prefix-cache", c->filename,
             e->bytes / 1048576.0);
        prefix_free(e);
        return;
    }
    const int32_t n = e->key.n;
    struct srv_prefix *gone = NULL;
    pthread_mutex_lock(&srv->mu);
    struct srv_prefix *old = by_id_locked(srv, c->id);
    if (old) {
        unlink_locked(srv, old);
        old->next = gone;
        gone = old;
    }
    e->id = c->id;
    if (srv->pc_next_id <= c->id) srv->pc_next_id = c->id + 1;
    insert_locked(srv, e, &gone);
    pthread_mutex_unlock(&srv->mu);
    free_list(gone);
    struct stat stt;
    const double size = stat(c->path, &stt) == 0 ? (double)stt.st_size : 0;
    cJSON *o = cJSON_CreateObject(), *t = NULL;
    cJSON_AddNumberToObject(o, "id_slot", (double)c->id);
    cJSON_AddStringToObject(o, "filename", c->filename);
    cJSON_AddNumberToObject(o, "n_restored", n);
    cJSON_AddNumberToObject(o, "n_read", size);
    if ((t = cJSON_AddObjectToObject(o, "timings"))) cJSON_AddNumberToObject(t, "restore_ms", (cli_now() - t0) * 1e3);
    if (!(c->body = answer(o))) FAIL(c, 500, NULL, "out of memory");
}

void srv_ctl_run_locked(struct srv *srv) {
    while (srv->ctl_head) {
        struct srv_ctl *c = srv->ctl_head;
        srv->ctl_head = c->next;
        struct srv_prefix *e = c->action == SRV_SLOT_RESTORE ? NULL : by_id_locked(srv, c->id);
        if (c->action != SRV_SLOT_RESTORE && !e) {
            FAIL(c, 404, "slot_not_found", "no slot %llu (GET /slots lists them)", (unsigned long long)c->id);
        } else if (c->action == SRV_SLOT_ERASE) {
            unlink_locked(srv, e);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "id_slot", (double)c->id);
            cJSON_AddNumberToObject(o, "n_erased", e->key.n);
            prefix_free(e);
            if (!(c->body = answer(o))) FAIL(c, 500, NULL, "out of memory");
        } else {
            pthread_mutex_unlock(&srv->mu);
            if (c->action == SRV_SLOT_SAVE) slot_save(c, e);
            else slot_restore(srv, c);
            pthread_mutex_lock(&srv->mu);
        }
        c->done = true;
        pthread_cond_signal(&c->cv);
    }
}

void srv_ctl_fail_locked(struct srv *srv) {
    while (srv->ctl_head) {
        struct srv_ctl *c = srv->ctl_head;
        srv->ctl_head = c->next;
        FAIL(c, 503, "shutting_down", "the server is shutting down");
        c->done = true;
        pthread_cond_signal(&c->cv);
    }
}

char *srv_slots_json(struct srv *srv) {
    cJSON *a = cJSON_CreateArray();
    pthread_mutex_lock(&srv->mu);
    const double now = cli_now();
    for (const struct srv_prefix *e = srv->prefixes; e && a; e = e->next) {
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(a, o);
        cJSON_AddNumberToObject(o, "id", (double)e->id);
        cJSON_AddNumberToObject(o, "n_past", e->key.n);
        cJSON_AddBoolToObject(o, "has_images", e->key.img != 0);
        cJSON_AddNumberToObject(o, "hits", (double)e->hits);
        cJSON_AddNumberToObject(o, "idle_seconds", now - e->t_used);
        cJSON *kv = cJSON_AddObjectToObject(o, "kv");
        if (kv) {
            cJSON_AddStringToObject(kv, "policy", e->spec);
            cJSON_AddNumberToObject(kv, "budget", e->kv.budget);
            cJSON_AddStringToObject(kv, "type_k", ekv_kv_type_name(e->kv.type_k));
            cJSON_AddStringToObject(kv, "type_v", ekv_kv_type_name(e->kv.type_v));
            cJSON_AddNumberToObject(kv, "bytes", (double)e->bytes);
        }
    }
    pthread_mutex_unlock(&srv->mu);
    return answer(a);
}

/* A file name inside --slot-save-path: letters, digits, '.', '_', '-', not
 * starting with '.', at most 200 bytes (no '/', so no path outside it). */
static bool filename_ok(const char *f) {
    const size_t n = strlen(f);
    if (n == 0 || n > 200 || f[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        const char ch = f[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-'))
            return false;
    }
    return true;
}

char *srv_slot_action(struct srv *srv, const char *id, const char *action, const char *body, size_t len,
                      struct srv_error *e) {
#define BAD(code, ...) (srv_fail(e, 400, "invalid_request_error", NULL, code, __VA_ARGS__), (char *)NULL)
    struct srv_ctl c = {0};
    char *end = NULL;
    const unsigned long long v = id && *id >= '0' && *id <= '9' ? strtoull(id, &end, 10) : 0;
    if (!end || *end || v > (1ull << 53)) return BAD("invalid_slot", "slot id must be a number, not '%.40s'", id ? id : "");
    c.id = v;
    if (!action) return BAD("missing_action", "?action=save, restore or erase is required");
    c.action = !strcmp(action, "save") ? SRV_SLOT_SAVE : !strcmp(action, "restore") ? SRV_SLOT_RESTORE
             : !strcmp(action, "erase") ? SRV_SLOT_ERASE : 0;
    if (!c.action) return BAD("invalid_action", "action '%.40s' is not save, restore or erase", action);
    if (c.action != SRV_SLOT_ERASE) {
        if (!srv->cfg.slot_save_path)
            return srv_fail(e, 501, "not_supported_error", NULL, "slots_disabled",
                            "slot save and restore are off: start ekv serve with --slot-save-path DIR"), NULL;
        if (c.action == SRV_SLOT_RESTORE && !srv->cfg.prefix_cache)
            return BAD("prefix_cache_off", "prefix reuse is off (--prefix-cache 0): a restored slot would not be used");
        cJSON *root = len ? cJSON_ParseWithLength(body, len) : NULL;
        const cJSON *f = root && cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "filename") : NULL;
        if (!f || !cJSON_IsString(f)) {
            cJSON_Delete(root);
            return BAD("missing_filename", "the body must be {\"filename\": \"NAME\"}");
        }
        const bool ok = filename_ok(f->valuestring);
        if (ok) snprintf(c.filename, sizeof c.filename, "%s", f->valuestring);
        cJSON_Delete(root);
        if (!ok) return BAD("invalid_filename", "file names are letters, digits, '.', '_' and '-', not starting with "
                                                "'.' (no paths)");
        if ((size_t)snprintf(c.path, sizeof c.path, "%s/%s", srv->cfg.slot_save_path, c.filename) >= sizeof c.path)
            return BAD("invalid_filename", "the path is too long");
    }
#undef BAD
    if (pthread_cond_init(&c.cv, NULL) != 0) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    pthread_mutex_lock(&srv->mu);
    if (srv->stop || srv->draining) {
        FAIL(&c, 503, "shutting_down", "the server is shutting down");
    } else {
        struct srv_ctl **p = &srv->ctl_head;
        while (*p) p = &(*p)->next;
        *p = &c;
        pthread_cond_signal(&srv->engine_cv);
        while (!c.done) pthread_cond_wait(&c.cv, &srv->mu);
    }
    pthread_mutex_unlock(&srv->mu);
    pthread_cond_destroy(&c.cv);
    if (c.err.status) *e = c.err;
    return c.err.status ? NULL : c.body;
}
