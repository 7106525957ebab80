/*
 * full.c — the "full" policy: keeps every token, asks for no statistics.
 * It is the reference every other policy is measured against, and budget
 * 1.0 with it must give the same logits as running without a policy.
 */
#include "kv/kv.h"

const struct ekv_policy_ops ekv_policy_full = {
    .name = "full",
    .summary = "keep every token (no compression)",
};
