/**
 * End-to-end test of the extension in a real VS Code (code-server 4.100.3 = VS Code 1.100.3, web UI in
 * headless chromium) against the real server with its bundled model; the cases are in cases.mjs.
 *
 * Run with `npm run e2e` (builds the .vsix first). Needs install.sh. Screenshots and logs of a failure
 * are kept in the artifacts folder it prints. To hunt a flaky case, run some cases many times in one
 * window: `node e2e/run.mjs --only "cannot start" --only "settings change" --repeat 20`.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseArgs } from 'node:util';

import { baseSettings, CASES, FILE } from './cases.mjs';
import {
  checkInstalled,
  installExtension,
  openWorkbench,
  Profile,
  startCodeServer,
  stopProcess,
} from './harness.mjs';

const { values: options } = parseArgs({
  options: { only: { type: 'string', multiple: true }, repeat: { type: 'string', default: '1' } },
});
const repeat = Number(options.repeat);
if (!Number.isInteger(repeat) || repeat < 1) throw new Error(`--repeat wants a count: ${options.repeat}`);
const selected = CASES.filter(([name]) => !options.only || options.only.some((o) => name.includes(o)));
if (selected.length === 0) throw new Error(`no case matches ${JSON.stringify(options.only)}`);
/** The whole run, once: a hang anywhere ends it. */
const RUN_MS = 300_000;

/** The code-server process, for the watchdog to end. */
let codeServer;

async function main() {
  checkInstalled();
  const profile = new Profile();
  profile.writeSettings(baseSettings(profile));
  fs.writeFileSync(path.join(profile.workspace, FILE), '');
  installExtension(profile);
  const { child, url } = await startCodeServer(profile);
  codeServer = child;
  let browser;
  let failed = 0;
  try {
    const opened = await openWorkbench(url, profile.workspace);
    browser = opened.browser;
    for (let round = 1; round <= repeat; round++) {
      for (const [name, run] of selected) {
        const label = repeat === 1 ? name : `${name} [${round}/${repeat}]`;
        const started = Date.now();
        try {
          await run(opened.page, profile);
          console.log(`ok - ${label} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
        } catch (err) {
          failed += 1;
          const shot = path.join(profile.artifacts, `failure-${failed}.png`);
          await opened.page.screenshot({ path: shot }).catch(() => undefined);
          const statusBar = await opened.page
            .locator('.statusbar')
            .first()
            .innerHTML()
            .catch(() => '');
          fs.writeFileSync(path.join(profile.artifacts, `failure-${failed}-statusbar.html`), statusBar);
          console.log(
            `not ok - ${label}\n  ${String(err.stack ?? err).replace(/\n/g, '\n  ')}\n  screenshot: ${shot}`,
          );
        }
      }
    }
  } finally {
    await browser?.close().catch(() => undefined);
    await stopProcess(child);
  }
  if (failed > 0) {
    console.log(`${failed} failed; logs and screenshots in ${profile.artifacts}`);
    process.exitCode = 1;
  } else if (!process.env.LSP_DSCODER_E2E_ARTIFACTS) {
    profile.remove();
  }
}

const watchdog = setTimeout(() => {
  console.log(`not ok - the end-to-end run took over ${(RUN_MS * repeat) / 60_000} minutes`);
  codeServer?.kill('SIGKILL');
  process.exit(1);
}, RUN_MS * repeat);
watchdog.unref();
await main();
