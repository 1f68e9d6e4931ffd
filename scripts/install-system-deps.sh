#!/bin/sh
# System packages the tests need that pip and npm cannot provide, from Debian:
# redis-server (the shared store), chromium (/usr/bin/chromium, driven by playwright-core
# in the browser tests; Playwright's own browser download is not used) and espeak-ng (the
# Python client's voice example speaks with it).
# A no-op when everything is present; uses sudo only when not root.
set -eu
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
command -v espeak-ng >/dev/null 2>&1 || missing="$missing espeak-ng"
if [ -z "$missing" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing:$missing, and apt-get is not available: install them" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # one word per package
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
