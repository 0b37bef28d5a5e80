#!/bin/sh
# Prints the Python interpreter that `make` installs into and runs with.
#
# - $PYTHON itself when pip may install into it: it is a virtual environment's, or its installation
#   carries no EXTERNALLY-MANAGED marker (PEP 668).
# - Otherwise ./.venv's interpreter, created on first use (with --system-site-packages, so a torch the
#   system already has is reused); a note on stderr says so. Later runs reuse it.
set -eu
PYTHON="${PYTHON:-python3}"
VENV="${OPGEN_VENV:-.venv}"
if "$PYTHON" - <<'PY'
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if in_venv or not managed else 1)
PY
then
    command -v "$PYTHON" 2>/dev/null || echo "$PYTHON"
    exit 0
fi
if [ -x "$VENV/bin/python" ]; then
    echo "opgen: $PYTHON is externally managed (PEP 668); using the virtual environment in $VENV" >&2
    echo "$VENV/bin/python"
    exit 0
fi
echo "opgen: $PYTHON is externally managed (PEP 668); creating a virtual environment in $VENV and installing there" >&2
if ! "$PYTHON" -m venv --system-site-packages "$VENV" >&2; then
    echo "opgen: could not create $VENV (on Debian/Ubuntu: apt install python3-venv), or set PYTHON=... to a Python pip may install into" >&2
    exit 1
fi
echo "$VENV/bin/python"
