/*
 * select.c — the selection primitives every policy shares, so that each
 * policy file holds only its own rule: top-k with ekv's tie rule (higher
 * score first, then the lower index; NaN ranks last), SnapKV-style 1-D
 * pooling of scores, "keep the last w and the top of the rest" for one
 * head, and the on/off values of spec options.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"

/* ---- option values ---- */

bool ekv_kv_option_bool(const char *v, bool *out) {
    if (!strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "true")) return *out = true, true;
    if (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false")) return *out = false, true;
    return false;
}

/* ---- top-k ---- */

/* NaN ranks below everything. */
static inline double topk_key(const double *score, int32_t j) {
    double s = score[j];
    return isnan(s) ? -INFINITY : s;
}

/* a ranks before b: score descending, then index ascending. */
static inline bool topk_better(const double *score, int32_t a, int32_t b) {
    double sa = topk_key(score, a), sb = topk_key(score, b);
    return sa > sb || (sa == sb && a < b);
}

/* Min-heap (root = the worst kept) over heap[0..n). */
static void topk_sift_down(const double *score, int32_t *heap, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && topk_better(score, heap[w], heap[l])) w = l;
        if (r < n && topk_better(score, heap[w], heap[r])) w = r;
        if (w == i) return;
        int32_t t = heap[i];
        heap[i] = heap[w];
        heap[w] = t;
        i = w;
    }
}

static void topk_sift_up(const double *score, int32_t *heap, int32_t i) {
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!topk_better(score, heap[p], heap[i])) return;
        int32_t t = heap[i];
        heap[i] = heap[p];
        heap[p] = t;
        i = p;
    }
}

/* In-place heapsort of indices, ascending. */
static void idx_sift(int32_t *a, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && a[l] > a[m]) m = l;
        if (r < n && a[r] > a[m]) m = r;
        if (m == i) return;
        int32_t t = a[i];
        a[i] = a[m];
        a[m] = t;
        i = m;
    }
}

static void sort_idx(int32_t *a, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) idx_sift(a, n, i);
    for (int32_t end = n - 1; end > 0; end--) {
        int32_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        idx_sift(a, end, 0);
    }
}

/* Max-heap by rank (root = the best of the dropped) over heap[0..n). */
static void drop_sift_down(const double *score, int32_t *heap, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && topk_better(score, heap[l], heap[w])) w = l;
        if (r < n && topk_better(score, heap[r], heap[w])) w = r;
        if (w == i) return;
        int32_t t = heap[i];
        heap[i] = heap[w];
        heap[w] = t;
        i = w;
    }
}

#define EKV_TOPK_DROP_MAX 64

/* ekv_topk when all but d <= EKV_TOPK_DROP_MAX of the c candidates are
 * kept (an eviction step drops one or a few of thousands): the d ranked
 * last are found with a heap of d, then every other candidate is listed in
 * index order, O(n log d) instead of O(n log k). Same set: the complement
 * of the last d in the same total order. */
static int32_t topk_all_but(const double *score, int32_t n, int32_t d, const uint8_t *mask, int32_t *out) {
    int32_t drop[EKV_TOPK_DROP_MAX], m = 0;
    for (int32_t j = 0; j < n; j++) {
        if (mask && !mask[j]) continue;
        if (m < d) {
            drop[m] = j;
            for (int32_t i = m++; i > 0;) { /* sift up */
                const int32_t p = (i - 1) / 2;
                if (!topk_better(score, drop[i], drop[p])) break;
                const int32_t t = drop[i];
                drop[i] = drop[p], drop[p] = t, i = p;
            }
        } else if (d > 0 && topk_better(score, drop[0], j)) {
            drop[0] = j;
            drop_sift_down(score, drop, m, 0);
        }
    }
    sort_idx(drop, m);
    int32_t got = 0, q = 0;
    for (int32_t j = 0; j < n; j++) {
        if (mask && !mask[j]) continue;
        if (q < m && drop[q] == j) {
            q++;
            continue;
        }
        out[got++] = j;
    }
    return got;
}

int32_t ekv_topk(const double *score, int32_t n, int32_t k, const uint8_t *mask, int32_t *out) {
    if (!score || !out || n <= 0 || k <= 0) return 0;
    int32_t c = n; /* candidates */
    if (mask) {
        c = 0;
        for (int32_t j = 0; j < n; j++) c += mask[j] != 0;
    }
    if (k >= c - EKV_TOPK_DROP_MAX) return topk_all_but(score, n, k >= c ? 0 : c - k, mask, out);
    int32_t m = 0; /* heap size */
    for (int32_t j = 0; j < n; j++) {
        if (mask && !mask[j]) continue;
        if (m < k) {
            out[m] = j;
            topk_sift_up(score, out, m);
            m++;
        } else if (topk_better(score, j, out[0])) {
            out[0] = j;
            topk_sift_down(score, out, m, 0);
        }
    }
    sort_idx(out, m);
    return m;
}

/* ---- pooling ---- */

void ekv_pool1d(const double *in, int32_t n, int32_t kernel, enum ekv_pool_kind kind, double *out) {
    if (!in || !out || n <= 0) return;
    if (kernel < 1) kernel = 1;
    const int32_t half = kernel / 2;
    for (int32_t i = 0; i < n; i++) {
        const int32_t lo = i - half, hi = i - half + kernel - 1; /* inclusive window */
        const int32_t a = lo < 0 ? 0 : lo, b = hi >= n ? n - 1 : hi;
        if (kind == EKV_POOL_AVG) {
            double s = 0.0;
            for (int32_t t = a; t <= b; t++) s += in[t];
            out[i] = s / (double)kernel; /* zero padding counts */
        } else {
            double mx = -INFINITY;
            for (int32_t t = a; t <= b; t++) mx = in[t] > mx ? in[t] : mx;
            out[i] = mx;
        }
    }
}

/* ---- shared eviction rule ---- */

enum ekv_status ekv_kv_head_keep_recent_top(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t target,
                                            int32_t window, const double *score) {
    if (h->len <= target) return EKV_OK;
    if (target < 0) target = 0;
    const int32_t w = window < 0 ? 0 : (window > target ? target : window);
    const int32_t n_old = h->len - w;
    int32_t *idx = malloc((size_t)(target ? target : 1) * sizeof *idx);
    if (!idx) return ekv_err(EKV_ERR_NOMEM, "kv: out of memory selecting %d of %d entries", (int)target, (int)h->len);
    int32_t m = ekv_topk(score, n_old, target - w, NULL, idx);
    for (int32_t t = 0; t < w; t++) idx[m + t] = n_old + t;
    enum ekv_status s = ekv_kv_head_keep_idx(kv, h, idx, m + w);
    free(idx);
    return s;
}
