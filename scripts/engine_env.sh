#!/usr/bin/env bash
# Build (or reuse) the optional test venv of one real engine and install this checkout into it.
#   scripts/engine_env.sh sglang|vllm      prints the venv's python on its last stdout line
# The venvs live under $KVEVENTS_ENGINE_VENVS (default /work/.engine-venvs), one per engine and
# pinned version; a venv is reused when its marker file (.kvevents-complete) matches the pins
# below. Facts behind the pins (CPU torch 2.13.0 first, the engine with --no-deps, its imports
# under a constraint pinning torch, no torchvision): ../shared/ENGINES.md.
# Exit codes: 0 ready; 2 usage; 3 the package registry cannot be reached (one line on stderr, the
# engine tests skip); 4 the install failed (log kept beside the venv).
set -uo pipefail

usage() { echo "usage: scripts/engine_env.sh sglang|vllm" >&2; exit 2; }
[ $# -eq 1 ] || usage
engine="$1"
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${KVEVENTS_ENGINE_VENVS:-/work/.engine-venvs}"
torch_pin="torch==2.13.0"

case "$engine" in
  sglang)
    engine_pin="sglang==0.5.20"
    # its imports; transformers 5.24.0 (SGLang's own pin 5.12.1 demands torchvision at import);
    # triton is not declared by SGLang (a CUDA torch brings it) but imported by its cache paths
    imports=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pyzmq tqdm
      IPython pydantic aiohttp dill "compressed-tensors==0.18.0" gguf "openai==2.6.1"
      partial_json_parser "xgrammar==0.2.1" sentencepiece "apache-tvm-ffi==0.1.11" "triton==3.9.0"
      "transformers==5.24.0")
    nodeps=()
    extra_constraints=()
    ;;
  vllm)
    engine_pin="vllm==0.33.0"
    imports=(packaging psutil pyzmq regex numpy msgspec pydantic cbor2 "transformers>=5.16.1,<5.21"
      aiohttp requests openai-harmony openai pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo
      prometheus-client "fastapi<0.137" partial-json-parser "llguidance>=1.7,<1.8" einops)
    # without their deps: xgrammar would pull triton (~1 GB), unused on these paths
    nodeps=("xgrammar==0.2.8" "apache-tvm-ffi==0.1.11")
    extra_constraints=("fastapi<0.137" "transformers>=5.16.1,<5.21")
    ;;
  *) usage ;;
esac

spec="$(printf '%s\n' "$torch_pin" "$engine_pin" "${imports[@]}" "--no-deps" "${nodeps[@]}" "${extra_constraints[@]}")"
spec_id="$(printf '%s' "$spec" | sha256sum | cut -c1-16)"
venv="$root/$engine-${engine_pin#*==}"
marker="$venv/.kvevents-complete"
log="$root/$engine-${engine_pin#*==}.log"
mkdir -p "$root" || { echo "engine_env: cannot create $root" >&2; exit 4; }

# one builder at a time per engine (tests of several worktrees may ask at once)
exec 9>"$root/$engine.lock"
flock 9

install_checkout() {
  # this checkout, editable and without deps (its deps came with the engine step); redone when the
  # venv points at another checkout or pyproject.toml changed (entry points live in its metadata)
  local stamp want
  want="$repo $(sha256sum "$repo/pyproject.toml" | cut -c1-16)"
  stamp="$(cat "$venv/.kvevents-checkout" 2>/dev/null || true)"
  if [ "$stamp" != "$want" ]; then
    "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$repo" >>"$log" 2>&1 \
      || { echo "engine_env: installing this checkout into $venv failed (see $log)" >&2; exit 4; }
    echo "$want" >"$venv/.kvevents-checkout"
  fi
}

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$spec_id" ]; then
  install_checkout
  echo "$venv/bin/python"
  exit 0
fi

# can the registry be reached? (a metadata look-up of the engine, not a download)
if ! timeout 60 python3 -m pip index versions --timeout 15 --retries 1 "${engine_pin%%==*}" 2>/dev/null |
  grep -q "${engine_pin#*==}"; then
  echo "engine_env: the package registry cannot be reached for $engine_pin: engine tests skip" >&2
  exit 3
fi

start=$(date +%s)
rm -rf "$venv"
: >"$log"
cons="$root/$engine.constraints.txt"
printf '%s\n' "$torch_pin" "${extra_constraints[@]}" >"$cons"
step() {
  echo "+ $*" >>"$log"
  "$@" >>"$log" 2>&1 || { echo "engine_env: $engine install failed at: $* (see $log)" >&2; exit 4; }
}
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
step python3 -m venv "$venv"
step "${pip[@]}" -U "pip>=24" setuptools wheel
step "${pip[@]}" "$torch_pin"
step "${pip[@]}" --no-deps "$engine_pin"
step "${pip[@]}" -c "$cons" "${imports[@]}"
[ ${#nodeps[@]} -eq 0 ] || step "${pip[@]}" --no-deps "${nodeps[@]}"
# kvevents' own deps (from pyproject.toml), under the same constraints
deps="$("$venv/bin/python" - "$repo/pyproject.toml" <<'EOF'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
EOF
)"
mapfile -t kdeps <<<"$deps"
step "${pip[@]}" -c "$cons" "${kdeps[@]}" pytest
"$venv/bin/python" -c "import torchvision" >/dev/null 2>&1 && step "$venv/bin/python" -m pip uninstall -q -y torchvision
"$venv/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__" >>"$log" 2>&1 ||
  { echo "engine_env: $engine venv has the wrong torch (see $log)" >&2; exit 4; }
install_checkout
echo "$spec_id" >"$marker"
secs=$(($(date +%s) - start))
size="$(du -sh "$venv" | cut -f1)"
echo "engine_env: $engine_pin ready in ${secs}s, $size at $venv" >&2
echo "$venv/bin/python"
