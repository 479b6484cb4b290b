import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  Anchor,
  cancelOnReplace,
  parsePartial,
  PartialCompletion,
  REQUERY_TRIGGERS,
  RequeryPlan,
  sameAnchor,
  SuggestionStore,
} from '../suggestions';

const URI = 'file:///src/%E4%BD%A0%E5%A5%BD.py';
// Line 2 is `s = "😀你" + ` : the cursor after it is at UTF-16 character 12 (the emoji counts 2).
const AT: Anchor = { uri: URI, version: 7, position: { line: 2, character: 12 } };

function partial(
  requestId: number,
  text: string,
  change: Partial<PartialCompletion> = {},
): PartialCompletion {
  return { requestId, uri: AT.uri, version: AT.version, position: AT.position, text, done: false, ...change };
}

test('parsePartial accepts the documented shape and rejects anything else', () => {
  const ok = {
    requestId: 3,
    uri: URI,
    version: 1,
    position: { line: 0, character: 4 },
    text: 'x',
    done: true,
  };
  assert.deepEqual(parsePartial(ok), ok);
  assert.deepEqual(parsePartial({ ...ok, requestId: 'r-3' }), { ...ok, requestId: 'r-3' });
  assert.equal(parsePartial(null), undefined);
  assert.equal(parsePartial({ ...ok, requestId: 1.5 }), undefined);
  assert.equal(parsePartial({ ...ok, version: '1' }), undefined);
  assert.equal(parsePartial({ ...ok, position: { line: 0 } }), undefined);
  assert.equal(parsePartial({ ...ok, text: undefined }), undefined);
  assert.equal(parsePartial({ ...ok, done: 1 }), undefined);
});

test('sameAnchor compares uri, version, line and UTF-16 character exactly', () => {
  assert.equal(sameAnchor(AT, { ...AT, position: { line: 2, character: 12 } }), true);
  assert.equal(sameAnchor(AT, { ...AT, version: 8 }), false);
  assert.equal(sameAnchor(AT, { ...AT, position: { line: 2, character: 11 } }), false);
  assert.equal(sameAnchor(AT, { ...AT, position: { line: 3, character: 12 } }), false);
  assert.equal(sameAnchor(AT, { ...AT, uri: 'file:///src/other.py' }), false);
});

test('partials grow the suggestion; the first text reports the time to first token', () => {
  const store = new SuggestionStore();
  store.begin(AT, 1000);
  assert.equal(store.has(AT), true);
  assert.equal(store.suggestion(AT), undefined);
  assert.deepEqual(store.onPartial(partial(4, ''), 1010), { changed: false, ttftMs: undefined });
  assert.deepEqual(store.onPartial(partial(4, '"🎉'), 1025), { changed: true, ttftMs: 25 });
  assert.equal(store.suggestion(AT), '"🎉');
  assert.deepEqual(store.onPartial(partial(4, '"🎉世界"\n'), 1030), { changed: true, ttftMs: undefined });
  const same = store.onPartial(partial(4, '"🎉世界"\n'), 1031);
  assert.deepEqual(same, { changed: false, ttftMs: undefined });
  assert.equal(store.suggestion(AT), '"🎉世界"\n');
  assert.equal(store.isFinal(AT), false);
});

test('partials for another version, position or document are stale and ignored', () => {
  const store = new SuggestionStore();
  store.begin(AT, 0);
  const stale = [
    partial(4, 'old', { version: 6 }),
    partial(4, 'left', { position: { line: 2, character: 11 } }),
    partial(4, 'below', { position: { line: 3, character: 12 } }),
    partial(4, 'other', { uri: 'file:///src/other.py' }),
  ];
  for (const p of stale) assert.deepEqual(store.onPartial(p, 5), { changed: false, ttftMs: undefined });
  assert.equal(store.suggestion(AT), undefined);
  // A suggestion is never shown at another version or position than its own.
  store.onPartial(partial(4, 'x = 1'), 6);
  assert.equal(store.suggestion({ ...AT, version: 8 }), undefined);
  assert.equal(store.suggestion({ ...AT, position: { line: 2, character: 13 } }), undefined);
  assert.equal(store.suggestion(AT), 'x = 1');
});

