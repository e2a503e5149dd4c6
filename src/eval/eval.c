/* eval.c — the rows of the Decision Index kit through the engine's scheduler,
 * into the kit's results.jsonl.  See eval.h.
 *
 * Threads: the calling thread reads and parses rows, skips the ones an
 * earlier run answered, hands the others to a window of `in_flight` slots and
 * writes their result lines in row order; `in_flight` worker threads take
 * slots in order and do what a server connection thread does (parse,
 * encode, submit to the scheduler and wait, render, check); the scheduler's
 * engine thread packs whatever records wait into one forward.
 */
#include "eval/eval.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "engine/scheduler.h"
#include "eval/check.h"
#include "eval/lines.h"
#include "json/json.h"
#include "util/timer.h"

enum { ST_OK, ST_UNSUPPORTED, ST_ERROR };
static const char *const STATUS_NAME[] = {"ok", "unsupported", "error"};

/* ---- small helpers ---------------------------------------------------- */

void clef_eval_utc_now(char *out, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char day[24];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, cap, "%s.%06ld+00:00", day, ts.tv_nsec / 1000);
}

int clef_eval_make_dir(const char *dir, clef_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "--out %.200s...: path too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "--out %s: cannot create %s: %s", dir, path, strerror(errno));
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "--out %s: %s is not a directory", dir, path);
        *p = c;
        if (!c) return 0;
    }
}

/* write(2) all of it; 0 or -1 with errno. */
static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

