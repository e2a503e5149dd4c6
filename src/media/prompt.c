#include "media/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "media/melspec.h"

int clef_media_tokens_resolve(const clef_tokenizer *tok, clef_media_tokens *out, clef_err *err) {
    static const char *const names[7] = {"<|image_pad|>",    "<|video_pad|>",  "<|audio_pad|>", "<|vision_start|>",
                                         "<|vision_end|>", "<|audio_start|>", "<|audio_end|>"};
    int32_t *dst[7] = {&out->image_pad,    &out->video_pad,  &out->audio_pad, &out->vision_start,
                       &out->vision_end, &out->audio_start, &out->audio_end};
    for (int i = 0; i < 7; i++) {
        *dst[i] = clef_token_id(tok, names[i]);
        if (*dst[i] < 0) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "tokenizer has no %s token", names[i]);
    }
    return 0;
}

static void push_n(clef_ids *out, int32_t id, size_t n) {
    for (size_t i = 0; i < n; i++) clef_ids_push(out, id);
}

/* The video pads of one video and the audio pads of its soundtrack,
 * interleaved by time as the processor's replace_multimodal_special_tokens. */
static void push_interleaved(clef_ids *out, const clef_media *m, size_t v, size_t clip, const clef_media_tokens *t) {
    const clef_grid *g = &m->video_grids[v];
    size_t per_t = (size_t)(g->h / CLEF_MERGE) * (g->w / CLEF_MERGE);
    size_t n_video = per_t * (size_t)g->t, n_audio = (size_t)m->audio_tokens[clip];
    double step = m->video_second_per_grid[v] * CLEF_POSITION_ID_PER_SECONDS;
    size_t vi = 0, ai = 0;
    while (vi < n_video && ai < n_audio) {
        if ((double)(vi / per_t) * step <= (double)ai) {
            clef_ids_push(out, t->video_pad);
            vi++;
        } else {
            clef_ids_push(out, t->audio_pad);
            ai++;
        }
    }
    push_n(out, t->video_pad, n_video - vi);
    push_n(out, t->audio_pad, n_audio - ai);
}

int clef_media_prompt_ids(const clef_tokenizer *tok, const clef_media *m, clef_ids *out, clef_err *err) {
    if (clef_media_empty(m)) return 0;
    clef_media_tokens t;
    if (clef_media_tokens_resolve(tok, &t, err)) return -1;
    clef_buf text = {0};
    for (size_t i = 0; i < m->n_images; i++) clef_buf_puts(&text, CLEF_IMAGE_PH);
    for (size_t i = 0; i < m->n_audio; i++) clef_buf_puts(&text, CLEF_AUDIO_PH);
    for (size_t i = 0; i < m->n_videos; i++) clef_buf_puts(&text, CLEF_VIDEO_PH);
    clef_ids ph = {0};
    int rc = clef_tokenize(tok, text.data, text.len, &ph, err);
    clef_buf_free(&text);
    if (rc) return -1;
    size_t image = 0, audio = 0, video = 0;
    for (size_t k = 0; k < ph.n; k++) {
        int32_t id = ph.v[k];
        if (id == t.image_pad && image < m->n_images) {
            push_n(out, t.image_pad, clef_media_image_tokens(m, image++));
        } else if (id == t.audio_pad && audio < m->n_audio) {
            push_n(out, t.audio_pad, (size_t)m->audio_tokens[audio++]);
        } else if (id == t.video_pad && video < m->n_videos) {
            if (m->use_audio_in_video) {
                clef_ids_push(out, t.audio_start);
                push_interleaved(out, m, video, m->n_audio + video, &t);
                clef_ids_push(out, t.audio_end);
            } else {
                push_n(out, t.video_pad, clef_media_video_tokens(m, video));
            }
            video++;
        } else {
            clef_ids_push(out, id);
        }
    }
    clef_ids_free(&ph);
    if (image != m->n_images || audio != m->n_audio || video != m->n_videos)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "media placeholders did not tokenize to their pad tokens");
    return 0;
}

/* ---- get_rope_index ------------------------------------------------------ */

typedef struct rope_writer {
    int32_t *pos;
    size_t n, at;     /* tokens written */
    int64_t last_max; /* largest position of the most recent run */
    int have_run;
    int overflow;
} rope_writer;

