/**
 * Inline completion middleware: sends one `textDocument/inlineCompletion` per (document version, cursor),
 * shows the streamed partial text before the response arrives, and asks VS Code to re-query as it grows.
 *
 * The LSP request is not tied to VS Code's per-call cancellation token: every refresh makes VS Code
 * cancel its previous call, which must not cancel the generation. The request is cancelled when a newer
 * one replaces it (another version or position of the same document) or the document closes.
 */

import * as vscode from 'vscode';
import type { Middleware } from 'vscode-languageclient';

import { Anchor, parsePartial, sameAnchor, SuggestionStore, Update } from './suggestions';

type Items = vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined;
type InlineMiddleware = Required<Pick<Middleware, 'provideInlineCompletionItems'>>;
/** The client's own provider: sends the LSP request and converts the response. */
type Next = Parameters<InlineMiddleware['provideInlineCompletionItems']>[4];

/** VS Code redraws on each re-query; partials can arrive per token, faster than that is useful. */
const REFRESH_INTERVAL_MS = 30;

export interface InlineEvents {
  /** Number of requests in flight changed. */
  busy(count: number): void;
  /** Request sent -> first text, in milliseconds. */
  ttft(ms: number): void;
}

function anchorOf(document: vscode.TextDocument, position: vscode.Position): Anchor {
  return {
    uri: document.uri.toString(),
    version: document.version,
    position: { line: position.line, character: position.character },
  };
}

function firstInsertText(items: Items): string | undefined {
  const list = Array.isArray(items) ? items : items?.items;
  const text = list?.[0]?.insertText;
  return typeof text === 'string' ? text : text?.value;
}

export class InlineStreaming implements vscode.Disposable {
  private readonly store = new SuggestionStore();
  /** Per document: the request in flight and its anchor. */
  private readonly inflight = new Map<string, { anchor: Anchor; cancel: vscode.CancellationTokenSource }>();
  /** Per document: the server's own items once its response came, shown instead of the partial text. */
  private readonly finals = new Map<string, { anchor: Anchor; items: Items }>();
  /** Per document: provider calls waiting for the first text. */
  private readonly waiters = new Map<string, Set<() => void>>();
  private refreshTimer: NodeJS.Timeout | undefined;

  readonly middleware: InlineMiddleware = {
    provideInlineCompletionItems: (document, position, context, token, next) =>
      this.provide(document, position, context, token, next),
  };

  constructor(
    private readonly enabled: (languageId: string) => boolean,
    private readonly events: InlineEvents,
  ) {}

  /** Handler of `dscoder/partialCompletion`. */
  onPartial(params: unknown): void {
    const partial = parsePartial(params);
    if (partial !== undefined) this.updated(partial.uri, this.store.onPartial(partial, performance.now()));
  }

  /** The document closed or the client stopped: cancel what is in flight for it. */
  forget(uri: string): void {
    this.inflight.get(uri)?.cancel.cancel();
    this.inflight.delete(uri);
    this.finals.delete(uri);
    this.store.forget(uri);
    this.events.busy(this.inflight.size);
  }

  dispose(): void {
    clearTimeout(this.refreshTimer);
    for (const uri of [...this.inflight.keys()]) this.forget(uri);
  }

  private async provide(
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
    next: Next,
  ): Promise<Items> {
    if (!this.enabled(document.languageId)) return undefined;
    const anchor = anchorOf(document, position);
    if (!this.store.has(anchor)) this.request(anchor, document, position, context, next);
    if (this.store.suggestion(anchor) === undefined && !this.store.isFinal(anchor)) {
      await this.firstText(anchor.uri, token);
    }
    if (token.isCancellationRequested) return undefined;
    const final = this.finals.get(anchor.uri);
    if (final !== undefined && sameAnchor(final.anchor, anchor)) return final.items;
    const text = this.store.suggestion(anchor);
    return text === undefined ? undefined : [new vscode.InlineCompletionItem(text, new vscode.Range(position, position))];
  }

  private request(
    anchor: Anchor,
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    next: Next,
  ): void {
    this.forget(anchor.uri); // latest wins: the older request of this document is cancelled
    const cancel = new vscode.CancellationTokenSource();
    this.inflight.set(anchor.uri, { anchor, cancel });
    this.store.begin(anchor, performance.now());
    this.events.busy(this.inflight.size);
    const settle = (items: Items): void => {
      if (this.inflight.get(anchor.uri)?.cancel !== cancel) return; // replaced or forgotten meanwhile
      this.inflight.delete(anchor.uri);
      cancel.dispose();
      this.events.busy(this.inflight.size);
      this.finals.set(anchor.uri, { anchor, items });
      this.updated(anchor.uri, this.store.onFinal(anchor, firstInsertText(items), performance.now()), true);
    };
    Promise.resolve(next(document, position, context, cancel.token)).then(settle, () => settle(undefined));
  }

  /** `settled`: the response came, so waiting provider calls return even when it has no item. */
  private updated(uri: string, update: Update, settled = false): void {
    if (update.ttftMs !== undefined) this.events.ttft(update.ttftMs);
    if (!update.changed && !settled) return;
    const waiting = this.waiters.get(uri);
    if (waiting !== undefined && waiting.size > 0) {
      for (const wake of waiting) wake();
      return; // the provider calls waiting return the new text themselves
    }
    if (update.changed) this.scheduleRefresh(uri);
  }

  /** Re-query the visible editor when its suggestion changed at its current version and cursor. */
  private scheduleRefresh(uri: string): void {
    if (this.refreshTimer !== undefined) return;
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      const editor = vscode.window.activeTextEditor;
      if (editor === undefined || editor.document.uri.toString() !== uri) return;
      const here = anchorOf(editor.document, editor.selection.active);
      if (this.store.suggestion(here) !== undefined) {
        void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
      }
    }, REFRESH_INTERVAL_MS);
  }

  /** Resolves on the next change of the document's suggestion, or when VS Code gives up on the call. */
  private firstText(uri: string, token: vscode.CancellationToken): Promise<void> {
    if (token.isCancellationRequested) return Promise.resolve();
    return new Promise((resolve) => {
      const set = this.waiters.get(uri) ?? new Set<() => void>();
      this.waiters.set(uri, set);
      const wake = (): void => {
        set.delete(wake);
        sub.dispose();
        resolve();
      };
      const sub = token.onCancellationRequested(wake);
      set.add(wake);
    });
  }
}