test("a new request replaces the document's suggestion; late partials of older requests are dropped", () => {
  const store = new SuggestionStore();
  store.begin(AT, 0);
  store.onPartial(partial(4, 'abc'), 1);
  const moved: Anchor = { ...AT, version: 8, position: { line: 2, character: 13 } };
  store.begin(moved, 10);
  assert.equal(store.has(AT), false);
  assert.equal(store.suggestion(AT), undefined);
  assert.equal(store.suggestion(moved), undefined);
  assert.equal(store.onPartial(partial(4, 'abcd'), 11).changed, false);
  // The cursor comes back to the first anchor: request 4 (seen before) is over, request 9 is current.
  store.begin(AT, 20);
  assert.equal(store.onPartial(partial(4, 'abcde'), 21).changed, false);
  assert.deepEqual(store.onPartial(partial(9, 'ab'), 22), { changed: true, ttftMs: 2 });
  // Once a request owns the anchor, text from any other request id is ignored.
  assert.equal(store.onPartial(partial(10, 'zz'), 23).changed, false);
  assert.equal(store.suggestion(AT), 'ab');
});

test('the response (first line) does not cut the suggestion; partials after it keep growing it', () => {
  const store = new SuggestionStore();
  store.begin(AT, 100);
  store.onPartial(partial(4, 'return a\n'), 120);
  assert.deepEqual(store.onFinal(AT, 'return a', 130), { changed: false, ttftMs: undefined });
  assert.equal(store.isFinal(AT), true);
  assert.equal(store.suggestion(AT), 'return a\n');
  assert.deepEqual(store.onPartial(partial(4, 'return a\n    b', { done: true }), 140), {
    changed: true,
    ttftMs: undefined,
  });
  assert.equal(store.suggestion(AT), 'return a\n    b');
  assert.deepEqual(store.onFinal(AT, 'again', 150), { changed: false, ttftMs: undefined });
  assert.equal(store.suggestion(AT), 'return a\n    b');
});

test('a response longer than the partials received so far is shown until they catch up', () => {
  const store = new SuggestionStore();
  store.begin(AT, 0);
  store.onPartial(partial(4, 'ret'), 1);
  assert.deepEqual(store.onFinal(AT, 'return a', 2), { changed: true, ttftMs: undefined });
  assert.equal(store.suggestion(AT), 'return a');
  assert.equal(store.onPartial(partial(4, 'return'), 3).changed, false);
  assert.equal(store.suggestion(AT), 'return a');
  assert.equal(store.onPartial(partial(4, 'return a\n'), 4).changed, true);
  assert.equal(store.suggestion(AT), 'return a\n');
});

test('a response without an item clears the suggestion and ends the request', () => {
  const store = new SuggestionStore();
  store.begin(AT, 10);
  store.onPartial(partial(5, 'pa'), 12);
  assert.deepEqual(store.onFinal(AT, undefined, 15), { changed: true, ttftMs: undefined });
  assert.equal(store.suggestion(AT), undefined);
  assert.equal(store.isFinal(AT), true);
  assert.equal(store.onPartial(partial(5, 'pass'), 16).changed, false);
  assert.equal(store.suggestion(AT), undefined);
});

test('a response before any partial reports the time to first token; a stale response is ignored', () => {
  const store = new SuggestionStore();
  store.begin(AT, 50);
  assert.deepEqual(store.onFinal({ ...AT, version: 6 }, 'stale', 60), { changed: false, ttftMs: undefined });
  assert.deepEqual(store.onFinal(AT, 'y', 90), { changed: true, ttftMs: 40 });
  store.forget(AT.uri);
  assert.equal(store.has(AT), false);
  assert.equal(store.suggestion(AT), undefined);
});

