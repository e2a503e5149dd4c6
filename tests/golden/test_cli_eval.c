/* test_cli_eval.c — `clef eval` end to end on the tiny fixture:
 *   - rows covering ok / unsupported / error get exactly their statuses and
 *     error objects, with the _evaluation fields first and in order, blank
 *     lines skipped, fields of the row other than state/questions unseen;
 *     environment.json and status.json say what ran and how it ended;
 *   - every ok response is byte for byte what `clef decide` prints for the
 *     same request (so its probabilities are decide's);
 *   - a resumed run after a kill (a truncated last line): ok and unsupported
 *     rows are kept, not recomputed (their lines stay byte-identical even
 *     when the row's state changed), error rows are answered again, the cut
 *     line is repaired and answered again;
 *   - the same rows gzipped give the same results; a truncated gzip stream
 *     answers the rows before the damage, then fails with exit 1;
 *   - bad command lines exit 2 before any model is loaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "testutil.h"
#include "util/buf.h"

#define MODEL CLEF_FIXTURES "/tiny-clef-omni"

static char tmpdir[64];

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/clef-eval-test-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run `clef <args>` (at most 300 s) with stdout+stderr into `out`. */
static int run_clef(const char *args, clef_buf *out) {
    char full[8192];
    snprintf(full, sizeof full, "exec 2>&1; timeout 300 %s %s", CLEF_BINARY, args);
    return tu_run_cmd(full, out);
}

static char *path_in(const char *name) {
    char *p = malloc(strlen(tmpdir) + strlen(name) + 2);
    sprintf(p, "%s/%s", tmpdir, name);
    return p;
}

static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

static void write_gz(const char *path, const char *text, size_t len) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, text, (unsigned)len), (int)len);
    assert_int_equal(gzclose(f), Z_OK);
}

/* `clef eval` on the tiny model, one thread, rows -> out; returns the exit
 * status, the output in `log`. */
static int eval(const char *rows, const char *out, const char *extra, clef_buf *log) {
    char args[4096];
    snprintf(args, sizeof args, "eval --model %s --rows %s --out %s --threads 1 --in-flight 8 %s", MODEL, rows, out,
             extra ? extra : "");
    return run_clef(args, log);
}

/* The lines of a results file (each NUL-terminated, newline dropped), as
 * raw text; *n lines.  Fails when a line is not a JSON object. */
static char **result_lines(const char *path, size_t *n) {
    size_t len;
    char *text = tu_read_file(path, &len);
    char **lines = NULL;
    *n = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        assert_non_null(nl); /* every line complete */
        lines = realloc(lines, (*n + 1) * sizeof *lines);
        lines[*n] = strndup(p, (size_t)(nl - p));
        clef_err err;
        json_value *v = json_parse(lines[*n], strlen(lines[*n]), &err);
        if (!v || v->type != JSON_OBJECT) fail_msg("result line %zu is not a JSON object: %s", *n + 1, lines[*n]);
        json_free(v);
        (*n)++;
        p = nl + 1;
    }
    free(text);
    return lines;
}

static void free_lines(char **l, size_t n) {
    for (size_t i = 0; i < n; i++) free(l[i]);
    free(l);
}

/* The result line of run_id `rid` (the last one); NULL when none. */
static const char *line_of(char **lines, size_t n, const char *rid) {
    char want[160];
    snprintf(want, sizeof want, "{\"run_id\":\"%s\",", rid);
    const char *found = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strncmp(lines[i], want, strlen(want))) found = lines[i];
    return found;
}

static size_t count_of(char **lines, size_t n, const char *rid) {
    char want[160];
    snprintf(want, sizeof want, "{\"run_id\":\"%s\",", rid);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += !strncmp(lines[i], want, strlen(want));
    return k;
}

static json_value *parse_line(const char *line) {
    clef_err err;
    json_value *v = json_parse(line, strlen(line), &err);
    assert_non_null(v);
    return v;
}

static const char *str_of(const json_value *obj, const char *key) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type != JSON_STRING) fail_msg("no string '%s'", key);
    return v->str;
}

