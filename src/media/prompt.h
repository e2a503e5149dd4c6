/* prompt.h — the media block of the prompt and the 3-D M-RoPE positions
 * (SPEC §3.4 step 2, §9 "Accepted inputs and order", "Audio in video",
 * "3-D positions").
 */
#ifndef CLEF_MEDIA_PROMPT_H
#define CLEF_MEDIA_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "media/media.h"
#include "text/tokenizer.h"
#include "util/buf.h"
#include "util/err.h"

/* Placeholder texts (SPEC §3.1). */
#define CLEF_IMAGE_PH "<|vision_start|><|image_pad|><|vision_end|>\n"
#define CLEF_AUDIO_PH "<|audio_start|><|audio_pad|><|audio_end|>\n"
#define CLEF_VIDEO_PH "<|vision_start|><|video_pad|><|vision_end|>\n"

/* thinker_config.position_id_per_seconds of every Clef-Omni config. */
#define CLEF_POSITION_ID_PER_SECONDS 13

/* Ids of the media marker tokens, looked up by their text in the tokenizer
 * (they equal thinker_config's image_token_id, video_token_id, ...). */
typedef struct clef_media_tokens {
    int32_t image_pad, video_pad, audio_pad;
    int32_t vision_start, vision_end, audio_start, audio_end;
} clef_media_tokens;

/* Look the seven markers up; 500 internal_error if one is missing. */
int clef_media_tokens_resolve(const clef_tokenizer *tok, clef_media_tokens *out, clef_err *err);

/* Append the media block to `out`: IMAGE_PH x images + AUDIO_PH x standalone
 * clips + VIDEO_PH x videos tokenized as ONE piece, then every pad expanded
 * to its item's token count (images and videos t*h*w/4, audio f(m)); with
 * use_audio_in_video each <|video_pad|> becomes <|audio_start|>, the video
 * and audio pads interleaved by time (a video pad first while its T index
 * t*second_per_grid*13 <= the next audio index), <|audio_end|>.
 * Appends nothing without media. */
int clef_media_prompt_ids(const clef_tokenizer *tok, const clef_media *m, clef_ids *out, clef_err *err);

/* transformers' Qwen3-Omni get_rope_index for one unpadded sequence:
 * pos[a*n + i] is position a (0 = T, 1 = H, 2 = W) of token i.  `ids` must
 * hold the media block of clef_media_prompt_ids at [media_start,
 * media_start + media_len); runs of text, markers, grids and audio clips
 * follow the reference's rule that the next run starts at 1 + the largest
 * position of the most recently emitted run.
 * Errors (422 invalid_request): a pad marker (<|image_pad|>, <|video_pad|>,
 * <|audio_pad|>) or <|audio_start|> outside the media block while media are
 * present — the reference fails on those (feature/token count mismatch);
 * 500 if the block does not match `m`. */
int clef_media_positions(const int32_t *ids, size_t n, size_t media_start, size_t media_len, const clef_media *m,
                         const clef_media_tokens *t, int32_t *pos, clef_err *err);

#endif
