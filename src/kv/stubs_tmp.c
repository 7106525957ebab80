/*
 * stubs_tmp.c — TEMPORARY placeholders so that branch kvcore links before
 * the kvadv branch provides these policies. They behave like "full".
 * Delete this file when merging kvadv (it defines the same symbols).
 */
#include "kv/kv.h"

const struct ekv_policy_ops ekv_policy_roco = {.name = "roco", .summary = "stub: not implemented on this branch"};
const struct ekv_policy_ops ekv_policy_snapkv = {.name = "snapkv", .summary = "stub: not implemented on this branch"};
const struct ekv_policy_ops ekv_policy_pyramidkv = {.name = "pyramidkv", .summary = "stub: not implemented on this branch"};
const struct ekv_policy_ops ekv_policy_vlcache = {.name = "vlcache", .summary = "stub: not implemented on this branch"};
const struct ekv_policy_ops ekv_policy_elastic = {.name = "elastic", .summary = "stub: not implemented on this branch"};
