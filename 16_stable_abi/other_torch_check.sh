#!/usr/bin/env bash
# Stage 16: one wheel, a second torch. Builds the stage's abi3 wheel against the tutorial's torch
# (2.13.0, in .venv), installs that very file into a separate venv that holds another torch, and
# runs the stage's tests there, with no rebuild. The README pastes its output.
#
#   16_stable_abi/other_torch_check.sh [VENV]
#
# VENV (default: .venv-other-torch at the repository root) is made if missing, with
# torch==$OTHER_TORCH (default 2.14.1), numpy and pytest. PyPI's torch 2.14.1 is a CUDA build:
# on a CPU-only machine it imports once its nvidia-* wheels are installed, several GB. Not part
# of `make test`: the symbol test there (tests/test_stage.py) is the cheap half of this proof.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STAGE="$ROOT/16_stable_abi"
TUTORIAL_PY="$ROOT/.venv/bin/python"
OTHER_VENV=${1:-$ROOT/.venv-other-torch}
OTHER_TORCH=${OTHER_TORCH:-2.14.1}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

test -x "$TUTORIAL_PY" || { echo "no $TUTORIAL_PY: run \`make\` at the repository root first"; exit 1; }
if [ ! -x "$OTHER_VENV/bin/python" ]; then
    # The venv's Python must take the cp310-abi3 wheel: the tutorial's own interpreter does.
    BASE_PY=$("$TUTORIAL_PY" -c 'import sys; print(sys._base_executable)')
    echo "==> creating $OTHER_VENV with $BASE_PY and torch==$OTHER_TORCH (several GB)"
    "$BASE_PY" -m venv "$OTHER_VENV"
    "$OTHER_VENV/bin/pip" install --quiet "torch==$OTHER_TORCH" \
        "$(grep '^numpy==' "$ROOT/requirements.txt")" "$(grep '^pytest==' "$ROOT/requirements.txt")"
fi

echo "==> building the wheel with the tutorial's torch $("$TUTORIAL_PY" -c 'import torch; print(torch.__version__)')"
PATH="$ROOT/.venv/bin:$PATH" "$TUTORIAL_PY" -m pip wheel --quiet --no-build-isolation --no-deps -w "$WORK/wheels" "$STAGE"
PATH="$ROOT/.venv/bin:$PATH" "$TUTORIAL_PY" -m pip wheel --quiet --no-build-isolation --no-deps -w "$WORK/wheels" "$ROOT/common"
WHEEL=$(ls "$WORK"/wheels/eml_linear_stable-*.whl)
echo "    $(basename "$WHEEL")"
unzip -p "$WHEEL" eml/linear_stable/_C.abi3.so | sha256sum | sed 's/ .*//; s/^/    _C.abi3.so sha256 /'

echo "==> installing that wheel into $OTHER_VENV, without its dependencies (torch stays as it is)"
"$OTHER_VENV/bin/pip" install --quiet --force-reinstall --no-deps "$WORK"/wheels/*.whl
"$OTHER_VENV/bin/python" - <<'EOF'
import hashlib, pathlib, torch, eml.linear_stable as m
so = pathlib.Path(m._C.__file__)
print(f"    torch {torch.__version__} imports {so.name}, sha256 {hashlib.sha256(so.read_bytes()).hexdigest()}")
EOF

# The stage's tests, in the other venv, from a folder outside the repository (so that Python finds
# the installed package, not the sources). Deselected: the wheel test, which would build a new
# wheel against this torch, the very thing this check avoids.
echo "==> the stage's tests under torch $OTHER_TORCH"
cd "$WORK"
status=0
"$OTHER_VENV/bin/python" -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" \
    -k "not abi3_wheel" "$STAGE/tests" > "$WORK/pytest.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then cat "$WORK/pytest.log"; echo "the stage's tests failed under torch $OTHER_TORCH"; exit "$status"; fi
grep -E "passed|failed|error" "$WORK/pytest.log" | tail -n 1 | sed 's/^/    /' 

# For contrast: stage 08's abi3 wheel, built the same way against torch 2.13 on ATen's C++ API,
# installed into a folder of its own and put first on the path. Nothing promises that it loads:
# libtorch's C++ symbols may be renamed or change meaning in any release. It prints what happens.
echo "==> for contrast, stage 08's wheel (built on ATen) under torch $OTHER_TORCH"
PATH="$ROOT/.venv/bin:$PATH" "$TUTORIAL_PY" -m pip wheel --quiet --no-build-isolation --no-deps -w "$WORK/wheels08" "$ROOT/08_custom_op"
"$OTHER_VENV/bin/pip" install --quiet --no-deps --target "$WORK/stage08" "$WORK"/wheels08/*.whl
echo "    it imports $(nm -D -C --undefined-only "$WORK/stage08/eml/linear_op/_C.abi3.so" | grep -cE '\b(at|c10|torch|caffe2)::') libtorch C++ symbols"
PYTHONPATH="$WORK/stage08" "$OTHER_VENV/bin/python" - <<'EOF' 2>&1 | tail -n 1 | cut -c1-200 | sed 's/^/    /'
import torch, torch.nn.functional as F
try:
    import eml.linear_op
except ImportError as error:
    print(f"import fails: {error}")
else:
    x, w, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3)
    torch.testing.assert_close(torch.ops.eml.linear(x, w, b), F.linear(x, w, b))
    print(f"imports and computes F.linear's result: every one of those symbols is still in torch {torch.__version__}")
EOF