int clef_eval_write_file(const char *out_dir, const char *name, const char *text, size_t len, clef_err *err) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot write %s: %s", tmp, strerror(errno));
    int bad = write_all(fd, text, len);
    int e = errno;
    if (close(fd) != 0 && !bad) bad = 1, e = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, e = errno;
    if (bad) {
        unlink(tmp);
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

int clef_eval_write_status(const char *out_dir, const clef_eval_progress *p, clef_err *err) {
    char now[48];
    clef_eval_utc_now(now, sizeof now);
    clef_buf b = {0};
    clef_buf_printf(&b, "{\"time\":\"%s\",\"event\":", now);
    json_render_string(p->event, strlen(p->event), &b);
    clef_buf_printf(&b,
                    ",\"engine\":\"%s\",\"completed\":%zu,\"total\":%zu,\"counts\":{\"ok\":%zu,\"unsupported\":%zu,"
                    "\"error\":%zu},\"skipped\":%zu,\"answered\":%zu,\"violations\":%zu,\"unreadable_results\":%zu,"
                    "\"elapsed_seconds\":%.1f,\"rows_per_s\":%.3f,\"eta_seconds\":",
                    CLEF_EVAL_ENGINE_NAME, p->skipped + p->answered, p->total, p->ok, p->unsupported, p->error,
                    p->skipped, p->answered, p->violations, p->unreadable_results, p->elapsed_s, p->rows_per_s);
    if (p->eta_s >= 0)
        clef_buf_printf(&b, "%.1f", p->eta_s);
    else
        clef_buf_puts(&b, "null");
    clef_buf_printf(&b, ",\"batches\":%zu,\"mean_batch_records\":%.2f,\"mean_batch_tokens\":%.1f", p->batches,
                    p->batches ? (double)p->batch_records / (double)p->batches : 0.0,
                    p->batches ? (double)p->batch_tokens / (double)p->batches : 0.0);
    if (p->failure) {
        clef_buf_puts(&b, ",\"error\":");
        json_render_string(p->failure, strlen(p->failure), &b);
    }
    clef_buf_puts(&b, "}\n");
    int rc = clef_eval_write_file(out_dir, "status.json", b.data, b.len, err);
    clef_buf_free(&b);
    return rc;
}

/* ---- earlier results (resume) ------------------------------------------ */

typedef struct prev_result {
    char *key; /* json_render of the run_id */
    size_t seq; /* line order: the last line of a run_id wins */
    int status; /* ST_* (ST_ERROR for any status but ok / unsupported) */
} prev_result;

typedef struct prev_set {
    prev_result *v;
    size_t n, cap;
    size_t unreadable;
} prev_set;

static int prev_cmp(const void *a, const void *b) {
    const prev_result *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

/* Cut a last line without its newline (a run killed while writing) off
 * `path`; 0 or -1 + err.  A missing file is fine. */
static int repair_tail(const char *path, clef_err *err) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = -1;
    off_t end = rc ? 0 : st.st_size, keep = 0;
    char last = '\n';
    if (!rc && end > 0 && pread(fd, &last, 1, end - 1) != 1) rc = -1;
    if (!rc && end > 0 && last != '\n') {
        char blk[65536];
        for (off_t at = end; at > 0 && !keep;) {
            size_t n = at > (off_t)sizeof blk ? sizeof blk : (size_t)at;
            at -= (off_t)n;
            if (pread(fd, blk, n, at) != (ssize_t)n) {
                rc = -1;
                break;
            }
            for (size_t i = n; i-- > 0;)
                if (blk[i] == '\n') {
                    keep = at + (off_t)i + 1;
                    break;
                }
        }
        if (!rc && ftruncate(fd, keep) != 0) rc = -1;
        if (!rc)
            fprintf(stderr, "clef eval: %s: cut its last line, %lld bytes without a newline (an interrupted write)\n",
                    path, (long long)(end - keep));
    }
    if (rc) clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot repair %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* Read the earlier results of `path` into `ps` (sorted by key, one entry per
 * run_id: its last line).  0, or -1 + err. */
static int load_previous(const char *path, prev_set *ps, clef_err *err) {
    if (repair_tail(path, err)) return -1;
    if (access(path, F_OK) != 0) return 0;
    clef_lines *lr = clef_lines_open(path, 0, err);
    if (!lr) return -1;
    clef_buf line = {0};
    size_t no = 0;
    int rc;
    while ((rc = clef_lines_next(lr, &line, &no, NULL, err)) == 1) {
        size_t i = 0;
        while (i < line.len && (line.data[i] == ' ' || line.data[i] == '\t')) i++;
        if (i == line.len) continue;
        clef_err perr;
        json_value *v = json_parse(line.data, line.len, &perr);
        const json_value *rid = v && v->type == JSON_OBJECT ? json_get(v, "run_id") : NULL;
        const json_value *st = v && v->type == JSON_OBJECT ? json_get(v, "status") : NULL;
        if (!rid || !st || st->type != JSON_STRING) {
            ps->unreadable++;
        } else {
            clef_buf key = {0};
            json_render(rid, &key);
            if (ps->n == ps->cap) {
                ps->cap = ps->cap ? 2 * ps->cap : 1024;
                ps->v = clef_xrealloc(ps->v, ps->cap * sizeof *ps->v);
            }
            int s = !strcmp(st->str, "ok") ? ST_OK : !strcmp(st->str, "unsupported") ? ST_UNSUPPORTED : ST_ERROR;
            ps->v[ps->n++] = (prev_result){key.data, no, s};
        }
        json_free(v);
    }
    clef_buf_free(&line);
    clef_lines_close(lr);
    if (rc < 0) return -1;
    qsort(ps->v, ps->n, sizeof *ps->v, prev_cmp);
    size_t w = 0; /* keep the last (highest seq) entry of each key */
    for (size_t i = 0; i < ps->n; i++) {
        if (i + 1 < ps->n && !strcmp(ps->v[i].key, ps->v[i + 1].key)) {
            free(ps->v[i].key);
            continue;
        }
        ps->v[w++] = ps->v[i];
    }
    ps->n = w;
    return 0;
}

static const prev_result *prev_find(const prev_set *ps, const char *key) {
    size_t lo = 0, hi = ps->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ps->v[mid].key, key);
        if (!c) return &ps->v[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static void prev_free(prev_set *ps) {
    for (size_t i = 0; i < ps->n; i++) free(ps->v[i].key);
    free(ps->v);
}

/* ---- one row ------------------------------------------------------------ */

enum { SLOT_FREE, SLOT_QUEUED, SLOT_TAKEN, SLOT_DONE };

typedef struct slot {
    int state;
    size_t line;        /* 1-based line in ROWS */
    json_value *row;    /* the parsed row (owned), or NULL with row_err */
    clef_err row_err;   /* why the row could not be read (row == NULL) */
    clef_buf out;       /* the result line, "\n" included */
    int status;         /* ST_* */
    int violation;      /* the answer failed the kit's checks */
} slot;

typedef struct run {
    clef_engine *engine;
    clef_scheduler *sched;
    const clef_eval_options *o;
    const char *model_name;
    slot *slots;
    size_t n_slots;
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    size_t take, tail; /* next sequence number to take / to fill */
    int quit;
    pthread_mutex_t stats_lock;
    size_t batches, batch_records, batch_tokens;
} run;

static void on_batch(void *ctx, size_t n_records, size_t n_tokens, double seconds) {
    run *r = ctx;
    pthread_mutex_lock(&r->stats_lock);
    r->batches++;
    r->batch_records += n_records;
    r->batch_tokens += n_tokens;
    pthread_mutex_unlock(&r->stats_lock);
}

/* Keys the result line writes itself: an `_evaluation` field of the same
 * name is left out (the kit's runner overwrites them too). */
static int reserved_key(const char *k, size_t n) {
    static const char *const names[] = {"line", "engine", "started_utc", "completed_utc", "total_wall_ms",
                                        "model_request_wall_ms", "status", "response", "error"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i]) == n && !memcmp(names[i], k, n)) return 1;
    return 0;
}

static void render_error_object(const clef_err *e, clef_buf *out) {
    const char *type = e->type ? e->type : CLEF_E_INTERNAL;
    clef_buf_puts(out, "{\"message\":");
    json_render_string(e->message, strlen(e->message), out);
    clef_buf_puts(out, ",\"type\":");
    json_render_string(type, strlen(type), out);
    clef_buf_puts(out, ",\"param\":");
    if (e->param[0])
        json_render_string(e->param, strlen(e->param), out);
    else
        clef_buf_puts(out, "null");
    clef_buf_putc(out, '}');
}

/* The request the kit's HTTP engine would send for `row`:
 * {"model","state","questions"} (a field the row lacks is left out, so the
 * engine's own message names it). */
static void request_body(const json_value *row, const char *model, clef_buf *body) {
    clef_buf_puts(body, "{\"model\":");
    json_render_string(model, strlen(model), body);
    const json_value *state = json_get(row, "state"), *questions = json_get(row, "questions");
    if (state) {
        clef_buf_puts(body, ",\"state\":");
        json_render_opts(state, 0, body);
    }
    if (questions) {
        clef_buf_puts(body, ",\"questions\":");
        json_render_opts(questions, 0, body);
    }
    clef_buf_putc(body, '}');
}

/* Answer one row into sl->out / sl->status (a worker thread). */
static void answer_row(run *r, slot *sl) {
    char started[48], completed[48];
    clef_eval_utc_now(started, sizeof started);
    double t0 = clef_now(), model_ms = 0.0;
    clef_err err;
    clef_err_clear(&err);
    clef_buf resp = {0};
    int status = ST_ERROR, failed = 0;
    const json_value *row = sl->row, *ev = row ? json_get(row, "_evaluation") : NULL;
    if (!row) {
        err = sl->row_err;
        failed = 1;
    } else if (!ev || ev->type != JSON_OBJECT || !json_get(ev, "run_id")) {
        clef_fail(&err, 400, CLEF_E_REQUEST, ev && ev->type == JSON_OBJECT ? "_evaluation.run_id" : "_evaluation",
                  "%s", !ev ? "the row has no _evaluation object"
                        : ev->type != JSON_OBJECT ? "the row's _evaluation is not an object"
                                                 : "the row's _evaluation has no run_id");
        failed = 1;
    }
    if (!failed) {
        clef_buf body = {0};
        request_body(row, r->model_name, &body);
        clef_request req;
        clef_job job = {0};
        clef_decide_params params = {.truncate_state = r->o->truncate_state ? 1 : 0};
        failed = clef_engine_parse(r->engine, body.data, body.len, &req, &err) != 0;
        clef_buf_free(&body);
        if (!failed) failed = clef_engine_encode(r->engine, &req, &params, &job, &err) != 0;
        if (!failed) {
            double t1 = clef_now();
            failed = clef_scheduler_submit(r->sched, &job, &err) != 0;
            model_ms = (clef_now() - t1) * 1e3;
        }
        if (!failed) {
            clef_engine_render(&job, &resp);
            clef_err perr;
            json_value *parsed = json_parse(resp.data, resp.len, &perr);
            if (!parsed) {
                clef_fail(&err, 500, CLEF_E_INVALID_RESPONSE, NULL, "the response is not JSON: %s", perr.message);
                failed = sl->violation = 1;
            } else if (clef_eval_check_response(json_get(row, "questions"), parsed, &err) != 0) {
                failed = sl->violation = 1;
            }
            json_free(parsed);
        }
        clef_job_free(&job);
        status = failed ? (sl->violation ? ST_ERROR : clef_eval_unsupported(&err) ? ST_UNSUPPORTED : ST_ERROR) : ST_OK;
    }
    double total_ms = (clef_now() - t0) * 1e3;
    clef_eval_utc_now(completed, sizeof completed);

    clef_buf *o = &sl->out;
    o->len = 0;
    clef_buf_putc(o, '{');
    if (ev && ev->type == JSON_OBJECT)
        for (size_t i = 0; i < ev->n; i++) {
            if (reserved_key(ev->keys[i], ev->key_lens[i])) continue;
            json_render_string(ev->keys[i], ev->key_lens[i], o);
            clef_buf_putc(o, ':');
            json_render_opts(ev->items[i], 0, o);
            clef_buf_putc(o, ',');
        }
    clef_buf_printf(o,
                    "\"line\":%zu,\"engine\":\"%s\",\"started_utc\":\"%s\",\"completed_utc\":\"%s\","
                    "\"total_wall_ms\":%.3f,\"model_request_wall_ms\":%.3f,\"status\":\"%s\",",
                    sl->line, CLEF_EVAL_ENGINE_NAME, started, completed, total_ms, model_ms, STATUS_NAME[status]);
    if (status == ST_OK) {
        clef_buf_puts(o, "\"response\":");
        clef_buf_append(o, resp.data, resp.len);
    } else {
        clef_buf_puts(o, "\"error\":");
        render_error_object(&err, o);
    }
    clef_buf_puts(o, "}\n");
    clef_buf_free(&resp);
    sl->status = status;
}

static void *worker(void *arg) {
    run *r = arg;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (r->take == r->tail && !r->quit) pthread_cond_wait(&r->work, &r->lock);
        if (r->take == r->tail) break; /* quit, nothing left */
        slot *sl = &r->slots[r->take++ % r->n_slots];
        sl->state = SLOT_TAKEN;
        pthread_mutex_unlock(&r->lock);
        answer_row(r, sl);
        pthread_mutex_lock(&r->lock);
        sl->state = SLOT_DONE;
        pthread_cond_broadcast(&r->done);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* ---- the run -------------------------------------------------------------- */

/* 1 if the line is only JSON whitespace (skipped, as the kit skips it). */
static int blank(const clef_buf *line) {
    for (size_t i = 0; i < line->len; i++)
        if (!strchr(" \t\r\n", line->data[i])) return 0;
    return 1;
}

/* Non-blank lines of ROWS (a row over the limit counts); stops at a read
 * error, which the answering pass then reports. */
static size_t count_rows(const char *path, size_t max_row) {
    clef_err err;
    clef_lines *lr = clef_lines_open(path, max_row, &err);
    if (!lr) return 0;
    clef_buf line = {0};
    size_t n = 0, too_long;
    int rc;
    while ((rc = clef_lines_next(lr, &line, NULL, &too_long, &err)) > 0) n += rc == 2 || !blank(&line);
    clef_buf_free(&line);
    clef_lines_close(lr);
    return n;
}

typedef struct tally {
    clef_eval_progress p;
    double t0, last_status;
} tally;

static void refresh(run *r, tally *t) {
    clef_eval_progress *p = &t->p;
    p->elapsed_s = clef_now() - t->t0;
    p->rows_per_s = p->elapsed_s > 0 ? (double)p->answered / p->elapsed_s : 0.0;
    size_t left = p->total > p->skipped + p->answered ? p->total - p->skipped - p->answered : 0;
    p->eta_s = left == 0 ? 0.0 : p->rows_per_s > 0 ? (double)left / p->rows_per_s : -1.0;
    pthread_mutex_lock(&r->stats_lock);
    p->batches = r->batches, p->batch_records = r->batch_records, p->batch_tokens = r->batch_tokens;
    pthread_mutex_unlock(&r->stats_lock);
}

static void count_status(clef_eval_progress *p, int status) {
    if (status == ST_OK) p->ok++;
    else if (status == ST_UNSUPPORTED) p->unsupported++;
    else p->error++;
}

/* Read the next row into a new slot (or count it as skipped).  Returns 1 a
 * slot was queued, 2 a row was skipped or blank, 0 end of input, -1 + err. */
static int next_row(run *r, clef_lines *lr, clef_buf *line, const prev_set *ps, tally *t, clef_err *err) {
    size_t no = 0, too_long = 0;
    int rc = clef_lines_next(lr, line, &no, &too_long, err);
    if (rc <= 0) return rc;
    if (rc == 1 && blank(line)) return 2;
    json_value *row = NULL;
    clef_err row_err;
    clef_err_clear(&row_err);
    if (rc == 2) {
        clef_fail(&row_err, 413, CLEF_E_TOO_LARGE, NULL, "the row is %zu bytes, more than the limit of %zu bytes (--max-row-mb)",
                  too_long, r->o->max_row_bytes ? r->o->max_row_bytes : CLEF_EVAL_DEFAULT_MAX_ROW_BYTES);
    } else if (!(row = json_parse(line->data, line->len, &row_err))) {
        /* row_err: invalid JSON at byte N ... */
    } else if (row->type != JSON_OBJECT) {
        json_free(row);
        row = NULL;
        clef_fail(&row_err, 400, CLEF_E_REQUEST, NULL, "the row must be a JSON object");
    }
    const json_value *ev = row ? json_get(row, "_evaluation") : NULL;
    const json_value *rid = ev && ev->type == JSON_OBJECT ? json_get(ev, "run_id") : NULL;
    if (rid && ps->n) {
        clef_buf key = {0};
        json_render(rid, &key);
        const prev_result *pr = prev_find(ps, key.data);
        clef_buf_free(&key);
        if (pr && pr->status != ST_ERROR) {
            t->p.skipped++;
            count_status(&t->p, pr->status);
            json_free(row);
            return 2;
        }
    }
    pthread_mutex_lock(&r->lock);
    slot *sl = &r->slots[r->tail % r->n_slots];
    sl->state = SLOT_QUEUED;
    sl->line = no;
    sl->row = row;
    sl->row_err = row_err;
    sl->violation = 0;
    r->tail++;
    pthread_cond_signal(&r->work);
    pthread_mutex_unlock(&r->lock);
    return 1;
}

int clef_eval_run(clef_engine *e, const clef_eval_options *o, clef_eval_progress *final, clef_err *err) {
    clef_err_clear(err);
    if (clef_eval_make_dir(o->out_dir, err)) return -1;
    char results[4200];
    snprintf(results, sizeof results, "%s/results.jsonl", o->out_dir);
    size_t max_row = o->max_row_bytes ? o->max_row_bytes : CLEF_EVAL_DEFAULT_MAX_ROW_BYTES;
    clef_lines *lr = clef_lines_open(o->rows_path, max_row, err);
    if (!lr) return -1;
    prev_set ps = {0};
    if (load_previous(results, &ps, err)) {
        clef_lines_close(lr);
        prev_free(&ps);
        return -1;
    }
    int fd = open(results, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot write %s: %s", results, strerror(errno));
        clef_lines_close(lr);
        prev_free(&ps);
        return -1;
    }
    run r = {.engine = e, .o = o, .model_name = o->model_name ? o->model_name : CLEF_EVAL_DEFAULT_MODEL_NAME};
    r.n_slots = o->in_flight ? o->in_flight : CLEF_EVAL_DEFAULT_IN_FLIGHT;
    r.slots = clef_xcalloc(r.n_slots, sizeof *r.slots);
    pthread_mutex_init(&r.lock, NULL);
    pthread_mutex_init(&r.stats_lock, NULL);
    pthread_cond_init(&r.work, NULL);
    pthread_cond_init(&r.done, NULL);
    tally t = {.p = {.event = "progress", .eta_s = -1}};
    t.p.total = count_rows(o->rows_path, max_row);
    t.p.unreadable_results = ps.unreadable;

    clef_scheduler_options so = {.max_queue = r.n_slots + 16, .max_batch_tokens = o->max_batch_tokens,
                                 .on_batch = on_batch, .ctx = &r};
    r.sched = clef_scheduler_start(e, &so, err);
    pthread_t *threads = clef_xcalloc(r.n_slots, sizeof *threads);
    size_t n_threads = 0;
    int rc = r.sched ? 0 : -1;
    for (; rc == 0 && n_threads < r.n_slots; n_threads++)
        if (pthread_create(&threads[n_threads], NULL, worker, &r) != 0) {
            rc = clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot start worker thread %zu: %s", n_threads,
                           strerror(errno));
            break;
        }

    t.t0 = clef_now();
    t.last_status = t.t0;
    double status_every = o->status_every_s > 0 ? o->status_every_s : 1.0;
    clef_buf line = {0};
    size_t head = 0; /* sequence number of the next result to write */
    int eof = rc != 0;
    clef_err read_err;
    clef_err_clear(&read_err);
    for (;;) {
        /* fill the window; after a read error, what is in flight is still
         * answered and written before the run fails */
        while (!eof && r.tail - head < r.n_slots) {
            int k = next_row(&r, lr, &line, &ps, &t, &read_err);
            if (k <= 0) eof = 1;
            if (k < 0) rc = -1;
        }
        if (head == r.tail) break;
        slot *sl = &r.slots[head % r.n_slots];
        pthread_mutex_lock(&r.lock);
        while (sl->state != SLOT_DONE) pthread_cond_wait(&r.done, &r.lock);
        pthread_mutex_unlock(&r.lock);
        if (fd >= 0 && write_all(fd, sl->out.data, sl->out.len) != 0) {
            int we = errno;
            if (rc == 0) clef_fail(&read_err, 500, CLEF_E_INTERNAL, NULL, "cannot write %s: %s", results, strerror(we));
            rc = -1;
            close(fd);
            fd = -1;
            eof = 1;
        }
        if (fd >= 0) {
            t.p.answered++;
            count_status(&t.p, sl->status);
            t.p.violations += (size_t)sl->violation;
        }
        json_free(sl->row);
        sl->row = NULL;
        sl->state = SLOT_FREE;
        head++;
        refresh(&r, &t);
        if (o->on_progress) o->on_progress(o->ctx, &t.p);
        if (clef_now() - t.last_status >= status_every) {
            clef_err serr;
            clef_eval_write_status(o->out_dir, &t.p, &serr); /* best effort while running */
            t.last_status = clef_now();
        }
    }
    if (rc != 0 && read_err.status && !err->status) *err = read_err;

    pthread_mutex_lock(&r.lock);
    r.quit = 1;
    pthread_cond_broadcast(&r.work);
    pthread_mutex_unlock(&r.lock);
    for (size_t i = 0; i < n_threads; i++) pthread_join(threads[i], NULL);
    free(threads);
    clef_scheduler_free(r.sched);
    if (fd >= 0 && (fsync(fd) != 0 && errno != EINVAL)) {
        if (rc == 0) clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot write %s: %s", results, strerror(errno));
        rc = -1;
    }
    if (fd >= 0) close(fd);

    refresh(&r, &t);
    t.p.event = rc == 0 ? "complete" : "failed";
    t.p.failure = rc == 0 ? NULL : err->message;
    clef_err serr;
    if (clef_eval_write_status(o->out_dir, &t.p, &serr) != 0 && rc == 0) {
        *err = serr;
        rc = -1;
        t.p.event = "failed";
        t.p.failure = err->message;
    }
    if (o->on_progress) o->on_progress(o->ctx, &t.p);
    if (final) *final = t.p;

    for (size_t i = 0; i < r.n_slots; i++) {
        json_free(r.slots[i].row);
        clef_buf_free(&r.slots[i].out);
    }
    free(r.slots);
    clef_buf_free(&line);
    pthread_mutex_destroy(&r.lock);
    pthread_mutex_destroy(&r.stats_lock);
    pthread_cond_destroy(&r.work);
    pthread_cond_destroy(&r.done);
    clef_lines_close(lr);
    prev_free(&ps);
    return rc;
}
