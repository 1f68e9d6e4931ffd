#!/usr/bin/env bash
# The release artefacts, built from a clean tree and each installed into a clean
# environment, then imported:
#   tokenpace (the root distribution) and tokenpace-client (sdk_python/): `python -m
#     build` (an sdist, then the wheel from it), each wheel into a fresh virtualenv;
#   tokenpace-web (sdk_web/): `npm pack` (its prepack builds dist/ and copies LICENSE),
#     the tarball into a scratch npm project, imported by Node and type-checked by tsc.
# Every artefact must carry LICENSE. The clean tree is a copy of what git would commit
# (no dist/, build/ or node_modules/). Builds use .venv's setuptools (`--no-isolation`)
# and installs use pip's cache, at the versions of constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=$root/.venv/bin/python
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait; rm -rf "$work"' EXIT
tree=$work/tree
out=$work/dist
mkdir -p "$tree" "$out"

step() { printf '\n== %s\n' "$*"; }

# A command whose output goes to a log, shown only when it fails.
logged() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 || { cat "$log" >&2; return 1; }
}

# A fresh virtualenv with the given requirements (run in the background: the two
# virtualenvs are filled while the web SDK is packed).
fresh_venv() {
    local venv=$1
    shift
    python3 -m venv "$venv" &&
        logged "$venv.log" "$venv/bin/pip" install --disable-pip-version-check -c constraints.txt "$@"
}

step "a clean tree: the files git would commit"
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    xargs -0 cp -P --parents -t "$tree"

step "python -m build: tokenpace, tokenpace-client"
logged "$work/build-tokenpace.log" "$python" -m build --no-isolation --outdir "$out" "$tree"
logged "$work/build-client.log" "$python" -m build --no-isolation --outdir "$out" "$tree/sdk_python"
ls "$out"
"$python" - "$out" <<'EOF'
import sys, tarfile, zipfile
from pathlib import Path

for artefact in sorted(Path(sys.argv[1]).iterdir()):
    if artefact.suffix == ".whl":
        names = zipfile.ZipFile(artefact).namelist()
        ok = any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    else:
        names = tarfile.open(artefact).getnames()
        ok = any(n.count("/") == 1 and n.endswith("/LICENSE") for n in names)
    if not ok:
        sys.exit(f"{artefact.name}: no LICENSE in it")
    print(f"{artefact.name}: LICENSE included")
EOF

fresh_venv "$work/venv-client" "$(ls "$out"/tokenpace_client-*.whl)[openai]" &
client_venv=$!
fresh_venv "$work/venv-gateway" "$(ls "$out"/tokenpace-*.whl)[gateway]" &
gateway_venv=$!

step "npm pack: tokenpace-web from the clean tree"
ln -s "$root/sdk_web/node_modules" "$tree/sdk_web/node_modules"  # its build tools
(cd "$tree/sdk_web" && npm pack --silent --pack-destination "$out" >/dev/null)
tarball=$(ls "$out"/tokenpace-web-*.tgz)
contents=$(tar -tzf "$tarball")
for file in package/LICENSE package/dist/index.js package/dist/index.d.ts; do
    grep -qx "$file" <<<"$contents" || { echo "$tarball: no $file in it" >&2; exit 1; }
done
echo "$(basename "$tarball"): LICENSE, dist/index.js and dist/index.d.ts included"

step "tokenpace-web into a scratch npm project"
project=$work/npm-project
mkdir -p "$project"
pushd "$project" >/dev/null
npm init --yes >/dev/null
npm pkg set type=module
npm install --silent --no-audit --no-fund --offline "$tarball"
node --input-type=module -e '
import { createClient, paceStream, TIERS, SDK_VERSION } from "tokenpace-web";
if (typeof createClient !== "function" || typeof paceStream !== "function") throw new Error("missing exports");
console.log(`tokenpace-web ${SDK_VERSION} imported; chat tier ${TIERS.chat.tds} tokens/s`);
'
cat >check.ts <<'EOF'
import { createClient, TIERS, type PacedStream, type ChatCompletionChunk } from "tokenpace-web";

const client = createClient({ baseURL: "http://127.0.0.1:8000/v1", tier: "chat" });
const tds: number = TIERS.chat.tds;
async function first(): Promise<PacedStream<ChatCompletionChunk>> {
  return client.chat.completions.create({ model: "m", messages: [], stream: true });
}
void first;
void tds;
EOF
"$root/sdk_web/node_modules/.bin/tsc" --noEmit --strict --target es2022 --lib es2022,dom \
    --module nodenext --moduleResolution nodenext check.ts
echo "check.ts type-checks against the package's declarations"
popd >/dev/null

step "tokenpace-client[openai] into a fresh virtualenv"
wait "$client_venv"
(cd "$work" && "$work/venv-client/bin/python" - <<'EOF'
import importlib.util

import tokenpace_client
from tokenpace_client import TIERS, AsyncOpenAI, OpenAI, PacedStream, apace, pace

assert importlib.util.find_spec("gateway") is None, "the client must not need the gateway"
assert TIERS["chat"].tds > 0 and callable(pace) and callable(apace)
print(f"tokenpace_client {tokenpace_client.__version__}: {OpenAI.__name__}, {AsyncOpenAI.__name__}, "
      f"{PacedStream.__name__} from {tokenpace_client.__file__}")
EOF
)

step "tokenpace[gateway] into a fresh virtualenv"
wait "$gateway_venv"
(cd "$work" && "$work/venv-gateway/bin/python" - <<'EOF'
import gateway.app
import qos.metrics

assert qos.metrics.andes_qoe([(1.0, 1)], expected_ttft=1.0, expected_tds=4.8) == 1.0
print(f"gateway and qos imported from {gateway.app.__file__}")
EOF
)
usage=$("$work/venv-gateway/bin/tokenpace" --help)
echo "${usage%%$'\n'*}"
