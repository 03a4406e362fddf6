#!/usr/bin/env bash
# Creates (or tops up) the virtual environment the peers of benchmarks/peer_race.py
# run in: Hugging Face transformers' FlaxRobertaForMaskedLM and PyTorch's
# RobertaForMaskedLM.
#
#   benchmarks/peer_venv.sh            # ${TMPDIR:-/tmp}/peer_venv
#   benchmarks/peer_venv.sh DIR
#
# jax and jaxlib are pinned to the versions of the repository's own venv
# (.venv, read from it, not guessed), so ours and the Flax peer run the same XLA;
# flax and optax likewise.
# transformers 4.57.6 is the last release with the Flax models; torch 2.13.0 is
# the CPU wheel (pinned: an unpinned torch pulls GBs of CUDA wheels).
# Idempotent: an existing venv is reused, and pip leaves satisfied pins alone.
set -euo pipefail

DIR="${1:-${TMPDIR:-/tmp}/peer_venv}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OURS="${OURS_PYTHON:-$REPO/.venv/bin/python}"
TRANSFORMERS_VERSION=4.57.6
TORCH_VERSION=2.13.0

if [[ ! -x "$OURS" ]]; then
  echo "peer_venv.sh: $OURS not found; run 'make install' first (or set OURS_PYTHON)" >&2
  exit 1
fi
read -r JAX_VERSION JAXLIB_VERSION FLAX_VERSION OPTAX_VERSION < <("$OURS" -c \
  'import jax, jaxlib, flax, optax; print(jax.__version__, jaxlib.__version__, flax.__version__, optax.__version__)')
echo "from $OURS: jax $JAX_VERSION, jaxlib $JAXLIB_VERSION, flax $FLAX_VERSION, optax $OPTAX_VERSION"

if [[ ! -x "$DIR/bin/python" ]]; then
  echo "creating $DIR"
  python3 -m venv "$DIR"
else
  echo "reusing $DIR"
fi
PY="$DIR/bin/python"

# torch==2.13.0 resolves to the CPU wheel on this machine (pip's find-links,
# /opt/wheels). Elsewhere, set PEER_TORCH_INDEX=https://download.pytorch.org/whl/cpu
# so pip does not fetch the CUDA build.
EXTRA=()
if [[ -n "${PEER_TORCH_INDEX:-}" ]]; then
  EXTRA=(--extra-index-url "$PEER_TORCH_INDEX")
fi
"$PY" -m pip install --quiet "${EXTRA[@]}" \
  "jax==$JAX_VERSION" "jaxlib==$JAXLIB_VERSION" "flax==$FLAX_VERSION" \
  "optax==$OPTAX_VERSION" numpy \
  "transformers==$TRANSFORMERS_VERSION" "torch==$TORCH_VERSION"

"$PY" - <<'EOF'
import jax, jaxlib, flax, optax, numpy, torch, transformers
from transformers import FlaxRobertaForMaskedLM, RobertaForMaskedLM  # noqa: F401
print(f"ok: jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}, "
      f"optax {optax.__version__}, numpy {numpy.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
EOF
echo "peer python: $PY"
