/*
 * backend_vk_plan.c — what a compressing policy does to the rows of its
 * GPU cache (struct ekv_kv_dev of kv.h, for backend_vk_policy.c): keep /
 * merge / write become plans — runs of rows per (layer, KV head, side) —
 * and merged entries' means; ekv_vk_mg_flush runs them in one submission
 * (kv_merge.comp first, reading members where they are, then
 * kv_compact.comp through a scratch). Rows a policy computed itself are
 * quantised here with the CPU's own codecs (kvquant.h), so the device holds
 * the CPU cache's codes. A policy that reads rows gets a head read back
 * (kept until the head changes).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend_vk_mg.h"
#include "gpu/vk_push.h"
#include "kernels/kernels.h"
#include "kernels/kvquant.h"

/* ---- rows between the device's layout and floats ---- */

/* Quant bytes of one row of the device layout (words * 4) and its fp16 scales. */
void ekv_vk_mg_side_shape(enum ekv_kv_type t, uint32_t D, uint32_t *rw, uint32_t *sph) {
    *sph = (t == EKV_KV_Q8_0 || t == EKV_KV_Q4_0) ? D / 32 : 0;
    *rw = ekv_vk_row_words(t, D);
}

/* A device row (quants q, scales sc) as the CPU's row of the type (kvquant.h). */
static void dev_to_cpu(enum ekv_kv_type t, uint32_t D, const uint8_t *q, const uint16_t *sc, uint8_t *cpu) {
    if (t == EKV_KV_F32 || t == EKV_KV_F16) {
        memcpy(cpu, q, (size_t)D * (t == EKV_KV_F32 ? 4 : 2));
        return;
    }
    const size_t qb = t == EKV_KV_Q8_0 ? 32 : 16; /* quant bytes per block of 32 */
    for (uint32_t b = 0; b < D / 32; b++) {
        memcpy(cpu + b * (qb + 2), &sc[b], 2);
        memcpy(cpu + b * (qb + 2) + 2, q + b * qb, qb);
    }
}

static void cpu_to_dev(enum ekv_kv_type t, uint32_t D, const uint8_t *cpu, uint8_t *q, uint16_t *sc) {
    if (t == EKV_KV_F32 || t == EKV_KV_F16) {
        memcpy(q, cpu, (size_t)D * (t == EKV_KV_F32 ? 4 : 2));
        return;
    }
    const size_t qb = t == EKV_KV_Q8_0 ? 32 : 16;
    for (uint32_t b = 0; b < D / 32; b++) {
        memcpy(&sc[b], cpu + b * (qb + 2), 2);
        memcpy(q + b * qb, cpu + b * (qb + 2) + 2, qb);
    }
}

/* ---- plans ---- */

enum ekv_status ekv_vk_mg_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return EKV_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return ekv_err(EKV_ERR_NOMEM, "out of memory for a GPU cache plan of %zu entries", need);
    *p = np;
    *cap = nc;
    return EKV_OK;
}

/* Makes a device buffer hold `bytes` (no recording may be open). */
enum ekv_status ekv_vk_mg_buf_fit(struct ekv_vk *vk, struct ekv_vk_buf *b, size_t bytes, bool host, const char *what) {
    if (b->buffer && b->bytes >= bytes) return EKV_OK;
    ekv_vk_buf_free(vk, b);
    size_t want = bytes < 4096 ? 4096 : bytes + bytes / 2;
    return ekv_vk_buf_new(vk, want, host, what, b);
}

/* Words one sequence's merges take in the plan buffer (their table and
 * members), and with its KIVI units (their table, members and float rows;
 * its segments and runs: flush_compact), and in the stage. */
static size_t merge_words(const struct ekv_vk_mg *m) {
    /* + the heads' nq of a compressed KIVI side, per phase, layer and side */
    return 5 * m->n_means + 3 * m->n_members + m->n_rot * m->rot_w +
           (size_t)(m->phase + 1) * 2 * (size_t)m->s->n_layer * m->s->H;
}
static void flush_words(const struct ekv_vk_mg *m, size_t *plan_w, size_t *stage_w) {
    *plan_w = merge_words(m) + 5 * m->n_packs + m->n_pmembers + m->n_frows * m->s->D;
    *stage_w = 0;
    for (int side = 0; side < MG_SIDES; side++) *stage_w += m->n_stage[side];
}

/* Where each side's staged rows start in the stage, from the sequence's stage0 on. */
static void stage_offsets(const struct ekv_vk_mg *m, size_t stage0, size_t off[MG_SIDES]) {
    for (int side = 0; side < MG_SIDES; side++) {
        off[side] = stage0;
        stage0 += m->n_stage[side];
    }
}

/* Segments (layer, side) of a sequence's compaction: at most MG_SIDES per layer. */
static size_t flush_segs(const struct ekv_vk_mg *m) { return m->n_plans ? MG_SIDES * (size_t)m->s->n_layer : 0; }

/* Records the means of one phase of one sequence's merged entries into the
 * open recording (their table and members at plan0 of the plan buffer, the
 * staged rows at stage0 of the stage; phase 0 copies them there, *t counts
 * the table's rows over the phases): one dispatch per (layer, side) with
 * means, a workgroup per merged entry; they read the rows where they were,
 * before the phase's compaction. */
