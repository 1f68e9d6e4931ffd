#!/bin/sh
# The web SDK and the pages need Node.js >= 20 and npm. Debian 12's own nodejs is 18, too
# old, so a missing or older Node is reported rather than installed from apt.
set -eu
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "Node.js >= 20 with npm is needed (sdk_web/, webui/): install it, then re-run make" >&2
    exit 1
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
    echo "Node.js >= 20 is needed (sdk_web/, webui/); found $(node --version)" >&2
    exit 1
fi
