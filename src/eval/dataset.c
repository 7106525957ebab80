/*
 * dataset.c — reads evaluation sets for `ekv eval`: JSONL files (one object
 * per line with instruction/answer fields under several names, so that the
 * XSum, AlpacaEval and ekv's own sets load as they are) and plain text files
 * (one long document, or documents cut at a separator). Applies
 * --offset/--limit while reading, bounds every size, and reports bad input
 * with the file name and line number.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ekv_eval.h"
#include "eval_util.h"

static const char *const k_instruction_keys[] = {"instruction", "prompt", "question",
                                                 "article", "input", "document"};
static const char *const k_answer_keys[] = {"answer", "reference", "output", "summary_gt",
                                            "target", "summary"};
static const char *const k_id_keys[] = {"id", "question_id"};

struct ekv_data_opts ekv_data_default_opts(void) {
    struct ekv_data_opts o;
    memset(&o, 0, sizeof o);
    o.format = EKV_DATA_AUTO;
    o.max_line_bytes = EKV_DATA_DEFAULT_MAX_LINE;
    o.max_file_bytes = EKV_DATA_DEFAULT_MAX_FILE;
    o.max_items = EKV_DATA_DEFAULT_MAX_ITEMS;
    return o;
}

enum ekv_status ekv_data_format_parse(const char *s, enum ekv_data_format *out) {
    if (s && strcmp(s, "auto") == 0) *out = EKV_DATA_AUTO;
    else if (s && strcmp(s, "jsonl") == 0) *out = EKV_DATA_JSONL;
    else if (s && strcmp(s, "text") == 0) *out = EKV_DATA_TEXT;
    else return ekv_error_set(EKV_ERR_INVALID_ARG, "data format '%s': expected jsonl, text or auto",
                        s ? s : "(null)");
    return EKV_OK;
}

static bool has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static void item_free(struct ekv_eval_item *it) {
    free(it->id);
    free(it->type);
    free(it->system);
    free(it->instruction);
    free(it->answer);
    for (int32_t i = 0; i < it->n_images; i++) free(it->images[i]);
    free(it->images);
    free(it->text);
}

void ekv_dataset_free(struct ekv_dataset *ds) {
    if (!ds) return;
    for (size_t i = 0; i < ds->n_items; i++) item_free(&ds->items[i]);
    free(ds->items);
    memset(ds, 0, sizeof *ds);
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Appends a zeroed item, growing the array; *it points at it. */
static enum ekv_status push_item(struct ekv_dataset *ds, size_t *cap, size_t max_items,
                                 const char *path, struct ekv_eval_item **it) {
    if (ds->n_items >= max_items)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "%s: more than %zu items selected (use --limit)",
                       path, max_items);
    if (ds->n_items == *cap) {
        size_t nc = *cap ? *cap * 2 : 64, bytes;
        if (!ev_mul_ok(nc, sizeof *ds->items, &bytes))
            return ekv_error_set(EKV_ERR_OVERFLOW, "%s: item array of %zu entries", path, nc);
        struct ekv_eval_item *p = realloc(ds->items, bytes);
        if (!p) return ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for %zu items", path, nc);
        ds->items = p;
        *cap = nc;
    }
    *it = &ds->items[ds->n_items++];
    memset(*it, 0, sizeof **it);
    return EKV_OK;
}

/* ------------------------------------------------------------------------ */
/* JSONL                                                                      */
/* ------------------------------------------------------------------------ */

/* Reads lines through a fixed chunk buffer so that an over-long line is
 * refused after max bytes instead of being buffered whole. */
struct line_reader {
    FILE *f;
    char chunk[1 << 16];
    size_t pos, len;
    bool eof, err;
    char *line;   /* [cap] current line, NUL-terminated, without '\n' */
    size_t cap, n;
};