static void flush_merges(struct ekv_vk_mg *m, size_t plan0, size_t stage0, int32_t phase, size_t *tp) {
    struct ekv_vk_ctx *g = m->g;
    const struct ekv_vk_seq *s = m->s;
    const size_t mtab0 = plan0, mem0 = mtab0 + 5 * m->n_means, rot0 = mem0 + 3 * m->n_members;
    const size_t hq0 = rot0 + m->n_rot * m->rot_w + (size_t)phase * 2 * s->n_layer * s->H; /* [n_layer][2][H] */
    const size_t fr0 = plan0 + merge_words(m) + 5 * m->n_packs + m->n_pmembers; /* flush_packs' float rows */
    size_t st_off[MG_SIDES];
    stage_offsets(m, stage0, st_off);
    uint32_t *w = g->plan.host;
    uint32_t *sw = g->stage.host;
    for (int side = 0; side < MG_SIDES && phase == 0; side++)
        if (m->n_stage[side]) memcpy(sw + st_off[side], m->stage[side], m->n_stage[side] * 4);
    if (m->n_members && phase == 0) memcpy(w + mem0, m->members, 3 * m->n_members * 4);
    if (m->n_rot && phase == 0) memcpy(w + rot0, m->rots, m->n_rot * m->rot_w * 4);
    size_t t = *tp;
    for (int32_t il = 0; il < s->n_layer && m->n_means; il++)
        for (int side = 0; side < 2; side++) {
            const size_t t0 = t;
            for (size_t i = 0; i < m->n_means; i++) {
                const struct mg_mean *q = &m->means[i];
                if (q->il != il || q->side != side || q->phase != phase) continue;
                uint32_t *e = w + mtab0 + 5 * t;
                e[0] = (uint32_t)q->hk, e[1] = q->row, e[2] = q->first, e[3] = q->n, e[4] = q->r16;
                w[hq0 + ((size_t)il * 2 + (size_t)side) * s->H + (size_t)q->hk] = q->nq; /* (a head's means share it) */
                t++;
            }
            if (t == t0) continue;
            const struct ekv_vk_side *sd = mg_side_of(m, side);
            const int rs = side ? MG_VRES : MG_KRES; /* a KIVI side's fp16 means go to its residual's stage */
            struct ekv_vk_pc_kv_merge pc = {
                .base = sd->buf[il].addr, .stage = g->stage.addr + st_off[sd->managed ? rs : side] * 4,
                .table = g->plan.addr + (mtab0 + 5 * t0) * 4, .members = g->plan.addr + mem0 * 4,
                .rots = g->plan.addr + rot0 * 4,
                .hq = sd->managed ? g->plan.addr + (hq0 + ((size_t)il * 2 + (size_t)side) * s->H) * 4 : 0,
                .frows = g->plan.addr + fr0 * 4, .H = s->H, .C = (uint32_t)s->cap, .D = s->D, .rw = m->rw[side],
                .srw = m->srw[sd->managed ? rs : side], .rd = m->rot_w, .neox = m->seq->kv->rope.neox ? 1u : 0u,
                .G = sd->managed ? s->G : 1, .TC = sd->tc, .NGC = sd->ngc};
            ekv_vk_dispatch(g->vk, ekv_vk_kv_merge_pipe(sd->type, side == 1), &pc, sizeof pc, (uint32_t)(t - t0), 1, 1);
        }
    *tp = t;
}

/* Records one sequence's KIVI quantisation (kivi_pack.comp) into the open
 * recording: its units, members and float rows at plan0 of the plan
 * buffer, one dispatch per (layer, side) with units (at most 65535
 * workgroups each), before any compaction (members are read where they
 * are), their codes and parameters into the stage (stage0). */
static void flush_packs(struct ekv_vk_mg *m, size_t plan0, size_t stage0, int32_t phase, size_t *tp) {
    if (!m->n_packs) return;
    struct ekv_vk_ctx *g = m->g;
    const struct ekv_vk_seq *s = m->s;
    const size_t utab0 = plan0, mem0 = utab0 + 5 * m->n_packs, fr0 = mem0 + m->n_pmembers;
    size_t st_off[MG_SIDES];
    stage_offsets(m, stage0, st_off);
    uint32_t *w = g->plan.host;
    if (phase == 0) memcpy(w + mem0, m->pmembers, m->n_pmembers * 4);
    if (m->n_frows && phase == 0) memcpy(w + fr0, m->frows, m->n_frows * s->D * 4);
    size_t t = *tp;
    for (int32_t il = 0; il < s->n_layer; il++)
        for (int side = MG_K; side <= MG_V; side++) {
            const size_t t0 = t;
            for (size_t i = 0; i < m->n_packs; i++) {
                const struct mg_pack *q = &m->packs[i];
                if (q->il != il || q->side != side || q->phase != phase) continue;
                uint32_t *e = w + utab0 + 5 * t++;
                e[0] = (uint32_t)q->hk, e[1] = q->n, e[2] = q->first, e[3] = q->crow, e[4] = q->prow;
            }
            const struct ekv_vk_side *sd = mg_side_of(m, side);
            const enum ekv_vk_pipe p = ekv_vk_kivi_pack_pipe(sd->type, side == MG_V);
            for (size_t u = t0; u < t; u += 65535) {
                struct ekv_vk_pc_kivi_pack pc = {
                    .base = sd->buf[il].addr, .stage = g->stage.addr + st_off[side] * 4,
                    .pstage = g->stage.addr + st_off[MG_KPAR] * 4, .units = g->plan.addr + (utab0 + 5 * u) * 4,
                    .members = g->plan.addr + mem0 * 4, .frows = g->plan.addr + fr0 * 4, .H = s->H,
                    .C = (uint32_t)s->cap, .D = s->D, .G = s->G, .TC = sd->tc, .NGC = s->k.ngc,
                    .srw = m->srw[side], .psrw = m->srw[MG_KPAR]};
                ekv_vk_dispatch(g->vk, p, &pc, sizeof pc, (uint32_t)EKV_MIN((size_t)65535, t - u), 1, 1);
            }
        }
    *tp = t;
}