/* The raw response text of an ok line: everything after "response": but the line's closing brace. */
static char *response_text(const char *line) {
    const char *p = strstr(line, ",\"status\":\"ok\",\"response\":");
    assert_non_null(p);
    p += strlen(",\"status\":\"ok\",\"response\":");
    size_t n = strlen(p);
    assert_true(n > 1 && p[n - 1] == '}');
    return strndup(p, n - 1);
}

/* The row's status must be `status`; for a refusal its error type and message. */
static void expect_status(char **lines, size_t n, const char *rid, const char *status, const char *type,
                          const char *message) {
    const char *l = line_of(lines, n, rid);
    if (!l) fail_msg("no result for %s", rid);
    json_value *v = parse_line(l);
    if (strcmp(str_of(v, "status"), status)) fail_msg("%s: status %s, want %s: %s", rid, str_of(v, "status"), status, l);
    const json_value *err = json_get(v, "error"), *resp = json_get(v, "response");
    if (!strcmp(status, "ok")) {
        assert_null(err);
        assert_non_null(resp);
        assert_non_null(json_get(resp, "answers"));
    } else {
        assert_null(resp);
        assert_non_null(err);
        assert_string_equal(str_of(err, "type"), type);
        if (message && strcmp(str_of(err, "message"), message))
            fail_msg("%s: message '%s', want '%s'", rid, str_of(err, "message"), message);
    }
    printf("  %-13s %-11s %s\n", rid, status, err ? str_of(err, "message") : "");
    json_free(v);
}

/* ---- the rows ---------------------------------------------------------------- */

#define TRIAGE_Q                                                                                                       \
    "{\"department\":{\"type\":\"choice\",\"instructions\":\"Which team should handle the message?\","               \
    "\"criteria\":{\"billing\":\"Payments or invoices\",\"technical\":\"Bugs or outages\"}},"                         \
    "\"urgency\":{\"type\":\"score\",\"criteria\":[\"Can wait\",\"This week\",\"Today\"]},"                          \
    "\"outage\":{\"type\":\"noul\",\"instructions\":\"Is a service down?\"}}"

/* One row of each kind (13 rows on 15 lines: lines 3-4 are blank); `with_extra` adds ok-extra, a row
 * with fields the engine must not see. */
static void status_rows(clef_buf *b, int with_extra) {
    clef_buf_puts(b, "{\"state\":\"Our checkout started returning errors and orders are blocked.\",\"questions\":" TRIAGE_Q
                     ",\"_evaluation\":{\"run_id\":\"ok-triage\",\"dataset\":\"D\",\"group_id\":7,\"engine\":\"theirs\"}}\n");
    clef_buf_puts(b, "{\"state\":{\"ticket\":{\"subject\":\"refund\",\"body\":\"charged twice\"},\"tier\":2},\"questions\":"
                     "{\"team\":{\"type\":\"choice\",\"criteria\":{\"sales\":\"Plans\",\"billing\":\"Money\",\"abuse\":\"Fraud\"}}},"
                     "\"_evaluation\":{\"run_id\":\"ok-object\"}}\n");
    clef_buf_puts(b, "\n   \n");
    /* what the engine must not see: model, truncate_state, images, expected, metadata */
    if (with_extra)
        clef_buf_puts(b, "{\"model\":\"other\",\"truncate_state\":true,\"images\":[\"not a data url\"],\"expected\":{\"q\":true},"
                         "\"metadata\":{\"x\":1},\"state\":\"Is the sky blue?\",\"questions\":{\"q\":{\"type\":\"noul\"}},"
                         "\"_evaluation\":{\"run_id\":\"ok-extra\"}}\n");
    clef_buf_puts(b, "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"choice\",\"criteria\":{");
    for (int i = 0; i < 256; i++) clef_buf_printf(b, "%s\"o%d\":\"d\"", i ? "," : "", i);
    clef_buf_puts(b, "}}},\"_evaluation\":{\"run_id\":\"cap-options\"}}\n");
    clef_buf_puts(b, "{\"state\":\"");
    for (int i = 0; i < 70000; i++) clef_buf_puts(b, "word ");
    clef_buf_puts(b, "\",\"questions\":{\"q\":{\"type\":\"noul\"}},\"_evaluation\":{\"run_id\":\"cap-length\"}}\n");
    clef_buf_puts(b, "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"score\",\"criteria\":[\"only\"]}},"
                     "\"_evaluation\":{\"run_id\":\"cap-levels\"}}\n");
    clef_buf_puts(b, "{\"state\":\"s\",\"questions\":{},\"_evaluation\":{\"run_id\":\"err-empty\"}}\n");
    clef_buf_puts(b, "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"multi\"}},\"_evaluation\":{\"run_id\":\"err-type\"}}\n");
    clef_buf_puts(b, "{\"questions\":{\"q\":{\"type\":\"noul\"}},\"_evaluation\":{\"run_id\":\"err-nostate\"}}\n");
    clef_buf_puts(b, "{\"state\": \"s\", \"questions\": {oops}\n");
    clef_buf_puts(b, "[1,2]\n");
    clef_buf_puts(b, "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"noul\"}}}\n");
    clef_buf_puts(b, "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"noul\"}},\"_evaluation\":{\"dataset\":\"D\"}}\n");
}