static int lr_getc(struct line_reader *r) {
    if (r->pos == r->len) {
        if (r->eof) return EOF;
        r->len = fread(r->chunk, 1, sizeof r->chunk, r->f);
        r->pos = 0;
        if (r->len == 0) {
            r->eof = true;
            r->err = ferror(r->f) != 0;
            return EOF;
        }
    }
    return (unsigned char)r->chunk[r->pos++];
}

/* Reads the next line. keep = false only measures it (skipped items).
 * Returns 1 with a line, 0 at end of file, -1 when the line exceeds max
 * bytes (the rest of it is not read), -2 on a read error or no memory.
 * *blank tells whether the line has only spaces, tabs and '\r'. */
static int lr_next(struct line_reader *r, size_t max, bool keep, bool *blank) {
    r->n = 0;
    *blank = true;
    int c = lr_getc(r);
    if (c == EOF) return r->err ? -2 : 0;
    for (; c != EOF && c != '\n'; c = lr_getc(r)) {
        if (r->n >= max) return -1;
        if (c != ' ' && c != '\t' && c != '\r') *blank = false;
        if (keep) {
            if (r->n + 1 >= r->cap) {
                size_t nc = r->cap ? r->cap * 2 : 4096;
                if (nc > max + 1) nc = max + 1;
                char *p = realloc(r->line, nc);
                if (!p) return -2;
                r->line = p;
                r->cap = nc;
            }
            r->line[r->n] = (char)c;
        }
        r->n++;
    }
    if (r->err) return -2;
    if (keep) {
        if (!r->line) {
            r->line = malloc(1);
            if (!r->line) return -2;
            r->cap = 1;
        }
        r->line[r->n] = '\0';
    }
    return 1;
}

/* Copies the string field of the first key present in keys into *dst
 * (*key receives the name found). Absent: *dst = NULL. */
static enum ekv_status get_field(const cJSON *obj, const char *const *keys, size_t nkeys,
                                 const char *where, char **dst, const char **key) {
    *dst = NULL;
    for (size_t i = 0; i < nkeys; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, keys[i]);
        if (!v) continue;
        if (key) *key = keys[i];
        if (!cJSON_IsString(v) || !v->valuestring)
            return ekv_error_set(EKV_ERR_FORMAT, "%s: field \"%s\" must be a string", where, keys[i]);
        *dst = dup_n(v->valuestring, strlen(v->valuestring));
        if (!*dst) return ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for field \"%s\"", where, keys[i]);
        return EKV_OK;
    }
    return EKV_OK;
}

#define EV_MAX_IMAGES 16

/* "image": one path, or "images": an array of 1..16 paths (not both);
 * it->image is the first. */
static enum ekv_status get_images(const cJSON *obj, const char *where, struct ekv_eval_item *it) {
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(obj, "image");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, "images");
    if (!one && !arr) return EKV_OK;
    if (one && arr) return ekv_error_set(EKV_ERR_FORMAT, "%s: give \"image\" or \"images\", not both", where);
    const int n = one ? 1 : cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
    if (n < 1 || n > EV_MAX_IMAGES)
        return ekv_error_set(EKV_ERR_FORMAT, "%s: field \"images\" must be an array of 1 to %d paths", where,
                             EV_MAX_IMAGES);
    if (!(it->images = calloc((size_t)n, sizeof *it->images)))
        return ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for the images", where);
    for (int i = 0; i < n; i++) {
        const cJSON *v = one ? one : cJSON_GetArrayItem(arr, i);
        if (!cJSON_IsString(v) || !v->valuestring || !v->valuestring[0])
            return ekv_error_set(EKV_ERR_FORMAT, "%s: %s must be a non-empty string", where,
                                 one ? "field \"image\"" : "each of \"images\"");
        if (!(it->images[i] = dup_n(v->valuestring, strlen(v->valuestring))))
            return ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for an image path", where);
        it->n_images = i + 1;
    }
    it->image = it->images[0];
    return EKV_OK;
}

