#!/usr/bin/env bash
# The README's main command: installs what is missing, builds moeserve (Release), writes the
# bundled demo model (a small random-weight Qwen3.5-MoE checkpoint with the real Qwen3
# tokenizer) into build/demo-model if it is not there yet, and serves it as "demo" on
# 127.0.0.1:${PORT:-8000}. Extra arguments are passed to `moeserve serve`, e.g.
#   scripts/demo.sh --threads 4
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS" --target moeserve

MODEL_DIR="$BUILD_DIR/demo-model"
if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
  template_args=()
  # The Qwen3.5 template (thinking on by default) when the repository has it; otherwise the
  # Qwen3 template from tokenizer_config.json.
  if [ -f tests/fixtures/chat_templates/qwen3_5.jinja ]; then
    template_args=(--chat-template tests/fixtures/chat_templates/qwen3_5.jinja)
  fi
  "$BUILD_DIR/moeserve" make-demo-model "$MODEL_DIR" --seed 0 --size tiny \
    --tokenizer third_party/tokenizers/qwen3 "${template_args[@]}" --overwrite
fi

if ! "$BUILD_DIR/moeserve" serve --help >/dev/null 2>&1; then
  echo "demo.sh: this build of moeserve has no 'serve' subcommand yet; the demo model is in $MODEL_DIR" >&2
  exit 1
fi
echo "demo.sh: serving $MODEL_DIR as 'demo' on http://127.0.0.1:${PORT:-8000}/v1 (Ctrl-C stops it)" >&2
exec "$BUILD_DIR/moeserve" serve "$MODEL_DIR" --served-model-name demo --host 127.0.0.1 --port "${PORT:-8000}" "$@"
