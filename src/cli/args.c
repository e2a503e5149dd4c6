#include "cli/args.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/placement.h"
#include "engine/state_cache.h"
#include "util/buf.h"

int arg_str(int argc, char **argv, int *i, const char *name, const char **out) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *out = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "clef: %s needs a value\n", name);
        return -1;
    }
    *out = argv[++*i];
    return 1;
}

int arg_numerics(int argc, char **argv, int *i, const char *name, clef_numerics *out) {
    const char *v;
    int r = arg_str(argc, argv, i, name, &v);
    if (r <= 0) return r;
    if (clef_numerics_parse(v, out) != 0) {
        fprintf(stderr, "clef: %s must be fast, balanced or precise (got '%.40s')\n", name, v);
        return -1;
    }
    return 1;
}

int arg_towers(int argc, char **argv, int *i, int *out) {
    const char *v;
    int r = arg_str(argc, argv, i, "--towers", &v);
    if (r <= 0) return r;
    if (!strcmp(v, "cpu")) *out = CLEF_TOWERS_CPU;
    else if (!strcmp(v, "gpu")) *out = CLEF_TOWERS_GPU;
    else {
        fprintf(stderr, "clef: --towers must be cpu or gpu (got '%.40s')\n", v);
        return -1;
    }
    return 1;
}

int cli_check_placement(const char *cmd, const char *device, size_t gpu_memory, int towers, size_t tokens,
                        const char *tokens_flag) {
    if (gpu_memory && tokens > CLEF_PLACE_MAX_TOKENS) {
        fprintf(stderr, "%s: %s is at most %zu with --gpu-memory (got %zu)\n", cmd, tokens_flag,
                (size_t)CLEF_PLACE_MAX_TOKENS, tokens);
        return 2;
    }
    clef_err err;
    clef_err_clear(&err);
    if (clef_engine_check_placement(device, gpu_memory, towers, 0, &err)) {
        fprintf(stderr, "%s: %s\n", cmd, err.message);
        return 2;
    }
    return 0;
}

int arg_size(int argc, char **argv, int *i, const char *name, size_t *out) {
    const char *v;
    int r = arg_str(argc, argv, i, name, &v);
    if (r <= 0) return r;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || v[0] == '+') {
        fprintf(stderr, "clef: %s wants a non-negative integer, got '%s'\n", name, v);
        return -1;
    }
    *out = (size_t)x;
    return 1;
}

int arg_bytes(int argc, char **argv, int *i, const char *name, size_t *out) {
    const char *v;
    int r = arg_str(argc, argv, i, name, &v);
    if (r <= 0) return r;
    clef_err err;
    clef_err_clear(&err);
    if (clef_parse_size(name, v, out, &err) != 0) {
        fprintf(stderr, "clef: %s\n", err.message);
        return -1;
    }
    return 1;
}

char *read_all(const char *path, size_t *len) { return read_all_max(path, SIZE_MAX, len); }

char *read_all_max(const char *path, size_t max_bytes, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "clef: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    const char *name = f == stdin ? "stdin" : path;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (uintmax_t)st.st_size > max_bytes) {
        fprintf(stderr, "clef: %s is %jd bytes, more than the limit of %zu bytes\n", name, (intmax_t)st.st_size, max_bytes);
        if (f != stdin) fclose(f);
        return NULL;
    }
    clef_buf b = {0};
    char chunk[65536];
    size_t n;
    int too_big = 0;
    errno = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n > max_bytes - b.len) {
            too_big = 1;
            break;
        }
        clef_buf_append(&b, chunk, n);
    }
    int bad = ferror(f), e = errno; /* EISDIR for a directory */
    if (f != stdin) fclose(f);
    if (too_big || bad) {
        if (too_big)
            fprintf(stderr, "clef: %s is more than the limit of %zu bytes\n", name, max_bytes);
        else
            fprintf(stderr, "clef: error reading %s: %s\n", name, e ? strerror(e) : "read error");
        clef_buf_free(&b);
        return NULL;
    }
    clef_buf_reserve(&b, 0);
    *len = b.len;
    return b.data;
}

/* Directory of the running binary (from /proc/self/exe) into out[0..cap);
 * 0, or -1 when it cannot be read. */
static int exe_dir(char *out, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1) return -1;
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) return -1;
    *slash = '\0';
    return 0;
}

const char *cli_default_tokenizer(const char *cmd) {
    static char tried[4][4200]; /* the one found is returned */
    char dir[4096];
    int n = 0;
    snprintf(tried[n++], sizeof tried[0], "%s", CLI_DEFAULT_TOKENIZER);
    if (exe_dir(dir, sizeof dir) == 0) {
        snprintf(tried[n++], sizeof tried[0], "%s/../" CLI_DEFAULT_TOKENIZER, dir);  /* build/clef in a checkout */
        snprintf(tried[n++], sizeof tried[0], "%s/../" CLI_INSTALLED_TOKENIZER, dir); /* PREFIX/bin/clef */
    }
#ifdef CLEF_SOURCE_DIR
    snprintf(tried[n++], sizeof tried[0], "%s", CLEF_SOURCE_DIR "/" CLI_DEFAULT_TOKENIZER);
#endif
    for (int i = 0; i < n; i++)
        if (access(tried[i], R_OK) == 0) return tried[i];
    fprintf(stderr, "%s: --synthetic needs a tokenizer.json, and the default one (the tiny fixture's) is in none of:\n",
            cmd);
    for (int i = 0; i < n; i++) fprintf(stderr, "  %s\n", tried[i]);
    fprintf(stderr, "%s: give --tokenizer PATH (e.g. a checkpoint's tokenizer.json)\n", cmd);
    return NULL;
}

/* --out must be missing or an empty directory, unless `force` (then any
 * directory).  Returns 0, or 2 with the reason printed: not a directory, not
 * empty, or not listable (its emptiness unknown). */
int cli_check_out_dir(const char *cmd, const char *dir, int force) {
    struct stat st;
    if (stat(dir, &st) != 0) return 0; /* missing: the converter creates it (or says why it cannot) */
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: --out %s exists and is not a directory\n", cmd, dir);
        return 2;
    }
    if (force) return 0;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "%s: cannot list --out %s (%s); add --force to write into it anyway\n", cmd, dir,
                strerror(errno));
        return 2;
    }
    const struct dirent *de;
    while ((de = readdir(d)) && (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")))
        ;
    int empty = !de;
    closedir(d);
    if (!empty) {
        fprintf(stderr,
                "%s: --out %s is not empty; give a new or empty directory, or add --force to write "
                "into it (files of the same names are replaced)\n",
                cmd, dir);
        return 2;
    }
    return 0;
}