/* "score_from": how many answer tokens are fed but not scored (a cue the
 * answer carries, so that the scored tokens are read through the compressed
 * cache); a whole number in [0, 1000000], 0 when absent. */
static enum ekv_status get_score_from(const cJSON *obj, const char *where, int32_t *dst) {
    *dst = 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "score_from");
    if (!v) return EKV_OK;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1.0;
    if (!(d >= 0.0 && d <= 1e6) || d != (double)(int32_t)d)
        return ekv_error_set(EKV_ERR_FORMAT, "%s: field \"score_from\" must be a whole number from 0 to 1000000", where);
    *dst = (int32_t)d;
    return EKV_OK;
}

static enum ekv_status get_id(const cJSON *obj, const char *where, char **dst) {
    *dst = NULL;
    for (size_t i = 0; i < EV_ARRAY_LEN(k_id_keys); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, k_id_keys[i]);
        if (!v) continue;
        char buf[64];
        const char *s;
        if (cJSON_IsString(v) && v->valuestring) {
            s = v->valuestring;
        } else if (cJSON_IsNumber(v)) {
            double d = v->valuedouble;
            /* the range first: casting a double outside long long's range is undefined (found by fuzz_jsonl) */
            if (d > -9007199254740992.0 && d < 9007199254740992.0 && d == (double)(long long)d)
                snprintf(buf, sizeof buf, "%lld", (long long)d);
            else
                snprintf(buf, sizeof buf, "%.17g", d);
            s = buf;
        } else {
            return ekv_error_set(EKV_ERR_FORMAT, "%s: field \"%s\" must be a string or a number",
                           where, k_id_keys[i]);
        }
        *dst = dup_n(s, strlen(s));
        if (!*dst) return ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for the id", where);
        return EKV_OK;
    }
    return EKV_OK;
}

/* "type" (else "category"): the item's kind for per-type results, a
 * string; any other value (a number, an object: data sets use these names
 * for other things) is not a type and is ignored. */
static enum ekv_status get_type(const cJSON *obj, const char *where, char **dst) {
    *dst = NULL;
    static const char *const keys[] = {"type", "category"};
    for (size_t i = 0; i < EV_ARRAY_LEN(keys); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, keys[i]);
        if (!cJSON_IsString(v) || !v->valuestring || !v->valuestring[0]) continue;
        *dst = dup_n(v->valuestring, strlen(v->valuestring));
        return *dst ? EKV_OK : ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for field \"%s\"", where, keys[i]);
    }
    return EKV_OK;
}

/* Parses one non-blank JSONL line into it. */
static enum ekv_status parse_item(char *line, size_t n, const char *path, size_t lineno,
                                  const struct ekv_data_opts *o, struct ekv_eval_item *it) {
    char where[512];
    snprintf(where, sizeof where, "%s:%zu", path, lineno);
    if (memchr(line, '\0', n))
        return ekv_error_set(EKV_ERR_FORMAT, "%s: NUL byte at column %zu", where,
                       (size_t)((char *)memchr(line, '\0', n) - line) + 1);
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(line, n, &end, false);
    if (!obj) {
        size_t col = end && end >= line && end <= line + n ? (size_t)(end - line) + 1 : 1;
        return ekv_error_set(EKV_ERR_FORMAT, "%s: invalid JSON at column %zu", where, col);
    }
    enum ekv_status st = EKV_OK;
    if (end) {
        const char *p = end;
        while (p < line + n && isspace((unsigned char)*p)) p++;
        if (p < line + n) {
            st = ekv_error_set(EKV_ERR_FORMAT, "%s: unexpected text after the JSON value at column %zu",
                         where, (size_t)(p - line) + 1);
            goto done;
        }
    }
    if (!cJSON_IsObject(obj)) {
        st = ekv_error_set(EKV_ERR_FORMAT, "%s: expected a JSON object", where);
        goto done;
    }
    const char *ikey = NULL, *akey = NULL;
    it->line = lineno;
    st = get_field(obj, k_instruction_keys, EV_ARRAY_LEN(k_instruction_keys), where,
                   &it->instruction, &ikey);
    if (st != EKV_OK) goto done;
    if (!it->instruction) {
        st = ekv_error_set(EKV_ERR_FORMAT,
                     "%s: no instruction field (instruction|prompt|question|article|input|document)",
                     where);
        goto done;
    }
    if (it->instruction[0] == '\0') {
        st = ekv_error_set(EKV_ERR_FORMAT, "%s: field \"%s\" is empty", where, ikey);
        goto done;
    }
    st = get_field(obj, k_answer_keys, EV_ARRAY_LEN(k_answer_keys), where, &it->answer, &akey);
    if (st != EKV_OK) goto done;
    if (!it->answer && o->require_answer) {
        st = ekv_error_set(EKV_ERR_FORMAT,
                     "%s: no answer field (answer|reference|output|summary_gt|target|summary)",
                     where);
        goto done;
    }
    static const char *const sys_key[] = {"system"};
    st = get_field(obj, sys_key, 1, where, &it->system, NULL);
    if (st == EKV_OK) st = get_images(obj, where, it);
    if (st == EKV_OK) st = get_id(obj, where, &it->id);
    if (st == EKV_OK) st = get_type(obj, where, &it->type);
    if (st == EKV_OK) st = get_score_from(obj, where, &it->score_from);
done:
    cJSON_Delete(obj);
    return st;
}

