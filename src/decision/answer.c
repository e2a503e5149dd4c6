/* answer.c — probabilities, answers and the response envelope (SPEC.md §8),
 * reproducing `systemone()` / `systemone_answer` of joint_schema_model.py.
 */
#include "decision/answer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"

/* ---- softmax ------------------------------------------------------------ */

/* exp(d) for d <= 0 in f32, evaluated the way the reference's CPU softmax
 * kernel does (ATen vectorised exp, a SLEEF-style u10 expf with FMA):
 * d = q·ln2 + s with q = rint(d/ln2) and a two-constant Cody–Waite split of
 * ln2, a degree-6 Horner polynomial for e^s, then a scale by 2^q.  glibc's
 * expf is correctly rounded and differs from it by one ulp on about 15% of
 * the golden probabilities; this form reproduces all 212 bit for bit. */
static float reference_expf(float d) {
    if (d < -104.0f) return 0.0f;
    const float inv_ln2 = 1.442695040888963407359924681001892137f;
    const float ln2_hi = 0.693145751953125f;
    const float ln2_lo = 1.428606765330187045e-06f;
    float q = rintf(d * inv_ln2);
    float s = fmaf(q, -ln2_hi, d);
    s = fmaf(q, -ln2_lo, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    float s2 = s * s;
    u = fmaf(s2, u, s) + 1.0f;
    return ldexpf(u, (int)q);
}

/* Sum in the reference kernel's order (ATen vec::reduce_all with 16-lane
 * vectors): fewer than 16 values are added left to right; otherwise value i
 * goes to lane i mod 16 and the lanes are folded pairwise (8, 4, 2, 1). */
static float reference_sum(const float *e, size_t n) {
    enum { LANES = 16 };
    if (n < LANES) {
        float s = 0.0f;
        for (size_t i = 0; i < n; i++) s += e[i];
        return s;
    }
    float lane[LANES] = {0};
    for (size_t i = 0; i < n; i++) lane[i % LANES] += e[i];
    for (size_t w = LANES / 2; w >= 1; w /= 2)
        for (size_t i = 0; i < w; i++) lane[i] += lane[i + w];
    return lane[0];
}

/* torch.softmax(logits, -1) on one question's f32 logits: subtract the max,
 * exponentiate, multiply by the reciprocal of the sum. */
static void softmax_f32(const float *logits, size_t n, float *probs) {
    if (n == 0) return;
    float m = logits[0];
    for (size_t i = 1; i < n; i++)
        if (logits[i] > m) m = logits[i];
    for (size_t i = 0; i < n; i++) probs[i] = reference_expf(logits[i] - m);
    float inv = 1.0f / reference_sum(probs, n);
    for (size_t i = 0; i < n; i++) probs[i] *= inv;
}

void clef_softmax_per_question(const clef_record *rec, const float *logits, float *probs) {
    size_t off = 0;
    for (size_t q = 0; q < rec->n_questions; q++) {
        softmax_f32(logits + off, rec->questions[q].n_options, probs + off);
        off += rec->questions[q].n_options;
    }
}

int clef_check_logits(const clef_request *req, const clef_record *rec, const float *logits, clef_err *err) {
    size_t off = 0;
    for (size_t q = 0; q < rec->n_questions; q++) {
        for (size_t j = 0; j < rec->questions[q].n_options; j++)
            if (!isfinite(logits[off + j]))
                return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: the head produced a non-finite logit",
                                 req->questions[q].id);
        off += rec->questions[q].n_options;
    }
    return 0;
}

/* ---- Python round(x, 4) ------------------------------------------------ */

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Round the exact decimal expansion `digits` (as printed by "%.*f", no sign)
 * to 4 fractional digits, ties to even, in place; may grow by one char.  The
 * radix character is whatever printf used (locale), found as the first
 * non-digit, and strtod reads it back in the same locale. */
