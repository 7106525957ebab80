/*
 * repack.c — the X16 weight layout (kernels.h): Q8_0 and Q4_0 matrices
 * rearranged at load time so that the int8 kernels read 16 rows at once.
 *
 * Within a group of 16 rows, block column b holds the 16 fp16 scales, then
 * the quants in chunks of 64 bytes: chunk k has 4 bytes of each of the 16
 * rows (row i at 4i). Q8_0: chunk k = elements 4k..4k+3 stored as w + 128
 * (unsigned, for vpdpbusd), k < 8. Q4_0: chunk k = stored bytes 4k..4k+3,
 * whose low nibbles are elements 4k..4k+3 and high nibbles elements
 * 16+4k..16+4k+3, k < 4. A group's block column is 544 (Q8_0) or 288
 * (Q4_0) bytes: exactly the bytes of the 16 rows, so the layout fits in
 * the same memory and can replace the file's bytes in place.
 *
 * At model load (ekv_weights_repack_mapped) the matrices are copied into
 * one anonymous arena in the new layout and the file pages they came from
 * are released from the process (madvise MADV_DONTNEED on the read-only
 * mapping), so resident memory stays one copy of the weights — llama.cpp's
 * repack keeps the mapped file resident beside its repacked copy. The
 * file and its mapping are never written.
 *
 * F32, F16 and BF16 matrices move into the same arena unchanged (the
 * rows layout, the same bytes): decoding TinyLlama-1.1B F16 read its
 * weights from anonymous memory at 1.6x the rate it read them from the
 * file's page-cache pages on the 2-core AMD Zen 5 host (24.6-27.5 against
 * 13.9-19.2 tok/s, interleaved; docs/performance.md, "Zen 5").
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/util.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

static size_t x16_block_bytes(enum ekv_dtype t) {
    return t == EKV_Q8_0 ? EKV_X16_Q8_0_BYTES : EKV_X16_Q4_0_BYTES;
}

bool ekv_weight_can_repack(const struct ekv_weight *w) {
    size_t rb;
    return w && w->data && w->layout == EKV_LAYOUT_ROWS && (w->type == EKV_Q8_0 || w->type == EKV_Q4_0) &&
           w->ne0 > 0 && w->ne1 > 0 && w->ne1 % 16 == 0 && ekv_dtype_row_bytes(w->type, w->ne0, &rb) &&
           rb == w->row_bytes;
}

/* A float matrix moved into the arena as it is. */
static bool can_copy(const struct ekv_weight *w) {
    size_t rb;
    return w && w->data && w->layout == EKV_LAYOUT_ROWS &&
           (w->type == EKV_F32 || w->type == EKV_F16 || w->type == EKV_BF16) && w->ne0 > 0 && w->ne1 > 0 &&
           ekv_dtype_row_bytes(w->type, w->ne0, &rb) && rb == w->row_bytes;
}

static bool moves(const struct ekv_weight *w) { return ekv_weight_can_repack(w) || can_copy(w); }

/* One group of 16 rows (src: rows layout) to X16 (dst). */
static void pack_group(enum ekv_dtype t, int64_t nb, const uint8_t *src, size_t row_bytes, uint8_t *dst) {
    const size_t gb = x16_block_bytes(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * gb;
        for (int i = 0; i < 16; i++) {
            const uint8_t *row = src + (size_t)i * row_bytes;
            uint32_t v;
            if (t == EKV_Q8_0) {
                const struct ekv_block_q8_0 *blk = (const struct ekv_block_q8_0 *)(const void *)row + b;
                memcpy(o + 2 * i, &blk->d, 2);
                for (int k = 0; k < 8; k++) {
                    memcpy(&v, blk->qs + 4 * k, 4);
                    v ^= 0x80808080u; /* int8 w -> uint8 w + 128 */
                    memcpy(o + 32 + 64 * k + 4 * i, &v, 4);
                }
            } else {
                const struct ekv_block_q4_0 *blk = (const struct ekv_block_q4_0 *)(const void *)row + b;
                memcpy(o + 2 * i, &blk->d, 2);
                for (int k = 0; k < 4; k++) memcpy(o + 32 + 64 * k + 4 * i, blk->qs + 4 * k, 4);
            }
        }
    }
}

void ekv_x16_unpack_row(const struct ekv_weight *w, int64_t r, void *dst) {
    if (w->layout != EKV_LAYOUT_X16) {
        memcpy(dst, (const char *)w->data + (size_t)r * w->row_bytes, w->row_bytes);
        return;
    }
    const size_t gb = x16_block_bytes(w->type);
    const int64_t nb = w->ne0 / EKV_QK8_0;
    const uint8_t *g = (const uint8_t *)w->data + (size_t)(r / 16) * 16 * w->row_bytes;
    const int i = (int)(r % 16);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g + (size_t)b * gb;
        if (w->type == EKV_Q8_0) {
            struct ekv_block_q8_0 *blk = (struct ekv_block_q8_0 *)dst + b;
            memcpy(&blk->d, o + 2 * i, 2);
            for (int k = 0; k < 8; k++)
                for (int j = 0; j < 4; j++) blk->qs[4 * k + j] = (int8_t)(o[32 + 64 * k + 4 * i + j] ^ 0x80);
        } else {
            struct ekv_block_q4_0 *blk = (struct ekv_block_q4_0 *)dst + b;
            memcpy(&blk->d, o + 2 * i, 2);
            for (int k = 0; k < 4; k++) memcpy(blk->qs + 4 * k, o + 32 + 64 * k + 4 * i, 4);
        }
    }
}

