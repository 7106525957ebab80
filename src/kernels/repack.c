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
 * In place in the model's mapping: the mapping is private, so writing to
 * it turns each touched page into an anonymous copy and drops the file
 * page from the process — resident memory stays one copy of the weights
 * (llama.cpp's repack keeps the mapped file and a repacked copy). The file
 * on disk is never written.
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

/* One group of 16 rows (src: rows layout) to X16 (dst). */
static void pack_group(enum ekv_dtype t, int64_t nb, const uint8_t *src, size_t row_bytes, uint8_t *dst) {
    const size_t gb = x16_block_bytes(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * gb;
        for (int i = 0; i < 16; i++) {
            const uint8_t *row = src + (size_t)i * row_bytes;
            if (t == EKV_Q8_0) {
                const struct ekv_block_q8_0 *blk = (const struct ekv_block_q8_0 *)(const void *)row + b;
                memcpy(o + 2 * i, &blk->d, 2);
                for (int k = 0; k < 8; k++)
                    for (int j = 0; j < 4; j++) o[32 + 64 * k + 4 * i + j] = (uint8_t)(blk->qs[4 * k + j] ^ 0x80);
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
    const size_t group = 16 * w->row_bytes;
    uint8_t *tmp = malloc(group);
    if (!tmp) return ekv_err(EKV_ERR_NOMEM, "repack: out of memory for %zu bytes", group);
    const int64_t nb = w->ne0 / EKV_QK8_0;
    for (int64_t g = 0; g < w->ne1 / 16; g++) {
        memcpy(tmp, (const uint8_t *)w->data + (size_t)g * group, group);
        pack_group(w->type, nb, tmp, w->row_bytes, (uint8_t *)dst + (size_t)g * group);
    }
    free(tmp);
    w->data = dst;
    w->layout = EKV_LAYOUT_X16;
    return EKV_OK;
}

enum ekv_status ekv_weights_repack_mapped(struct ekv_weight *const *ws, int n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        struct ekv_weight *w = ws[i];
        if (!ekv_weight_can_repack(w)) continue;
        const void *orig = w->data;
        const uintptr_t a = (uintptr_t)orig & ~(page - 1);
        const uintptr_t e = ((uintptr_t)orig + (size_t)w->ne1 * w->row_bytes + page - 1) & ~(page - 1);
        /* a mapping that cannot be made writable keeps the rows layout */
        if (mprotect((void *)a, e - a, PROT_READ | PROT_WRITE) != 0) continue;
        enum ekv_status s = ekv_weight_repack(w, (void *)(uintptr_t)orig);
        mprotect((void *)a, e - a, PROT_READ);
        if (s != EKV_OK) return s;
        /* every other view of the same bytes (tied embeddings) follows */
        for (int j = 0; j < n; j++)
            if (ws[j] != w && ws[j]->data == orig && ws[j]->layout == EKV_LAYOUT_ROWS &&
                ws[j]->type == w->type && ws[j]->ne0 == w->ne0 && ws[j]->ne1 == w->ne1)
                ws[j]->layout = EKV_LAYOUT_X16;
    }
    return EKV_OK;
}
