import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  formatMs,
  INITIAL,
  Phase,
  renderStatus,
  shortReason,
  withBackend,
  withBusy,
  withProgress,
} from '../status';

const CLICK = 'Click to show the server log.';

test("starting, then loading with the server's progress message and percentage", () => {
  assert.deepEqual(renderStatus(INITIAL), {
    text: '$(sync~spin) dscoder: starting',
    tooltip: `lsp-dscoder: starting\n${CLICK}`,
  });
  // The server runs and has not begun its load progress yet: loading, not idle.
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'loading' }), {
    text: '$(sync~spin) dscoder: loading',
    tooltip: `lsp-dscoder: loading\n${CLICK}`,
  });
  const loading = {
    ...INITIAL,
    phase: 'loading' as const,
    progress: { title: 'dscoder: loading model', message: 'loading weights 3/12', percentage: 12.6 },
  };
  assert.deepEqual(renderStatus(loading), {
    text: '$(sync~spin) dscoder: loading weights 3/12 13%',
    tooltip: `lsp-dscoder: loading\ndscoder: loading model: loading weights 3/12\n${CLICK}`,
  });
  const begun = {
    ...loading,
    progress: { title: 'dscoder: loading model', message: undefined, percentage: undefined },
  };
  assert.deepEqual(renderStatus(begun), {
    text: '$(sync~spin) dscoder: loading',
    tooltip: `lsp-dscoder: loading\ndscoder: loading model\n${CLICK}`,
  });
});

test('idle and generating show the last time to first token', () => {
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'idle' }), {
    text: '$(sparkle) dscoder',
    tooltip: `lsp-dscoder: idle\n${CLICK}`,
  });
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'idle', lastTtftMs: 41.6 }), {
    text: '$(sparkle) dscoder 42 ms',
    tooltip: `lsp-dscoder: idle\nlast time to first token: 42 ms\n${CLICK}`,
  });
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'generating', lastTtftMs: 7.25 }), {
    text: '$(loading~spin) dscoder 7.3 ms',
    tooltip: `lsp-dscoder: generating\nlast time to first token: 7.3 ms\n${CLICK}`,
  });
});

test('failed and stopped show why in the text and the tooltip, and no stale time to first token', () => {
  const failed = {
    ...INITIAL,
    phase: 'failed' as const,
    lastTtftMs: 12,
    error: 'OSError: no config.json in /m',
  };
  assert.deepEqual(renderStatus(failed), {
    text: '$(warning) dscoder: failed: OSError: no config.json in /m',
    tooltip: `lsp-dscoder: failed\nOSError: no config.json in /m\n${CLICK}`,
  });
  const stopped = { ...INITIAL, phase: 'stopped' as const, error: 'could not start "x": ENOENT' };
  assert.deepEqual(renderStatus(stopped), {
    text: '$(error) dscoder: stopped: could not start "x": ENOENT',
    tooltip: `lsp-dscoder: stopped\ncould not start "x": ENOENT\n${CLICK}`,
  });
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'stopped' }), {
    text: '$(error) dscoder: stopped',
    tooltip: `lsp-dscoder: stopped\n${CLICK}`,
  });
});

test('a long or multi-line reason is cut to its first line, 80 characters, in the text only', () => {
  const long = `exited with code 2: lsp-dscoder: error: ${'x'.repeat(100)}\nTraceback`;
  const { text, tooltip } = renderStatus({ ...INITIAL, phase: 'stopped', error: long });
  assert.equal(text, `$(error) dscoder: stopped: ${long.slice(0, 79)}…`);
  assert.equal(shortReason(long).length, 80);
  assert.equal(tooltip, `lsp-dscoder: stopped\n${long}\n${CLICK}`);
});

test('formatMs keeps a decimal below 10 ms only', () => {
  assert.equal(formatMs(0.04), '0.0 ms');
  assert.equal(formatMs(9.94), '9.9 ms');
  assert.equal(formatMs(9.96), '10 ms');
  assert.equal(formatMs(10.4), '10 ms');
  assert.equal(formatMs(1234.5), '1235 ms');
});