enum ekv_status ekv_weight_repack(struct ekv_weight *w, void *dst) {
    if (!ekv_weight_can_repack(w) || !dst)
        return ekv_err(EKV_ERR_INVALID_ARG, "repack: weight is not a packed Q8_0/Q4_0 matrix of 16k rows");
    const size_t group = 16 * w->row_bytes, total = (size_t)w->ne1 * w->row_bytes;
    const uint8_t *src = w->data;
    /* in place (overlapping) needs each group copied out first */
    const bool overlap = (const uint8_t *)dst < src + total && src < (const uint8_t *)dst + total;
    uint8_t *tmp = overlap ? malloc(group) : NULL;
    if (overlap && !tmp) return ekv_err(EKV_ERR_NOMEM, "repack: out of memory for %zu bytes", group);
    const int64_t nb = w->ne0 / EKV_QK8_0;
    for (int64_t g = 0; g < w->ne1 / 16; g++) {
        const uint8_t *gs = src + (size_t)g * group;
        if (tmp) {
            memcpy(tmp, gs, group);
            gs = tmp;
        }
        pack_group(w->type, nb, gs, w->row_bytes, (uint8_t *)dst + (size_t)g * group);
    }
    free(tmp);
    w->data = dst;
    w->layout = EKV_LAYOUT_X16;
    return EKV_OK;
}

enum ekv_status ekv_weights_repack_mapped(struct ekv_weight *const *ws, int n, struct ekv_repack_arena *arena) {
    memset(arena, 0, sizeof *arena);
    /* one anonymous arena for all repacked matrices, 64-byte aligned each */
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!moves(ws[i])) continue;
        bool dup = false;
        for (int j = 0; j < i; j++) dup = dup || (ws[j]->data == ws[i]->data && moves(ws[j]));
        if (dup) continue;
        size_t sz;
        if (!ekv_mul_ok((size_t)ws[i]->ne1, ws[i]->row_bytes, &sz) || !ekv_add_ok(total, (sz + 63) & ~(size_t)63, &total))
            return ekv_err(EKV_ERR_OVERFLOW, "repack: weight sizes overflow");
    }
    if (total == 0) return EKV_OK;
    /* Not populated up front, and huge pages asked for (2 MiB aligned):
     * the copy's first writes fault the memory in, 512 times fewer faults
     * and TLB entries. On the 2-core Zen 5 VM, loading TinyLlama-1.1B F16
     * took 4.4-6.1 s with MAP_POPULATE and 4 KiB pages, 1.5-1.8 s this way
     * (1.0 s reading the file mapping in place), and decoded 3-15 % faster. */
    const size_t huge = (size_t)2 << 20;
    size_t map_bytes = total;
    if (total >= huge && !ekv_add_ok(total, huge, &map_bytes))
        return ekv_err(EKV_ERR_OVERFLOW, "repack: weight sizes overflow");
    void *map = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return ekv_err(EKV_ERR_NOMEM, "repack: cannot map %zu bytes", map_bytes);
    char *base = map;
    if (total >= huge) {
        base = (char *)(((uintptr_t)map + huge - 1) & ~(uintptr_t)(huge - 1));
        (void)madvise(base, total, MADV_HUGEPAGE); /* advice only: fails where THP is off */
    }
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        struct ekv_weight *w = ws[i];
        /* a view of bytes already moved (tied embeddings) points into the arena */
        const bool moved = (const char *)w->data >= (const char *)base && (const char *)w->data < (const char *)base + total;
        if (moved || !moves(w)) continue;
        const void *orig = w->data;
        const size_t sz = (size_t)w->ne1 * w->row_bytes;
        if (can_copy(w)) {
            memcpy((char *)base + off, orig, sz);
            w->data = (char *)base + off;
        } else {
            enum ekv_status s = ekv_weight_repack(w, (char *)base + off);
            if (s != EKV_OK) {
                munmap(map, map_bytes);
                return s;
            }
        }
        off += (sz + 63) & ~(size_t)63;
        /* every other view of the same bytes (tied embeddings) follows */
        for (int j = 0; j < n; j++)
            if (ws[j] != w && ws[j]->data == orig && ws[j]->layout == EKV_LAYOUT_ROWS && ws[j]->type == w->type &&
                ws[j]->ne0 == w->ne0 && ws[j]->ne1 == w->ne1 && ws[j]->row_bytes == w->row_bytes) {
                ws[j]->data = w->data;
                ws[j]->layout = w->layout;
            }
        /* the file's pages of this matrix leave the process (they were only
         * read; another access would read the file again) */
        const uintptr_t a = ((uintptr_t)orig + page - 1) & ~(page - 1), e = ((uintptr_t)orig + sz) & ~(page - 1);
        if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    }
    arena->base = base;
    arena->bytes = total;
    arena->map = map;
    arena->map_bytes = map_bytes;
    return EKV_OK;
}

void ekv_repack_arena_free(struct ekv_repack_arena *arena) {
    if (arena && arena->map) munmap(arena->map, arena->map_bytes);
    if (arena) memset(arena, 0, sizeof *arena);
}
