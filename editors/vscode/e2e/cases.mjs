/**
 * The end-to-end cases (run by run.mjs), each in a real VS Code window against the real server:
 *
 * 1. typing a Python method header shows ghost text that appears and grows as the server streams it, never
 *    shows anything but a prefix of the final suggestion and never blinks out while it grows; Tab accepts
 *    exactly what is shown; the saved file on disk is exactly the typed text plus the suggestion; no
 *    completion item (suggest widget) is offered next to the inline suggestion; VS Code's requests, made
 *    50 ms after a keystroke, find the suggestion their didChange started;
 * 2. a model that does not load shows `failed` with its reason in the status item;
 * 3. a server command that cannot start shows `stopped` with its reason; one that exits before it
 *    answers `initialize` shows its exit status and error line, and is not restarted; one that answers
 *    `initialize` with an error shows that error, and its process is ended;
 * 4. a settings change while the server is still starting replaces it: the new command's outcome stays
 *    on the status item, and the old process is ended, not restarted.
 *
 * Every wait has a condition; a timeout says what the screen showed meanwhile.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

import { processesWith, serverCommand, waitFor } from './harness.mjs';

export const FILE = 'point.py';
const HEADER = 'class Point:\n    def __init__(self, x, y):\n        ';
/** Inserted in one edit (as a paste would). */
const INSERTED = 'self.';
const TYPED = HEADER + INSERTED;
/** The first line the bundled model suggests there (greedy). The lines after it depend on the prompt the
 * server built while the header was typed (edit anchor, typing through), so the test takes the whole
 * suggestion from the screen once it has stopped growing, and checks Tab and the file against that. */
const FIRST_LINE = 'x = x';
/** The whole suggestion is on screen when the server has finished its request, and the ghost text has
 * more than one line and has not changed for this long (the last text reaches the screen through one
 * more provider call). */
const SETTLED_MS = 3_000;
/** The server's one log line per finished request (response sent and decoding ended) in point.py. */
const FINISHED = /request id=\d+ uri=\S*point\.py v=\d+ source=\S+ outcome=ok /;

function serverLog(profile) {
  const log = path.join(profile.artifacts, 'server.log');
  return fs.existsSync(log) ? fs.readFileSync(log, 'utf8').split('\n') : [];
}

function finishedRequests(profile) {
  return serverLog(profile).filter((l) => FINISHED.test(l)).length;
}

/** Requests in point.py that the server answered from the suggestion their didChange had started: VS Code
 * asks 50 ms after the last keystroke, and the server does not wait for it (`startOnEdit`). */
function startedFromTheEdit(profile) {
  return serverLog(profile).filter((l) =>
    /request id=\d+ uri=\S*point\.py .*source=engine .*earlyMs=/.test(l),
  ).length;
}

export function baseSettings(profile) {
  return {
    'lspDscoder.server.command': serverCommand(),
    'lspDscoder.server.args': ['--stdio', '--log-file', path.join(profile.artifacts, 'server.log')],
    'lspDscoder.device': 'cpu',
    'workbench.startupEditor': 'none',
    'workbench.tips.enabled': false,
    'security.workspace.trust.enabled': false,
    'editor.wordBasedSuggestions': 'off', // the suggest widget may only come from our server
    'extensions.ignoreRecommendations': true,
    'files.autoSave': 'off',
    'telemetry.telemetryLevel': 'off',
  };
}

const statusItem = (page) => page.locator('.statusbar-item').filter({ hasText: /^\s*dscoder/ });

async function statusText(page) {
  const item = statusItem(page);
  return (await item.count()) === 0 ? '' : ((await item.first().textContent()) ?? '').trim();
}

/** Waits until the status item's text passes `test`; a timeout names every text it showed meanwhile and
 * the end of the extension's log (which command it started, how that ended). */
async function waitStatus(page, profile, what, test, timeoutMs) {
  const seen = [];
  try {
    return await waitFor(
      `status item: ${what}`,
      async () => {
        const text = await statusText(page);
        if (seen.at(-1) !== text) seen.push(text);
        return test(text) ? text : undefined;
      },
      { timeoutMs, intervalMs: 100 },
    );
  } catch (err) {
    const log = profile.extensionLog().replace(/\n/g, '\n    ');
    throw new Error(`${err.message}; shown: ${JSON.stringify(seen)}\n  extension log:\n    ${log}`);
  }
}

