#!/bin/sh
# The gateway image's install step: the gateway and its dependencies, at the versions the
# tests passed with (constraints.txt), in a virtualenv of their own.
#
#   install.sh SOURCE_DIR PREFIX
#
# SOURCE_DIR holds pyproject.toml, README.md, constraints.txt and the packages qos/,
# gateway/ and tokenpace/ (what the Containerfile copies); PREFIX becomes the virtualenv,
# whose bin/ the image puts first on PATH. $PYTHON is the interpreter [python3].
set -eu
src=${1:?usage: install.sh SOURCE_DIR PREFIX}
prefix=${2:?usage: install.sh SOURCE_DIR PREFIX}
python=${PYTHON:-python3}

"$python" -m venv "$prefix"
"$prefix/bin/python" -m pip install --quiet --disable-pip-version-check \
    --constraint "$src/constraints.txt" "$src[gateway]"
"$prefix/bin/tokenpace" check-config --help >/dev/null
echo "install.sh: tokenpace gateway installed in $prefix"
