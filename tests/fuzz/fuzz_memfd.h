/*
 * fuzz_memfd.h — the fuzz input as a file for loaders that take a path
 * (fuzz_model.c, fuzz_mmproj.c): the bytes in an anonymous memory file,
 * reachable as /proc/self/fd/N, so no input touches the disk.
 */
#ifndef EKV_FUZZ_MEMFD_H
#define EKV_FUZZ_MEMFD_H

/* memfd_create needs _GNU_SOURCE, defined by the including file before any header */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* A memory file named name holding data[0, size) and its path (path holds
 * at least 64 bytes); the descriptor (the caller closes it), or -1. */
static inline int fuzz_memfd(const char *name, const uint8_t *data, size_t size, char *path) {
    const int fd = memfd_create(name, 0);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < size) {
        const ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
