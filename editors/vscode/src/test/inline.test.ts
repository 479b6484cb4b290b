/**
 * The inline-completion middleware driven as VS Code drives it (provider calls with their own tokens,
 * the `editor.action.inlineSuggest.trigger` refresh), with partials and responses fed in by hand.
 */

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';

import type { PartialCompletion } from '../suggestions';
import { fake, FakeEditor, FakePosition, install } from './fake-vscode';

install();
const { InlineStreaming } = require('../inline') as typeof import('../inline');

const URI = 'file:///w/%F0%9F%98%80.py';
const AT: FakePosition = { line: 3, character: 9 };
const REFRESH_WAIT_MS = 60;

type Token = { isCancellationRequested: boolean };
interface Sent {
  position: FakePosition;
  token: Token;
  respond(items: unknown): void;
}

const live: { dispose(): void }[] = [];
afterEach(() => {
  for (const inline of live.splice(0)) inline.dispose(); // no refresh timer outlives its test
  fake.window.activeTextEditor = undefined;
  fake.onCommand = undefined;
});

function setup() {
  fake.executed.length = 0;
  const events = { busy: [] as boolean[], ttft: [] as number[] };
  const inline = new InlineStreaming((languageId) => languageId !== 'plaintext', {
    busy: (generating) => events.busy.push(generating),
    ttft: (ms) => events.ttft.push(ms),
  });
  live.push(inline);
  const sent: Sent[] = [];
  // The client's own provider: records the LSP request and lets the test answer it.
  const next = (_doc: unknown, position: FakePosition, _ctx: unknown, token: Token) =>
    new Promise((respond) => sent.push({ position, token, respond }));
  const doc = (version: number, languageId = 'python') => ({
    uri: { toString: () => URI },
    version,
    languageId,
  });
  const provide = (
    version: number,
    position: FakePosition,
    vscodeToken = new fake.CancellationTokenSource(),
  ) =>
    inline.middleware.provideInlineCompletionItems(
      doc(version) as never,
      position as never,
      {} as never,
      vscodeToken.token as never,
      next as never,
    ) as Promise<{ insertText: string; range: { start: FakePosition; end: FakePosition } }[] | undefined>;
  const partial = (requestId: number, version: number, text: string, done = false): PartialCompletion => ({
    requestId,
    uri: URI,
    version,
    position: AT,
    text,
    done,
  });
  const editorAt = (version: number, position: FakePosition): FakeEditor => ({
    document: doc(version),
    selection: { active: position },
  });
  return { inline, events, sent, next, doc, provide, partial, editorAt };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const items = (text: string, at = AT) => [new fake.InlineCompletionItem(text, new fake.Range(at, at))];

test('the first call waits for the first partial; the LSP request has its own token', async () => {
  const t = setup();
  const call = t.provide(2, AT);
  assert.equal(t.sent.length, 1);
  assert.deepEqual(t.events.busy, [true]);
  t.inline.onPartial(t.partial(7, 2, ''));
  t.inline.onPartial(t.partial(7, 2, 'ret'));
  assert.deepEqual(await call, items('ret'));
  assert.equal(t.events.ttft.length, 1);
  assert.equal(t.sent[0].token.isCancellationRequested, false);
});

test('growing text re-queries the editor once; that call waits for the whole suggestion', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(2, AT);
  const first = t.provide(2, AT);
  t.inline.onPartial(t.partial(7, 2, 'ret'));
  assert.deepEqual(await first, items('ret'));
  t.inline.onPartial(t.partial(7, 2, 'retur'));
  t.inline.onPartial(t.partial(7, 2, 'return a'));
  assert.deepEqual(fake.executed, ['editor.action.inlineSuggest.trigger']); // once, not per partial
  let answer: unknown;
  const requery = t.provide(2, AT).then((a) => (answer = a));
  t.inline.onPartial(t.partial(7, 2, 'return a\n  b'));
  t.sent[0].respond(items('return a'));
  await sleep(REFRESH_WAIT_MS);
  assert.equal(answer, undefined); // not complete: no done partial yet
  t.inline.onPartial(t.partial(7, 2, 'return a\n  b + 1', true));
  await requery;
  assert.deepEqual(answer, items('return a\n  b + 1'));
  assert.equal(t.sent.length, 1);
  assert.deepEqual(fake.executed, ['editor.action.inlineSuggest.trigger']);
});

/**
 * VS Code 1.100's inline-completion source, as far as re-queries go: a fetch at the version and cursor of
 * the shown result is skipped when that result came from an explicit request or the new one is automatic
 * (`UpdateRequest.satisfies`); `editor.action.inlineSuggest.trigger` fetches explicitly.
 */
class InlineSource {
  shown: { text: string | undefined; explicit: boolean } | undefined;
  fetches = 0;

  constructor(private readonly provide: () => Promise<{ insertText: string }[] | undefined>) {
    fake.onCommand = (command) => {
      if (command === 'editor.action.inlineSuggest.trigger') void this.fetch(true);
    };
  }