/* The compaction of every sequence's plans (kv_compact.comp): per
 * (sequence, layer, side) a segment {base, stage, row shape} and its runs
 * {destination, source, rows, segment} with absolute rows, the runs'
 * prefix sums of words, two dispatches per chunk of segments whose words
 * fit the scratch (scr_w words; a segment is never split: its rows are all
 * read before any is written), for the plans of one phase. The plan
 * buffer from word at on holds them (comp_words); stage0[i]: where sequence
 * i's staged rows are. */
struct flush_chunk { size_t runs0, pre0, n_runs, words; };

/* The two dispatches of one chunk: its runs and prefix sums in the plan buffer. */
static void compact_chunk(struct ekv_vk_ctx *g, const struct flush_chunk *c, size_t seg0) {
    struct ekv_vk_pc_kv_compact pc = {.runs = g->plan.addr + c->runs0 * 4, .pre = g->plan.addr + c->pre0 * 4,
                                      .segs = g->plan.addr + seg0 * 4, .scr = g->cscr.addr, .n_runs = (uint32_t)c->n_runs};
    const uint32_t gx = (uint32_t)EKV_MIN((uint64_t)65535, (c->words + 255) / 256);
    for (pc.phase = 0; pc.phase < 2; pc.phase++) ekv_vk_dispatch(g->vk, EKV_VK_KV_COMPACT, &pc, sizeof pc, gx, 1, 1);
}

static void flush_compact(struct ekv_vk_ctx *g, struct ekv_vk_mg *const *ms, int32_t n, const size_t *stage0, size_t at,
                          size_t scr_w, int32_t phase) {
    uint32_t *w = g->plan.host;
    size_t n_seg = 0;
    for (int32_t i = 0; i < n; i++) n_seg += flush_segs(ms[i]);
    size_t n_runs = 0;
    for (int32_t i = 0; i < n; i++) n_runs += ms[i]->n_pairs;
    const size_t seg0 = at, runs0 = seg0 + 8 * n_seg, pre0 = runs0 + 4 * n_runs;
    size_t sg = 0, r = 0, pre = pre0;
    struct flush_chunk c = {runs0, pre0, 0, 0};
    for (int32_t i = 0; i < n; i++) {
        struct ekv_vk_mg *m = ms[i];
        const struct ekv_vk_seq *s = m->s;
        if (!m->n_plans) continue;
        size_t st_off[MG_SIDES];
        stage_offsets(m, stage0[i], st_off);
        for (int32_t il = 0; il < s->n_layer; il++)
            for (int side = 0; side < MG_SIDES; side++) {
                if (!mg_side_on(m, side)) continue;
                const uint32_t ew = m->rw[side] + m->sph[side];
                size_t words = 0, nr = 0;
                for (int32_t k = 0; k < m->n_plans; k++) {
                    const struct mg_plan *p = &m->plans[k];
                    if (p->il != il || p->side != side || p->phase != phase) continue;
                    for (uint32_t q = 0; q < p->n; q++) words += (size_t)m->pairs[3 * (p->first + q) + 2] * ew, nr++;
                }
                if (nr == 0) continue;
                if (c.n_runs > 0 && c.words + words > scr_w) { /* the chunk so far: its dispatches */
                    w[pre++] = (uint32_t)c.words;
                    compact_chunk(g, &c, seg0);
                    c = (struct flush_chunk){runs0 + 4 * r, pre, 0, 0};
                }
                const struct ekv_vk_side *sd = side == MG_K || side == MG_V ? mg_side_of(m, side) : NULL;
                const uint64_t base = mg_side_buf(m, side, il)->addr + mg_side_word0(m, side) * 4;
                const uint64_t stage = g->stage.addr + st_off[side] * 4;
                uint32_t *e = w + seg0 + 8 * sg;
                e[0] = (uint32_t)base, e[1] = (uint32_t)(base >> 32), e[2] = (uint32_t)stage, e[3] = (uint32_t)(stage >> 32);
                e[4] = m->rw[side], e[5] = m->sph[side], e[6] = sd ? (uint32_t)(2 * sd->p0) : 0, e[7] = m->srw[side];
                const uint32_t hstride = mg_side_hstride(m, side);
                for (int32_t k = 0; k < m->n_plans; k++) {
                    const struct mg_plan *p = &m->plans[k];
                    if (p->il != il || p->side != side || p->phase != phase) continue;
                    const uint32_t hrow0 = (uint32_t)p->hk * hstride;
                    for (uint32_t q = 0; q < p->n; q++) {
                        const uint32_t *x = m->pairs + 3 * (p->first + q);
                        uint32_t *o = w + runs0 + 4 * r++;
                        o[0] = hrow0 + x[0];
                        o[1] = x[1] == MG_ZERO || (x[1] & MG_HI) ? x[1] : hrow0 + x[1];
                        o[2] = x[2];
                        o[3] = (uint32_t)sg;
                        w[pre++] = (uint32_t)c.words;
                        c.words += (size_t)x[2] * ew;
                        c.n_runs++;
                    }
                }
                sg++;
            }
    }
    if (c.n_runs == 0) return;
    w[pre++] = (uint32_t)c.words;
    compact_chunk(g, &c, seg0);
}

/* Words of the largest (layer, side) of a sequence's planned rows. */
static size_t flush_seg_max_words(const struct ekv_vk_mg *m) {
    size_t max_words = 1;
    for (int32_t il = 0; il < m->s->n_layer; il++)
        for (int side = 0; side < MG_SIDES; side++) {
            if (!mg_side_on(m, side)) continue;
            size_t r = 0;
            for (int32_t i = 0; i < m->n_plans; i++) {
                const struct mg_plan *p = &m->plans[i];
                if (p->il != il || p->side != side) continue;
                for (uint32_t k = 0; k < p->n; k++) r += m->pairs[3 * (p->first + k) + 2];
            }
            max_words = EKV_MAX(max_words, r * (m->rw[side] + m->sph[side]));
        }
    return max_words;
}

