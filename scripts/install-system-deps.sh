#!/bin/sh
# System packages the tests need that pip cannot provide: redis-server (Debian package).
# A no-op when everything is present; uses sudo only when not root.
set -eu
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing and apt-get is not available: install redis-server" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server