static void round_decimal_string(char *digits) {
    char *dot = digits;
    while (is_digit(*dot)) dot++;
    char *last = dot + 4; /* the 4th fractional digit */
    const char *rest = last + 1;
    int up;
    if (*rest > '5') up = 1;
    else if (*rest < '5') up = 0;
    else {
        up = 0;
        for (const char *p = rest + 1; *p; p++)
            if (*p != '0') up = 1;
        if (!up) up = (*last - '0') % 2; /* exact tie: to even */
    }
    last[1] = '\0';
    if (!up) return;
    char *p = last;
    for (;;) {
        if (!is_digit(*p)) { p--; continue; } /* the radix character */
        if (*p != '9') { (*p)++; return; }
        *p = '0';
        if (p == digits) break;
        p--;
    }
    memmove(digits + 1, digits, strlen(digits) + 1); /* carry out of the top: 9.9999x -> 10.0000 */
    digits[0] = '1';
}

double clef_round4(double x) {
    if (!isfinite(x) || x == 0.0) return x;
    double ax = fabs(x);
    /* 2^52 and above every double is an integer: round(x, 4) == x. */
    if (ax >= 4503599627370496.0) return x;
    /* Far below the first rounding boundary (0.00005): rounds to a signed zero. */
    if (ax < 1e-5) return copysign(0.0, x);
    /* ax = M·2^(e-53): its exact expansion has max(0, 53-e) fractional
     * digits, at most 53+17 = 70 here, and glibc prints it exactly. */
    int e;
    frexp(ax, &e);
    int frac = 53 - e;
    if (frac < 5) frac = 5;
    char buf[128];
    snprintf(buf, sizeof buf - 1, "%.*f", frac, ax);
    round_decimal_string(buf);
    return copysign(strtod(buf, NULL), x);
}

/* ---- response ------------------------------------------------------------ */

static void put_rounded(double x, clef_buf *out) { json_render_float(clef_round4(x), out); }

static void put_key(const char *s, size_t n, clef_buf *out) {
    json_render_string(s, n, out);
    clef_buf_putc(out, ':');
}

static void render_noul(const float *p, clef_buf *out) {
    clef_buf_puts(out, "{\"type\":\"noul\",\"noul\":");
    put_rounded(p[0], out); /* option 0 is "true" (SPEC §3.3) */
    clef_buf_putc(out, '}');
}

/* Choice: argmax and probabilities in the request's criteria order; the
 * first maximum wins (Python max over the criteria dict). */
static void render_choice(const clef_question *q, const float *p, clef_buf *out) {
    size_t best = q->request_order[0];
    for (size_t k = 1; k < q->n_options; k++)
        if (p[q->request_order[k]] > p[best]) best = q->request_order[k];
    clef_buf_puts(out, "{\"type\":\"choice\",\"choice\":");
    json_render_string(q->options[best].id, q->options[best].id_len, out);
    clef_buf_puts(out, ",\"confidence\":");
    put_rounded(p[best], out);
    clef_buf_puts(out, ",\"probabilities\":{");
    for (size_t k = 0; k < q->n_options; k++) {
        size_t j = q->request_order[k];
        if (k) clef_buf_putc(out, ',');
        put_key(q->options[j].id, q->options[j].id_len, out);
        put_rounded(p[j], out);
    }
    clef_buf_puts(out, "}}");
}

/* Score: expectation Σ i·p_i in double over the f32 probabilities (i = 0..n-1
 * in that order), confidence max p, legend echoing the criteria verbatim. */
static void render_score(const clef_question *q, const float *p, clef_buf *out) {
    double score = 0.0;
    float pmax = p[0];
    for (size_t i = 0; i < q->n_options; i++) {
        score += (double)i * (double)p[i];
        if (p[i] > pmax) pmax = p[i];
    }
    clef_buf_puts(out, "{\"type\":\"score\",\"score\":");
    put_rounded(score, out);
    clef_buf_puts(out, ",\"confidence\":");
    put_rounded(pmax, out);
    clef_buf_puts(out, ",\"legend\":{");
    for (size_t i = 0; i < q->n_options; i++) {
        if (i) clef_buf_putc(out, ',');
        put_key(q->options[i].id, q->options[i].id_len, out);
        json_render_opts(q->criteria->items[i], 0, out); /* verbatim: null stays null, keys unsorted */
    }
    clef_buf_puts(out, "},\"probabilities\":{");
    for (size_t i = 0; i < q->n_options; i++) {
        if (i) clef_buf_putc(out, ',');
        put_key(q->options[i].id, q->options[i].id_len, out);
        put_rounded(p[i], out);
    }
    clef_buf_puts(out, "}}");
}