static void put(rope_writer *w, int64_t p0, int64_t p1, int64_t p2) {
    if (w->at >= w->n) {
        w->overflow = 1;
        return;
    }
    w->pos[w->at] = (int32_t)p0;
    w->pos[w->n + w->at] = (int32_t)p1;
    w->pos[2 * w->n + w->at] = (int32_t)p2;
    w->at++;
}

static int64_t next_start(const rope_writer *w) { return w->have_run ? w->last_max + 1 : 0; }

/* A run of `len` text-like tokens s, s+1, ... on all three axes. */
static void run_linear(rope_writer *w, int64_t s, size_t len) {
    if (len == 0) return;
    for (size_t i = 0; i < len; i++) put(w, s + (int64_t)i, s + (int64_t)i, s + (int64_t)i);
    w->last_max = s + (int64_t)len - 1;
    w->have_run = 1;
}

/* Position of token k of a vision grid starting at s (get_llm_pos_ids_for_vision). */
static void vision_pos(const clef_grid *g, double t_step, int64_t s, size_t k, int64_t p[3]) {
    size_t lh = (size_t)(g->h / CLEF_MERGE), lw = (size_t)(g->w / CLEF_MERGE);
    size_t t = k / (lh * lw), r = (k / lw) % lh, c = k % lw;
    p[0] = s + (int64_t)((double)t * t_step);
    p[1] = s + (int64_t)r;
    p[2] = s + (int64_t)c;
}

static size_t grid_tokens(const clef_grid *g) { return (size_t)g->t * (g->h / CLEF_MERGE) * (g->w / CLEF_MERGE); }

/* A whole image/video grid as one run. */
static void run_vision(rope_writer *w, const clef_grid *g, double t_step, int64_t s) {
    size_t n = grid_tokens(g);
    int64_t mx = s;
    for (size_t k = 0; k < n; k++) {
        int64_t p[3];
        vision_pos(g, t_step, s, k, p);
        put(w, p[0], p[1], p[2]);
        for (int a = 0; a < 3; a++)
            if (p[a] > mx) mx = p[a];
    }
    if (n) {
        w->last_max = mx;
        w->have_run = 1;
    }
}

/* Audio in video: each interleaved token is its own run, then the leftover
 * of the longer stream as one run. */
static void run_audio_in_video(rope_writer *w, const clef_grid *g, double t_step, size_t n_audio, int64_t s) {
    size_t n_video = grid_tokens(g), vi = 0, ai = 0;
    while (vi < n_video && ai < n_audio) {
        int64_t p[3];
        vision_pos(g, t_step, s, vi, p);
        if (p[0] <= s + (int64_t)ai) {
            put(w, p[0], p[1], p[2]);
            w->last_max = p[0] > p[1] ? (p[0] > p[2] ? p[0] : p[2]) : (p[1] > p[2] ? p[1] : p[2]);
            vi++;
        } else {
            put(w, s + (int64_t)ai, s + (int64_t)ai, s + (int64_t)ai);
            w->last_max = s + (int64_t)ai;
            ai++;
        }
        w->have_run = 1;
    }
    if (vi < n_video) {
        int64_t mx = INT64_MIN;
        for (; vi < n_video; vi++) {
            int64_t p[3];
            vision_pos(g, t_step, s, vi, p);
            put(w, p[0], p[1], p[2]);
            for (int a = 0; a < 3; a++)
                if (p[a] > mx) mx = p[a];
        }
        w->last_max = mx;
        w->have_run = 1;
    }
    if (ai < n_audio) run_linear(w, s + (int64_t)ai, n_audio - ai);
}

static size_t index_from(const int32_t *ids, size_t n, int32_t id, size_t from) {
    for (size_t i = from; i < n; i++)
        if (ids[i] == id) return i;
    return (size_t)-1;
}

static int contains(const int32_t *ids, size_t n, int32_t id) { return index_from(ids, n, id, 0) != (size_t)-1; }

/* Pads and <|audio_start|> outside the media block would make the reference
 * miscount media (token/feature mismatch or an out-of-range audio index). */
static int check_stray_markers(const int32_t *ids, size_t n, size_t ms, size_t ml, const clef_media_tokens *t,
                               clef_err *err) {
    for (size_t i = 0; i < n; i++) {
        if (i >= ms && i < ms + ml) continue;
        int32_t id = ids[i];
        if (id == t->image_pad || id == t->video_pad || id == t->audio_pad || id == t->audio_start)
            return clef_fail(err, 422, CLEF_E_REQUEST, NULL,
                             "the text contains a media marker token (id %d) at position %zu; markers such as "
                             "<|image_pad|>, <|video_pad|>, <|audio_pad|> and <|audio_start|> cannot appear in the "
                             "state or schema of a request with media",
                             (int)id, i);
    }
    return 0;
}

