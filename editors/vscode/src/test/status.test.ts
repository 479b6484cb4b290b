import assert from 'node:assert/strict';
import { test } from 'node:test';

import { formatMs, INITIAL, renderStatus } from '../status';

test('starting, then loading with the server\'s progress title and percentage', () => {
  assert.deepEqual(renderStatus(INITIAL), { text: '$(sync~spin) dscoder', tooltip: 'lsp-dscoder: starting' });
  const loading = {
    ...INITIAL,
    phase: 'loading' as const,
    progress: { title: 'Loading model', message: 'layer 3/24', percentage: 12.6 },
  };
  assert.deepEqual(renderStatus(loading), {
    text: '$(sync~spin) dscoder Loading model 13%',
    tooltip: 'lsp-dscoder: loading\nLoading model: layer 3/24',
  });
  const noPct = { ...loading, progress: { title: 'Warming up', message: undefined, percentage: undefined } };
  assert.deepEqual(renderStatus(noPct), {
    text: '$(sync~spin) dscoder Warming up',
    tooltip: 'lsp-dscoder: loading\nWarming up',
  });
});

test('idle and generating show the last time to first token', () => {
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'idle' }), {
    text: '$(sparkle) dscoder',
    tooltip: 'lsp-dscoder: idle',
  });
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'idle', lastTtftMs: 41.6 }), {
    text: '$(sparkle) dscoder 42 ms',
    tooltip: 'lsp-dscoder: idle\nlast time to first token: 42 ms',
  });
  assert.deepEqual(renderStatus({ ...INITIAL, phase: 'generating', lastTtftMs: 7.25 }), {
    text: '$(loading~spin) dscoder 7.3 ms',
    tooltip: 'lsp-dscoder: generating\nlast time to first token: 7.3 ms',
  });
});

test('stopped shows why in the tooltip', () => {
  const v = { ...INITIAL, phase: 'stopped' as const, lastTtftMs: 12, error: 'could not start "x": ENOENT' };
  assert.deepEqual(renderStatus(v), {
    text: '$(error) dscoder',
    tooltip: 'lsp-dscoder: stopped\ncould not start "x": ENOENT',
  });
});

test('formatMs keeps a decimal below 10 ms only', () => {
  assert.equal(formatMs(0.04), '0.0 ms');
  assert.equal(formatMs(9.94), '9.9 ms');
  assert.equal(formatMs(9.96), '10 ms');
  assert.equal(formatMs(10.4), '10 ms');
  assert.equal(formatMs(1234.5), '1235 ms');
});