/* The result of the row on line `line_no` (rows without a run_id are named by their line). */
static const char *no_id_line(char **lines, size_t n, int line_no) {
    char want[48];
    snprintf(want, sizeof want, "\"line\":%d,\"engine\":", line_no);
    for (size_t i = 0; i < n; i++)
        if (strstr(lines[i], want)) return lines[i];
    return NULL;
}

static void check_status_results(const char *out, size_t want_lines) {
    char *results = path_in(out), *rp = malloc(strlen(results) + 20);
    sprintf(rp, "%s/results.jsonl", results);
    size_t n;
    char **lines = result_lines(rp, &n);
    assert_int_equal(n, want_lines);
    expect_status(lines, n, "ok-triage", "ok", NULL, NULL);
    expect_status(lines, n, "ok-object", "ok", NULL, NULL);
    expect_status(lines, n, "ok-extra", "ok", NULL, NULL);
    expect_status(lines, n, "cap-options", "unsupported", "capacity_exceeded",
                  "q: 256 options per choice exceed the limit of 255");
    expect_status(lines, n, "cap-length", "unsupported", "capacity_exceeded", NULL);
    assert_non_null(strstr(line_of(lines, n, "cap-length"), "maximum context length: record requires more than "));
    expect_status(lines, n, "cap-levels", "unsupported", "invalid_request",
                  "q: score criteria need at least 2 levels (got 1, below the minimum of 2 options per choice)");
    expect_status(lines, n, "err-empty", "error", "invalid_request", "at least one question is required");
    expect_status(lines, n, "err-type", "error", "invalid_request", "q: type must be noul, choice, or score");
    expect_status(lines, n, "err-nostate", "error", "invalid_request", "model and state are required");
    /* rows without a run_id: named by their line */
    const char *bad_json = no_id_line(lines, n, 12), *not_obj = no_id_line(lines, n, 13),
               *no_ev = no_id_line(lines, n, 14), *no_rid = no_id_line(lines, n, 15);
    assert_non_null(bad_json);
    assert_non_null(not_obj);
    assert_non_null(no_ev);
    assert_non_null(no_rid);
    assert_non_null(strstr(bad_json, "\"status\":\"error\",\"error\":{\"message\":\"invalid JSON at byte 29: expecting property name enclosed in double quotes, found 'o'\",\"type\":\"invalid_json\",\"param\":null}"));
    assert_non_null(strstr(not_obj, "\"error\":{\"message\":\"the row must be a JSON object\",\"type\":\"invalid_request\",\"param\":null}"));
    assert_non_null(strstr(no_ev, "\"error\":{\"message\":\"the row has no _evaluation object\",\"type\":\"invalid_request\",\"param\":\"_evaluation\"}"));
    assert_non_null(strstr(no_rid, "{\"dataset\":\"D\",\"line\":15,"));
    assert_non_null(strstr(no_rid, "\"message\":\"the row's _evaluation has no run_id\""));
    /* the _evaluation fields first, in order; its "engine" is ours; then line, engine, the times, status */
    const char *t = line_of(lines, n, "ok-triage");
    static const char head[] = "{\"run_id\":\"ok-triage\",\"dataset\":\"D\",\"group_id\":7,\"line\":1,\"engine\":\"clef\",\"started_utc\":\"";
    assert_memory_equal(t, head, sizeof head - 1);
    json_value *v = parse_line(t);
    const char *order[] = {"run_id", "dataset", "group_id", "line", "engine", "started_utc", "completed_utc",
                           "total_wall_ms", "model_request_wall_ms", "status", "response"};
    assert_int_equal(v->n, sizeof order / sizeof *order);
    for (size_t i = 0; i < v->n; i++) assert_string_equal(v->keys[i], order[i]);
    double total, model;
    assert_int_equal(json_as_double(json_get(v, "total_wall_ms"), &total), 0);
    assert_int_equal(json_as_double(json_get(v, "model_request_wall_ms"), &model), 0);
    assert_true(model > 0 && total >= model);
    assert_true(strlen(str_of(v, "started_utc")) == 32 && strstr(str_of(v, "started_utc"), "+00:00"));
    json_free(v);
    /* ok-extra: the row's model, truncate_state and images were not sent */
    assert_non_null(strstr(line_of(lines, n, "ok-extra"), "\"response\":{\"model\":\"clef-omni\",\"answers\":{\"q\":{\"type\":\"noul\",\"noul\":"));
    free_lines(lines, n);
    free(rp);
    free(results);
}

