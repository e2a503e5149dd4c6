# Thin wrapper over CMake.  `make demo` and `make test` are the README's quick start.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
# Quiet the nested CMake makefiles ("Entering directory" lines).
MAKEFLAGS += --no-print-directory

.PHONY: all deps demo test test-sanitize fuzz fuzz-media clean

all: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@scripts/deps.sh --check 2>/dev/null || scripts/deps.sh

demo: all
	@$(BUILD)/clef demo --model tests/fixtures/tiny-clef-omni

test: all
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Same tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test-sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCLEF_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS)

# libFuzzer over request parse + validate + encode (tests/fuzz/fuzz_request.c), built with clang
# and ASan/UBSan, run for FUZZ_SECONDS on a corpus seeded from the golden requests.  Findings
# (crash-*, leak-*, timeout-*) land in $(FUZZ_BUILD) and fail the target.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SRCS = $(filter-out src/media/avdecode_off.c,$(wildcard src/util/*.c src/json/*.c src/text/*.c src/decision/*.c \
	src/media/*.c))
FUZZ_CFLAGS = -std=gnu11 -g -O1 -fno-omit-frame-pointer -Isrc -DCLEF_FIXTURES='"$(CURDIR)/tests/fixtures"'
FUZZ_LIBS = $(shell pkg-config --libs libpcre2-8 libutf8proc libjpeg libpng libwebp libavformat libavcodec \
	libswresample libswscale libavutil fftw3 libcrypto) -lpthread -lm

fuzz: deps fuzz-media
	@mkdir -p $(FUZZ_BUILD)/corpus
	@clang $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		tests/fuzz/fuzz_request.c $(FUZZ_SRCS) $(FUZZ_LIBS) -o $(FUZZ_BUILD)/fuzz_request
	@clang $(FUZZ_CFLAGS) tests/fuzz/seed_corpus.c src/util/buf.c src/util/err.c src/json/json.c -lm \
		-o $(FUZZ_BUILD)/seed_corpus
	@$(FUZZ_BUILD)/seed_corpus tests/fixtures/goldens/goldens.jsonl $(FUZZ_BUILD)/corpus
	@cd $(FUZZ_BUILD) && ./fuzz_request -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 corpus

# libFuzzer over the media decoders (tests/fuzz/fuzz_media.c): every input is tried as an image,
# an audio clip and a video through data URL -> decode -> preprocess; seeded with tests/fixtures/media.
FUZZ_MEDIA_SRCS = $(filter-out src/media/avdecode_off.c,$(wildcard src/media/*.c)) src/util/buf.c src/util/err.c

fuzz-media: deps
	@mkdir -p $(FUZZ_BUILD)/corpus-media
	@clang $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		tests/fuzz/fuzz_media.c $(filter-out src/media/prompt.c,$(FUZZ_MEDIA_SRCS)) $(FUZZ_LIBS) \
		-o $(FUZZ_BUILD)/fuzz_media
	@cd $(FUZZ_BUILD) && ./fuzz_media -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=20 \
		-rss_limit_mb=2048 -print_final_stats=1 corpus-media $(CURDIR)/tests/fixtures/media

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
