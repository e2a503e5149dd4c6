# Thin wrapper over CMake.  `make demo` and `make test` are the README's quick start.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
# Quiet the nested CMake makefiles ("Entering directory" lines).
MAKEFLAGS += --no-print-directory

.PHONY: all deps demo test test-sanitize fuzz fuzz-media fuzz-loader clean

all: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@scripts/deps.sh --check 2>/dev/null || scripts/deps.sh

demo: all
	@$(BUILD)/clef demo --model tests/fixtures/tiny-clef-omni

test: all
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Same tests under AddressSanitizer + UndefinedBehaviorSanitizer.  Without the CUDA backend: the
# sanitizers instrument host C code, the CUDA tests need a GPU to run anything, and the plain-C kernel
# choice (cuda_select.c, cuda_env.c) is in every build; this saves compiling the kernels for six GPU
# architectures a second time.
test-sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCLEF_SANITIZE=ON -DCLEF_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS)

# libFuzzer targets (tests/fuzz/), built with clang and ASan/UBSan; findings (crash-*, leak-*,
# timeout-*) land in $(FUZZ_BUILD) and fail the target.  `make fuzz` runs them all:
#   fuzz_request (parse + validate + encode, corpus from the golden requests) and fuzz_media for
#   FUZZ_SECONDS each; the loader targets (fuzz_safetensors: safetensors header + index,
#   fuzz_config: config.json / joint_head_config.json / hf_quant_config.json, fuzz_tokenizer:
#   tokenizer.json loading, fuzz_tokenize_long: tokenizing inputs up to 1 MiB) for FUZZ_SECONDS / 3
#   each, seeded by tests/fuzz/seed_loader.c from the fixtures.  CI runs FUZZ_SECONDS=30.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SHORT_SECONDS ?= $(shell expr $(FUZZ_SECONDS) / 3)
FUZZ_SRCS = $(filter-out src/media/avdecode_off.c,$(wildcard src/util/*.c src/json/*.c src/text/*.c src/decision/*.c \
	src/media/*.c))
FUZZ_CFLAGS = -std=gnu11 -g -O1 -fno-omit-frame-pointer -Isrc -DCLEF_FIXTURES='"$(CURDIR)/tests/fixtures"'
FUZZ_SAN = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_LIBS = $(shell pkg-config --libs libpcre2-8 libutf8proc libjpeg libpng libwebp libavformat libavcodec \
	libswresample libswscale libavutil fftw3 libcrypto) -lpthread -lm
# what the loader targets link: files, JSON, dtypes, safetensors, checkpoint, configs, quant configs,
# the finiteness scan (one thread without OpenMP), the tokenizer
FUZZ_LOADER_SRCS = $(wildcard src/util/*.c src/json/*.c src/tensor/*.c src/text/*.c) src/io/safetensors.c \
	src/io/checkpoint.c src/io/config.c src/io/finite.c src/quant/format.c
FUZZ_LOADER_LIBS = $(shell pkg-config --libs libpcre2-8 libutf8proc) -lm
FUZZ_RUN = -rss_limit_mb=2048 -print_final_stats=1

fuzz: deps fuzz-media fuzz-loader
	@mkdir -p $(FUZZ_BUILD)/corpus
	@clang $(FUZZ_CFLAGS) $(FUZZ_SAN) tests/fuzz/fuzz_request.c $(FUZZ_SRCS) $(FUZZ_LIBS) -o $(FUZZ_BUILD)/fuzz_request
	@clang $(FUZZ_CFLAGS) tests/fuzz/seed_corpus.c src/util/buf.c src/util/err.c src/json/json.c -lm \
		-o $(FUZZ_BUILD)/seed_corpus
	@$(FUZZ_BUILD)/seed_corpus tests/fixtures/goldens/goldens.jsonl $(FUZZ_BUILD)/corpus
	@cd $(FUZZ_BUILD) && ./fuzz_request -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 $(FUZZ_RUN) corpus

# The loader targets: each built alone, then run for FUZZ_SHORT_SECONDS on its seeded corpus.
FUZZ_LOADER = fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_tokenize_long
fuzz-loader: deps
	@mkdir -p $(FUZZ_BUILD)/seeds
	@clang $(FUZZ_CFLAGS) tests/fuzz/seed_loader.c src/io/st_write.c src/util/buf.c src/util/err.c src/json/json.c \
		src/tensor/dtype.c -lm -o $(FUZZ_BUILD)/seed_loader
	@$(FUZZ_BUILD)/seed_loader $(CURDIR)/tests/fixtures $(FUZZ_BUILD)/seeds
	@for t in $(FUZZ_LOADER); do \
		clang $(FUZZ_CFLAGS) $(FUZZ_SAN) tests/fuzz/$$t.c $(FUZZ_LOADER_SRCS) $(FUZZ_LOADER_LIBS) \
			-o $(FUZZ_BUILD)/$$t || exit 1; done
	@mkdir -p $(FUZZ_BUILD)/corpus-safetensors $(FUZZ_BUILD)/corpus-config $(FUZZ_BUILD)/corpus-tokenizer \
		$(FUZZ_BUILD)/corpus-tokenize-long
	@cd $(FUZZ_BUILD) && ./fuzz_safetensors -max_total_time=$(FUZZ_SHORT_SECONDS) -max_len=65536 -timeout=10 \
		-dict=$(CURDIR)/tests/fuzz/json_loader.dict $(FUZZ_RUN) corpus-safetensors seeds/safetensors
	@cd $(FUZZ_BUILD) && ./fuzz_config -max_total_time=$(FUZZ_SHORT_SECONDS) -max_len=65536 -timeout=10 \
		-dict=$(CURDIR)/tests/fuzz/json_loader.dict $(FUZZ_RUN) corpus-config seeds/config
	@cd $(FUZZ_BUILD) && ./fuzz_tokenizer -max_total_time=$(FUZZ_SHORT_SECONDS) -max_len=65536 -timeout=10 \
		-dict=$(CURDIR)/tests/fuzz/json_loader.dict $(FUZZ_RUN) corpus-tokenizer seeds/tokenizer
	@cd $(FUZZ_BUILD) && ./fuzz_tokenize_long -max_total_time=$(FUZZ_SHORT_SECONDS) -max_len=1048577 -timeout=30 \
		$(FUZZ_RUN) corpus-tokenize-long seeds/tokenize-long

# libFuzzer over the media decoders (tests/fuzz/fuzz_media.c): each input goes to the decoder its
# magic number names (else to the one its first byte picks), through data URL -> decode ->
# preprocess; seeded with tests/fixtures/media, mutated with fuzz_media.dict's magic numbers.
FUZZ_MEDIA_SRCS = $(filter-out src/media/avdecode_off.c,$(wildcard src/media/*.c)) src/util/buf.c src/util/err.c src/util/budget.c

# the numeric kernels: ASan/UBSan but no coverage tracing (their inner loops' comparisons were most of the time)
FUZZ_MEDIA_PLAIN = src/media/resize.c src/media/melspec.c

fuzz-media: deps
	@mkdir -p $(FUZZ_BUILD)/corpus-media $(FUZZ_BUILD)/obj
	@for f in $(FUZZ_MEDIA_PLAIN); do clang $(FUZZ_CFLAGS) -fsanitize=address,undefined -fno-sanitize-recover=undefined \
		-c $$f -o $(FUZZ_BUILD)/obj/$$(basename $$f .c).o || exit 1; done
	@clang $(FUZZ_CFLAGS) $(FUZZ_SAN) tests/fuzz/fuzz_media.c \
		$(filter-out src/media/prompt.c $(FUZZ_MEDIA_PLAIN),$(FUZZ_MEDIA_SRCS)) \
		$(patsubst src/media/%.c,$(FUZZ_BUILD)/obj/%.o,$(FUZZ_MEDIA_PLAIN)) $(FUZZ_LIBS) -o $(FUZZ_BUILD)/fuzz_media
	@cd $(FUZZ_BUILD) && ./fuzz_media -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=20 \
		-dict=$(CURDIR)/tests/fuzz/fuzz_media.dict $(FUZZ_RUN) corpus-media $(CURDIR)/tests/fixtures/media

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
