#include "media/melspec.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <fftw3.h>

#include "media/media.h"
#include "util/buf.h"

#define N_MELS CLEF_MEL_BINS
#define PAD (CLEF_N_FFT / 2)

/* Slaney mel scale (librosa / transformers "slaney"). */
static double hz_to_mel(double f) {
    const double min_log_hz = 1000.0, min_log_mel = 15.0, logstep = 27.0 / log(6.4);
    return f >= min_log_hz ? min_log_mel + log(f / min_log_hz) * logstep : 3.0 * f / 200.0;
}

static double mel_to_hz(double m) {
    const double min_log_hz = 1000.0, min_log_mel = 15.0, logstep = log(6.4) / 27.0;
    return m >= min_log_mel ? min_log_hz * exp(logstep * (m - min_log_mel)) : 200.0 * m / 3.0;
}

void clef_mel_filters(double *F) {
    double f[N_MELS + 2];
    double m0 = hz_to_mel(0.0), m1 = hz_to_mel(CLEF_SAMPLE_RATE / 2);
    double step = (m1 - m0) / (N_MELS + 1); /* np.linspace: i*step + start, last = stop */
    for (int i = 0; i < N_MELS + 2; i++) f[i] = mel_to_hz(i == N_MELS + 1 ? m1 : i * step + m0);
    for (int b = 0; b < CLEF_N_FREQ; b++) {
        double nu = 40.0 * b; /* linspace(0, 8000, 201) */
        for (int k = 0; k < N_MELS; k++) {
            double down = -(f[k] - nu) / (f[k + 1] - f[k]);
            double up = (f[k + 2] - nu) / (f[k + 2] - f[k + 1]);
            double w = down < up ? down : up;
            if (w < 0) w = 0;
            F[b * N_MELS + k] = w * (2.0 / (f[k + 2] - f[k]));
        }
    }
}

int32_t clef_audio_frames(size_t l, size_t l_max) {
    size_t a = (l + CLEF_HOP - 1) / CLEF_HOP, b = l_max / CLEF_HOP;
    return (int32_t)(a < b ? a : b);
}

static int32_t conv_len(int32_t x) { return (x + 1) / 2; } /* ceil(x/2) for x >= 0 */

int32_t clef_audio_tokens(int32_t m) { return 13 * (m / 100) + conv_len(conv_len(conv_len(m % 100))); }

/* FFTW's planner is not thread-safe; execution is. */
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

/* Sample i of the reflect-padded, zero-extended clip (the STFT's input). */
static inline float padded_at(const float *x, size_t len, size_t l_max, int64_t i) {
    int64_t j = i - PAD;
    if (j < 0) j = -j;
    else if (j >= (int64_t)l_max) j = 2 * ((int64_t)l_max - 1) - j;
    return j < (int64_t)len ? x[j] : 0.0f;
}

int clef_log_mel(const float *const *clips, const size_t *lens, size_t n_clips, size_t l_max, float *out) {
    if (l_max <= PAD) return -1;
    size_t n_frames = l_max / CLEF_HOP;
    double *F = clef_xmalloc(sizeof(double) * CLEF_N_FREQ * N_MELS);
    clef_mel_filters(F);
    /* torch.hann_window(400) (periodic), computed in fp32 as torch does. */
    float win[CLEF_N_FFT];
    float wstep = (float)(2.0 * M_PI / CLEF_N_FFT);
    for (int n = 0; n < CLEF_N_FFT; n++) win[n] = cosf((float)n * wstep) * -0.5f + 0.5f;

    double *in = fftw_malloc(sizeof(double) * CLEF_N_FFT);
    fftw_complex *spec = fftw_malloc(sizeof(fftw_complex) * CLEF_N_FREQ);
    pthread_mutex_lock(&plan_lock);
    fftw_plan plan = fftw_plan_dft_r2c_1d(CLEF_N_FFT, in, spec, FFTW_ESTIMATE);
    pthread_mutex_unlock(&plan_lock);

    /* Each triangular filter covers a few bins; skipping its exact zeros
     * leaves every sum unchanged. */
    int lo[N_MELS], hi[N_MELS];
    for (int k = 0; k < N_MELS; k++) {
        lo[k] = CLEF_N_FREQ, hi[k] = 0;
        for (int b = 0; b < CLEF_N_FREQ; b++)
            if (F[b * N_MELS + k] != 0.0) {
                if (b < lo[k]) lo[k] = b;
                hi[k] = b + 1;
            }
    }
    double power[CLEF_N_FREQ];
    for (size_t c = 0; c < n_clips; c++) {
        float *o = out + c * N_MELS * n_frames;
        float vmax = -INFINITY;
        for (size_t t = 0; t < n_frames; t++) {
            int64_t s0 = (int64_t)(t * CLEF_HOP);
            for (int n = 0; n < CLEF_N_FFT; n++) in[n] = (double)win[n] * padded_at(clips[c], lens[c], l_max, s0 + n);
            fftw_execute(plan);
            for (int b = 0; b < CLEF_N_FREQ; b++) power[b] = spec[b][0] * spec[b][0] + spec[b][1] * spec[b][1];
            for (int k = 0; k < N_MELS; k++) {
                double mel = 0.0;
                for (int b = lo[k]; b < hi[k]; b++) mel += F[b * N_MELS + k] * power[b];
                float v = (float)log10(mel > 1e-10 ? mel : 1e-10);
                o[(size_t)k * n_frames + t] = v;
                if (v > vmax) vmax = v;
            }
        }
        float floor_v = vmax - 8.0f;
        for (size_t q = 0; q < N_MELS * n_frames; q++) {
            float v = o[q] > floor_v ? o[q] : floor_v;
            o[q] = (v + 4.0f) / 4.0f;
        }
    }
    pthread_mutex_lock(&plan_lock);
    fftw_destroy_plan(plan);
    pthread_mutex_unlock(&plan_lock);
    fftw_free(in);
    fftw_free(spec);
    free(F);
    return 0;
}
