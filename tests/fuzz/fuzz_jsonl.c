/*
 * fuzz_jsonl.c — libFuzzer target for the evaluation set reader
 * (ekv_dataset_load, src/eval/dataset.c): arbitrary bytes as a JSONL file
 * or a text file split into documents, with an offset and a limit. The input
 * goes to an anonymous in-memory file (memfd) read by its /proc path, the
 * same calls `ekv eval -f FILE` makes. Byte 0 picks the format, the
 * separator, offset and limit. Every string of every item is read (ASan sees
 * a length that lies). fuzz_replay.c replays the corpus in every build
 * (README.md).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ekv_eval.h"

#define CHECK(c)                                                                                                   \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

void ekv_fuzz_cleanup(void) {}

static size_t touch(const char *s) { return s ? strlen(s) : 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const unsigned b = data[0];
    const int fd = memfd_create("ekv-fuzz-jsonl", 0);
    if (fd < 0) return 0;
    size_t off = 0;
    while (off < size - 1) {
        const ssize_t w = write(fd, data + 1 + off, size - 1 - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    struct ekv_data_opts o = ekv_data_default_opts();
    o.format = (b & 1) ? EKV_DATA_TEXT : EKV_DATA_JSONL;
    o.doc_sep = (b & 2) ? "\n\n" : (b & 4) ? "###" : NULL;
    o.offset = (b >> 3) & 3;
    o.limit = (b >> 5) & 3;
    o.require_answer = (b & 0x80) != 0;
    o.max_line_bytes = 1 << 16; /* small limits: their checks are reached */
    o.max_file_bytes = 1 << 16;
    o.max_items = 64;
    struct ekv_dataset ds = {0};
    volatile size_t sink = 0;
    if (ekv_dataset_load(path, &o, &ds) == EKV_OK) {
        CHECK(ds.n_items <= 64 && (o.limit == 0 || ds.n_items <= o.limit));
        for (size_t i = 0; i < ds.n_items; i++) {
            const struct ekv_eval_item *it = &ds.items[i];
            sink += touch(it->id) + touch(it->system) + touch(it->instruction) + touch(it->answer) +
                    touch(it->image) + touch(it->text);
            if (ds.format == EKV_DATA_JSONL) CHECK(it->instruction != NULL);
            else CHECK(it->text != NULL);
        }
        ekv_dataset_free(&ds);
    }
    close(fd);
    (void)sink;
    return 0;
}
