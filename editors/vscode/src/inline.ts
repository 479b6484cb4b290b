/**
 * Inline completion middleware: sends one `textDocument/inlineCompletion` per (document version, cursor),
 * shows the streamed partial text before the response arrives, and asks VS Code to re-query as it grows.
 *
 * The LSP request is not tied to VS Code's per-call cancellation token: every refresh makes VS Code
 * cancel its previous call, which must not cancel the generation. One request is in flight at a time:
 * a newer one replaces it (see `cancelOnReplace` for when that sends `$/cancelRequest`), and closing its
 * document cancels it. The server keeps decoding after its response (the rest of a multi-line
 * suggestion arrives as partials of the same request); those keep refreshing the suggestion.
 */

import * as vscode from 'vscode';
import type { Middleware } from 'vscode-languageclient';

import { Anchor, cancelOnReplace, parsePartial, sameAnchor, SuggestionStore, Update } from './suggestions';

type Items = vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined;
type InlineMiddleware = Required<Pick<Middleware, 'provideInlineCompletionItems'>>;
/** The client's own provider: sends the LSP request and converts the response. */
type Next = Parameters<InlineMiddleware['provideInlineCompletionItems']>[4];

/** VS Code redraws on each re-query; partials can arrive per token, faster than that is useful. */
const REFRESH_INTERVAL_MS = 30;

export interface InlineEvents {
  /** A request went out, or the one in flight ended. */
  busy(generating: boolean): void;
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

function firstItem(items: Items): vscode.InlineCompletionItem | undefined {
  return (Array.isArray(items) ? items : items?.items)?.[0];
}

function insertText(item: vscode.InlineCompletionItem | undefined): string | undefined {
  const text = item?.insertText;
  return typeof text === 'string' ? text : text?.value;
}

export class InlineStreaming implements vscode.Disposable {
  private readonly store = new SuggestionStore();
  private inflight: { anchor: Anchor; cancel: vscode.CancellationTokenSource } | undefined;
  /** Per document: the first item of the response, whose range the shown suggestion takes. */
  private readonly finals = new Map<
    string,
    { anchor: Anchor; item: vscode.InlineCompletionItem | undefined }
  >();
  /** Per document: provider calls waiting for its first text or its response. */
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

  /** The document closed: cancel its request if it is in flight, and drop its suggestion. */
  forget(uri: string): void {
    if (this.inflight?.anchor.uri === uri) this.cancelInflight();
    this.finals.delete(uri);
    this.store.forget(uri);
  }

  dispose(): void {
    clearTimeout(this.refreshTimer);
    this.cancelInflight();
  }

  /** Stops waiting for the request in flight (and cancels it unless `replacedBy` says otherwise); its
   * unfinished suggestion is dropped, so that asking again re-requests. */
  private cancelInflight(replacedBy?: Anchor): void {
    const inflight = this.inflight;
    if (inflight === undefined) return;
    this.inflight = undefined;
    if (replacedBy === undefined || cancelOnReplace(inflight.anchor, replacedBy)) inflight.cancel.cancel();
    inflight.cancel.dispose();
    this.store.forget(inflight.anchor.uri);
    this.finals.delete(inflight.anchor.uri);
    this.events.busy(false);
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
    // Until the first text or the response, unless VS Code gives up or a newer request replaces this one.
    while (
      this.store.has(anchor) &&
      this.store.suggestion(anchor) === undefined &&
      !this.store.isFinal(anchor)
    ) {
      if (token.isCancellationRequested) return undefined;
      await this.nextUpdate(anchor.uri, token);
    }
    const text = this.store.suggestion(anchor);
    if (token.isCancellationRequested || text === undefined) return undefined;
    const final = this.finals.get(anchor.uri);
    const item = final !== undefined && sameAnchor(final.anchor, anchor) ? final.item : undefined;
    return [
      new vscode.InlineCompletionItem(
        text,
        item?.range ?? new vscode.Range(position, position),
        item?.command,
      ),
    ];
  }

  private request(
    anchor: Anchor,
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    next: Next,
  ): void {
    this.cancelInflight(anchor); // latest wins
    this.finals.delete(anchor.uri);
    const cancel = new vscode.CancellationTokenSource();
    this.inflight = { anchor, cancel };
    this.store.begin(anchor, performance.now());
    this.events.busy(true);
    const settle = (items: Items): void => {
      if (this.inflight?.cancel !== cancel) return; // replaced or forgotten meanwhile
      this.inflight = undefined;
      cancel.dispose();
      this.events.busy(false);
      const item = firstItem(items);
      this.finals.set(anchor.uri, { anchor, item });
      this.updated(anchor.uri, this.store.onFinal(anchor, insertText(item), performance.now()), true);
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
    if (update.changed) this.scheduleRefresh();
  }

  /** Re-query the active editor (to show more text, or to hide a dropped suggestion) when the
   * suggestion that changed is the one for its current version and cursor. */
  private scheduleRefresh(): void {
    if (this.refreshTimer !== undefined) return;
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      const editor = vscode.window.activeTextEditor;
      if (editor !== undefined && this.store.has(anchorOf(editor.document, editor.selection.active))) {
        void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
      }
    }, REFRESH_INTERVAL_MS);
  }

  /** Resolves on the next update of the document's suggestion, or when VS Code gives up on the call. */
  private nextUpdate(uri: string, token: vscode.CancellationToken): Promise<void> {
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
