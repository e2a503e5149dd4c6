/* melspec.h — Whisper log-mel features and the Qwen3-Omni audio token count
 * (SPEC §9 "Audio"), as transformers' WhisperFeatureExtractor computes them
 * with torch (n_fft 400, hop 160, 128 Slaney mel bins, dither 0) for a batch
 * padded to its longest clip.
 */
#ifndef CLEF_MEDIA_MELSPEC_H
#define CLEF_MEDIA_MELSPEC_H

#include <stddef.h>
#include <stdint.h>

#define CLEF_N_FFT 400
#define CLEF_N_FREQ (CLEF_N_FFT / 2 + 1) /* 201 */

/* librosa.filters.mel(sr=16000, n_fft=400, n_mels=128, fmin=0, fmax=8000,
 * htk=False, norm="slaney") computed in double: F[b*128 + k], b = 0..200. */
void clef_mel_filters(double *F);

/* Log-mel of `n_clips` clips, each zero-padded at the end to `l_max`
 * samples (l_max >= every clip length, l_max > 200 for the reflect pad):
 * out [n_clips][128][l_max/160] fp32.  Periodic Hann window, centre reflect
 * pad of 200, |X|^2 with the last frame dropped, mel projection,
 * log10(max(mel, 1e-10)), clamp at (max over the clip) - 8, (x + 4)/4.
 * Returns 0, or -1 if l_max <= 200 (the reference's reflect pad fails). */
int clef_log_mel(const float *const *clips, const size_t *lens, size_t n_clips, size_t l_max, float *out);

/* Frames of a clip of `l` samples in a batch padded to `l_max`:
 * min(ceil(l/160), floor(l_max/160)) — the feature attention-mask sum. */
int32_t clef_audio_frames(size_t l, size_t l_max);

/* Audio tokens of m frames: 13 per 100-frame chunk plus c(c(c(m mod 100)))
 * with c(x) = ceil(x/2) (written with ceiling division, so c(0) = 0). */
int32_t clef_audio_tokens(int32_t m);

#endif