static void test_statuses(void **state) {
    clef_buf rows = {0}, log = {0};
    status_rows(&rows, 1);
    char *rp = path_in("rows.jsonl"), *out = path_in("statuses");
    write_text(rp, rows.data, rows.len);
    int rc = eval(rp, out, NULL, &log);
    printf("%s", strstr(log.data, "clef eval: complete") ? strstr(log.data, "clef eval: complete") : log.data);
    assert_int_equal(rc, 0);
    check_status_results("statuses", 13);
    /* status.json: the last event, counts of every row */
    char *sp = malloc(strlen(out) + 20);
    sprintf(sp, "%s/status.json", out);
    char *st = tu_read_file(sp, NULL);
    clef_err err;
    json_value *s = json_parse(st, strlen(st), &err);
    assert_non_null(s);
    assert_string_equal(str_of(s, "event"), "complete");
    const json_value *c = json_get(s, "counts");
    int64_t ok, uns, er, total, completed;
    json_as_i64(json_get(c, "ok"), &ok), json_as_i64(json_get(c, "unsupported"), &uns), json_as_i64(json_get(c, "error"), &er);
    json_as_i64(json_get(s, "total"), &total), json_as_i64(json_get(s, "completed"), &completed);
    assert_int_equal(ok, 3);
    assert_int_equal(uns, 3);
    assert_int_equal(er, 7);
    assert_int_equal(total, 13);
    assert_int_equal(completed, 13);
    json_free(s);
    free(st);
    /* environment.json: what ran */
    sprintf(sp, "%s/environment.json", out);
    char *en = tu_read_file(sp, NULL);
    json_value *e = json_parse(en, strlen(en), &err);
    assert_non_null(e);
    assert_string_equal(str_of(e, "engine"), "clef");
    assert_non_null(strstr(str_of(e, "model"), "/tests/fixtures/tiny-clef-omni"));
    assert_string_equal(str_of(e, "format"), "bf16");
    assert_string_equal(str_of(e, "device"), "cpu");
    assert_string_equal(str_of(e, "numerics"), "f32");
    assert_non_null(json_get(json_get(e, "build"), "compiler"));
    /* the state cache's bound (the default, 2 GiB, on; the CPU reads a cached prefix) and no GPU budget */
    const json_value *eo = json_get(e, "engine_options");
    double cache_bytes;
    assert_int_equal(json_as_double(json_get(eo, "state_cache_bytes"), &cache_bytes), 0);
    assert_true(cache_bytes == 2147483648.0);
    assert_int_equal(json_get(eo, "state_cache_off")->type, JSON_NULL);
    assert_int_equal(json_get(eo, "gpu_memory_bytes")->type, JSON_NULL);
    assert_int_equal(json_get(eo, "placement")->type, JSON_NULL);
    assert_int_equal(json_get(eo, "towers")->type, JSON_NULL); /* no --towers: the device's */
    double load;
    assert_int_equal(json_as_double(json_get(e, "loaded_seconds"), &load), 0);
    assert_true(load > 0);
    json_free(e);
    free(en);
    free(sp);
    clef_buf_free(&rows);
    clef_buf_free(&log);
    free(rp);
    free(out);
}