/** Records, once per animation frame, the ghost text of the focused editor ('' when none), and whether
 * one of its lines is `marker` (ghost text aside, spaces around it trimmed). A recorder started before
 * ends. */
async function startGhostRecorder(page, marker) {
  await page.evaluate((marker) => {
    const typedLines = () =>
      [...document.querySelectorAll('.monaco-editor.focused .view-lines .view-line')].map((line) => {
        const copy = line.cloneNode(true);
        for (const ghost of copy.querySelectorAll('[class*="ghost-text"]')) ghost.remove();
        return copy.textContent.replace(/\u00a0/g, ' ');
      });
    const read = () => {
      const editor = document.querySelector('.monaco-editor.focused');
      if (!editor) return '';
      const inline = [...editor.querySelectorAll('.ghost-text-decoration')].map((e) => e.textContent);
      const lines = [...editor.querySelectorAll('.suggest-preview-text .view-line')].map(
        (e) => e.textContent,
      );
      return [inline.join(''), ...lines].join('\n').replace(/\u00a0/g, ' ');
    };
    const log = [];
    window.__ghost?.end();
    const ghost = { log, read, typedLines, suggestWidget: false, ended: false };
    window.__ghost = ghost;
    // Read what each frame paints: VS Code renders in its own animation-frame callbacks, and resize
    // observers run after all of those and layout, just before the paint. A probe element changes its
    // width every frame so that the observer runs every frame.
    const sample = () => {
      const text = read();
      const marked = typedLines().some((line) => line.trim() === marker);
      const last = log[log.length - 1];
      if (!last || last.text !== text || last.marked !== marked)
        log.push({ t: performance.now(), text, marked });
      if (document.querySelector('.editor-widget.suggest-widget.visible')) ghost.suggestWidget = true;
    };
    const probe = document.createElement('div');
    probe.style.cssText = 'position:fixed;left:-10px;top:-10px;height:1px;width:1px';
    document.body.appendChild(probe);
    const observer = new ResizeObserver(sample);
    observer.observe(probe);
    ghost.end = () => {
      ghost.ended = true;
      observer.disconnect();
      probe.remove();
    };
    const frame = () => {
      probe.style.width = probe.style.width === '1px' ? '2px' : '1px';
      if (!ghost.ended) requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
  }, marker);
}

async function ghostLog(page) {
  return page.evaluate(() => ({ log: window.__ghost.log, suggestWidget: window.__ghost.suggestWidget }));
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function openFile(page, name) {
  await page.keyboard.press('Control+P');
  await page.locator('.quick-input-widget input').waitFor({ state: 'visible', timeout: 15_000 });
  await page.keyboard.type(name);
  await page
    .locator('.quick-input-list .monaco-list-row', { hasText: name })
    .first()
    .waitFor({ timeout: 15_000 });
  await page.keyboard.press('Enter');
  await page.locator(`.tab[aria-label^="${name}"]`).waitFor({ timeout: 15_000 });
  await page.locator('.monaco-editor.focused').waitFor({ timeout: 15_000 });
}

/** Writes the settings and waits until the server has applied the change (its log says so). */
async function changeServerSettings(profile, settings, logged) {
  const before = serverLog(profile).filter((l) => l.includes(logged)).length;
  profile.writeSettings(settings);
  await waitFor(
    `the server to log "${logged}"`,
    () => serverLog(profile).filter((l) => l.includes(logged)).length > before,
  );
}

async function streamedSuggestionIsShownAcceptedAndSaved(page, profile) {
  const file = path.join(profile.workspace, FILE);
  await waitStatus(page, profile, 'model ready (idle)', (t) => /^dscoder( [\d.]+ ms)?$/.test(t), 120_000);
  // The paste's suggestion must stream after its request. With `startOnEdit` the header's last keystroke
  // starts a suggestion ("self.x = x ...") at once, and when it has got past "self." before the paste
  // arrives, the paste types through it and the rest is shown whole, from memory: right, but nothing to see
  // grow. So the server starts suggestions only when asked, for this part.
  const asked = { ...baseSettings(profile), 'lspDscoder.serverSettings': { startOnEdit: false } };
  await changeServerSettings(profile, asked, 'settings changed: startOnEdit=False');
  await openFile(page, FILE);
  // Started before typing: the paste follows the last keystroke at once, with no round trip to the page
  // between them in which the header's own suggestion could stream and re-query.
  await startGhostRecorder(page, INSERTED);
  await clearEditor(page); // a repeated run starts where the previous one ended
  // Human speed; VS Code's Python rules indent after each `:` line on Enter.
  await page.keyboard.type(HEADER.replace(/\n */g, '\n'), { delay: 40 });
  const finishedBefore = finishedRequests(profile);
  await page.keyboard.insertText(INSERTED);
  let last = '';
  let since = performance.now();
  await waitFor(
    `a whole suggestion as ghost text (the server's request finished; more than one line, unchanged for ${SETTLED_MS} ms)`,
    async () => {
      const text = await page.evaluate(() => window.__ghost.read());
      if (text !== last) [last, since] = [text, performance.now()];
      const finished = finishedRequests(profile) > finishedBefore;
      return finished && text.includes('\n') && performance.now() - since >= SETTLED_MS;
    },
    { timeoutMs: 60_000 },
  ).catch(async (err) => {
    const { log } = await ghostLog(page);
    const finished = finishedRequests(profile) - finishedBefore;
    throw new Error(
      `${err.message}; requests finished since: ${finished}; shown: ${JSON.stringify(log.slice(-8).map((s) => s.text))}`,
    );
  });
  const SUGGESTION = last;
  check(
    SUGGESTION.split('\n')[0] === FIRST_LINE,
    `the suggestion's first line is not ${JSON.stringify(FIRST_LINE)}: ${JSON.stringify(SUGGESTION)}`,
  );
  const { log } = await ghostLog(page);
  // The frames since the editor showed the pasted text.
  const pasted = log.findIndex((s) => s.marked);
  const shown = (pasted < 0 ? [] : log.slice(pasted)).map((s) => s.text);
  const first = shown.findIndex((t) => t !== '');
  const streamed = shown.slice(first);
  fs.writeFileSync(path.join(profile.artifacts, 'ghost-frames.json'), JSON.stringify(shown, null, 1));
  for (const text of streamed) {
    check(text !== '', `the ghost text blinked out while it grew: ${JSON.stringify(streamed)}`);
    check(SUGGESTION.startsWith(text), `shown ${JSON.stringify(text)}, not a prefix of the suggestion`);
  }
  check(
    new Set(streamed).size >= 2,
    `the ghost text did not grow while streaming: ${JSON.stringify(streamed)}`,
  );
  await page.keyboard.press('Tab');
  await waitFor('the suggestion to be inserted', async () => {
    const lines = await page.locator('.monaco-editor.focused .view-lines').textContent();
    return lines.replace(/\u00a0/g, ' ').includes('self.x = x');
  });
  await page.keyboard.press('Control+S');
  const expected = TYPED + SUGGESTION;
  await waitFor(
    `${FILE} on disk to be the typed text plus the suggestion`,
    () => fs.readFileSync(file, 'utf8') === expected,
    { timeoutMs: 15_000 },
  ).catch((err) => {
    throw new Error(`${err.message}: ${JSON.stringify(fs.readFileSync(file, 'utf8'))}`);
  });
  const { suggestWidget } = await ghostLog(page);
  check(!suggestWidget, 'the suggest widget showed completion items next to the inline suggestion');
  await changeServerSettings(profile, baseSettings(profile), 'settings changed: startOnEdit=True');
  // Typing on at human speed: VS Code asks 50 ms after each keystroke, and the server, which has started
  // the suggestion from the keystroke's didChange, has it running when the request comes.
  const before = startedFromTheEdit(profile);
  await page.keyboard.press('End');
  await page.keyboard.type('\nreturn', { delay: 120 });
  await waitFor(
    'a request answered from the suggestion its didChange started (earlyMs in the server log)',
    () => startedFromTheEdit(profile) > before,
    { timeoutMs: 20_000 },
  );
}

/** Empties the focused editor and waits until it shows no text (ghost text aside; needs the recorder). */
async function clearEditor(page) {
  await page.keyboard.press('Control+A');
  await page.keyboard.press('Delete');
  await waitFor('the editor to be empty', () =>
    page.evaluate(() => {
      const lines = window.__ghost.typedLines();
      return lines.length === 1 && lines[0].trim() === '';
    }),
  );
}

/** A new window on the settings just written: the server starts with them. Waits for the workbench, not
 * for the page's `load` event. A page that shows no workbench in time is loaded once more: on a starved
 * machine a reload has sat for minutes without opening its connection to code-server, which is no part
 * of what these cases test. */
async function reloadWindow(page) {
  for (let attempt = 1; ; attempt++) {
    try {
      await page.reload({ waitUntil: 'commit', timeout: 60_000 });
      await page.locator('.monaco-workbench').waitFor({ timeout: 60_000 });
      return;
    } catch (err) {
      if (attempt === 2) throw err;
      console.log(`# the window did not load, loading it again: ${err.message.split('\n')[0]}`);
    }
  }
}

async function badModelShowsItsReason(page, profile) {
  const model = path.join(profile.root, 'no-such-model');
  profile.writeSettings({ ...baseSettings(profile), 'lspDscoder.model': model });
  await reloadWindow(page);
  await waitStatus(
    page,
    profile,
    'failed with the reason, naming the model',
    (t) => t.startsWith('dscoder: failed:') && t.includes('no-such-model'),
    60_000,
  );
}

async function serverThatCannotStartShowsItsReason(page, profile) {
  const command = path.join(profile.root, 'no-such-server');
  profile.writeSettings({ ...baseSettings(profile), 'lspDscoder.server.command': command });
  await reloadWindow(page);
  await waitStatus(
    page,
    profile,
    'stopped with the spawn error',
    (t) => t.startsWith('dscoder: stopped: could not start') && t.includes('no-such-server'),
    60_000,
  );
}

async function serverThatExitsBeforeInitializeShowsItsReason(page, profile) {
  // As the real server does on a bad argument: one error line on stderr, then exit status 2. Each start
  // adds a line to `starts`.
  const starts = path.join(profile.root, `starts-${Date.now()}`);
  const script = [
    `require('fs').appendFileSync(${JSON.stringify(starts)}, 'started\\n');`,
    "process.stderr.write('lsp-dscoder: error: unrecognized arguments: --bad\\n');",
    'process.exit(2);',
  ].join(' ');
  profile.writeSettings({
    ...baseSettings(profile),
    'lspDscoder.server.command': process.execPath,
    'lspDscoder.server.args': ['-e', script],
  });
  await reloadWindow(page);
  const text = await waitStatus(
    page,
    profile,
    'stopped with the exit status and the error line',
    (t) => t === 'dscoder: stopped: exited with code 2: lsp-dscoder: error: unrecognized arguments: --bad',
    60_000,
  );
  // A server that ends before `initialize` is not restarted: it would fail the same way.
  const started = () => fs.readFileSync(starts, 'utf8').split('\n').length - 1;
  await staysUnchanged(page, text, () => check(started() === 1, `the server started ${started()} times`));
}

/** A server (node) that answers `initialize` with an error and would then run on; it exits when its
 * stdin closes, as the real one does. */
function refusingServer(marker) {
  const lines = [
    "let input = '';",
    "process.stdin.on('end', () => process.exit(0)).on('data', (chunk) => {",
    '  input += chunk;',
    '  const header = /Content-Length: (\\d+)\\r\\n\\r\\n/.exec(input);',
    '  if (header === null || input.length < header.index + header[0].length + Number(header[1])) return;',
    '  const request = JSON.parse(input.slice(header.index + header[0].length));',
    "  const body = JSON.stringify({ jsonrpc: '2.0', id: request.id, error: { code: -32603, message: 'no GPU here' } });",
    "  input = '';",
    '  process.stdout.write(`Content-Length: ${Buffer.byteLength(body)}\\r\\n\\r\\n${body}`);',
    `}); // ${marker}`,
  ];
  return lines.join('\n');
}

async function serverWhoseInitializeFailsShowsItsError(page, profile) {
  const marker = `lsp-dscoder-e2e-refusing-${process.pid}-${Date.now()}`;
  profile.writeSettings({
    ...baseSettings(profile),
    'lspDscoder.server.command': process.execPath,
    'lspDscoder.server.args': ['-e', refusingServer(marker)],
  });
  await reloadWindow(page);
  const text = await waitStatus(
    page,
    profile,
    "stopped with the server's error",
    (t) => t === 'dscoder: stopped: no GPU here',
    60_000,
  );
  // It cannot serve this window: its process is ended, and not started again.
  await waitFor('the refusing server to be ended', () => processesWith(marker).length === 0, {
    timeoutMs: 10_000,
  });
  await staysUnchanged(page, text, () =>
    check(processesWith(marker).length === 0, 'the refusing server was started again'),
  );
}

/** How long a replaced server must stay gone: its client's restart would follow its exit at once. */
const STAYS_STOPPED_MS = 2_000;

async function settingsChangeWhileStartingReplacesTheServer(page, profile) {
  // A server that never answers `initialize` keeps the client starting, which it cannot stop itself.
  // Like the real one, it exits when its stdin closes (the window that started it went away).
  const marker = `lsp-dscoder-e2e-silent-${process.pid}-${Date.now()}`;
  const silent = `process.stdin.on('end', () => process.exit(0)).resume(); // ${marker}`;
  profile.writeSettings({
    ...baseSettings(profile),
    'lspDscoder.server.command': process.execPath,
    'lspDscoder.server.args': ['-e', silent],
  });
  await reloadWindow(page);
  await waitStatus(
    page,
    profile,
    'starting, with the silent server running',
    (t) => t === 'dscoder: starting' && processesWith(marker).length === 1,
    60_000,
  );
  const command = path.join(profile.root, 'no-such-server');
  profile.writeSettings({ ...baseSettings(profile), 'lspDscoder.server.command': command });
  const text = await waitStatus(
    page,
    profile,
    'stopped with the spawn error of the new command',
    (t) => t.startsWith('dscoder: stopped: could not start') && t.includes('no-such-server'),
    30_000,
  );
  await waitFor('the silent server to be ended', () => processesWith(marker).length === 0, {
    timeoutMs: 10_000,
  }).catch(async (err) => {
    const log = profile.extensionLog().replace(/\n/g, '\n    ');
    throw new Error(`${err.message}; status: ${JSON.stringify(await statusText(page))}\n    ${log}`);
  });
  // The replaced client is not restarted: that would show `starting` again and rerun the old command.
  await staysUnchanged(page, text, () =>
    check(processesWith(marker).length === 0, 'the replaced server was started again'),
  );
}

/** The status keeps `text` (and `also` holds) for STAYS_STOPPED_MS: no restart follows. */
async function staysUnchanged(page, text, also) {
  const until = Date.now() + STAYS_STOPPED_MS;
  while (Date.now() < until) {
    const now = await statusText(page);
    check(now === text, `the status changed after it stopped: ${JSON.stringify([text, now])}`);
    also();
    await new Promise((r) => setTimeout(r, 100));
  }
}

export const CASES = [
  [
    'streamed suggestion is shown as it grows, accepted with Tab and saved',
    streamedSuggestionIsShownAcceptedAndSaved,
  ],
  ['a model that does not load shows failed: <reason>', badModelShowsItsReason],
  ['a server that cannot start shows stopped: <reason>', serverThatCannotStartShowsItsReason],
  [
    'a server that exits before initialize shows stopped: <exit status: its error line>, not restarted',
    serverThatExitsBeforeInitializeShowsItsReason,
  ],
  [
    'a server whose initialize fails shows stopped: <its error>, and its process is ended',
    serverWhoseInitializeFailsShowsItsError,
  ],
  [
    'a settings change while the server starts replaces it: the new outcome stays, the old process ends',
    settingsChangeWhileStartingReplacesTheServer,
  ],
];