static void flush_reset(struct ekv_vk_mg *m) {
    m->n_plans = 0;
    m->n_pairs = 0;
    m->n_means = 0;
    m->n_members = 0;
    m->n_rot = 0;
    if (m->rot_hash) memset(m->rot_hash, 0, m->rot_hcap * sizeof *m->rot_hash);
    for (int side = 0; side < MG_SIDES; side++) m->n_stage[side] = 0;
    m->n_packs = m->n_pmembers = m->n_frows = 0;
    memset(m->pending, 0, (size_t)m->s->n_layer * m->s->H * sizeof *m->pending);
    m->phase = 0;
}

/* The compaction scratch of one submission: every planned word of the
 * forward when that is at most EKV_VK_CSCR_WORDS (64 MiB), else chunks of that
 * size (at least the largest segment). */
#define EKV_VK_CSCR_WORDS ((size_t)16 << 20)
static size_t ekv_vk_cscr_cap = EKV_VK_CSCR_WORDS;

void ekv_vk_mg_set_chunk(size_t words) { ekv_vk_cscr_cap = words ? words : EKV_VK_CSCR_WORDS; }

/* Runs the plans of n sequences' caches (of one context) in one submission;
 * the plans are dropped whatever happens. */
enum ekv_status ekv_vk_mg_flush_all(struct ekv_vk_ctx *g, struct ekv_vk_mg *const *ms, int32_t n) {
    size_t plan_w = 0, stage_w = 0, seg_max = 1, all_w = 0, n_seg = 0, n_runs = 0;
    size_t stage0[64], *st0 = n <= 64 ? stage0 : malloc((size_t)n * sizeof *st0);
    if (!st0) {
        for (int32_t i = 0; i < n; i++) flush_reset(ms[i]);
        return ekv_err(EKV_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        st0[i] = stage_w;
        if (ms[i]->n_plans == 0) continue;
        size_t p, st;
        flush_words(ms[i], &p, &st);
        plan_w += p, stage_w += st;
        const size_t mw = flush_seg_max_words(ms[i]);
        seg_max = EKV_MAX(seg_max, mw);
        for (int32_t k = 0; k < ms[i]->n_plans; k++) { /* every planned word */
            const struct mg_plan *pl = &ms[i]->plans[k];
            for (uint32_t q = 0; q < pl->n; q++)
                all_w += (size_t)ms[i]->pairs[3 * (pl->first + q) + 2] * (ms[i]->rw[pl->side] + ms[i]->sph[pl->side]);
        }
        n_seg += flush_segs(ms[i]), n_runs += ms[i]->n_pairs;
    }
    int32_t n_phase = 0;
    for (int32_t i = 0; i < n; i++)
        if (ms[i]->n_plans) n_phase = EKV_MAX(n_phase, ms[i]->phase + 1);
    size_t *tc = calloc(2 * (size_t)(n ? n : 1), sizeof *tc); /* per sequence: rows of its means' and units' tables so far */
    enum ekv_status st = tc ? EKV_OK : ekv_err(EKV_ERR_NOMEM, "out of memory");
    if (n_seg == 0 || st != EKV_OK) goto out;
    /* segments, runs, prefix sums: a region per phase, each as large as all of them */
    const size_t comp_w = 8 * n_seg + 4 * n_runs + n_runs + n_seg + 1;
    const size_t scr_w = EKV_MAX(seg_max, EKV_MIN(all_w, ekv_vk_cscr_cap));
    st = ekv_vk_mg_buf_fit(g->vk, &g->plan, (plan_w + (size_t)n_phase * comp_w) * 4, true, "GPU cache plans");
    if (st == EKV_OK) st = ekv_vk_mg_buf_fit(g->vk, &g->stage, (stage_w ? stage_w : 1) * 4, true, "GPU cache staged rows");
    if (st == EKV_OK) st = ekv_vk_mg_buf_fit(g->vk, &g->cscr, scr_w * 4, false, "GPU cache compaction scratch");
    if (st == EKV_OK) st = ekv_vk_begin(g->vk);
    for (int32_t ph = 0; ph < n_phase && st == EKV_OK; ph++) { /* each phase reads what the one before wrote */
        size_t p0 = 0;
        for (int32_t i = 0; i < n; i++) {
            if (ms[i]->n_plans == 0) continue;
            size_t p, sw;
            flush_words(ms[i], &p, &sw);
            flush_merges(ms[i], p0, st0[i], ph, &tc[2 * i]);
            flush_packs(ms[i], p0 + merge_words(ms[i]), st0[i], ph, &tc[2 * i + 1]);
            p0 += p;
        }
        flush_compact(g, ms, n, st0, plan_w + (size_t)ph * comp_w, scr_w, ph);
    }
    if (st == EKV_OK) st = ekv_vk_submit(g->vk);
out:
    free(tc);
    for (int32_t i = 0; i < n; i++)
        if (ms[i]->n_plans) flush_reset(ms[i]);
    if (st0 != stage0) free(st0);
    return st;
}

/* Runs the plans made so far (one submission). */
enum ekv_status ekv_vk_mg_flush(struct ekv_vk_mg *m) { return ekv_vk_mg_flush_all(m->g, &m, 1); }

/* Stages a float row of one side, quantised as the CPU would; its source code. */
static enum ekv_status stage_row(struct ekv_vk_mg *m, int side, const float *x, uint32_t *code) {
    const enum ekv_kv_type t = mg_side_of(m, side)->type;
    const uint32_t srw = m->srw[side];
    const size_t row = m->n_stage[side] / srw;
    if (row >= MG_HI) return ekv_err(EKV_ERR_OVERFLOW, "too many staged rows");
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->stage[side], &m->cap_stage[side], m->n_stage[side] + srw, 4);
    if (st != EKV_OK) return st;
    uint8_t cpu[256 * 4];
    ekv_kv_traits(t)->from_float(x, cpu, (int64_t)m->s->D);
    uint32_t *dst = m->stage[side] + m->n_stage[side];
    memset(dst, 0, (size_t)srw * 4);
    cpu_to_dev(t, m->s->D, cpu, (uint8_t *)dst, (uint16_t *)(dst + m->rw[side]));
    m->n_stage[side] += srw;
    *code = MG_HI | (uint32_t)row;
    return EKV_OK;
}

