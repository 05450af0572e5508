#!/usr/bin/env bash
# The one command for a lent GPU machine (torch, pytest, numpy, hypothesis, pluggy there,
# no network): `bash tools/gpu_check.sh [--device cpu] [--reps N] [--out DIR]`.
#
# Installs only our wheels (no index, no dependencies) into a fresh private folder put on
# PYTHONPATH, so entry points resolve through importlib.metadata as for users; refuses to
# run if a dt-* distribution is already importable (its plugins would register twice) or
# a wheel no longer matches packages/*/src. Then tools/gpu_check.py runs tests/gpu and the
# timings and writes the dated results to $OUT (default build/gpu-check).
#
# Environment: PYTHON (default python3); DT_GPU_WHEELS, the wheel folder (default dist);
# DT_GPU_DEP_WHEELS, wheels of requirements the machine lacks (default dist/deps; only
# what is missing is installed from there); DT_GPU_ALLOW_STALE=1 warns on stale wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
wheels=${DT_GPU_WHEELS:-dist}
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

shopt -s nullglob
ours=("$wheels"/*.whl)
if ((${#ours[@]} == 0)); then
  echo "gpu_check: no wheels in $wheels/ (build them: python3 tools/build_dists.py all)" >&2
  exit 1
fi
stale=()
[[ ${DT_GPU_ALLOW_STALE:-0} == 1 ]] && stale=(--allow-stale)
"$py" tools/gpu_env.py clean "${ours[@]}" ${stale[@]+"${stale[@]}"}

site=$(mktemp -d "${TMPDIR:-/tmp}/dt-gpu-check.XXXXXX")
trap 'rm -rf "$site"' EXIT
"$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "${ours[@]}"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
"$py" tools/gpu_env.py verify "$site" "${ours[@]}" --dep-wheels "${DT_GPU_DEP_WHEELS:-dist/deps}"
# A torch outside the supported window (the lent machine's 2.11) leaves the plugins
# inactive; the check then runs them with the override, and its report says so.
problem=$("$py" -c 'from dt_core.compat import torch_version_problem as p; print(p() or "")')
if [[ -n $problem ]]; then
  echo "gpu_check: $problem"
  echo "gpu_check: running with DT_PLUGINS_ALLOW_UNTESTED_TORCH=1 (outside the window)"
  export DT_PLUGINS_ALLOW_UNTESTED_TORCH=1
fi
"$py" tools/gpu_check.py "$@"
