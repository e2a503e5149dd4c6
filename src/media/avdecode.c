#include "media/avdecode.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>

#include "media/image.h"
#include "util/buf.h"

/* Demuxers we accept; everything else (hls, concat, image2, ...) is refused
 * before probing can reach it. */
#define CLEF_AV_FORMATS "wav,w64,matroska,webm,mov,mp4,m4a,3gp,3g2,mj2,ogg,mp3,flac,aac,aiff,avi"
#define CLEF_AV_IO_BUF 32768
#define CLEF_MAX_DECODED_FRAMES 20000

static pthread_once_t av_once = PTHREAD_ONCE_INIT;
/* A library should not write FFmpeg's diagnostics to the server's stderr;
 * failures are reported through clef_err instead. */
static void av_quiet(void) { av_log_set_level(AV_LOG_QUIET); }

/* ---- container in memory ------------------------------------------------- */

typedef struct mem_reader {
    const uint8_t *data;
    size_t size, pos;
} mem_reader;

static int mem_read(void *opaque, uint8_t *buf, int n) {
    mem_reader *r = opaque;
    size_t left = r->size - r->pos;
    if (left == 0) return AVERROR_EOF;
    if ((size_t)n > left) n = (int)left;
    memcpy(buf, r->data + r->pos, (size_t)n);
    r->pos += (size_t)n;
    return n;
}

static int64_t mem_seek(void *opaque, int64_t off, int whence) {
    mem_reader *r = opaque;
    int64_t base;
    switch (whence & ~AVSEEK_FORCE) {
    case AVSEEK_SIZE: return (int64_t)r->size;
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)r->pos; break;
    case SEEK_END: base = (int64_t)r->size; break;
    default: return AVERROR(EINVAL);
    }
    if (off > (int64_t)r->size - base || base + off < 0) return AVERROR(EINVAL);
    r->pos = (size_t)(base + off);
    return (int64_t)r->pos;
}

typedef struct av_input {
    mem_reader reader;
    AVIOContext *io;
    AVFormatContext *fmt;
} av_input;

static void av_input_close(av_input *in) {
    if (in->fmt) avformat_close_input(&in->fmt);
    if (in->io) {
        av_freep(&in->io->buffer);
        avio_context_free(&in->io);
    }
}

/* Open `data` as a container: the headers (avformat_open_input), then,
 * unless `headers_only`, the stream-info pass that may decode a few packets. */
