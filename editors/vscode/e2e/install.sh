#!/bin/sh
# Installs what the end-to-end test needs, into editors/vscode/e2e/.deps (git-ignored): code-server
# 4.100.3 (VS Code 1.100.3, the last line that runs on Node 20) and playwright-core, plus Debian's
# chromium (driven by playwright-core, no browser download), libkrb5-dev (code-server's `kerberos`
# module builds against it) and ripgrep (code-server's search expects @vscode/ripgrep's binary).
# code-server installs with --ignore-scripts: its postinstall downloads things this machine cannot
# reach, so the steps it needs are done here by hand. Idempotent: a second run changes nothing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
deps="$here/.deps"
CODE_SERVER_VERSION=4.100.3
PLAYWRIGHT_VERSION=1.65.1

need_apt=""
command -v chromium >/dev/null 2>&1 || need_apt=1
command -v rg >/dev/null 2>&1 || need_apt=1
[ -e /usr/include/krb5.h ] || [ -e /usr/include/gssapi/gssapi.h ] || need_apt=1
if [ -n "$need_apt" ]; then
  sudo_=""
  [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y --no-install-recommends chromium libkrb5-dev ripgrep
fi

mkdir -p "$deps"
cs="$deps/node_modules/code-server"
if [ ! -e "$deps/.installed-$CODE_SERVER_VERSION-$PLAYWRIGHT_VERSION" ]; then
  [ -e "$deps/package.json" ] || echo '{"name": "lsp-dscoder-e2e-deps", "private": true}' >"$deps/package.json"
  npm install --prefix "$deps" --ignore-scripts --no-audit --no-fund --save-exact \
    "code-server@$CODE_SERVER_VERSION" "playwright-core@$PLAYWRIGHT_VERSION"
  # code-server's postinstall.sh, by hand: the VS Code build's own dependencies, without their
  # install scripts (they download prebuilt binaries), then its native modules built with node-gyp
  # against the system's Node headers; below, the links postinstall.sh makes.
  (cd "$cs/lib/vscode" && npm install --omit=dev --ignore-scripts --no-audit --no-fund)
  (cd "$cs/lib/vscode/extensions" && npm install --omit=dev --ignore-scripts --no-audit --no-fund)
  gyp="$(npm root -g)/npm/node_modules/node-gyp/bin/node-gyp.js"
  for mod in kerberos @vscode/spdlog node-pty native-watchdog @vscode/deviceid; do
    (cd "$cs/lib/vscode/node_modules/$mod" && npm_config_nodedir=/usr node "$gyp" rebuild --nodedir=/usr >"$deps/gyp.log" 2>&1) || { cat "$deps/gyp.log"; exit 1; }
  done
  # argon2 (code-server's password hashing; unused with --auth none, but loaded at start) comes
  # prebuilt from GitHub through node-pre-gyp: built here, where node-pre-gyp would put it.
  (cd "$deps/node_modules/argon2" && node "$gyp" rebuild --nodedir=/usr --napi_build_version=3 \
    --module_name=argon2 --module_path="$PWD/lib/binding/napi-v3" >"$deps/gyp.log" 2>&1) || { cat "$deps/gyp.log"; exit 1; }
  touch "$deps/.installed-$CODE_SERVER_VERSION-$PLAYWRIGHT_VERSION"
fi
ln -sfn node_modules "$cs/lib/vscode/node_modules.asar"
ln -sfn code-linux.sh "$cs/lib/vscode/bin/remote-cli/code-server"
ln -sfn browser-linux.sh "$cs/lib/vscode/bin/helpers/browser.sh"
# @vscode/ripgrep downloads its binary in a postinstall; Debian's does the same job.
for rgdir in $(find "$cs/lib/vscode" -type d -path '*/@vscode/ripgrep' 2>/dev/null); do
  mkdir -p "$rgdir/bin"
  [ -x "$rgdir/bin/rg" ] || cp "$(command -v rg)" "$rgdir/bin/rg"
done
echo "e2e dependencies ready in $deps"