static void render_span(clef_span s, clef_buf *out) { clef_buf_printf(out, "[%d,%d]", (int)s.start, (int)s.end); }

static void render_debug(const clef_request *req, const clef_record *rec, const float *logits, clef_buf *out) {
    clef_buf_puts(out, ",\"debug\":{\"input_ids\":[");
    for (size_t i = 0; i < rec->n_ids; i++) clef_buf_printf(out, i ? ",%d" : "%d", (int)rec->input_ids[i]);
    clef_buf_puts(out, "],\"questions\":[");
    size_t off = 0;
    for (size_t q = 0; q < rec->n_questions; q++) {
        const clef_record_question *rq = &rec->questions[q];
        const clef_question *qq = &req->questions[q];
        clef_buf_puts(out, q ? ",{\"id\":" : "{\"id\":");
        json_render_string(qq->id, qq->id_len, out);
        clef_buf_puts(out, ",\"question_span\":");
        render_span(rq->question, out);
        clef_buf_puts(out, ",\"option_spans\":[");
        for (size_t j = 0; j < rq->n_options; j++) {
            if (j) clef_buf_putc(out, ',');
            render_span(rq->options[j], out);
        }
        clef_buf_puts(out, "],\"option_ids\":[");
        for (size_t j = 0; j < rq->n_options; j++) {
            if (j) clef_buf_putc(out, ',');
            json_render_string(qq->options[j].id, qq->options[j].id_len, out);
        }
        clef_buf_puts(out, "],\"logits\":[");
        for (size_t j = 0; j < rq->n_options; j++) {
            if (j) clef_buf_putc(out, ',');
            json_render_float((double)logits[off + j], out);
        }
        clef_buf_puts(out, "]}");
        off += rq->n_options;
    }
    clef_buf_puts(out, "]}");
}

void clef_render_response(const clef_request *req, const clef_record *rec, const float *logits, int debug,
                          clef_buf *out) {
    size_t total = clef_record_total_options(rec);
    float *probs = clef_xmalloc((total ? total : 1) * sizeof *probs);
    clef_softmax_per_question(rec, logits, probs);
    clef_buf_puts(out, "{\"model\":");
    json_render_string(req->model, req->model_len, out);
    clef_buf_puts(out, ",\"answers\":{");
    size_t off = 0;
    for (size_t i = 0; i < req->n_questions; i++) {
        const clef_question *q = &req->questions[i];
        if (i) clef_buf_putc(out, ',');
        put_key(q->id, q->id_len, out);
        if (q->type == CLEF_NOUL) render_noul(probs + off, out);
        else if (q->type == CLEF_CHOICE) render_choice(q, probs + off, out);
        else render_score(q, probs + off, out);
        off += q->n_options;
    }
    clef_buf_printf(out, "},\"usage\":{\"input_tokens\":%zu,\"output_tokens\":0}", rec->n_ids);
    if (debug) render_debug(req, rec, logits, out);
    clef_buf_putc(out, '}');
    free(probs);
}

void clef_render_error(const clef_err *err, clef_buf *out) {
    const char *type = err->type ? err->type : CLEF_E_INTERNAL;
    clef_buf_puts(out, "{\"error\":{\"message\":");
    json_render_string(err->message, strlen(err->message), out);
    clef_buf_puts(out, ",\"type\":");
    json_render_string(type, strlen(type), out);
    clef_buf_puts(out, ",\"param\":");
    if (err->param[0])
        json_render_string(err->param, strlen(err->param), out);
    else
        clef_buf_puts(out, "null");
    clef_buf_puts(out, "}}");
}
