/**
 * The real server over stdio, driven with the exchange the extension performs: initialize (with
 * vscode-languageclient's capabilities), initialized, didOpen, didChange, inlineCompletion, and
 * `$/cancelRequest` when a newer request replaces one. The tiny checkpoint writes deterministic
 * gibberish, so expectations are derived from what the server sent, never guessed.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
  CancellationTokenSource,
  Message,
  NotificationMessage,
  RequestMessage,
  ResponseMessage,
} from 'vscode-jsonrpc/node';

import {
  initializationOptions,
  readSettings,
  SERVER_SECTION,
  serverConfiguration,
  Settings,
} from '../settings';
import {
  Anchor,
  PARTIAL_COMPLETION_METHOD,
  PartialCompletion,
  Position,
  SuggestionStore,
} from '../suggestions';
import { Session, testModel } from './lsp';

const LOAD_MS = 240_000; // torch import + checkpoint load + warm-up on a busy 2-core CI machine
const REQUEST_MS = 60_000;

/** The capabilities vscode-languageclient 11 advertises that the server reads. */
const CLIENT_CAPABILITIES = {
  general: {
    positionEncodings: ['utf-16'],
    staleRequestSupport: { cancel: true, retryOnContentModified: [] },
  },
  window: {
    workDoneProgress: true,
    showMessage: { messageActionItem: { additionalPropertiesSupport: true } },
  },
  workspace: { configuration: true, didChangeConfiguration: { dynamicRegistration: true } },
  textDocument: {
    synchronization: { dynamicRegistration: true, willSave: true, willSaveWaitUntil: true, didSave: true },
    inlineCompletion: { dynamicRegistration: true },
  },
};

// The cursor goes at the end of the last line: UTF-16 character 35 (34 code points: the emoji counts 2).
const SOURCE = [
  'import os',
  '',
  'GREETING = "世界"',
  '',
  '',
  'def main(path):',
  '    label = "你好 😀" + os.path.join(',
];

type ServerStats = { engineState: string; engineError: string | null; settings: Record<string, unknown> };
type InlineResult = { items: { insertText: string; range: { start: Position; end: Position } }[] } | null;

/** The server's first-line rule: the text up to the end of its first non-blank line. */
function firstLine(text: string): string {
  let start = 0;
  for (let end = text.indexOf('\n'); end >= 0; end = text.indexOf('\n', start)) {
    if (text.slice(start, end).trim() !== '') return text.slice(0, end);
    start = end + 1;
  }
  return text;
}

