/**
 * A real VS Code for the end-to-end test: code-server (VS Code 1.100.3, installed by install.sh into
 * .deps) on 127.0.0.1 with a temporary user-data folder and our .vsix installed, its web UI in Debian's
 * chromium driven by playwright-core. Every wait here is bounded and names what it waited for.
 */

import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const DEPS = path.join(here, '.deps');
const CODE_SERVER = path.join(DEPS, 'node_modules', 'code-server', 'out', 'node', 'entry.js');
export const VSIX = path.join(here, '..', 'lsp-dscoder.vsix');
const CHROMIUM = process.env.LSP_DSCODER_CHROMIUM ?? '/usr/bin/chromium';

/** Process ids whose command line contains `marker` (Linux /proc). */
export function processesWith(marker) {
  return fs.readdirSync('/proc').filter((pid) => {
    if (!/^\d+$/.test(pid)) return false;
    try {
      return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(marker);
    } catch {
      return false; // ended meanwhile
    }
  });
}

/** Polls `probe` every `intervalMs` until it returns a value other than undefined/false; throws after
 * `timeoutMs` with `what` and the last value seen. */
export async function waitFor(what, probe, { timeoutMs = 30_000, intervalMs = 50 } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await probe();
    if (last !== undefined && last !== false) return last;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

async function freePort() {
  const server = net.createServer().listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

/** The server's absolute path: code-server's extension host gets it in the user settings. */
export function serverCommand() {
  const fromEnv = process.env.LSP_DSCODER_COMMAND;
  if (fromEnv) return fromEnv;
  const found = spawnSync('sh', ['-c', 'command -v lsp-dscoder'], { encoding: 'utf8' }).stdout.trim();
  if (!found) throw new Error('lsp-dscoder is not on PATH (pip install -e .), or set LSP_DSCODER_COMMAND');
  return found;
}

export function checkInstalled() {
  for (const [file, hint] of [
    [CODE_SERVER, 'run editors/vscode/e2e/install.sh'],
    [CHROMIUM, 'run editors/vscode/e2e/install.sh (Debian chromium)'],
    [VSIX, 'run npm run package --prefix editors/vscode'],
  ]) {
    if (!fs.existsSync(file)) throw new Error(`${file} is missing: ${hint}`);
  }
}

/** A temporary VS Code profile: user settings, extensions folder, a workspace folder. */
export class Profile {
  constructor() {
    this.root = fs.mkdtempSync(path.join(os.tmpdir(), 'lsp-dscoder-e2e-'));
    this.userData = path.join(this.root, 'user-data');
    this.extensions = path.join(this.root, 'extensions');
    this.workspace = path.join(this.root, 'workspace');
    this.artifacts = process.env.LSP_DSCODER_E2E_ARTIFACTS ?? path.join(this.root, 'artifacts');
    for (const d of [path.join(this.userData, 'User'), this.extensions, this.workspace, this.artifacts]) {
      fs.mkdirSync(d, { recursive: true });
    }
    this.config = path.join(this.root, 'config.yaml');
    fs.writeFileSync(this.config, 'auth: none\ncert: false\n');
  }

  /** The same settings as user settings and as the remote machine's settings. code-server's window is a
   * remote window: VS Code reads machine-scoped settings (`lspDscoder.server.command`, `.args`) from
   * the machine's file (`Machine/settings.json`) and drops them from the user's file once it knows their
   * scope, which depends on start-up order. With them in the user's file only, a window now and then
   * started the default command. The machine's file is also watched, so a change reaches a running window. */
  writeSettings(settings) {
    for (const dir of ['User', 'Machine']) {
      fs.mkdirSync(path.join(this.userData, dir), { recursive: true });
      fs.writeFileSync(path.join(this.userData, dir, 'settings.json'), JSON.stringify(settings, null, 2));
    }
  }

  /** The last `count` lines of the extension's log (its output channel) in the newest window. */
  extensionLog(count = 20) {
    const logs = path.join(this.userData, 'logs');
    const hosts = (fs.existsSync(logs) ? fs.readdirSync(logs) : []).flatMap((session) =>
      fs
        .readdirSync(path.join(logs, session))
        .filter((d) => /^exthost\d+$/.test(d))
        .map((d) => ({ dir: path.join(logs, session, d), n: Number(d.slice(7)), session })),
    );
    hosts.sort((a, b) => a.session.localeCompare(b.session) || a.n - b.n);
    const file =
      hosts.length === 0 ? '' : path.join(hosts.at(-1).dir, 'lsp-dscoder.lsp-dscoder', 'lsp-dscoder.log');
    if (!fs.existsSync(file)) return '(no extension log)';
    return fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-count).join('\n');
  }

  remove() {
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}

function codeServerArgs(profile) {
  return [
    CODE_SERVER,
    '--config',
    profile.config,
    '--user-data-dir',
    profile.userData,
    '--extensions-dir',
    profile.extensions,
  ];
}

/** code-server's environment: its data under the profile, and no extension gallery (it would look
 * up open-vsx.org): a loopback address where nothing listens. */
function codeServerEnv(profile) {
  const nowhere = 'http://127.0.0.1:9';
  return {
    ...process.env,
    XDG_CONFIG_HOME: profile.root,
    XDG_DATA_HOME: profile.root,
    EXTENSIONS_GALLERY: JSON.stringify({ serviceUrl: `${nowhere}/gallery`, itemUrl: `${nowhere}/item` }),
  };
}

/** `code-server --install-extension lsp-dscoder.vsix` into the profile. */
export function installExtension(profile) {
  const r = spawnSync(process.execPath, [...codeServerArgs(profile), '--install-extension', VSIX], {
    encoding: 'utf8',
    timeout: 120_000,
    env: codeServerEnv(profile),
  });
  if (r.status !== 0 || !/successfully installed/.test(r.stdout)) {
    throw new Error(`installing the .vsix failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
  }
}

/** Starts code-server on a free loopback port; resolves once it answers /healthz. */
export async function startCodeServer(profile) {
  const port = await freePort();
  const log = fs.openSync(path.join(profile.artifacts, 'code-server.log'), 'w');
  const args = [
    ...codeServerArgs(profile),
    '--bind-addr',
    `127.0.0.1:${port}`,
    '--auth',
    'none',
    '--disable-telemetry',
    '--disable-update-check',
    '--disable-workspace-trust',
    '--disable-getting-started-override',
    '--ignore-last-opened',
    profile.workspace,
  ];
  const child = spawn(process.execPath, args, {
    stdio: ['ignore', log, log],
    env: codeServerEnv(profile),
  });
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    'code-server to answer /healthz',
    async () => {
      if (child.exitCode !== null) throw new Error(`code-server exited with ${child.exitCode}`);
      return fetch(`${url}/healthz`).then(
        (r) => r.ok,
        () => false,
      );
    },
    { timeoutMs: 60_000, intervalMs: 200 },
  );
  return { child, url };
}

export async function stopProcess(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const exited = once(child, 'exit');
  const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
  await exited;
  clearTimeout(timer);
}

/** Chromium on the workbench of `folder`; only loopback requests leave the page. */
export async function openWorkbench(url, folder) {
  const require = createRequire(path.join(DEPS, 'package.json'));
  const { chromium } = require('playwright-core');
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: 60_000,
    args: [
      '--no-sandbox',
      '--disable-dev-shm-usage',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--no-first-run',
    ],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  await context.route(/^(?!(https?|wss?):\/\/127\.0\.0\.1[:/]|data:|blob:)/, (route) => route.abort());
  const page = await context.newPage();
  page.setDefaultTimeout(30_000);
  await page.goto(`${url}/?folder=${encodeURIComponent(folder)}`, { waitUntil: 'commit', timeout: 60_000 });
  await page.locator('.monaco-workbench').waitFor({ timeout: 90_000 });
  return { browser, page };
}