/* Stages a logit bias (side 2): log(weight), 0 for weight 1 (attend.c's rule). */
static enum ekv_status stage_bias(struct ekv_vk_mg *m, float weight, uint32_t *code) {
    const size_t row = m->n_stage[2];
    if (row >= MG_HI) return ekv_err(EKV_ERR_OVERFLOW, "too many staged rows");
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->stage[2], &m->cap_stage[2], row + 1, 4);
    if (st != EKV_OK) return st;
    const float b = weight != 1.0f ? logf(weight) : 0.0f;
    memcpy(&m->stage[2][row], &b, 4);
    m->n_stage[2]++;
    *code = MG_HI | (uint32_t)row;
    return EKV_OK;
}

/* Adds rows dst.. <- src.. (n of them; src MG_ZERO: zeros) to the plan
 * begun at run `first`, extending its last run when both continue it. */
enum ekv_status ekv_vk_mg_add_run(struct ekv_vk_mg *m, size_t first, uint32_t dst, uint32_t src, uint32_t n) {
    if (m->n_pairs > first) {
        uint32_t *q = m->pairs + 3 * (m->n_pairs - 1);
        if (q[0] + q[2] == dst && ((src == MG_ZERO && q[1] == MG_ZERO) ||
                                   (src != MG_ZERO && q[1] != MG_ZERO && q[1] + q[2] == src))) {
            q[2] += n;
            return EKV_OK;
        }
    }
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->pairs, &m->cap_pairs, m->n_pairs + 1, 12);
    if (st != EKV_OK) return st;
    uint32_t *q = m->pairs + 3 * m->n_pairs;
    q[0] = dst, q[1] = src, q[2] = n;
    m->n_pairs++;
    return EKV_OK;
}

enum ekv_status ekv_vk_mg_add_pair(struct ekv_vk_mg *m, size_t first, uint32_t dst, uint32_t src) {
    return ekv_vk_mg_add_run(m, first, dst, src, 1);
}

/* The moves that compact a head of len entries to its kept ones (no row
 * replaced): one run per stretch of kept entries that moves, found at
 * memchr speed (an eviction of one entry is a few runs, not one per entry). */
enum ekv_status ekv_vk_mg_keep_runs(struct ekv_vk_mg *m, size_t first, const uint8_t *keep, int32_t len, uint32_t *kept) {
    enum ekv_status st = EKV_OK;
    uint32_t e = 0;
    for (int32_t j = ekv_keep_next(keep, 0, len, true); j < len && st == EKV_OK; j = ekv_keep_next(keep, j, len, true)) {
        const int32_t r = ekv_keep_next(keep, j, len, false);
        if ((uint32_t)j != e) st = ekv_vk_mg_add_run(m, first, e, (uint32_t)j, (uint32_t)(r - j));
        e += (uint32_t)(r - j);
        j = r;
    }
    if (kept) *kept = e;
    return st;
}

enum ekv_status ekv_vk_mg_add_plan(struct ekv_vk_mg *m, int il, int hk, int side, size_t first) {
    if (m->n_pairs == first) return EKV_OK;
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->plans, &m->cap_plans, (size_t)m->n_plans + 1, sizeof *m->plans);
    if (st != EKV_OK) return st;
    m->plans[m->n_plans++] = (struct mg_plan){.il = il, .hk = hk, .side = side, .phase = m->phase,
                                              .first = (uint32_t)first, .n = (uint32_t)(m->n_pairs - first)};
    m->pending[(size_t)il * m->s->H + (size_t)hk] = m->phase + 1;
    return EKV_OK;
}

/* A head about to get a plan: an earlier plan of it runs first (plans of
 * one head in one dispatch would race): one in this phase opens the next
 * phase of the submission; and its read-back is stale. */
enum ekv_status ekv_vk_mg_head_touch(struct ekv_vk_mg *m, int il, int hk) {
    if (m->rc_il == il && m->rc_hk == hk) m->rc_il = -1;
    if (m->pending[(size_t)il * m->s->H + (size_t)hk] == m->phase + 1) m->phase++;
    return EKV_OK;
}

/* The biases of head (il, hk) follow its entries: kept ones move, the
 * places past the kept ones become 0. A survivor whose weight changed gets
 * its new log: one given a new row (k_of[j] or v_of[j], a mean made on the
 * host) or one that members joined (cnt[j] > 0, a merge on the device);
 * with neither array the kept biases move as runs. */
