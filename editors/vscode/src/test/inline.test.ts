/**
 * The inline-completion middleware driven as VS Code drives it (provider calls with their own tokens,
 * the `editor.action.inlineSuggest.trigger` refresh), with partials and responses fed in by hand.
 */

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';

import { PartialCompletion, REQUERY_RETRY_MS } from '../suggestions';
import { fake, FakeEditor, FakePosition, install } from './fake-vscode';
import { DEBOUNCE_MS, InlineSource, TRIGGER } from './inline-source';

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
  /** A provider call: automatic, or explicit (after `editor.action.inlineSuggest.trigger`). */
  const provide = (
    version: number,
    position: FakePosition,
    { explicit = false, vscodeToken = new fake.CancellationTokenSource() } = {},
  ) =>
    inline.middleware.provideInlineCompletionItems(
      doc(version) as never,
      position as never,
      {
        triggerKind: explicit
          ? fake.InlineCompletionTriggerKind.Invoke
          : fake.InlineCompletionTriggerKind.Automatic,
      } as never,
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

test('growing text asks the editor for the re-query once; the explicit call waits for all of it', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(2, AT);
  const first = t.provide(2, AT);
  t.inline.onPartial(t.partial(7, 2, 'ret'));
  assert.deepEqual(await first, items('ret'));
  t.inline.onPartial(t.partial(7, 2, 'retur'));
  t.inline.onPartial(t.partial(7, 2, 'return a'));
  assert.deepEqual(fake.executed, [TRIGGER]); // once, not per partial
  let answer: unknown;
  const requery = t.provide(2, AT, { explicit: true }).then((a) => (answer = a));
  t.inline.onPartial(t.partial(7, 2, 'return a\n  b'));
  t.sent[0].respond(items('return a'));
  await sleep(REQUERY_RETRY_MS + REFRESH_WAIT_MS);
  assert.equal(answer, undefined); // not complete: no done partial yet
  assert.deepEqual(fake.executed, [TRIGGER]); // the re-query came: no second trigger while it waits
  t.inline.onPartial(t.partial(7, 2, 'return a\n  b + 1', true));
  await requery;
  assert.deepEqual(answer, items('return a\n  b + 1'));
  assert.equal(t.sent.length, 1);
  await sleep(REQUERY_RETRY_MS + REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, [TRIGGER]);
});

test('two automatic calls at one anchor both answer at the first text; growth asks for the re-query', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(2, AT);
  const calls = [t.provide(2, AT), t.provide(2, AT)];
  t.inline.onPartial(t.partial(7, 2, 'x'));
  const answers = await Promise.race([Promise.all(calls), sleep(REFRESH_WAIT_MS).then(() => 'waiting')]);
  assert.deepEqual(answers, [items('x'), items('x')]);
  t.inline.onPartial(t.partial(7, 2, 'x ='));
  assert.deepEqual(fake.executed, [TRIGGER]);
  assert.equal(t.sent.length, 1);
});

function vscodeOn(t: ReturnType<typeof setup>, version: number) {
  return new InlineSource({ version, position: AT }, (v, position, explicit, cancel) =>
    t.provide(v, position, { explicit, vscodeToken: cancel }),
  );
}

/** VS Code at version 2 and AT: its automatic fetch, answered with the request's first partial `text`. */
async function shownAutomatically(text: string) {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(2, AT);
  const source = vscodeOn(t, 2);
  const typed = source.fetch(false);
  await sleep(DEBOUNCE_MS);
  t.inline.onPartial(t.partial(7, 2, text));
  await typed;
  return { t, source };
}

test('in VS Code 1.100 the streamed suggestion reaches the screen whole, in two answers', async () => {
  const { t, source } = await shownAutomatically('self');
  assert.deepEqual(source.shown, { version: 2, position: AT, text: 'self', explicit: false });
  for (const text of ['self.x', 'self.x = x', 'self.x = x\n    self.y']) {
    t.inline.onPartial(t.partial(7, 2, text));
    await sleep(5);
  }
  t.sent[0].respond(items('self.x = x'));
  t.inline.onPartial(t.partial(7, 2, 'self.x = x\n    self.y = y', true));
  await sleep(REFRESH_WAIT_MS);
  assert.deepEqual(source.shown, {
    version: 2,
    position: AT,
    text: 'self.x = x\n    self.y = y',
    explicit: true,
  });
  assert.deepEqual(source.fetches, [
    { version: 2, explicit: false },
    { version: 2, explicit: true },
  ]);
  assert.equal(t.sent.length, 1);
});