int clef_media_positions(const int32_t *ids, size_t n, size_t media_start, size_t media_len, const clef_media *m,
                         const clef_media_tokens *t, int32_t *pos, clef_err *err) {
    if (!clef_media_empty(m) && check_stray_markers(ids, n, media_start, media_len, t, err)) return -1;
    rope_writer w = {pos, n, 0, 0, 0, 0};
    int aiv = m->use_audio_in_video;
    size_t image_nums = 0, video_nums = 0, audio_nums = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == t->audio_start) audio_nums++;
        if (ids[i] == t->vision_start && i + 1 < n) {
            int32_t nx = ids[i + 1];
            if (nx == t->image_pad) image_nums++;
            if (aiv ? nx == t->audio_start : nx == t->video_pad) video_nums++;
        }
    }
    size_t mm_nums = aiv ? image_nums + audio_nums : image_nums + video_nums + audio_nums;
    size_t remain_images = image_nums, remain_videos = video_nums, remain_audios = audio_nums;
    size_t image_idx = 0, video_idx = 0, audio_idx = 0, st = 0;
    int has_vision_pad = contains(ids, n, t->image_pad) || contains(ids, n, t->video_pad);
    int has_audio_pad = contains(ids, n, t->audio_pad);
    for (size_t it = 0; it < mm_nums; it++) {
        int64_t st_idx = next_start(&w);
        size_t ed_v = n + 1, ed_a = n + 1;
        if (has_vision_pad && (remain_videos > 0 || remain_images > 0)) ed_v = index_from(ids, n, t->vision_start, st);
        if (has_audio_pad && remain_audios > 0) ed_a = index_from(ids, n, t->audio_start, st);
        if (ed_v == (size_t)-1 || ed_a == (size_t)-1) goto mismatch;
        size_t min_ed = ed_v < ed_a ? ed_v : ed_a;
        if (min_ed > n) goto mismatch;
        size_t text_len = min_ed - st;
        run_linear(&w, st_idx, text_len);
        st_idx += (int64_t)text_len;
        int both = min_ed == ed_v && ed_v + 1 == ed_a;
        size_t bos = both ? 2 : 1, eos = bos;
        run_linear(&w, st_idx, bos);
        st_idx += (int64_t)bos;
        if (min_ed == ed_a) {
            if (audio_idx >= m->n_clips) goto mismatch;
            size_t len = (size_t)m->audio_tokens[audio_idx++];
            run_linear(&w, st_idx, len);
            st += text_len + bos + len + eos;
            remain_audios--;
        } else if (min_ed + 1 < n && ids[min_ed + 1] == t->image_pad) {
            if (image_idx >= m->n_images) goto mismatch;
            const clef_grid *g = &m->image_grids[image_idx++];
            run_vision(&w, g, (double)CLEF_POSITION_ID_PER_SECONDS, st_idx);
            st += text_len + bos + grid_tokens(g) + eos;
            remain_images--;
        } else if (min_ed + 1 < n && ids[min_ed + 1] == t->video_pad) {
            if (video_idx >= m->n_videos) goto mismatch;
            const clef_grid *g = &m->video_grids[video_idx];
            run_vision(&w, g, m->video_second_per_grid[video_idx] * CLEF_POSITION_ID_PER_SECONDS, st_idx);
            video_idx++;
            st += text_len + bos + grid_tokens(g) + eos;
            remain_videos--;
        } else if (both) {
            if (video_idx >= m->n_videos || audio_idx >= m->n_clips) goto mismatch;
            const clef_grid *g = &m->video_grids[video_idx];
            size_t n_audio = (size_t)m->audio_tokens[audio_idx++];
            run_audio_in_video(&w, g, m->video_second_per_grid[video_idx] * CLEF_POSITION_ID_PER_SECONDS, n_audio,
                               st_idx);
            video_idx++;
            st += text_len + bos + n_audio + grid_tokens(g) + eos;
            remain_videos--;
            remain_audios--;
        } else {
            goto mismatch;
        }
        run_linear(&w, next_start(&w), eos);
    }
    if (st < n) run_linear(&w, next_start(&w), n - st);
    if (w.overflow || w.at != n) goto mismatch;
    return 0;
mismatch:
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "media block does not match the decoded media");
}
