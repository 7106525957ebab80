/*
 * alloc_walk.h — the allocation-failure walk shared by tests/alloc_fail.c
 * and tests/alloc_fail_http.c (issue 23): a test linked with
 * -Wl,--wrap=malloc,calloc,realloc,strdup,aligned_alloc routes every
 * allocation of the objects it links (ekv's library, the eval runner, the
 * server's sources; not libc's, cJSON's or libmicrohttpd's own) through
 * alloc_walk.c, which can make the n-th one fail. aw_walk runs a scenario
 * once to count its allocations, then once per allocation with exactly that
 * one failing, and checks each run: an error status with a message, or
 * success with the same results; never a crash, and (ASan build) no leak.
 */
#ifndef EKV_ALLOC_WALK_H
#define EKV_ALLOC_WALK_H

#include <stdbool.h>
#include <stddef.h>

#include "ekv.h"

#define AW_MSG_MAX 512

/* A scenario: runs with what arg holds, returns its first failing status
 * and sets *sum to a checksum of its results (compared when it succeeds).
 * An error the scenario reports itself (not through ekv_last_error(),
 * e.g. the server's JSON error) goes into aw_msg. */
typedef enum ekv_status (*aw_scenario)(void *arg, double *sum);

extern char aw_msg[AW_MSG_MAX];
/* Set by a scenario whose outcome is wrong in a way it can tell itself
 * (e.g. a request the server never answered): the walk fails. */
extern bool aw_defect;
/* Summed over every walk so far. */
extern long aw_sites, aw_clean, aw_absorbed;

/* The allocation that fails in the run now going on (0: the first run,
 * without failures): a scenario keeps that run's results to name what
 * differs in a later one. */
long aw_failing(void);

/* Walks scenario fn (a CHECK per walk; a line on stdout with the counts).
 * Progress on stderr when $EKV_ALLOC_FAIL_PROGRESS is set (or the GPU
 * walk's $EKV_ALLOC_FAIL_GPU); $EKV_ALLOC_FAIL_FROM=N then resumes at N,
 * $EKV_ALLOC_FAIL_TO=M stops after M, $EKV_ALLOC_FAIL_TRACE=1 prints the call
 * stack of each failing allocation, $EKV_ALLOC_FAIL_MSGS=1 each error's message;
 * $EKV_ALLOC_FAIL_STRIDE=k fails every k-th allocation only (1, 1+k, ...). A run that succeeds
 * with other results prints the failed allocation's call stack. */
void aw_walk(const char *name, aw_scenario fn, void *arg);

/* The unwrapped allocator, for a test's own buffers (not failure sites). */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);

#endif