static enum ekv_status plan_bias(struct ekv_vk_mg *m, int il, int hk, int32_t len, const uint8_t *keep, const int32_t *into,
                                 const float *const *k_of, const float *const *v_of, const int32_t *cnt) {
    if (m->posb) { /* the positions move with their entries (a merged entry keeps its own) */
        const size_t first = m->n_pairs;
        enum ekv_status st = EKV_OK;
        uint32_t e = 0;
        if (keep) {
            st = ekv_vk_mg_keep_runs(m, first, keep, len, NULL);
        } else {
            for (int32_t j = 0; j < len && st == EKV_OK; j++) {
                if (into[j] != j) continue;
                if ((uint32_t)j != e) st = ekv_vk_mg_add_pair(m, first, e, (uint32_t)j);
                e++;
            }
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, 3, first);
        if (st != EKV_OK) return st;
    }
    if (!m->bias) return EKV_OK;
    const float *w_now = m->seq->kv->layers[il].heads[hk].weight; /* survivors' new weights are set already */
    const size_t first = m->n_pairs;
    enum ekv_status st = EKV_OK;
    uint32_t e = 0;
    if (keep && !k_of && !v_of) { /* an eviction: the kept biases move as runs */
        st = ekv_vk_mg_keep_runs(m, first, keep, len, &e);
    } else {
        for (int32_t j = 0; j < len && st == EKV_OK; j++) {
            if (keep ? !keep[j] : into[j] != j) continue;
            uint32_t src = (uint32_t)j;
            const bool changed = (k_of && k_of[j]) || (v_of && v_of[j]) || (cnt && cnt[j] > 0);
            if (changed) st = stage_bias(m, w_now[j], &src);
            if (st == EKV_OK && src != e) st = ekv_vk_mg_add_pair(m, first, e, src);
            e++;
        }
    }
    if (st == EKV_OK && e < (uint32_t)len) st = ekv_vk_mg_add_run(m, first, e, MG_ZERO, (uint32_t)len - e);
    return st == EKV_OK ? ekv_vk_mg_add_plan(m, il, hk, 2, first) : st;
}

static enum ekv_status dev_compact(void *user, int il, int hk, int32_t len, const uint8_t *keep,
                                   const float *const *k_of, const float *const *v_of) {
    struct ekv_vk_mg *m = user;
    enum ekv_status st = ekv_vk_mg_head_touch(m, il, hk);
    for (int side = 0; side < 2 && st == EKV_OK; side++) {
        const float *const *of = side ? v_of : k_of;
        if (mg_side_of(m, side)->managed) {
            st = ekv_vk_kivi_compact(m, side, il, hk, len, keep, of, NULL);
            continue;
        }
        const size_t first = m->n_pairs;
        uint32_t e = 0;
        if (!of) st = ekv_vk_mg_keep_runs(m, first, keep, len, NULL); /* no row replaced: runs */
        for (int32_t j = 0; of && j < len && st == EKV_OK; j++) {
            if (!keep[j]) continue;
            uint32_t src = (uint32_t)j;
            if (of[j]) st = stage_row(m, side, of[j], &src);
            if (st == EKV_OK && src != e) st = ekv_vk_mg_add_pair(m, first, e, src); /* rows already in place stay */
            e++;
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, side, first);
    }
    /* new rows are merged survivors (a merge averaged on the host), whose weights changed */
    return st == EKV_OK ? plan_bias(m, il, hk, len, keep, NULL, k_of, v_of, NULL) : st;
}

/* A stage row the device fills (a merged entry's mean); its source code. */
enum ekv_status ekv_vk_mg_stage_blank(struct ekv_vk_mg *m, int side, uint32_t *code) {
    const uint32_t srw = m->srw[side];
    const size_t row = m->n_stage[side] / srw;
    if (row >= MG_HI) return ekv_err(EKV_ERR_OVERFLOW, "too many staged rows");
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->stage[side], &m->cap_stage[side], m->n_stage[side] + srw, 4);
    if (st != EKV_OK) return st;
    memset(m->stage[side] + m->n_stage[side], 0, (size_t)srw * 4);
    m->n_stage[side] += srw;
    *code = MG_HI | (uint32_t)row;
    return EKV_OK;
}

/* Slot of a delta in a rotation hash of cap (a power of two) slots. */
static size_t rot_slot(const int64_t d[3], size_t cap) {
    return (size_t)(((uint64_t)d[0] * 0x9E3779B97F4A7C15ull ^ (uint64_t)d[1] * 0xC2B2AE3D27D4EB4Full ^
                     (uint64_t)d[2] * 0x165667B19E3779F9ull) >> 17) & (cap - 1);
}

/* The rotation row that turns a key by delta (key=rotate), added once per
 * distinct delta of this flush; *row its index. */
static enum ekv_status rot_row(struct ekv_vk_mg *m, const int64_t delta[3], uint32_t *row) {
    if (m->n_rot + 1 > m->rot_hcap / 2) { /* grow and rehash (load <= 1/2) */
        const size_t nc = m->rot_hcap ? 2 * m->rot_hcap : 1024;
        uint32_t *nh = calloc(nc, sizeof *nh);
        if (!nh) return ekv_err(EKV_ERR_NOMEM, "out of memory for key rotations");
        for (size_t r = 0; r < m->n_rot; r++) {
            size_t i = rot_slot(m->rot_keys + 3 * r, nc);
            while (nh[i]) i = (i + 1) & (nc - 1);
            nh[i] = (uint32_t)r + 1;
        }
        free(m->rot_hash);
        m->rot_hash = nh;
        m->rot_hcap = nc;
    }
    size_t i = rot_slot(delta, m->rot_hcap);
    for (; m->rot_hash[i]; i = (i + 1) & (m->rot_hcap - 1)) {
        const int64_t *k = m->rot_keys + 3 * (m->rot_hash[i] - 1);
        if (k[0] == delta[0] && k[1] == delta[1] && k[2] == delta[2]) {
            *row = m->rot_hash[i] - 1;
            return EKV_OK;
        }
    }
    const struct ekv_kv *kv = m->seq->kv;
    m->rot_w = (uint32_t)(2 * ((kv->rope.dim < kv->head_dim ? kv->rope.dim : kv->head_dim) / 2));
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->rots, &m->cap_rot, (m->n_rot + 1) * m->rot_w + 1, sizeof(float));
    if (st == EKV_OK) st = ekv_vk_mg_grow((void **)&m->rot_keys, &m->cap_rot_keys, 3 * (m->n_rot + 1), sizeof(int64_t));
    if (st != EKV_OK) return st;
    const int64_t d4[4] = {delta[0], delta[1], delta[2], 0};
    (void)ekv_rope_shift_cs(&kv->rope, d4, kv->head_dim, m->rots + m->n_rot * m->rot_w);
    memcpy(m->rot_keys + 3 * m->n_rot, delta, 3 * sizeof *delta);
    m->rot_hash[i] = (uint32_t)m->n_rot + 1;
    *row = (uint32_t)m->n_rot++;
    return EKV_OK;
}