static enum ekv_status load_jsonl(const char *path, const struct ekv_data_opts *o,
                                  struct ekv_dataset *ds) {
    struct line_reader *r = calloc(1, sizeof *r);
    if (!r) return ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for the reader", path);
    r->f = fopen(path, "rb");
    if (!r->f) {
        free(r);
        return ekv_error_set(EKV_ERR_IO, "%s: cannot open", path);
    }
    enum ekv_status st = EKV_OK;
    size_t cap = 0, lineno = 0, seen = 0;
    for (;;) {
        if (o->limit && ds->n_items >= o->limit) break;
        bool keep = seen >= o->offset, blank;
        int rc = lr_next(r, o->max_line_bytes, keep, &blank);
        if (rc == 0) break;
        lineno++;
        if (rc == -1) {
            st = ekv_error_set(EKV_ERR_FORMAT, "%s:%zu: line longer than %zu bytes", path, lineno,
                         o->max_line_bytes);
            break;
        }
        if (rc == -2) {
            st = ekv_error_set(r->err ? EKV_ERR_IO : EKV_ERR_NOMEM, "%s:%zu: %s", path, lineno,
                         r->err ? "read error" : "no memory for the line");
            break;
        }
        if (blank) continue;
        seen++;
        if (!keep) continue;
        char *line = r->line;
        size_t n = r->n;
        if (lineno == 1 && n >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0) { /* UTF-8 BOM */
            line += 3;
            n -= 3;
        }
        struct ekv_eval_item *it;
        st = push_item(ds, &cap, o->max_items, path, &it);
        if (st != EKV_OK) break;
        st = parse_item(line, n, path, lineno, o, it);
        if (st != EKV_OK) break;
    }
    ds->n_total = seen;
    fclose(r->f);
    free(r->line);
    free(r);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Plain text                                                                 */
/* ------------------------------------------------------------------------ */

static bool is_ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static enum ekv_status read_all(const char *path, size_t max, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return ekv_error_set(EKV_ERR_IO, "%s: cannot open", path);
    size_t cap = 0, n = 0;
    char *buf = NULL;
    enum ekv_status st = EKV_OK;
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                st = ekv_error_set(EKV_ERR_FORMAT, "%s: larger than %zu bytes", path, max);
                break;
            }
            size_t nc = cap ? cap * 2 : 1 << 16;
            if (nc > max + 1) nc = max + 1; /* one byte past max detects too-large files */
            char *p = realloc(buf, nc + 1);
            if (!p) {
                st = ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for %zu bytes", path, nc);
                break;
            }
            buf = p;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = ekv_error_set(EKV_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (st == EKV_OK && n > max) st = ekv_error_set(EKV_ERR_FORMAT, "%s: larger than %zu bytes", path, max);
    if (st != EKV_OK) {
        free(buf);
        return st;
    }
    if (!buf) {
        buf = malloc(1);
        if (!buf) return ekv_error_set(EKV_ERR_NOMEM, "%s: no memory", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return EKV_OK;
}

static size_t line_of(const char *buf, const char *p) {
    size_t l = 1;
    for (const char *q = buf; q < p; q++) l += *q == '\n';
    return l;
}

static enum ekv_status load_text(const char *path, const struct ekv_data_opts *o,
                                 struct ekv_dataset *ds) {
    char *buf = NULL;
    size_t len = 0;
    enum ekv_status st = read_all(path, o->max_file_bytes, &buf, &len);
    if (st != EKV_OK) return st;
    const char *nul = memchr(buf, '\0', len);
    if (nul) {
        st = ekv_error_set(EKV_ERR_FORMAT, "%s: NUL byte at offset %zu (not a text file)", path,
                     (size_t)(nul - buf));
        free(buf);
        return st;
    }
    const char *sep = o->doc_sep && o->doc_sep[0] ? o->doc_sep : NULL;
    size_t seplen = sep ? strlen(sep) : 0;
    size_t cap = 0, seen = 0, line = 1;
    const char *p = buf, *end = buf + len, *counted = buf;
    while (p <= end) {
        if (o->limit && ds->n_items >= o->limit) break;
        const char *e = sep ? strstr(p, sep) : NULL;
        if (!e) e = end;
        const char *a = p, *b = e;
        while (a < b && is_ascii_space(*a)) a++;
        while (b > a && is_ascii_space(b[-1])) b--;
        if (b > a) {
            if (seen++ >= o->offset) {
                struct ekv_eval_item *it;
                st = push_item(ds, &cap, o->max_items, path, &it);
                if (st != EKV_OK) break;
                line += line_of(counted, a) - 1;
                counted = a;
                it->line = line;
                it->text = dup_n(a, (size_t)(b - a));
                if (!it->text) {
                    st = ekv_error_set(EKV_ERR_NOMEM, "%s:%zu: no memory for a %zu-byte document", path,
                                 line, (size_t)(b - a));
                    break;
                }
            }
        }
        if (e == end) break;
        p = e + seplen;
    }
    ds->n_total = seen;
    free(buf);
    return st;
}

enum ekv_status ekv_dataset_load(const char *path, const struct ekv_data_opts *opts,
                                 struct ekv_dataset *out) {
    if (!path || !out) return ekv_error_set(EKV_ERR_INVALID_ARG, "dataset: NULL argument");
    memset(out, 0, sizeof *out);
    struct ekv_data_opts o = opts ? *opts : ekv_data_default_opts();
    if (o.max_line_bytes == 0) o.max_line_bytes = EKV_DATA_DEFAULT_MAX_LINE;
    if (o.max_file_bytes == 0) o.max_file_bytes = EKV_DATA_DEFAULT_MAX_FILE;
    if (o.max_items == 0) o.max_items = EKV_DATA_DEFAULT_MAX_ITEMS;
    enum ekv_data_format fmt = o.format;
    if (fmt == EKV_DATA_AUTO)
        fmt = has_suffix(path, ".jsonl") || has_suffix(path, ".json") ? EKV_DATA_JSONL
                                                                      : EKV_DATA_TEXT;
    if (fmt != EKV_DATA_JSONL && fmt != EKV_DATA_TEXT)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "%s: unknown data format %d", path, (int)fmt);
    out->format = fmt;
    enum ekv_status st = fmt == EKV_DATA_JSONL ? load_jsonl(path, &o, out) : load_text(path, &o, out);
    if (st != EKV_OK) ekv_dataset_free(out);
    return st;
}