/* Every ok response of the statuses run is what `clef decide` prints for
 * {"model":"clef-omni","state","questions"} of its row. */
static void test_ok_equals_decide(void **state) {
    char *rp = path_in("statuses/results.jsonl");
    size_t n;
    char **lines = result_lines(rp, &n);
    const char *reqs[][2] = {
        {"ok-triage", "{\"model\":\"clef-omni\",\"state\":\"Our checkout started returning errors and orders are blocked.\",\"questions\":" TRIAGE_Q "}"},
        {"ok-object", "{\"model\":\"clef-omni\",\"state\":{\"ticket\":{\"subject\":\"refund\",\"body\":\"charged twice\"},\"tier\":2},"
                      "\"questions\":{\"team\":{\"type\":\"choice\",\"criteria\":{\"sales\":\"Plans\",\"billing\":\"Money\",\"abuse\":\"Fraud\"}}}}"},
        {"ok-extra", "{\"model\":\"clef-omni\",\"state\":\"Is the sky blue?\",\"questions\":{\"q\":{\"type\":\"noul\"}}}"},
    };
    char *req = path_in("req.json");
    for (size_t k = 0; k < 3; k++) {
        write_text(req, reqs[k][1], strlen(reqs[k][1]));
        char args[1024];
        snprintf(args, sizeof args, "decide --model %s --threads 1 %s 2>/dev/null", MODEL, req);
        clef_buf out = {0};
        char full[2048];
        snprintf(full, sizeof full, "timeout 120 %s %s", CLEF_BINARY, args);
        assert_int_equal(tu_run_cmd(full, &out), 0);
        while (out.len && out.data[out.len - 1] == '\n') out.data[--out.len] = '\0';
        char *got = response_text(line_of(lines, n, reqs[k][0]));
        if (strcmp(got, out.data)) fail_msg("%s: eval answered\n%s\ndecide printed\n%s", reqs[k][0], got, out.data);
        printf("  %s = decide: %.100s...\n", reqs[k][0], got);
        /* and the probabilities are a real distribution (not a copied constant) */
        assert_non_null(strstr(got, "\"usage\":{\"input_tokens\":"));
        free(got);
        clef_buf_free(&out);
    }
    free(req);
    free_lines(lines, n);
    free(rp);
}

/* Kill-equivalent: the last line cut mid-way; rows changed so a recomputed
 * ok row would show, and an error row fixed so its retry succeeds. */