test('a trigger that crosses a keystroke lands on the new version: that call shows all of it', async () => {
  const { t, source } = await shownAutomatically('self');
  // The user types `self.`; this side still sees version 2 when the text grows, and triggers.
  const after = { line: AT.line, character: AT.character + 5 };
  void source.type(3, after);
  t.inline.onPartial(t.partial(7, 2, 'self.'));
  assert.deepEqual(fake.executed, [TRIGGER]);
  fake.window.activeTextEditor = t.editorAt(3, after);
  // The explicit fetch replaced the debounced automatic one: the only answer VS Code takes at version 3.
  assert.deepEqual(source.fetches.at(-1), { version: 3, explicit: true });
  assert.deepEqual([t.sent.length, t.sent[1].position], [2, after]);
  const partial3 = (text: string, done = false) => ({ ...t.partial(8, 3, text, done), position: after });
  t.inline.onPartial(partial3('x ='));
  t.inline.onPartial(partial3('x = x'));
  t.sent[1].respond(items('x = x', after));
  await sleep(REFRESH_WAIT_MS);
  assert.equal(source.shown?.version, 2); // still waiting for all of it
  t.inline.onPartial(partial3('x = x\n    self.y = y', true));
  await sleep(REFRESH_WAIT_MS);
  assert.deepEqual(source.shown, {
    version: 3,
    position: after,
    text: 'x = x\n    self.y = y',
    explicit: true,
  });
  assert.deepEqual(source.fetches, [
    { version: 2, explicit: false },
    { version: 3, explicit: true },
  ]);
  assert.deepEqual(fake.executed, [TRIGGER]);
});

test('a trigger that brings no call is sent again after REQUERY_RETRY_MS', async () => {
  const { t, source } = await shownAutomatically('x');
  source.dropTriggers = 1;
  t.inline.onPartial(t.partial(7, 2, 'x = x', true));
  assert.deepEqual(fake.executed, [TRIGGER]);
  t.sent[0].respond(items('x = x'));
  await sleep(REQUERY_RETRY_MS / 2);
  assert.deepEqual(fake.executed, [TRIGGER]);
  await sleep(REQUERY_RETRY_MS / 2 + REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, [TRIGGER, TRIGGER]);
  assert.deepEqual(source.shown, { version: 2, position: AT, text: 'x = x', explicit: true });
  await sleep(REQUERY_RETRY_MS + REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, [TRIGGER, TRIGGER]);
});

test('a re-query VS Code cancels unanswered is asked again while the cursor stays, not after it moved', async () => {
  const { t, source } = await shownAutomatically('x');
  t.inline.onPartial(t.partial(7, 2, 'x ='));
  assert.deepEqual(source.fetches.at(-1), { version: 2, explicit: true });
  source.cancel();
  await sleep(REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, [TRIGGER]); // not at once: a keystroke may be on its way
  await sleep(REQUERY_RETRY_MS);
  assert.deepEqual(fake.executed, [TRIGGER, TRIGGER]);
  assert.equal(source.fetches.length, 3);
  source.cancel();
  fake.window.activeTextEditor = t.editorAt(2, { line: 4, character: 0 }); // the cursor moved
  await sleep(REQUERY_RETRY_MS + REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, [TRIGGER, TRIGGER]);
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
  assert.deepEqual(fake.executed, [TRIGGER]);
  // Complete: the re-query is answered at once.
  assert.deepEqual(await t.provide(2, AT, { explicit: true }), items('return a\n    b'));
});

test('stale partials (older version, other position) change nothing and trigger nothing', async () => {
  const t = setup();
  fake.window.activeTextEditor = t.editorAt(3, AT);
  const call = t.provide(3, AT);
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
  const call = t.provide(2, AT, { vscodeToken });
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
  assert.deepEqual(fake.executed, [TRIGGER]);
  assert.equal(await again.provide(2, AT, { explicit: true }), undefined);
  assert.equal(again.sent.length, 1);
  await sleep(REQUERY_RETRY_MS + REFRESH_WAIT_MS);
  assert.deepEqual(fake.executed, [TRIGGER]); // VS Code took the empty answer: nothing more to ask
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
