/*
 * test_longctx_sets.c — the long-context evaluation sets shipped in
 * data/longctx/ (made by data/longctx/make_longctx.py from held-out
 * documents of ekv-ref-28m) are what their README says: every set loads
 * with ekv's own reader, has its item count, and every item is a
 * token-exact cut under ekv's tokenizer (the tokenizer of the shipped
 * models/ekv-ref-28m-q8_0.gguf, the same vocabulary as the F16 model):
 * the prompt has the stated number of tokens, the answer too, and
 * tokenize(prompt) + tokenize(answer) == tokenize(prompt + answer), so
 * `ekv eval` scores exactly the tokens the set names. Recall answers occur
 * earlier in their prompt (there is something to copy); retrieval answers
 * are a call the prompt holds three times, opening with a cue that is fed, not scored (retrieval_q: the
 * same, with the question at the prompt's end); needle answers (ruler_niah_*) are a "// key NAME = VALUE"
 * line the prompt holds once and asks for at its end. Needs only the repository (no ../shared).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "ekv_eval.h"
#include "testutil.h"

static int32_t *tok(const struct ekv_model *m, const char *s, size_t len, size_t *n) {
    size_t cap = len + 16, got = 0;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t || ekv_tokenize(m, s, len, false, false, t, cap, &got) != EKV_OK) {
        free(t);
        *n = 0;
        return NULL;
    }
    *n = got;
    return t;
}

static size_t count_occ(const char *hay, const char *needle) {
    size_t c = 0, ln = strlen(needle);
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += ln) c++;
    return c;
}

struct set_spec {
    const char *file;
    size_t n_items;
    size_t p_lo, p_hi; /* prompt tokens */
    size_t a_lo, a_hi; /* answer tokens */
    int kind;          /* 0 continuation, 1 recall, 2 retrieval (and retrieval_q), 3 needle (ruler_niah_*) */
};

static void check_set(const struct ekv_model *m, const struct set_spec *sp) {
    struct ekv_data_opts o = ekv_data_default_opts();
    o.require_answer = true;
    struct ekv_dataset ds;
    char path[256];
    snprintf(path, sizeof path, "data/longctx/%s", sp->file);
    enum ekv_status st = ekv_dataset_load(tu_src(path), &o, &ds);
    CHECK_OK(st);
    if (st != EKV_OK) return;
    CHECK_MSG(ds.n_items == sp->n_items, "%s: %zu items, expected %zu", sp->file, ds.n_items, sp->n_items);
    size_t bad = 0;
    for (size_t i = 0; i < ds.n_items; i++) {
        const struct ekv_eval_item *it = &ds.items[i];
        size_t lp = strlen(it->instruction), la = strlen(it->answer), np, na, nb;
        char *both = malloc(lp + la + 1);
        memcpy(both, it->instruction, lp);
        memcpy(both + lp, it->answer, la + 1);
        int32_t *tp = tok(m, it->instruction, lp, &np), *ta = tok(m, it->answer, la, &na),
                *tb = tok(m, both, lp + la, &nb);
        bool ok = tp && ta && tb && np >= sp->p_lo && np <= sp->p_hi && na >= sp->a_lo && na <= sp->a_hi &&
                  nb == np + na && memcmp(tb, tp, np * sizeof *tp) == 0 &&
                  memcmp(tb + np, ta, na * sizeof *ta) == 0;
        if (ok && sp->kind == 1) ok = count_occ(it->instruction, it->answer) >= 1;
        if (ok && sp->kind == 2) {
            /* the answer is "\tw1_w2_w3(" with the cue "\tw1_w2_" fed, not
             * scored (score_from = its tokens), and the prompt holds the
             * call three times */
            const char *us = strchr(it->answer, '_'), *us2 = us ? strchr(us + 1, '_') : NULL;
            ok = it->answer[0] == '\t' && la < 64 && it->answer[la - 1] == '(' && us2;
            if (ok) {
                size_t nc;
                int32_t *tc = tok(m, it->answer, (size_t)(us2 + 1 - it->answer), &nc);
                ok = tc && it->score_from == (int32_t)nc && nc + 2 <= na && memcmp(tc, ta, nc * sizeof *tc) == 0;
                free(tc);
            }
            if (ok) ok = count_occ(it->instruction, it->answer) == 3;
        }
        if (ok && sp->kind == 3) {
            /* the answer is the needle line "// key NAME = VALUE\n" with its cue
             * "// key NAME =" fed, not scored; the prompt holds the line once and
             * ends with the question that names the key */
            const char *eq = strstr(it->answer, " = ");
            ok = !strncmp(it->answer, "// key ", 7) && eq && it->answer[la - 1] == '\n' &&
                 count_occ(it->instruction, it->answer) == 1;
            if (ok) {
                size_t nc;
                int32_t *tc = tok(m, it->answer, (size_t)(eq + 2 - it->answer), &nc);
                ok = tc && it->score_from == (int32_t)nc && nc + 2 <= na && memcmp(tc, ta, nc * sizeof *tc) == 0;
                free(tc);
                char q[96];
                snprintf(q, sizeof q, "// what is key %.*s?\n", (int)(eq - it->answer - 7), it->answer + 7);
                ok = ok && lp > strlen(q) && !strcmp(it->instruction + lp - strlen(q), q);
            }
        }
        if (!ok) {
            bad++;
            fprintf(stderr, "%s item %zu (%s): prompt %zu, answer %zu, joint %zu tokens\n", sp->file, i,
                    it->id ? it->id : "?", np, na, nb);
        }
        free(tp);
        free(ta);
        free(tb);
        free(both);
    }
    CHECK_MSG(bad == 0, "%s: %zu items are not token-exact cuts of their stated lengths", sp->file, bad);
    ekv_dataset_free(&ds);
}

int main(void) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/ekv-ref-28m-q8_0.gguf"), NULL, &m));
    if (!m) return test_finish("test_longctx_sets");
    /* continuation prompts may be a token short of their length: the cut
     * moves down until it neither splits a character nor merges tokens
     * across the boundary (README) */
    static const struct set_spec sets[] = {
        {"cont_1k.jsonl", 16, 1008, 1024, 256, 256, 0},
        {"cont_2k.jsonl", 16, 2032, 2048, 256, 256, 0},
        {"cont_3.5k.jsonl", 16, 3568, 3584, 256, 256, 0},
        {"recall.jsonl", 24, 2900, 3100, 64, 64, 1},
        {"retrieval.jsonl", 48, 2900, 3100, 6, 12, 2},
        {"retrieval_q.jsonl", 45, 2900, 3100, 6, 12, 2},
        {"ruler_niah_single.jsonl", 32, 2850, 3050, 8, 14, 3},
        {"ruler_niah_multikey.jsonl", 32, 2850, 3050, 8, 14, 3},
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) check_set(m, &sets[i]);
    ekv_model_free(m);
    return test_finish("test_longctx_sets");
}