static void test_resume(void **state) {
    char *rp = path_in("resume.jsonl"), *out = path_in("resume"), *res = path_in("resume/results.jsonl");
    const char *first =
        "{\"state\":\"The invoice is wrong.\",\"questions\":{\"q\":{\"type\":\"noul\"}},\"_evaluation\":{\"run_id\":\"ok-1\"}}\n"
        "{\"state\":\"Login fails.\",\"questions\":" TRIAGE_Q ",\"_evaluation\":{\"run_id\":\"ok-2\"}}\n"
        "{\"state\":\"s\",\"questions\":{},\"_evaluation\":{\"run_id\":\"err-fix\"}}\n"
        "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"multi\"}},\"_evaluation\":{\"run_id\":\"err-keep\"}}\n"
        "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"score\",\"criteria\":[\"x\"]}},\"_evaluation\":{\"run_id\":\"unsup\"}}\n";
    write_text(rp, first, strlen(first));
    clef_buf log = {0};
    assert_int_equal(eval(rp, out, "--quiet", &log), 0);
    size_t len1;
    char *r1 = tu_read_file(res, &len1);
    size_t n;
    char **lines = result_lines(res, &n);
    assert_int_equal(n, 5);
    expect_status(lines, n, "ok-1", "ok", NULL, NULL);
    expect_status(lines, n, "err-fix", "error", "invalid_request", "at least one question is required");
    expect_status(lines, n, "unsup", "unsupported", "invalid_request", NULL);
    free_lines(lines, n);
    /* the kill: the last line (unsup's) cut 20 bytes before its end */
    assert_int_equal(truncate(res, (off_t)len1 - 20), 0);
    size_t keep = (size_t)(strrchr(r1, '\n') - r1); /* end of line 4 ... */
    while (keep && r1[keep - 1] != '\n') keep--;    /* ... start of line 5 */

    /* the second run: ok-1's state changed (a recomputation would answer differently), err-fix fixed */
    const char *second =
        "{\"state\":\"Something else entirely, with many more words than before.\",\"questions\":{\"q\":{\"type\":\"noul\"}},\"_evaluation\":{\"run_id\":\"ok-1\"}}\n"
        "{\"state\":\"Login fails.\",\"questions\":" TRIAGE_Q ",\"_evaluation\":{\"run_id\":\"ok-2\"}}\n"
        "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"noul\"}},\"_evaluation\":{\"run_id\":\"err-fix\"}}\n"
        "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"multi\"}},\"_evaluation\":{\"run_id\":\"err-keep\"}}\n"
        "{\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"score\",\"criteria\":[\"x\"]}},\"_evaluation\":{\"run_id\":\"unsup\"}}\n";
    write_text(rp, second, strlen(second));
    int rc = eval(rp, out, "--quiet", &log);
    printf("%s", log.data);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(log.data, "cut its last line"));
    assert_non_null(strstr(log.data, "5 of 5 rows have a result (3 answered now, 2 kept from an earlier run)"));
    size_t len2;
    char *r2 = tu_read_file(res, &len2);
    /* the first four lines are untouched: ok-1 and ok-2 not recomputed */
    assert_true(len2 > keep);
    assert_memory_equal(r2, r1, keep);
    lines = result_lines(res, &n);
    assert_int_equal(n, 7); /* 4 kept lines + err-fix, err-keep, unsup */
    assert_int_equal(count_of(lines, n, "ok-1"), 1);
    assert_int_equal(count_of(lines, n, "ok-2"), 1);
    assert_int_equal(count_of(lines, n, "err-fix"), 2);
    assert_int_equal(count_of(lines, n, "err-keep"), 2);
    assert_int_equal(count_of(lines, n, "unsup"), 1);
    expect_status(lines, n, "err-fix", "ok", NULL, NULL); /* the last line wins */
    expect_status(lines, n, "err-keep", "error", "invalid_request", "q: type must be noul, choice, or score");
    expect_status(lines, n, "unsup", "unsupported", "invalid_request", NULL);
    free_lines(lines, n);

    /* a third run: only err-keep is answered again */
    assert_int_equal(eval(rp, out, "--quiet", &log), 0);
    assert_non_null(strstr(log.data, "5 of 5 rows have a result (1 answered now, 4 kept from an earlier run)"));
    lines = result_lines(res, &n);
    assert_int_equal(n, 8);
    assert_int_equal(count_of(lines, n, "err-keep"), 3);
    free_lines(lines, n);
    /* another model into the same DIR is refused before loading */
    char args[2048];
    snprintf(args, sizeof args, "eval --synthetic tiny --rows %s --out %s", rp, out);
    assert_int_equal(run_clef(args, &log), 2);
    assert_non_null(strstr(log.data, "holds results of model"));
    free(r1);
    free(r2);
    clef_buf_free(&log);
    free(rp);
    free(out);
    free(res);
}

