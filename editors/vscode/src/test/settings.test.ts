import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  DEFAULTS,
  initializationOptions,
  isEnabled,
  usesBundledModel,
  needsRestart,
  readSettings,
  serverConfiguration,
  serverConfigurationChanged,
  serverLaunch,
  Settings,
} from '../settings';

const read = (values: Record<string, unknown>) => readSettings((key) => values[key]);

test('unset settings give the defaults: `lsp-dscoder --stdio` and an empty server section', () => {
  const { settings, problems } = read({});
  assert.deepEqual(settings, DEFAULTS);
  assert.deepEqual(problems, []);
  assert.deepEqual(serverLaunch(settings), { command: 'lsp-dscoder', args: ['--stdio'] });
  assert.deepEqual(initializationOptions(settings), { dscoder: {} });
});

test('the defaults package.json contributes ("", "auto", null, {}) are not sent', () => {
  const { settings, problems } = read({
    'server.command': 'lsp-dscoder',
    'server.args': ['--stdio'],
    model: '',
    device: 'auto',
    dtype: 'auto',
    maxTokens: null,
    serverSettings: {},
  });
  assert.deepEqual(problems, []);
  assert.deepEqual(serverLaunch(settings), { command: 'lsp-dscoder', args: ['--stdio'] });
  assert.deepEqual(initializationOptions(settings), { dscoder: {} });
});

test('server settings go under `dscoder`; the named ones win over serverSettings', () => {
  const { settings, problems } = read({
    'server.command': '/opt/venv/bin/lsp-dscoder',
    'server.args': ['--stdio', '--log-file', '/tmp/dscoder log.txt'],
    model: '/models/deepseek-coder 1.3b',
    device: 'cuda',
    dtype: 'bfloat16',
    maxTokens: 48,
    serverSettings: { responseMode: 'full', maxTokens: 999, suffixTokens: 256 },
  });
  assert.deepEqual(problems, []);
  assert.deepEqual(serverLaunch(settings), {
    command: '/opt/venv/bin/lsp-dscoder',
    args: ['--stdio', '--log-file', '/tmp/dscoder log.txt'],
  });
  assert.deepEqual(initializationOptions(settings), {
    dscoder: {
      responseMode: 'full',
      maxTokens: 48,
      suffixTokens: 256,
      model: '/models/deepseek-coder 1.3b',
      device: 'cuda',
      dtype: 'bfloat16',
    },
  });
});

test('a value of the wrong type falls back to its default with one message each', () => {
  const { settings, problems } = read({
    'server.command': 42,
    'server.args': '--stdio',
    maxTokens: 2.5,
    serverSettings: ['responseMode', 'full'],
    enable: { python: 'yes' },
  });
  assert.deepEqual(settings, DEFAULTS);
  assert.deepEqual(problems, [
    'lspDscoder.server.command: expected a string, got 42; using the default',
    'lspDscoder.server.args: expected an array of strings, got "--stdio"; using the default',
    'lspDscoder.maxTokens: expected a positive integer, got 2.5; using the default',
    'lspDscoder.serverSettings: expected an object, got ["responseMode","full"]; using the default',
    'lspDscoder.enable: expected an object of language id -> boolean, got {"python":"yes"}; using the default',
  ]);
  assert.deepEqual(read({ maxTokens: 0 }).problems, [
    'lspDscoder.maxTokens: expected a positive integer, got 0; using the default',
  ]);
});

test("enable: a listed language wins over `*`, `*` over the model's languages", () => {
  // The bundled model (no model set anywhere) was trained on Python only.
  assert.equal(usesBundledModel(DEFAULTS), true);
  assert.equal(usesBundledModel(read({ model: '' }).settings), true); // "": the bundled model
  assert.deepEqual(
    ['python', 'rust', 'plaintext', 'scminput'].map((l) => isEnabled(DEFAULTS, l)),
    [true, false, false, false],
  );
  // A model of your own (setting, server setting or command line) or a remote backend: every language
  // but plain text and commit messages.
  for (const own of [
    read({ model: '/m/a' }).settings,
    read({ serverSettings: { model: '/m/a' } }).settings,
    read({ 'server.args': ['--stdio', '--model', '/m/a'] }).settings,
    read({ remote: { backend: 'remote', endpoint: 'http://gpu:8000' } }).settings,
  ]) {
    assert.equal(usesBundledModel(own), false, JSON.stringify(own));
    assert.deepEqual(
      ['python', 'rust', 'plaintext', 'scminput'].map((l) => isEnabled(own, l)),
      [true, true, false, false],
    );
  }
  const onlyPython = read({ model: '/m/a', enable: { '*': false, python: true } }).settings;
  assert.equal(isEnabled(onlyPython, 'python'), true);
  assert.equal(isEnabled(onlyPython, 'rust'), false);
  const everything = read({ enable: { '*': true } }).settings;
  assert.equal(isEnabled(everything, 'rust'), true);
  assert.equal(isEnabled(everything, 'plaintext'), true);
  const noStar = read({ enable: { go: false, rust: true } }).settings;
  assert.equal(isEnabled(noStar, 'go'), false);
  assert.equal(isEnabled(noStar, 'rust'), true);
  assert.equal(isEnabled(noStar, 'c'), false); // the bundled model's languages
});

test('only the command line restarts the server; server settings are sent when they change', () => {
  const base: Settings = read({ model: '/m/a' }).settings;
  const changes: [Partial<Settings>, boolean, boolean][] = [
    [{ maxTokens: 12 }, false, true],
    [{ model: '/m/b' }, false, true],
    [{ model: undefined }, false, true],
    [{ device: 'cpu' }, false, true],
    [{ dtype: 'float32' }, false, true],
    [{ serverSettings: { responseMode: 'full' } }, false, true],
    [{ enable: { '*': false } }, false, false],
    [{ serverArgs: ['--stdio', '--log-level', 'debug'] }, true, false],
    [{ serverCommand: 'other' }, true, false],
  ];
  for (const [change, restart, send] of changes) {
    const next = { ...base, ...change };
    assert.equal(needsRestart(base, next), restart, JSON.stringify(change));
    assert.equal(serverConfigurationChanged(base, next), send, JSON.stringify(change));
  }
  // An unset model is left out, so the server goes back to its default (it applies each set in full).
  assert.deepEqual(serverConfiguration({ ...base, model: undefined }), {});
});

test('remote backend keys come only from lspDscoder.remote (machine scope), never from serverSettings', () => {
  const { settings, problems } = read({
    serverSettings: { responseMode: 'full', endpoint: 'http://attacker:80', apiKeyEnv: 'AWS_SECRET' },
    remote: { backend: 'remote', endpoint: 'http://127.0.0.1:8080', suffixTokens: 1 },
  });
  assert.deepEqual(problems, [
    'lspDscoder.serverSettings: endpoint, apiKeyEnv ignored; the remote backend is set in lspDscoder.remote (user settings only)',
  ]);
  assert.deepEqual(serverConfiguration(settings), {
    responseMode: 'full',
    backend: 'remote',
    endpoint: 'http://127.0.0.1:8080',
  });
});
