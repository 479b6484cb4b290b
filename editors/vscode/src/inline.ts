/**
 * Inline completion middleware: sends one `textDocument/inlineCompletion` per (document version, cursor),
 * shows the streamed partial text before the response arrives, and shows the whole suggestion once the
 * server has streamed it.
 *
 * VS Code (1.100) takes at most two results per document version and cursor position while a suggestion
 * is shown: the automatic query's, and one explicit re-query (`editor.action.inlineSuggest.trigger`); later
 * queries are "satisfied" by the explicit result and never reach the provider, and hiding the suggestion
 * to force one makes it blink. So an automatic call answers with the first streamed text, and when the
 * text grows the editor is asked for the re-query (see `RequeryPlan`); an explicit call waits until the
 * suggestion is complete (or the request is dropped, the editor gives up, or HOLD_MS pass) and answers
 * with all of it. An explicit call is not always the re-query: a trigger that crosses a keystroke lands on
 * the new version, where its call is then the only one VS Code takes, so all of the suggestion is shown
 * at once there. A trigger whose call does not come within REQUERY_RETRY_MS, or whose call VS Code cancels
 * unanswered while the cursor stays, is sent again, a few times at most. What is shown is always an answer
 * of the provider, so Tab accepts exactly what is on the screen.
 *
 * The LSP request is not tied to VS Code's per-call cancellation token: the re-query makes VS Code
 * cancel its previous call, which must not cancel the generation. One request is in flight at a time:
 * a newer one replaces it (see `cancelOnReplace` for when that sends `$/cancelRequest`), and closing its
 * document cancels it. The server keeps decoding after its response (the rest of a multi-line
 * suggestion arrives as partials of the same request).
 */

import * as vscode from 'vscode';
import type { Middleware } from 'vscode-languageclient';

import {
  Anchor,
  cancelOnReplace,
  parsePartial,
  REQUERY_RETRY_MS,
  RequeryPlan,
  sameAnchor,
  SuggestionStore,
  Update,
} from './suggestions';

type Items = vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined;
type InlineMiddleware = Required<Pick<Middleware, 'provideInlineCompletionItems'>>;
/** The client's own provider: sends the LSP request and converts the response. */
type Next = Parameters<InlineMiddleware['provideInlineCompletionItems']>[4];

/** Longest wait of an explicit call for the rest of the suggestion; then it answers with what it has. */
export const HOLD_MS = 15_000;

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
  /** Per document: provider calls waiting for its suggestion to change (first text, response, more). */
  private readonly waiters = new Map<string, Set<() => void>>();
  private readonly requeries = new RequeryPlan();
  /** Per document: the timer that re-checks a trigger of the re-query after REQUERY_RETRY_MS. */
  private readonly retries = new Map<string, ReturnType<typeof setTimeout>>();

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
    this.requeries.forget(uri);
    clearTimeout(this.retries.get(uri));
    this.retries.delete(uri);
    this.store.forget(uri);
    this.wake(uri);
  }

  dispose(): void {
    this.cancelInflight();
    for (const timer of this.retries.values()) clearTimeout(timer);
    this.retries.clear();
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
    this.wake(inflight.anchor.uri);
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
    if (context.triggerKind !== vscode.InlineCompletionTriggerKind.Invoke) {
      return this.answer(anchor, position, token, false);
    }
    this.requeries.explicitBegan(anchor);
    try {
      return await this.answer(anchor, position, token, true);
    } finally {
      this.requeries.explicitEnded(anchor);
      // Cancelled unanswered: what is shown still takes the re-query. Asked later, once a keystroke that
      // cancelled the call has reached this side: a trigger that crosses it lands on the new version.
      if (token.isCancellationRequested) this.retryLater(anchor.uri);
    }
  }

  /** Waits for the first text, or for the whole suggestion when `explicit` (the last answer VS Code takes
   * at the anchor), then answers with it. */
  private async answer(
    anchor: Anchor,
    position: vscode.Position,
    token: vscode.CancellationToken,
    explicit: boolean,
  ): Promise<Items> {
    // Until the first text or the response, unless VS Code gives up or a newer request replaces this one.
    while (
      this.store.has(anchor) &&
      this.store.suggestion(anchor) === undefined &&
      !this.store.isFinal(anchor)
    ) {
      if (token.isCancellationRequested) return undefined;
      await this.nextUpdate(anchor.uri, token);
    }
    const deadline = performance.now() + HOLD_MS;
    while (explicit && !this.store.isComplete(anchor) && performance.now() < deadline) {
      if (token.isCancellationRequested) return undefined;
      await this.nextUpdate(anchor.uri, token, deadline - performance.now());
    }
    if (token.isCancellationRequested || !this.store.has(anchor)) return undefined;
    const text = this.store.suggestion(anchor);
    this.requeries.answered(anchor, text, explicit);
    if (text === undefined) return undefined;
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
    this.requeries.forget(anchor.uri);
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
    this.wake(uri);
    if (update.changed) this.requery(uri);
  }

  /** Wakes the provider calls waiting on the document. */
  private wake(uri: string): void {
    for (const wake of [...(this.waiters.get(uri) ?? [])]) wake();
  }

  /** Asks the active editor for the re-query when the suggestion it shows (an automatic answer at its
   * version and cursor) is no longer what the server has: more text, or none. */
  private requery(uri: string): void {
    const editor = vscode.window.activeTextEditor;
    const at = editor === undefined ? undefined : anchorOf(editor.document, editor.selection.active);
    if (!this.requeries.shouldTrigger(uri, at, at === undefined ? undefined : this.store.suggestion(at))) {
      return;
    }
    this.retryLater(uri);
    void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
  }

  /** Checks again after REQUERY_RETRY_MS whether the re-query is still wanted and has not come. */
  private retryLater(uri: string): void {
    clearTimeout(this.retries.get(uri));
    const retry = (): void => {
      this.retries.delete(uri);
      this.requeries.retry(uri);
      this.requery(uri);
    };
    this.retries.set(uri, setTimeout(retry, REQUERY_RETRY_MS));
  }

  /** Resolves on the next update of the document's suggestion, when VS Code gives up on the call, or
   * after `timeoutMs`. */
  private nextUpdate(uri: string, token: vscode.CancellationToken, timeoutMs = HOLD_MS): Promise<void> {
    return new Promise((resolve) => {
      const set = this.waiters.get(uri) ?? new Set<() => void>();
      this.waiters.set(uri, set);
      const wake = (): void => {
        set.delete(wake);
        sub.dispose();
        clearTimeout(timer);
        resolve();
      };
      const sub = token.onCancellationRequested(wake);
      const timer = setTimeout(wake, Math.max(0, timeoutMs));
      set.add(wake);
    });
  }
}