  async fetch(explicit: boolean): Promise<void> {
    if (this.shown !== undefined && (this.shown.explicit || !explicit)) return; // "satisfied"
    this.fetches += 1;
    const result = await this.provide();
    this.shown = { text: result?.[0]?.insertText, explicit };
  }
}

test('in VS Code 1.100 the streamed suggestion reaches the screen whole, in two answers', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(2, AT);
  const source = new InlineSource(() => t.provide(2, AT));
  const typed = source.fetch(false);
  t.inline.onPartial(t.partial(7, 2, 'self'));
  await typed;
  assert.deepEqual(source.shown, { text: 'self', explicit: false });
  for (const text of ['self.x', 'self.x = x', 'self.x = x\n    self.y']) {
    t.inline.onPartial(t.partial(7, 2, text));
    await sleep(5);
  }
  t.sent[0].respond(items('self.x = x'));
  t.inline.onPartial(t.partial(7, 2, 'self.x = x\n    self.y = y', true));
  await sleep(REFRESH_WAIT_MS);
  assert.deepEqual(source.shown, { text: 'self.x = x\n    self.y = y', explicit: true });
  assert.equal(source.fetches, 2);
  assert.equal(t.sent.length, 1);
});

test('after the response (first line) the partials keep growing the suggestion, in its range', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(2, AT);
  const first = t.provide(2, AT);
  t.inline.onPartial(t.partial(7, 2, 'return a'));
  await first;
  t.sent[0].respond([new fake.InlineCompletionItem('return a', new fake.Range(AT, AT))]);
  await sleep(0);
  assert.deepEqual(t.events.busy, [true, false]);
  t.inline.onPartial(t.partial(7, 2, 'return a\n    b', true));
  assert.deepEqual(fake.executed, ['editor.action.inlineSuggest.trigger']);
  assert.deepEqual(await t.provide(2, AT), items('return a\n    b')); // complete: answered at once
});

test('stale partials (older version, other position) change nothing and trigger nothing', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(3, AT);
  const call = t.provide(3, AT, new fake.CancellationTokenSource());
  t.inline.onPartial(t.partial(7, 2, 'old'));
  t.inline.onPartial({ ...t.partial(7, 3, 'moved'), position: { line: 3, character: 8 } });
  await sleep(REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, []);
  t.inline.onPartial(t.partial(8, 3, 'new'));
  assert.deepEqual(await call, items('new'));
});

test('a cursor move cancels the request in flight; a keystroke leaves it to the server', async () => {
  const t = setup();
  void t.provide(2, AT);
  const moved = { line: 4, character: 0 };
  void t.provide(2, moved); // same version, other position
  assert.deepEqual([t.sent[0].token.isCancellationRequested, t.sent[1].position], [true, moved]);
  void t.provide(3, { line: 4, character: 1 }); // the user typed
  assert.equal(t.sent[1].token.isCancellationRequested, false);
  assert.equal(t.sent.length, 3);
  t.inline.dispose(); // the client stops: what is in flight is cancelled
  assert.equal(t.sent[2].token.isCancellationRequested, true);
});

test('VS Code giving up on a call does not cancel the request; the next call gets its text', async () => {
  const t = setup();
  const vscodeToken = new fake.CancellationTokenSource();
  const call = t.provide(2, AT, vscodeToken);
  vscodeToken.cancel();
  assert.equal(await call, undefined);
  assert.equal(t.sent[0].token.isCancellationRequested, false);
  t.inline.onPartial(t.partial(7, 2, 'x = 1'));
  assert.deepEqual(await t.provide(2, AT), items('x = 1'));
  assert.equal(t.sent.length, 1);
});

test('a response without items ends the wait with nothing and hides what was streamed', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(2, AT);
  const call = t.provide(2, AT);
  t.sent[0].respond(null);
  assert.equal(await call, undefined);
  const again = setup();
  fake.window.activeTextEditor = again.editorAt(2, AT);
  const first = again.provide(2, AT);
  again.inline.onPartial(again.partial(7, 2, 'pa'));
  await first;
  again.sent[0].respond(null); // the server dropped it: the document changed meanwhile
  await sleep(REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, ['editor.action.inlineSuggest.trigger']);
  assert.equal(await again.provide(2, AT), undefined);
  assert.equal(again.sent.length, 1);
});

test('disabled languages get no request; closing a document cancels its request', async () => {
  const t = setup();
  const plain = t.inline.middleware.provideInlineCompletionItems(
    t.doc(1, 'plaintext') as never,
    AT as never,
    {} as never,
    new fake.CancellationTokenSource().token as never,
    t.next as never,
  );
  assert.equal(await plain, undefined);
  assert.equal(t.sent.length, 0);
  const call = t.provide(2, AT);
  t.inline.forget(URI);
  assert.equal(t.sent[0].token.isCancellationRequested, true);
  t.inline.onPartial(t.partial(7, 2, 'late'));
  assert.deepEqual(t.events.busy, [true, false]);
  void call;
});
