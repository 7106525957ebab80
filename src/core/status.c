/*
 * status.c — status strings and the per-thread error message. The library
 * never prints; callers read ekv_last_error() after a failed call. ekv_err
 * and ekv_err_prefix are the library's own (core/util.h); ekv_error_set,
 * ekv_error_prefix and ekv_error_clear the same for code built on ekv.h.
 */
#include <stdarg.h>
#include <stdio.h>

#include "core/util.h"

#define EKV_ERRMSG_LEN 1024

static _Thread_local char g_errmsg[EKV_ERRMSG_LEN];

const char *ekv_status_str(enum ekv_status s) {
    switch (s) {
    case EKV_OK: return "success";
    case EKV_ERR_INVALID_ARG: return "invalid argument";
    case EKV_ERR_NOMEM: return "out of memory";
    case EKV_ERR_IO: return "input/output error";
    case EKV_ERR_FORMAT: return "malformed file";
    case EKV_ERR_UNSUPPORTED: return "unsupported";
    case EKV_ERR_OVERFLOW: return "size overflow";
    case EKV_ERR_NOT_FOUND: return "not found";
    case EKV_ERR_CONTEXT_FULL: return "context full";
    case EKV_ERR_INTERNAL: return "internal error";
    case EKV_STATUS_COUNT: break;
    }
    return "unknown status";
}

const char *ekv_last_error(void) { return g_errmsg; }

const char *ekv_version(void) { return "0.1.0"; }

void ekv_err_clear(void) { g_errmsg[0] = '\0'; }
void ekv_error_clear(void) { ekv_err_clear(); }

static enum ekv_status err_set(enum ekv_status s, const char *fmt, va_list ap) {
    vsnprintf(g_errmsg, sizeof g_errmsg, fmt, ap);
    return s;
}

static enum ekv_status err_prefix(enum ekv_status s, const char *fmt, va_list ap) {
    char prefix[EKV_ERRMSG_LEN];
    char old[EKV_ERRMSG_LEN];
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    snprintf(old, sizeof old, "%s", g_errmsg);
    snprintf(g_errmsg, sizeof g_errmsg, "%.500s: %.500s", prefix, old);
    return s;
}

enum ekv_status ekv_err(enum ekv_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    s = err_set(s, fmt, ap);
    va_end(ap);
    return s;
}

enum ekv_status ekv_error_set(enum ekv_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    s = err_set(s, fmt, ap);
    va_end(ap);
    return s;
}

enum ekv_status ekv_err_prefix(enum ekv_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    s = err_prefix(s, fmt, ap);
    va_end(ap);
    return s;
}

enum ekv_status ekv_error_prefix(enum ekv_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    s = err_prefix(s, fmt, ap);
    va_end(ap);
    return s;
}