test('requests toggle idle/generating only: never hiding loading, failure or a stopped server', () => {
  const phases: Phase[] = ['starting', 'loading', 'idle', 'generating', 'failed', 'stopped'];
  const after = (phase: Phase, generating: boolean) => withBusy({ ...INITIAL, phase }, generating).phase;
  assert.deepEqual(
    phases.map((p) => [after(p, true), after(p, false)]),
    [
      ['starting', 'starting'],
      ['loading', 'loading'],
      ['generating', 'idle'],
      ['generating', 'idle'],
      ['failed', 'failed'],
      ['stopped', 'stopped'],
    ],
  );
  const v = { ...INITIAL, phase: 'idle' as const, lastTtftMs: 30 };
  assert.deepEqual(withBusy(v, true), { ...v, phase: 'generating' });
});

test("the server's load progress: begin, report, and its end with ready or failed: <reason>", () => {
  const title = 'dscoder: loading model';
  const begun = withProgress({ ...INITIAL, error: 'old' }, { kind: 'begin', title, percentage: 0 });
  assert.deepEqual(begun, {
    ...INITIAL,
    phase: 'loading',
    progress: { title, message: undefined, percentage: 0 },
  });
  const report = withProgress(begun, { kind: 'report', message: 'loading weights 3/12' });
  assert.deepEqual(report.progress, { title, message: 'loading weights 3/12', percentage: 0 });
  // A report without a begin changes nothing.
  assert.equal(withProgress(INITIAL, { kind: 'report', message: 'x' }), INITIAL);
  assert.deepEqual(withProgress(report, { kind: 'end', message: 'ready' }), { ...INITIAL, phase: 'idle' });
  assert.deepEqual(withProgress(report, { kind: 'end', message: 'failed: CheckpointError: no /m' }), {
    ...INITIAL,
    phase: 'failed',
    error: 'CheckpointError: no /m',
  });
  assert.deepEqual(withProgress(report, { kind: 'end', message: 'failed:' }), {
    ...INITIAL,
    phase: 'failed',
    error: 'unknown error',
  });
});

test('a remote endpoint that is down: unreachable with its reason until it works again', () => {
  const url = 'http://127.0.0.1:8080';
  const down = {
    backend: 'remote',
    endpoint: url,
    reachable: false,
    error: `nothing is listening at ${url}`,
  };
  const idle = { ...INITIAL, phase: 'idle' as const, lastTtftMs: 30 };
  const out = withBackend(idle, down);
  assert.deepEqual(out, { ...idle, unreachable: `nothing is listening at ${url}` });
  assert.deepEqual(renderStatus(out), {
    text: `$(debug-disconnect) dscoder: unreachable: nothing is listening at ${url}`,
    tooltip: `lsp-dscoder: unreachable\nnothing is listening at ${url}\n${CLICK}`,
  });
  // A request going out or ending does not hide it; the endpoint working again does.
  assert.equal(renderStatus(withBusy(out, true)).text, renderStatus(out).text);
  assert.deepEqual(withBackend(out, { ...down, reachable: true, error: null }), idle);
  assert.deepEqual(renderStatus(withBackend(out, { reachable: true })), renderStatus(idle));
  // Told while the model still loads: shown once it is loaded.
  const loading = withBackend({ ...INITIAL, phase: 'loading' }, down);
  assert.equal(renderStatus(loading).text, '$(sync~spin) dscoder: loading');
  assert.equal(renderStatus({ ...loading, phase: 'idle' }).text, renderStatus(out).text);
  // Without a reason it names the endpoint; a malformed notification changes nothing.
  assert.equal(
    withBackend(idle, { reachable: false, endpoint: url }).unreachable,
    `the completion endpoint ${url} is down`,
  );
  for (const bad of [null, 'down', 3, {}, { reachable: 'no' }]) assert.equal(withBackend(idle, bad), idle);
});