/* Member j's key rotation into survivor t (MG_NONE: none needed). */
static enum ekv_status member_rot(struct ekv_vk_mg *m, const struct ekv_kv_head *h, int32_t t, int32_t j, uint32_t *row) {
    *row = MG_NONE;
    int64_t d[3];
    if (h->mpos) {
        for (int c = 0; c < 3; c++) d[c] = (int64_t)h->mpos[3 * (size_t)t + c] - h->mpos[3 * (size_t)j + c];
    } else {
        d[0] = (int64_t)h->pos[t] - h->pos[j];
        d[1] = d[2] = 0;
    }
    if (!d[0] && !d[1] && !d[2]) return EKV_OK;
    return rot_row(m, d, row);
}

static enum ekv_status dev_merge(void *user, int il, int hk, int32_t len, const int32_t *into, const float *w,
                                 unsigned flags, const float *const *k_of, const float *const *v_of) {
    struct ekv_vk_mg *m = user;
    const struct ekv_kv_head *h = &m->seq->kv->layers[il].heads[hk]; /* positions before the merge */
    enum ekv_status st = ekv_vk_mg_head_touch(m, il, hk);
    /* members of each survivor: itself first, then the entries that join it in index order */
    int32_t *cnt = calloc((size_t)(len ? len : 1), sizeof *cnt), *start = malloc((size_t)(len ? len : 1) * sizeof *start);
    int32_t *list = malloc((size_t)(len ? len : 1) * sizeof *list);
    if (!cnt || !start || !list) st = ekv_err(EKV_ERR_NOMEM, "out of memory for a merge of %d entries", (int)len);
    for (int32_t j = 0; st == EKV_OK && j < len; j++) /* cnt[t]: entries that join t */
        if (into[j] >= 0 && into[j] != j) cnt[into[j]]++;
    int32_t at = 0;
    for (int32_t t = 0; st == EKV_OK && t < len; t++) {
        start[t] = at;
        if (into[t] == t) list[at] = t, at += 1 + cnt[t];
    }
    for (int32_t t = 0; st == EKV_OK && t < len; t++) cnt[t] = 0;
    for (int32_t j = 0; st == EKV_OK && j < len; j++) {
        const int32_t t = into[j];
        if (t >= 0 && t != j) list[start[t] + 1 + cnt[t]++] = j;
    }
    int32_t *mean_of = NULL; /* a compressed KIVI side: [len] the device mean of a survivor, or -1 */
    uint8_t *keep = NULL;
    if (st == EKV_OK && (m->s->k.managed || m->s->v.managed)) {
        mean_of = malloc((size_t)(len ? len : 1) * sizeof *mean_of);
        keep = malloc((size_t)(len ? len : 1));
        if (!mean_of || !keep) st = ekv_err(EKV_ERR_NOMEM, "out of memory for a merge of %d entries", (int)len);
        for (int32_t j = 0; keep && j < len; j++) keep[j] = into[j] == j;
    }
    for (int side = 0; side < 2 && st == EKV_OK; side++) {
        const float *const *of = side ? v_of : k_of;
        const bool keep_rows = side == 0 && (flags & EKV_KV_DEV_K_KEEP); /* key=anchor */
        const bool rotate = side == 0 && (flags & EKV_KV_DEV_K_ROTATE);
        const bool kivi = mg_side_of(m, side)->managed;
        const size_t first = m->n_pairs;
        uint32_t e = 0;
        for (int32_t j = 0; kivi && j < len; j++) mean_of[j] = -1;
        for (int32_t j = 0; j < len && st == EKV_OK; j++) {
            if (into[j] != j) continue;
            uint32_t src = (uint32_t)j;
            if (of && of[j]) {
                if (!kivi) st = stage_row(m, side, of[j], &src);
            } else if (!of && !keep_rows && cnt[j] > 0) { /* a mean of 1 + cnt[j] rows, on the device */
                if (kivi) { /* into a float row that the KIVI side's compaction quantises (backend_vk_kivi.c) */
                    mean_of[j] = (int32_t)m->n_means;
                    st = ekv_vk_kivi_mean_row(m, &src);
                } else {
                    st = ekv_vk_mg_stage_blank(m, side, &src);
                }
                const uint32_t nmem = (uint32_t)cnt[j] + 1;
                if (st == EKV_OK) st = ekv_vk_mg_grow((void **)&m->members, &m->cap_members, m->n_members + nmem, 12);
                if (st == EKV_OK) st = ekv_vk_mg_grow((void **)&m->means, &m->cap_means, m->n_means + 1, sizeof *m->means);
                if (st != EKV_OK) break;
                m->means[m->n_means++] = (struct mg_mean){.il = il, .hk = hk, .side = side, .phase = m->phase,
                                                          .row = src & ~MG_HI,
                                                          .first = (uint32_t)m->n_members, .n = nmem, .r16 = MG_NONE,
                                                          .nq = 0};
                if (kivi) m->means[m->n_means - 1].nq = (uint32_t)(side ? m->seq->kv->layers[il].heads[hk].vs.nq
                                                                         : m->seq->kv->layers[il].heads[hk].ks.nq);
                for (uint32_t i = 0; i < nmem && st == EKV_OK; i++) {
                    const int32_t mj = list[start[j] + (int32_t)i];
                    uint32_t rot = MG_NONE;
                    if (rotate) st = member_rot(m, h, j, mj, &rot);
                    m->members[3 * m->n_members] = (uint32_t)mj;
                    memcpy(&m->members[3 * m->n_members + 1], &w[mj], 4);
                    m->members[3 * m->n_members + 2] = rot;
                    m->n_members++;
                }
            }
            if (!kivi && st == EKV_OK && src != e) st = ekv_vk_mg_add_pair(m, first, e, src);
            e++;
        }
        if (kivi && st == EKV_OK) st = ekv_vk_kivi_compact(m, side, il, hk, len, keep, of, mean_of);
        else if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, side, first);
    }
    free(mean_of), free(keep);
    /* the biases: a survivor that members joined has a new weight (h->weight
     * holds the new ones already), the others keep theirs */
    if (st == EKV_OK) st = plan_bias(m, il, hk, len, NULL, into, NULL, NULL, cnt);
    free(cnt), free(start), free(list);
    return st;
}