static int av_input_open_as(av_input *in, const uint8_t *data, size_t size, int headers_only, char *why,
                            size_t why_len) {
    pthread_once(&av_once, av_quiet);
    memset(in, 0, sizeof *in);
    if (size == 0) {
        snprintf(why, why_len, "payload is empty");
        return -1;
    }
    in->reader = (mem_reader){data, size, 0};
    uint8_t *buf = av_malloc(CLEF_AV_IO_BUF);
    in->fmt = avformat_alloc_context();
    if (buf) in->io = avio_alloc_context(buf, CLEF_AV_IO_BUF, 0, &in->reader, mem_read, NULL, mem_seek);
    if (!buf || !in->fmt || !in->io) {
        if (!in->io) av_free(buf);
        av_input_close(in);
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    in->fmt->pb = in->io;
    in->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
    AVDictionary *opts = NULL;
    av_dict_set(&opts, "format_whitelist", CLEF_AV_FORMATS, 0);
    av_dict_set(&opts, "protocol_whitelist", "none", 0);
    int rc = avformat_open_input(&in->fmt, NULL, NULL, &opts);
    av_dict_free(&opts);
    if (rc < 0) { /* fmt was freed by avformat_open_input */
        in->fmt = NULL;
        av_input_close(in);
        snprintf(why, why_len, "not a supported audio/video container");
        return -1;
    }
    if (headers_only) return 0;
    if (avformat_find_stream_info(in->fmt, NULL) < 0) {
        av_input_close(in);
        snprintf(why, why_len, "unreadable container (no stream information)");
        return -1;
    }
    return 0;
}

static int av_input_open(av_input *in, const uint8_t *data, size_t size, char *why, size_t why_len) {
    return av_input_open_as(in, data, size, 0, why, why_len);
}

/* PyAV's container.streams.<kind>[0]: the first stream of that kind. */
static int first_stream(const AVFormatContext *fmt, enum AVMediaType type) {
    for (unsigned i = 0; i < fmt->nb_streams; i++)
        if (fmt->streams[i]->codecpar->codec_type == type) return (int)i;
    return -1;
}

/* Seconds of stream `st` from its own header, else the container's; < 0 unknown. */
static double stream_seconds(const AVFormatContext *fmt, const AVStream *st) {
    if (st->duration > 0 && st->time_base.num > 0 && st->time_base.den > 0) return (double)st->duration * av_q2d(st->time_base);
    if (fmt->duration > 0) return (double)fmt->duration / AV_TIME_BASE;
    return -1.0;
}

int clef_av_probe(const uint8_t *data, size_t size, clef_av_header *out) {
    memset(out, 0, sizeof *out);
    out->video_seconds = out->audio_seconds = -1.0;
    av_input in;
    char why[128];
    if (av_input_open_as(&in, data, size, 1, why, sizeof why)) return -1;
    int v = first_stream(in.fmt, AVMEDIA_TYPE_VIDEO), a = first_stream(in.fmt, AVMEDIA_TYPE_AUDIO);
    if (v >= 0) {
        const AVStream *st = in.fmt->streams[v];
        out->has_video = 1;
        out->width = st->codecpar->width > 0 ? st->codecpar->width : 0;
        out->height = st->codecpar->height > 0 ? st->codecpar->height : 0;
        if (out->width && out->height && st->codecpar->format >= 0) {
            int n = av_image_get_buffer_size((enum AVPixelFormat)st->codecpar->format, out->width, out->height, 64);
            out->frame_bytes = n > 0 ? (size_t)n : 0;
        }
        out->video_seconds = stream_seconds(in.fmt, st);
    }
    if (a >= 0) {
        out->has_audio = 1;
        out->audio_seconds = stream_seconds(in.fmt, in.fmt->streams[a]);
    }
    av_input_close(&in);
    return 0;
}

/* Ask `allow` for room before the decoder keeps `held` bytes in all. */
static int allowance_cover(clef_av_allowance *allow, size_t held, char *why, size_t why_len) {
    if (!allow || held <= allow->granted) return 0;
    if (allow->grow(allow->ctx, held - allow->granted)) {
        snprintf(why, why_len, "decoded-media budget refused more memory");
        return -1;
    }
    allow->granted = held;
    return 0;
}

static AVCodecContext *open_decoder(const AVStream *st, size_t max_pixels, char *why, size_t why_len) {
    const AVCodec *codec = avcodec_find_decoder(st->codecpar->codec_id);
    if (!codec) {
        snprintf(why, why_len, "unsupported codec");
        return NULL;
    }
    AVCodecContext *ctx = avcodec_alloc_context3(codec);
    if (!ctx || avcodec_parameters_to_context(ctx, st->codecpar) < 0) {
        avcodec_free_context(&ctx);
        snprintf(why, why_len, "unsupported codec parameters");
        return NULL;
    }
    ctx->thread_count = 1;
    ctx->pkt_timebase = st->time_base;
    AVDictionary *opts = NULL;
    if (max_pixels) av_dict_set_int(&opts, "max_pixels", (int64_t)max_pixels, 0);
    int rc = avcodec_open2(ctx, codec, &opts);
    av_dict_free(&opts);
    if (rc < 0) {
        avcodec_free_context(&ctx);
        snprintf(why, why_len, "cannot open the decoder");
        return NULL;
    }
    return ctx;
}

int clef_av_has_audio(const uint8_t *data, size_t size, char *why, size_t why_len) {
    av_input in;
    if (av_input_open(&in, data, size, why, why_len)) return -1;
    int has = first_stream(in.fmt, AVMEDIA_TYPE_AUDIO) >= 0;
    av_input_close(&in);
    return has;
}

/* ---- decode loop shared by audio and video ------------------------------- */

/* Called for every decoded frame; returns 0 to go on, -1 to fail or
 * CLEF_MEDIA_OVER_LIMIT to refuse for a limit (why set either way). */
typedef int (*frame_fn)(void *user, AVFrame *frame, char *why, size_t why_len);

/* Demux `stream` of `in`, decode every packet, flush, and hand each frame to `fn`. */
static int decode_stream(av_input *in, int stream, AVCodecContext *dec, frame_fn fn, void *user, char *why,
                         size_t why_len) {
    AVPacket *pkt = av_packet_alloc();
    AVFrame *frame = av_frame_alloc();
    int rc = 0, eof = 0;
    if (!pkt || !frame) {
        snprintf(why, why_len, "out of memory");
        rc = -1;
    }
    while (rc == 0 && !eof) {
        int r = av_read_frame(in->fmt, pkt);
        if (r == AVERROR_EOF) {
            eof = 1;
            r = avcodec_send_packet(dec, NULL);
        } else if (r < 0) {
            snprintf(why, why_len, "corrupt container data");
            rc = -1;
            break;
        } else if (pkt->stream_index != stream) {
            av_packet_unref(pkt);
            continue;
        } else {
            r = avcodec_send_packet(dec, pkt);
            av_packet_unref(pkt);
        }
        if (r < 0 && r != AVERROR_EOF) {
            snprintf(why, why_len, "invalid %s data", dec->codec_type == AVMEDIA_TYPE_AUDIO ? "audio" : "video");
            rc = -1;
            break;
        }
        for (;;) {
            r = avcodec_receive_frame(dec, frame);
            if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) break;
            if (r < 0) {
                snprintf(why, why_len, "invalid %s data", dec->codec_type == AVMEDIA_TYPE_AUDIO ? "audio" : "video");
                rc = -1;
                break;
            }
            rc = fn(user, frame, why, why_len);
            av_frame_unref(frame);
            if (rc) break;
        }
    }
    av_frame_free(&frame);
    av_packet_free(&pkt);
    return rc;
}