static void test_gzip(void **state) {
    clef_buf rows = {0}, log = {0};
    status_rows(&rows, 1);
    char *gp = path_in("rows.jsonl.gz"), *out = path_in("gz");
    write_gz(gp, rows.data, rows.len);
    assert_int_equal(eval(gp, out, "--quiet", &log), 0);
    check_status_results("gz", 13);
    /* same answers as the plain file's run */
    char *a = path_in("gz/results.jsonl"), *b = path_in("statuses/results.jsonl");
    size_t na, nb;
    char **la = result_lines(a, &na), **lb = result_lines(b, &nb);
    assert_int_equal(na, nb);
    const char *ok_ids[] = {"ok-triage", "ok-object", "ok-extra"};
    for (int i = 0; i < 3; i++) {
        char *x = response_text(line_of(la, na, ok_ids[i])), *y = response_text(line_of(lb, nb, ok_ids[i]));
        assert_string_equal(x, y);
        free(x), free(y);
    }
    free_lines(la, na), free_lines(lb, nb);
    free(a), free(b);

    /* a truncated gzip stream: the rows before the damage are answered, then exit 1 */
    clef_buf many = {0};
    for (int i = 0; i < 20000; i++)
        clef_buf_printf(&many, "{\"state\":\"s %d\",\"questions\":{},\"_evaluation\":{\"run_id\":\"e%05d\",\"pad\":\"%08x\"}}\n",
                        i, i, i * 2654435761u);
    char *tp = path_in("trunc.jsonl.gz"), *tout = path_in("trunc");
    write_gz(tp, many.data, many.len);
    struct stat st;
    assert_int_equal(stat(tp, &st), 0);
    assert_int_equal(truncate(tp, st.st_size / 2), 0);
    int rc = eval(tp, tout, "--quiet", &log);
    printf("%s", log.data);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(log.data, "the gzip stream is truncated"));
    char *tres = path_in("trunc/results.jsonl");
    size_t nt;
    char **lt = result_lines(tres, &nt);
    printf("  %zu rows answered before the damage\n", nt);
    assert_true(nt > 1000 && nt < 20000);
    free_lines(lt, nt);
    char *sp = path_in("trunc/status.json");
    char *stj = tu_read_file(sp, NULL);
    assert_non_null(strstr(stj, "\"event\":\"failed\""));
    assert_non_null(strstr(stj, "truncated"));
    free(stj), free(sp), free(tres);
    free(tp), free(tout);
    clef_buf_free(&many);
    clef_buf_free(&rows);
    clef_buf_free(&log);
    free(gp);
    free(out);
}

static void expect_usage(const char *args, int want, const char *needle) {
    clef_buf out = {0};
    int rc = run_clef(args, &out);
    if (rc != want || !strstr(out.data, needle))
        fail_msg("`clef %s`: exit %d (want %d), output:\n%s\n(want '%s')", args, rc, want, out.data, needle);
    printf("  exit %d: %.*s\n", rc, (int)strcspn(out.data, "\n"), out.data);
    clef_buf_free(&out);
}

static void test_usage(void **state) {
    expect_usage("eval --help", 0, "usage: clef eval");
    expect_usage("--help", 0, "eval     --model DIR --rows");
    expect_usage("eval --model " MODEL " --out /tmp/x", 2, "--rows ROWS.jsonl[.gz] is required");
    expect_usage("eval --model " MODEL " --rows /nonexistent.jsonl --out /tmp/x", 2,
                 "--rows /nonexistent.jsonl: No such file or directory");
    expect_usage("eval --model " MODEL " --rows /tmp --out /tmp/x", 2, "--rows /tmp is a directory");
    expect_usage("eval --model " MODEL " --rows /etc/hostname --out /etc/hostname", 2,
                 "--out /etc/hostname exists and is not a directory");
    expect_usage("eval --model " MODEL " --synthetic tiny --rows /etc/hostname --out /tmp/x", 2,
                 "give --model DIR or --synthetic P, not both");
    expect_usage("eval --model " MODEL " --rows /etc/hostname --out /tmp/x --in-flight 0", 2, "--in-flight wants 1..4096");
    expect_usage("eval --model " MODEL " --rows /etc/hostname --out /tmp/x --threads 100000", 2, "--threads 100000 is more");
    expect_usage("eval --model " MODEL " --rows /etc/hostname --out /tmp/x --bogus", 2, "unknown argument --bogus");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_statuses),
        cmocka_unit_test(test_ok_equals_decide), /* reads test_statuses' results */
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_gzip), /* compares with test_statuses' results */
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