static enum ekv_status dev_write(void *user, int il, int hk, int32_t len, const int32_t *idx, int32_t n,
                                 const float *k, const float *v) {
    struct ekv_vk_mg *m = user;
    (void)len;
    enum ekv_status st = ekv_vk_mg_head_touch(m, il, hk);
    for (int side = 0; side < 2 && st == EKV_OK; side++) {
        const float *x = side ? v : k;
        if (!x) continue;
        if (mg_side_of(m, side)->managed) {
            st = ekv_vk_kivi_write(m, side, il, hk, len, idx, n, x);
            continue;
        }
        const size_t first = m->n_pairs;
        for (int32_t t = 0; t < n && st == EKV_OK; t++) {
            uint32_t src;
            st = stage_row(m, side, x + (size_t)t * m->s->D, &src);
            if (st == EKV_OK) st = ekv_vk_mg_add_pair(m, first, (uint32_t)idx[t], src);
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, side, first);
    }
    return st;
}

/* Reads rows [0, len) of head (il, hk), both sides, into the read-back. */
static enum ekv_status read_head(struct ekv_vk_mg *m, int il, int hk, int32_t len) {
    const struct ekv_vk_seq *s = m->s;
    const size_t D = s->D, n = (size_t)(len ? len : 1);
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->rc_k, &m->rc_cap, n * D, sizeof(float));
    if (st == EKV_OK && m->rc_cap > 0) {
        float *nv = realloc(m->rc_v, m->rc_cap * sizeof(float));
        if (!nv) st = ekv_err(EKV_ERR_NOMEM, "out of memory for %d rows read back", (int)len);
        else m->rc_v = nv;
    }
    if (st != EKV_OK) return st;
    m->rc_il = -1;
    for (int side = 0; side < 2; side++) {
        const struct ekv_vk_side *sd = mg_side_of(m, side);
        if (sd->managed) {
            if ((st = ekv_vk_kivi_read(m, side, il, hk, len, side ? m->rc_v : m->rc_k)) != EKV_OK) return st;
            continue;
        }
        const uint32_t rw = m->rw[side], sph = m->sph[side];
        const size_t qbytes = (size_t)len * rw * 4, sbytes = (size_t)len * sph * 2;
        if ((st = ekv_vk_mg_grow((void **)&m->rc_raw, &m->rc_raw_cap, qbytes + sbytes + 1, 1)) != EKV_OK) return st;
        const size_t row0 = (size_t)hk * (size_t)s->cap;
        if (len > 0 && (st = ekv_vk_download(m->g->vk, &sd->buf[il], row0 * rw * 4, m->rc_raw, qbytes)) != EKV_OK)
            return st;
        if (len > 0 && sph &&
            (st = ekv_vk_download(m->g->vk, &sd->buf[il], (2 * sd->p0 + row0 * sph) * 2, m->rc_raw + qbytes, sbytes)) !=
                EKV_OK)
            return st;
        const struct ekv_kv_type_traits *tr = ekv_kv_traits(sd->type);
        uint8_t cpu[256 * 4];
        float *out = side ? m->rc_v : m->rc_k;
        for (int32_t j = 0; j < len; j++) {
            dev_to_cpu(sd->type, s->D, m->rc_raw + (size_t)j * rw * 4, (const uint16_t *)(m->rc_raw + qbytes) + (size_t)j * sph,
                       cpu);
            tr->to_float(cpu, out + (size_t)j * D, (int64_t)D);
        }
    }
    m->rc_il = il;
    m->rc_hk = hk;
    m->rc_len = len;
    m->n_read_back++;
    return EKV_OK;
}

static enum ekv_status dev_read(void *user, int il, int hk, int32_t len, const int32_t *idx, int32_t n, float *k,
                                float *v) {
    struct ekv_vk_mg *m = user;
    if (m->in_fwd) return ekv_err(EKV_ERR_INTERNAL, "a GPU cache's rows are read while its forward is recorded");
    enum ekv_status st = m->pending[(size_t)il * m->s->H + (size_t)hk] ? ekv_vk_mg_flush(m) : EKV_OK;
    if (st == EKV_OK && !(m->rc_il == il && m->rc_hk == hk && m->rc_len == len)) st = read_head(m, il, hk, len);
    if (st != EKV_OK) return st;
    const size_t D = m->s->D;
    for (int32_t t = 0; t < n; t++) {
        if (k) memcpy(k + (size_t)t * D, m->rc_k + (size_t)idx[t] * D, D * sizeof(float));
        if (v) memcpy(v + (size_t)t * D, m->rc_v + (size_t)idx[t] * D, D * sizeof(float));
    }
    return EKV_OK;
}

void ekv_vk_mg_dev_init(struct ekv_vk_mg *m) {
    m->dev = (struct ekv_kv_dev){.user = m, .compact = dev_compact, .merge = dev_merge, .read = dev_read,
                                 .write = dev_write};
    if (m->s->k.managed || m->s->v.managed) m->dev.flush = ekv_vk_kivi_flush; /* KIVI's residual rule */
}