/* ---- audio --------------------------------------------------------------- */

typedef struct audio_sink {
    SwrContext *swr;
    AVChannelLayout in_layout;
    int in_format, in_rate;
    float *buf;
    size_t n, cap, max;
    clef_av_allowance *allow;
} audio_sink;

static int audio_sink_reserve(audio_sink *s, size_t extra, char *why, size_t why_len) {
    if (s->n + extra <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 16384;
    while (cap < s->n + extra) cap *= 2;
    if (allowance_cover(s->allow, cap * sizeof(float), why, why_len)) return -1;
    float *p = realloc(s->buf, cap * sizeof *p);
    if (!p) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    s->buf = p;
    s->cap = cap;
    return 0;
}

/* Convert `in_samples` of `in` (NULL = flush) and append the output. */
static int audio_sink_convert(audio_sink *s, const uint8_t **in, int in_samples, char *why, size_t why_len) {
    int room = swr_get_out_samples(s->swr, in_samples);
    if (room < 0) {
        snprintf(why, why_len, "audio conversion failed");
        return -1;
    }
    if (room == 0) return 0;
    if (audio_sink_reserve(s, (size_t)room, why, why_len)) return -1;
    uint8_t *out = (uint8_t *)(s->buf + s->n);
    int got = swr_convert(s->swr, &out, room, in, in_samples);
    if (got < 0) {
        snprintf(why, why_len, "audio conversion failed");
        return -1;
    }
    s->n += (size_t)got;
    if (s->n > s->max) {
        snprintf(why, why_len, "audio lasts longer than %.0f s, the most the context window takes",
                 (double)s->max / CLEF_SAMPLE_RATE);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    return 0;
}

static int audio_on_frame(void *user, AVFrame *f, char *why, size_t why_len) {
    audio_sink *s = user;
    if (f->nb_samples <= 0) return 0;
    if (f->sample_rate <= 0 || f->ch_layout.nb_channels <= 0) {
        snprintf(why, why_len, "invalid audio data");
        return -1;
    }
    if (!s->swr) {
        AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
        if (av_channel_layout_copy(&s->in_layout, &f->ch_layout) < 0 ||
            swr_alloc_set_opts2(&s->swr, &mono, AV_SAMPLE_FMT_FLT, CLEF_SAMPLE_RATE, &f->ch_layout, f->format,
                                f->sample_rate, 0, NULL) < 0 ||
            swr_init(s->swr) < 0) {
            snprintf(why, why_len, "unsupported audio layout");
            return -1;
        }
        s->in_format = f->format;
        s->in_rate = f->sample_rate;
    } else if (f->format != s->in_format || f->sample_rate != s->in_rate ||
               av_channel_layout_compare(&f->ch_layout, &s->in_layout) != 0) {
        /* PyAV's resampler refuses a frame that does not match its setup. */
        snprintf(why, why_len, "audio format changes mid-stream");
        return -1;
    }
    return audio_sink_convert(s, (const uint8_t **)f->extended_data, f->nb_samples, why, why_len);
}

int clef_av_decode_audio(const uint8_t *data, size_t size, double max_seconds, clef_av_allowance *allow,
                         float **samples, size_t *n_samples, char *why, size_t why_len) {
    *samples = NULL;
    *n_samples = 0;
    av_input in;
    if (av_input_open(&in, data, size, why, why_len)) return -1;
    int stream = first_stream(in.fmt, AVMEDIA_TYPE_AUDIO);
    if (stream < 0) {
        av_input_close(&in);
        snprintf(why, why_len, "no audio stream");
        return -1;
    }
    AVCodecContext *dec = open_decoder(in.fmt->streams[stream], 0, why, why_len);
    if (!dec) {
        av_input_close(&in);
        return -1;
    }
    audio_sink sink = {0};
    sink.max = (size_t)(max_seconds * CLEF_SAMPLE_RATE);
    sink.allow = allow;
    int rc = decode_stream(&in, stream, dec, audio_on_frame, &sink, why, why_len);
    if (rc == 0 && sink.swr) rc = audio_sink_convert(&sink, NULL, 0, why, why_len);
    if (rc == 0 && sink.n == 0) {
        snprintf(why, why_len, "audio has no samples");
        rc = -1;
    }
    swr_free(&sink.swr);
    av_channel_layout_uninit(&sink.in_layout);
    avcodec_free_context(&dec);
    av_input_close(&in);
    if (rc) {
        free(sink.buf);
        return rc;
    }
    *samples = sink.buf;
    *n_samples = sink.n;
    return 0;
}

/* ---- video --------------------------------------------------------------- */

void clef_video_frame_size(int32_t w, int32_t h, int32_t *ow, int32_t *oh) {
    *ow = w;
    *oh = h;
    if ((int64_t)w * h <= CLEF_VIDEO_FRAME_MAX_PIXELS) return;
    double s = sqrt((double)CLEF_VIDEO_FRAME_MAX_PIXELS / ((double)w * (double)h));
    double rw = rint(w * s / 2.0) * 2.0, rh = rint(h * s / 2.0) * 2.0; /* Python round: half to even */
    *ow = rw < 2 ? 2 : (int32_t)rw;
    *oh = rh < 2 ? 2 : (int32_t)rh;
}

typedef struct video_sink {
    AVRational tb;
    double max_seconds;
    size_t max_pixels;
    size_t decoded;
    struct SwsContext *sws;
    clef_rgb *frames;
    size_t n, cap;
    size_t held; /* bytes of the kept frames and their array */
    clef_av_allowance *allow;
} video_sink;

/* PyAV's frame.time: float(Fraction(pts) * time_base), i.e. pts*num/den
 * correctly rounded. */
static double frame_time(int64_t pts, AVRational tb) {
    if (tb.den == 0) return NAN;
    __int128 num = (__int128)pts * tb.num;
    if (num >= ((__int128)1 << 53) || num <= -((__int128)1 << 53)) return (double)pts * av_q2d(tb);
    return (double)(int64_t)num / (double)tb.den;
}

/* to_ndarray(format="rgb24", width, height): swscale with PyAV's default
 * bilinear interpolation; a plain copy when already rgb24 at that size. */
static int frame_to_rgb(video_sink *s, const AVFrame *f, clef_rgb *out, char *why, size_t why_len) {
    int32_t ow, oh;
    clef_video_frame_size(f->width, f->height, &ow, &oh);
    out->w = ow;
    out->h = oh;
    out->data = malloc((size_t)ow * oh * 3);
    if (!out->data) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    if (f->format == AV_PIX_FMT_RGB24 && ow == f->width && oh == f->height) {
        for (int32_t y = 0; y < oh; y++)
            memcpy(out->data + (size_t)y * ow * 3, f->data[0] + (ptrdiff_t)y * f->linesize[0], (size_t)ow * 3);
        return 0;
    }
    s->sws = sws_getCachedContext(s->sws, f->width, f->height, f->format, ow, oh, AV_PIX_FMT_RGB24, SWS_BILINEAR,
                                  NULL, NULL, NULL);
    uint8_t *dst[4] = {out->data, NULL, NULL, NULL};
    int dst_stride[4] = {ow * 3, 0, 0, 0};
    if (!s->sws || sws_scale(s->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, dst, dst_stride) !=
                       oh) {
        clef_rgb_free(out);
        snprintf(why, why_len, "unsupported pixel format");
        return -1;
    }
    return 0;
}

static int video_on_frame(void *user, AVFrame *f, char *why, size_t why_len) {
    video_sink *s = user;
    if (++s->decoded > CLEF_MAX_DECODED_FRAMES) {
        snprintf(why, why_len, "video has more than %d frames, the most the context window takes",
                 CLEF_MAX_DECODED_FRAMES);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    if (f->width <= 0 || f->height <= 0) {
        snprintf(why, why_len, "video frame is %dx%d", f->width, f->height);
        return -1;
    }
    if ((uint64_t)f->width * (uint64_t)f->height > s->max_pixels) {
        snprintf(why, why_len, "video frame is %dx%d = %llu pixels; the canvas holds at most %zu pixels", f->width,
                 f->height, (unsigned long long)f->width * (unsigned long long)f->height, s->max_pixels);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    int64_t pts = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
    if (pts == AV_NOPTS_VALUE) {
        snprintf(why, why_len, "video frame without a timestamp");
        return -1;
    }
    double t = frame_time(pts, s->tb);
    if (!(t <= s->max_seconds)) {
        snprintf(why, why_len, "video lasts longer than %.0f s, the most the context window takes", s->max_seconds);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    if (!(t + 1e-6 >= (double)s->n / 2.0)) return 0; /* 2 fps by timestamp */
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        if (allowance_cover(s->allow, s->held + (cap - s->cap) * sizeof(clef_rgb), why, why_len)) return -1;
        s->held += (cap - s->cap) * sizeof(clef_rgb);
        clef_rgb *p = realloc(s->frames, cap * sizeof *p);
        if (!p) {
            snprintf(why, why_len, "out of memory");
            return -1;
        }
        s->frames = p;
        s->cap = cap;
    }
    clef_rgb *out = &s->frames[s->n];
    int32_t ow, oh;
    clef_video_frame_size(f->width, f->height, &ow, &oh);
    if (allowance_cover(s->allow, s->held + (size_t)ow * oh * 3, why, why_len)) return -1;
    s->held += (size_t)ow * oh * 3;
    if (frame_to_rgb(s, f, out, why, why_len)) return -1;
    s->n++;
    if (out->w != s->frames[0].w || out->h != s->frames[0].h) {
        snprintf(why, why_len, "video frame size changes mid-stream");
        return -1;
    }
    return 0;
}

int clef_av_decode_video(const uint8_t *data, size_t size, double max_seconds, size_t max_pixels,
                         clef_av_allowance *allow, clef_rgb **frames, size_t *n_frames, char *why, size_t why_len) {
    *frames = NULL;
    *n_frames = 0;
    av_input in;
    if (av_input_open(&in, data, size, why, why_len)) return -1;
    int stream = first_stream(in.fmt, AVMEDIA_TYPE_VIDEO);
    if (stream < 0) {
        av_input_close(&in);
        snprintf(why, why_len, "no video stream");
        return -1;
    }
    int pw = in.fmt->streams[stream]->codecpar->width, ph = in.fmt->streams[stream]->codecpar->height;
    if ((uint64_t)(pw > 0 ? pw : 0) * (uint64_t)(ph > 0 ? ph : 0) > max_pixels) {
        av_input_close(&in);
        snprintf(why, why_len, "video is %dx%d = %llu pixels a frame; the canvas holds at most %zu pixels", pw, ph,
                 (unsigned long long)pw * (unsigned long long)ph, max_pixels);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    AVCodecContext *dec = open_decoder(in.fmt->streams[stream], max_pixels, why, why_len);
    if (!dec) {
        av_input_close(&in);
        return -1;
    }
    video_sink sink = {0};
    sink.tb = in.fmt->streams[stream]->time_base;
    sink.max_seconds = max_seconds;
    sink.max_pixels = max_pixels;
    sink.allow = allow;
    int rc = decode_stream(&in, stream, dec, video_on_frame, &sink, why, why_len);
    if (rc == 0 && sink.n == 0) {
        snprintf(why, why_len, "video has no frames");
        rc = -1;
    }
    sws_freeContext(sink.sws);
    avcodec_free_context(&dec);
    av_input_close(&in);
    if (rc) {
        for (size_t i = 0; i < sink.n; i++) clef_rgb_free(&sink.frames[i]);
        free(sink.frames);
        return rc;
    }
    *frames = sink.frames;
    *n_frames = sink.n;
    return 0;
}
