#!/bin/sh
# deps.sh — install the Debian packages clef builds and tests with.
#   scripts/deps.sh          install what is missing (as root), or print the apt command
#   scripts/deps.sh --test   the same, plus the optional test packages: python3-jsonschema for
#                            test_openapi, chromium + chromium-driver for test_playground (the
#                            playground page in a real browser), nginx for test_nginx (two
#                            replicas behind deploy/nginx/clef.conf); without them those tests are
#                            skipped, saying why.  CI (.ci/run) installs them.
#   scripts/deps.sh --check  exit 0 if everything is installed, 1 otherwise (prints what is missing);
#                            with --test also the test packages
set -eu
PKGS="build-essential cmake pkg-config libpcre2-dev libutf8proc-dev libopenblas-dev libssl-dev libcmocka-dev libmicrohttpd-dev libcurl4-openssl-dev clang libclang-rt-14-dev
      libjpeg62-turbo-dev libpng-dev libwebp-dev libavformat-dev libavcodec-dev libswresample-dev libswscale-dev
      libavutil-dev libfftw3-dev zlib1g-dev"
TEST_PKGS="python3 python3-jsonschema chromium chromium-driver nginx"

check=0
for a in "$@"; do
    case "$a" in
    --check) check=1 ;;
    --test) PKGS="$PKGS $TEST_PKGS" ;;
    *) echo "usage: scripts/deps.sh [--test] [--check]" >&2; exit 2 ;;
    esac
done

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done

if [ -z "$missing" ]; then
    exit 0
fi
if [ "$check" = 1 ]; then
    echo "missing Debian packages:$missing" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "clef needs these Debian packages:$missing" >&2
    echo "install them with:  sudo apt-get install -y$missing" >&2
    exit 1
fi
echo "installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq $missing >/dev/null
