import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  DEFAULTS,
  initializationOptions,
  isEnabled,
  needsRestart,
  readSettings,
  serverLaunch,
  Settings,
} from '../settings';

const read = (values: Record<string, unknown>) => readSettings((key) => values[key]);

test('unset settings give the defaults and start `lsp-dscoder --stdio`', () => {
  const { settings, problems } = read({});
  assert.deepEqual(settings, DEFAULTS);
  assert.deepEqual(problems, []);
  assert.deepEqual(serverLaunch(settings), { command: 'lsp-dscoder', args: ['--stdio'] });
  assert.deepEqual(initializationOptions(settings), {});
});

test('the values as contributed by package.json defaults ("", "auto", null) mean "not passed"', () => {
  const { settings, problems } = read({
    'server.command': 'lsp-dscoder',
    'server.args': ['--stdio'],
    model: '',
    device: 'auto',
    dtype: 'auto',
    maxTokens: null,
  });
  assert.deepEqual(problems, []);
  assert.deepEqual(serverLaunch(settings), { command: 'lsp-dscoder', args: ['--stdio'] });
  assert.deepEqual(initializationOptions(settings), {});
});

test('model, device and dtype become flags after the server args; maxTokens an initialization option', () => {
  const { settings, problems } = read({
    'server.command': '/opt/venv/bin/lsp-dscoder',
    'server.args': ['--stdio', '--log-file', '/tmp/dscoder log.txt'],
    model: '/models/deepseek-coder 1.3b',
    device: 'cuda',
    dtype: 'bfloat16',
    maxTokens: 48,
  });
  assert.deepEqual(problems, []);
  assert.deepEqual(serverLaunch(settings), {
    command: '/opt/venv/bin/lsp-dscoder',
    args: [
      '--stdio',
      '--log-file',
      '/tmp/dscoder log.txt',
      '--model',
      '/models/deepseek-coder 1.3b',
      '--device',
      'cuda',
      '--dtype',
      'bfloat16',
    ],
  });
  assert.deepEqual(initializationOptions(settings), { maxTokens: 48 });
});

test('a value of the wrong type falls back to its default with one message each', () => {
  const { settings, problems } = read({
    'server.command': 42,
    'server.args': '--stdio',
    maxTokens: 2.5,
    enable: { python: 'yes' },
  });
  assert.deepEqual(settings, DEFAULTS);
  assert.deepEqual(problems, [
    'lspDscoder.server.command: expected a string, got 42; using the default',
    'lspDscoder.server.args: expected an array of strings, got "--stdio"; using the default',
    'lspDscoder.maxTokens: expected a positive integer, got 2.5; using the default',
    'lspDscoder.enable: expected an object of language id -> boolean, got {"python":"yes"}; using the default',
  ]);
  assert.deepEqual(read({ maxTokens: 0 }).problems, [
    'lspDscoder.maxTokens: expected a positive integer, got 0; using the default',
  ]);
});

test('enable: a listed language wins over `*`, unlisted languages follow `*`', () => {
  assert.equal(isEnabled(DEFAULTS, 'python'), true);
  assert.equal(isEnabled(DEFAULTS, 'plaintext'), false);
  assert.equal(isEnabled(DEFAULTS, 'scminput'), false);
  const onlyPython = read({ enable: { '*': false, python: true } }).settings;
  assert.equal(isEnabled(onlyPython, 'python'), true);
  assert.equal(isEnabled(onlyPython, 'rust'), false);
  const noStar = read({ enable: { go: false } }).settings;
  assert.equal(isEnabled(noStar, 'go'), false);
  assert.equal(isEnabled(noStar, 'c'), true);
});

test('only settings on the command line need a server restart', () => {
  const base: Settings = read({ model: '/m/a' }).settings;
  assert.equal(needsRestart(base, { ...base, maxTokens: 12 }), false);
  assert.equal(needsRestart(base, { ...base, enable: { '*': false } }), false);
  assert.equal(needsRestart(base, { ...base, model: '/m/b' }), true);
  assert.equal(needsRestart(base, { ...base, device: 'cpu' }), true);
  assert.equal(needsRestart(base, { ...base, dtype: 'float32' }), true);
  assert.equal(needsRestart(base, { ...base, serverArgs: ['--stdio', '-v'] }), true);
  assert.equal(needsRestart(base, { ...base, serverCommand: 'other' }), true);
});