describe(
  'lsp-dscoder over stdio, as the extension talks to it',
  { timeout: LOAD_MS + 6 * REQUEST_MS },
  () => {
    let session: Session;
    let cleanup: () => void = () => undefined;
    // The extension's settings; its middleware answers `workspace/configuration` for the server's section.
    let settings: Settings = readSettings((key) => ({ maxTokens: 24 })[key]).settings;
    let docs = 0;
    const uriOf = (n: number): string => `file:///work/demo/module_${n}.py`;

    before(async () => {
      const model = testModel();
      cleanup = model.cleanup;
      session = new Session('lsp-dscoder', ['--stdio', '--model', model.folder], (section) =>
        section === SERVER_SECTION ? serverConfiguration(settings) : null,
      );
      const { id } = session.request('initialize', {
        processId: process.pid,
        clientInfo: { name: 'Visual Studio Code', version: '1.91.0' },
        rootUri: null,
        capabilities: CLIENT_CAPABILITIES,
        initializationOptions: initializationOptions(settings),
        workspaceFolders: null,
      });
      const init = (await session.response(id, LOAD_MS)).result as { capabilities: Record<string, unknown> };
      assert.ok(init.capabilities.inlineCompletionProvider, JSON.stringify(init.capabilities));
      assert.equal((init.capabilities.textDocumentSync as { change: number }).change, 2); // incremental
      await session.notify('initialized', {});
      const end = await session.waitFor('the model load to end', LOAD_MS, (m) => isProgress(m, 'end'));
      const begin = session.received.find((m) => isProgress(m, 'begin')) as { params: Progress } | undefined;
      assert.deepEqual(begin?.params.value, { kind: 'begin', title: 'dscoder: loading model' });
      assert.deepEqual(end.params, { token: begin?.params.token, value: { kind: 'end', message: 'ready' } });
      // What the extension asks at the end of the load; and the settings it sent arrived, without complaint.
      const stats = await serverStats();
      assert.deepEqual([stats.engineState, stats.engineError, stats.settings.maxTokens], ['ready', null, 24]);
      assert.deepEqual(session.notifications('window/showMessage'), []);
    });

    after(async () => {
      if (session !== undefined) assert.equal(await session.close(10_000), 0);
      cleanup();
    });

    /** A new document holding `SOURCE` at version 1; returns its uri and the end of its last line. The
     * previous one is closed first: open documents are part of the prompt, and each test has its own. */
    async function open(): Promise<{ uri: string; end: Position }> {
      if (docs > 0) await session.notify('textDocument/didClose', { textDocument: { uri: uriOf(docs) } });
      const uri = uriOf(++docs);
      const text = SOURCE.join('\n') + '\n';
      await session.notify('textDocument/didOpen', {
        textDocument: { uri, languageId: 'python', version: 1, text },
      });
      const line = SOURCE.length - 1;
      return { uri, end: { line, character: SOURCE[line].length } };
    }

    async function insert(uri: string, version: number, at: Position, text: string): Promise<void> {
      const range = { start: at, end: at };
      await session.notify('textDocument/didChange', {
        textDocument: { uri, version },
        contentChanges: [{ range, rangeLength: 0, text }],
      });
    }

    function inline(uri: string, position: Position, token?: CancellationTokenSource) {
      const params = { textDocument: { uri }, position, context: { triggerKind: 2 } };
      return session.request<InlineResult>('textDocument/inlineCompletion', params, token?.token);
    }

    function partialsOf(id: number): { message: NotificationMessage; params: PartialCompletion }[] {
      return session
        .notifications(PARTIAL_COMPLETION_METHOD)
        .map((message) => ({ message, params: message.params as PartialCompletion }))
        .filter((p) => p.params.requestId === id);
    }

    async function serverStats(): Promise<ServerStats> {
      const { id } = session.request('dscoder/stats', null);
      return (await session.response(id, REQUEST_MS)).result as ServerStats;
    }

    /** Polls `dscoder/stats` (bounded) until `ok` holds, for settings the server applies asynchronously. */
    async function statsUntil(ok: (s: ServerStats) => boolean): Promise<ServerStats> {
      const deadline = Date.now() + REQUEST_MS;
      let stats = await serverStats();
      while (!ok(stats) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 20));
        stats = await serverStats();
      }
      return stats;
    }

    /** What the extension's store shows at `anchor` after each message, replaying them in arrival order
     * from the request `id` on (distinct consecutive values only). */
    function replay(id: number, anchor: Anchor): (string | undefined)[] {
      const store = new SuggestionStore();
      store.begin(anchor, 0);
      const shown: (string | undefined)[] = [];
      for (const m of session.received) {
        if (Message.isNotification(m) && m.method === PARTIAL_COMPLETION_METHOD) {
          store.onPartial(m.params as PartialCompletion, 1);
        } else if (Message.isResponse(m) && m.id === id) {
          store.onFinal(anchor, (m.result as InlineResult)?.items[0]?.insertText, 1);
        } else continue;
        const now = store.suggestion(anchor);
        if (now !== shown[shown.length - 1]) shown.push(now);
      }
      return shown;
    }

    /** Waits for the request's response and, if it streamed, its last (`done`) partial. */
    async function settled(id: number): Promise<ResponseMessage> {
      const response = await session.response(id, REQUEST_MS);
      if (partialsOf(id).length > 0 && response.error === undefined) {
        await session.waitFor(`the done partial of ${id}`, REQUEST_MS, (m) => {
          const p = m as NotificationMessage;
          return (
            p.method === PARTIAL_COMPLETION_METHOD &&
            (p.params as PartialCompletion).requestId === id &&
            (p.params as PartialCompletion).done
          );
        });
      }
      return response;
    }

    test('partials stream in order; the response is the first line; the rest streams after it', async () => {
      assert.deepEqual([SOURCE[6].length, [...SOURCE[6]].length], [35, 34]);
      const { uri, end } = await open();
      await insert(uri, 2, end, 'u'); // typed after didOpen, as an editor does
      const at = { line: end.line, character: end.character + 1 };
      const { id } = inline(uri, at);
      const response = await settled(id);
      const partials = partialsOf(id);
      for (const { params } of partials) {
        assert.deepEqual(
          {
            requestId: params.requestId,
            uri: params.uri,
            version: params.version,
            position: params.position,
          },
          { requestId: id, uri, version: 2, position: at },
        );
      }
      // Each partial holds the whole suggestion so far, only ever extended; the last one, alone, is done.
      for (let i = 1; i < partials.length; i++) {
        const [prev, cur] = [partials[i - 1].params, partials[i].params];
        assert.ok(
          cur.text.startsWith(prev.text) && (cur.text !== prev.text || cur.done),
          JSON.stringify([prev, cur]),
        );
      }
      assert.deepEqual(
        partials.map((p) => p.params.done),
        partials.map((_, i) => i === partials.length - 1),
      );
      const [before, after] = [0, 1].map((side) =>
        partials.filter((p) => session.indexOf(p.message) > session.indexOf(response) === (side === 1)),
      );
      assert.ok(
        before.length > 0 && after.length > 0,
        `${before.length} partials before, ${after.length} after`,
      );
      // The response is the first line of what had streamed when it was sent; the rest followed it.
      const shown = before[before.length - 1].params.text;
      const final = partials[partials.length - 1].params.text;
      assert.deepEqual(response.result, {
        items: [{ insertText: firstLine(shown), range: { start: at, end: at } }],
      });
      assert.equal(firstLine(final), firstLine(shown));
      assert.notEqual(final, firstLine(final), `one line: ${JSON.stringify(final)}; pick another typed text`);
      // The extension shows every streamed text in turn, not cut back to the response's first line.
      const texts = [...new Set(partials.map((p) => p.params.text))].filter((t) => t !== '');
      assert.deepEqual(replay(id, { uri, version: 2, position: at }), texts);
    });

    test('the cursor moves: the replaced request is cancelled (-32800), the new one streams', async () => {
      const { uri, end } = await open();
      await insert(uri, 2, end, ' p');
      const at = { line: end.line, character: end.character + 2 };
      const cancel = new CancellationTokenSource();
      const first = inline(uri, at, cancel);
      // What the extension does when VS Code asks at another position of the same version.
      cancel.cancel();
      const moved = { line: 5, character: SOURCE[5].length };
      const second = inline(uri, moved);
      const response = await session.response(first.id, REQUEST_MS);
      assert.deepEqual(response.error?.code, -32800);
      assert.equal(response.result, undefined);
      for (const p of partialsOf(first.id)) assert.ok(session.indexOf(p.message) < session.indexOf(response));
      await settled(second.id);
      const partials = partialsOf(second.id);
      assert.ok(partials.length > 0);
      for (const { params } of partials) assert.deepEqual([params.version, params.position], [2, moved]);
    });

    test('the document changes before the answer: no result, no old-version partial after it', async () => {
      const { uri, end } = await open();
      await insert(uri, 2, end, ' p');
      const at = { line: end.line, character: end.character + 2 };
      const first = inline(uri, at);
      // A keystroke that does not continue the suggestion; the extension sends no cancel for it.
      await insert(uri, 3, { line: 0, character: 0 }, '#');
      const second = inline(uri, at);
      const response = await session.response(first.id, REQUEST_MS);
      assert.deepEqual([response.error, response.result], [undefined, null]);
      for (const p of partialsOf(first.id)) {
        assert.equal(p.params.version, 2);
        assert.ok(session.indexOf(p.message) < session.indexOf(response));
      }
      await settled(second.id);
      assert.ok(partialsOf(second.id).length > 0);
      for (const p of partialsOf(second.id)) assert.equal(p.params.version, 3);
    });

    test('typing through the suggestion: the next request streams the rest of it', async () => {
      const { uri, end } = await open();
      await insert(uri, 2, end, ' p');
      const at = { line: end.line, character: end.character + 2 };
      const first = inline(uri, at);
      await settled(first.id);
      const suggestion = partialsOf(first.id).at(-1)!.params.text;
      const typed = suggestion[0];
      assert.notEqual(typed, '\n', `the suggestion starts a new line: ${JSON.stringify(suggestion)}`);
      await insert(uri, 3, at, typed);
      const next = { line: at.line, character: at.character + typed.length };
      const { id } = inline(uri, next);
      const response = await settled(id);
      const partials = partialsOf(id);
      assert.deepEqual(partials.at(-1)!.params, {
        requestId: id,
        uri,
        version: 3,
        position: next,
        text: suggestion.slice(typed.length),
        done: true,
      });
      const rest = firstLine(suggestion.slice(typed.length));
      assert.deepEqual(
        response.result,
        rest === '' ? null : { items: [{ insertText: rest, range: { start: next, end: next } }] },
      );
      assert.equal(
        replay(id, { uri, version: 3, position: next }).at(-1),
        suggestion.slice(typed.length) || undefined,
      );
    });

    test('settings changes as the extension sends them; cleared ones return to the default', async () => {
      const change = async (values: Record<string, unknown>) => {
        settings = readSettings((key) => values[key]).settings;
        await session.notify('workspace/didChangeConfiguration', {
          settings: initializationOptions(settings),
        });
      };
      await change({ maxTokens: 16, serverSettings: { responseMode: 'full' } });
      let stats = await statsUntil((s) => s.settings.maxTokens === 16);
      assert.deepEqual([stats.settings.maxTokens, stats.settings.responseMode], [16, 'full']);
      // All cleared: `{dscoder: {}}`; the server asks for its section and gets {} from the extension.
      await change({});
      stats = await statsUntil((s) => s.settings.maxTokens !== 16);
      assert.deepEqual([stats.settings.maxTokens, stats.settings.responseMode], [128, 'firstLine']);
      const asked = session.received.filter((m): m is RequestMessage => Message.isRequest(m));
      assert.deepEqual(
        asked.map((m) => [m.method, m.params]),
        [
          ['window/workDoneProgress/create', { token: 'dscoder-load-1' }],
          ['workspace/configuration', { items: [{ section: 'dscoder' }] }],
        ],
      );
      assert.deepEqual(session.notifications('window/showMessage'), []);
    });
  },
);

type Progress = { token: string; value: { kind: string; title?: string; message?: string } };

function isProgress(
  m: Message,
  kind: 'begin' | 'report' | 'end',
): m is NotificationMessage & { params: Progress } {
  return Message.isNotification(m) && m.method === '$/progress' && (m.params as Progress).value.kind === kind;
}