test('a replaced request is cancelled unless its document moved to a newer version', () => {
  const moved = { ...AT, position: { line: 2, character: 13 } };
  assert.equal(cancelOnReplace(AT, moved), true); // cursor moved, same version: nobody else stops it
  assert.equal(cancelOnReplace(AT, { ...AT, uri: 'file:///src/other.py', version: 9 }), true);
  assert.equal(cancelOnReplace(AT, AT), true);
  // A keystroke: the server's didChange handling already dropped it, or keeps it for typing through.
  assert.equal(cancelOnReplace(AT, { ...moved, version: 8 }), false);
  assert.equal(cancelOnReplace(AT, { ...AT, version: 8 }), false);
});

test('the re-query is asked for when the text of an automatic answer changed, at its anchor only', () => {
  const plan = new RequeryPlan();
  assert.equal(plan.shouldTrigger(URI, AT, 'x ='), false); // nothing answered
  plan.answered(AT, 'x', false);
  assert.equal(plan.shouldTrigger(URI, AT, 'x'), false); // unchanged
  assert.equal(plan.shouldTrigger(URI, undefined, 'x ='), false); // no editor
  assert.equal(plan.shouldTrigger(URI, { ...AT, version: 8 }, 'x ='), false); // the user typed on
  assert.equal(plan.shouldTrigger(URI, { ...AT, position: { line: 3, character: 0 } }, 'x ='), false);
  assert.equal(plan.shouldTrigger('file:///src/other.py', AT, 'x ='), false);
  assert.equal(plan.shouldTrigger(URI, AT, 'x ='), true);
  assert.equal(plan.shouldTrigger(URI, AT, 'x = x'), false); // on its way
});

test('an answer to be hidden (the server dropped the request) is asked for; nothing answered is not', () => {
  const plan = new RequeryPlan();
  plan.answered(AT, 'pa', false);
  assert.equal(plan.shouldTrigger(URI, AT, undefined), true);
  plan.answered(AT, undefined, false);
  assert.equal(plan.shouldTrigger(URI, AT, undefined), false);
});

test('no trigger while an explicit call waits at the anchor, or after an explicit answer', () => {
  const plan = new RequeryPlan();
  plan.answered(AT, 'x', false);
  const elsewhere = { ...AT, version: 8 };
  plan.explicitBegan(elsewhere); // a call at another anchor will not show this text
  const here = { ...AT };
  plan.explicitBegan(here);
  assert.equal(plan.shouldTrigger(URI, AT, 'x ='), false);
  plan.explicitEnded(here);
  assert.equal(plan.shouldTrigger(URI, AT, 'x ='), true);
  plan.explicitBegan(here);
  plan.explicitEnded(here);
  plan.answered(AT, 'x = x', true); // the last answer VS Code takes here
  assert.equal(plan.shouldTrigger(URI, AT, 'x = x\n'), false);
  plan.explicitEnded(elsewhere);
});

test(`a trigger is sent again when its call did not come or was cancelled, at most ${REQUERY_TRIGGERS} times`, () => {
  assert.equal(REQUERY_TRIGGERS, 3);
  const plan = new RequeryPlan();
  plan.answered(AT, 'x', false);
  assert.equal(plan.shouldTrigger(URI, AT, 'x ='), true);
  plan.retry(URI); // no call came in time
  assert.equal(plan.shouldTrigger(URI, AT, 'x ='), true);
  const call = { ...AT };
  plan.explicitBegan(call); // it came ...
  assert.equal(plan.shouldTrigger(URI, AT, 'x = x'), false);
  plan.explicitEnded(call); // ... and was cancelled unanswered
  assert.equal(plan.shouldTrigger(URI, AT, 'x = x'), true);
  plan.retry(URI);
  assert.equal(plan.shouldTrigger(URI, AT, 'x = x'), false); // the third was the last
  plan.answered(AT, 'x', false); // answered again at the same anchor: the count stays
  assert.equal(plan.shouldTrigger(URI, AT, 'x = x'), false);
  const next = { ...AT, version: 8 };
  plan.answered(next, 'y', false); // a new anchor starts afresh
  assert.equal(plan.shouldTrigger(URI, next, 'y ='), true);
  plan.forget(URI);
  plan.retry(URI);
  assert.equal(plan.shouldTrigger(URI, next, 'y = y'), false);
});
