/**
 * Streamed suggestions: the latest `dscoder/partialCompletion` per document, checked against the
 * document version and cursor position it was asked for, what to show at a given anchor, and when to
 * ask the editor to show it again. No VS Code imports: unit-tested in node.
 */

export interface Position {
  readonly line: number;
  readonly character: number;
}

/** Params of the `dscoder/partialCompletion` notification. `text` is everything streamed so far. */
export interface PartialCompletion {
  readonly requestId: number | string;
  readonly uri: string;
  readonly version: number;
  readonly position: Position;
  readonly text: string;
  readonly done: boolean;
}

export const PARTIAL_COMPLETION_METHOD = 'dscoder/partialCompletion';

const isPosition = (p: unknown): p is Position =>
  typeof p === 'object' &&
  p !== null &&
  Number.isInteger((p as Position).line) &&
  Number.isInteger((p as Position).character);

/** The notification's params if they have the documented shape, else undefined. */
export function parsePartial(params: unknown): PartialCompletion | undefined {
  if (typeof params !== 'object' || params === null) return undefined;
  const p = params as Record<string, unknown>;
  const idOk = typeof p.requestId === 'string' || Number.isInteger(p.requestId);
  const ok =
    idOk &&
    typeof p.uri === 'string' &&
    Number.isInteger(p.version) &&
    isPosition(p.position) &&
    typeof p.text === 'string' &&
    typeof p.done === 'boolean';
  return ok ? (params as PartialCompletion) : undefined;
}

/** Where a request was made: a document version and a cursor position in it. */
export interface Anchor {
  readonly uri: string;
  readonly version: number;
  readonly position: Position;
}

/** A suggestion is shown only at exactly the version and position it was computed for. */
export function sameAnchor(a: Anchor, b: Anchor): boolean {
  return (
    a.uri === b.uri &&
    a.version === b.version &&
    a.position.line === b.position.line &&
    a.position.character === b.position.character
  );
}

/**
 * Whether to send `$/cancelRequest` for the request in flight at `inflight` when a request at `next`
 * replaces it. Not when the same document moved to a newer version: the server settled that request on
 * the `didChange` already (dropped as stale, or kept decoding because the user typed through it, which a
 * late cancel would stop).
 */
export function cancelOnReplace(inflight: Anchor, next: Anchor): boolean {
  return !(inflight.uri === next.uri && next.version > inflight.version);
}

/** What one request has sent so far. */
interface Entry {
  readonly anchor: Anchor;
  readonly startedMs: number;
  /** Partials from requests up to this id belong to an earlier request (ids from one connection grow). */
  readonly afterRequestId: number | undefined;
  requestId: number | string | undefined;
  /** The latest partial's text: the whole suggestion so far (the server only ever extends it). */
  partial: string;
  /** The response's insert text: `undefined` until it came, '' when it had no item. */
  final: string | undefined;
  /** The server sent the request's last partial (`done`): the suggestion will not grow any more. */
  done: boolean;
  ttftMs: number | undefined;
}

export interface Update {
  /** False when the update was stale (another document version, position or request) or changed
   * nothing: neither the text shown nor whether the suggestion is complete. */
  readonly changed: boolean;
  /** Set on the first update that carries text: request sent -> first text. */
  readonly ttftMs: number | undefined;
}

const NO_CHANGE: Update = { changed: false, ttftMs: undefined };

/**
 * One entry per document: only the latest request of a document is ever shown.
 *
 * The server answers an inline request as soon as the first line is complete and keeps streaming the
 * rest of the suggestion as partials of the same request; what is shown is the longest text the server
 * sent for the request. A response without an item means the server dropped the request (the document
 * changed, or nothing to suggest): the suggestion is cleared and later partials are ignored.
 */
export class SuggestionStore {
  private readonly entries = new Map<string, Entry>();
  private readonly lastRequestId = new Map<string, number>();

  /** A request is being sent at `anchor`: forget what the document had. */
  begin(anchor: Anchor, nowMs: number): void {
    this.entries.set(anchor.uri, {
      anchor,
      startedMs: nowMs,
      afterRequestId: this.lastRequestId.get(anchor.uri),
      requestId: undefined,
      partial: '',
      final: undefined,
      done: false,
      ttftMs: undefined,
    });
  }

  has(anchor: Anchor): boolean {
    return this.entry(anchor) !== undefined;
  }

  /** True once the response for `anchor` has arrived. */
  isFinal(anchor: Anchor): boolean {
    return this.entry(anchor)?.final !== undefined;
  }

  /** True once the suggestion at `anchor` is whole: the response came and either had no item or the
   * server sent its last partial. Also true when `anchor` has no request (nothing more will come). */
  isComplete(anchor: Anchor): boolean {
    const e = this.entry(anchor);
    return e === undefined || (e.final !== undefined && (e.final === '' || e.done));
  }

  onPartial(p: PartialCompletion, nowMs: number): Update {
    if (typeof p.requestId === 'number') {
      this.lastRequestId.set(p.uri, Math.max(p.requestId, this.lastRequestId.get(p.uri) ?? p.requestId));
    }
    const e = this.entry(p);
    if (e === undefined || e.final === '') return NO_CHANGE;
    const older =
      typeof p.requestId === 'number' && e.afterRequestId !== undefined && p.requestId <= e.afterRequestId;
    if (older || (e.requestId !== undefined && e.requestId !== p.requestId)) return NO_CHANGE;
    e.requestId = p.requestId;
    const before = this.suggestion(p);
    const wasDone = e.done;
    e.partial = p.text;
    e.done = e.done || p.done;
    const update = this.result(e, before, nowMs);
    return e.done === wasDone ? update : { ...update, changed: true };
  }

  /** The response arrived: `text` is its first item's insert text, `undefined` for no item. */
  onFinal(anchor: Anchor, text: string | undefined, nowMs: number): Update {
    const e = this.entry(anchor);
    if (e === undefined || e.final !== undefined) return NO_CHANGE;
    const before = this.suggestion(anchor);
    e.final = text ?? '';
    return this.result(e, before, nowMs);
  }

  /** What to show at `anchor` now: the longest text its request sent; never text of another anchor. */
  suggestion(anchor: Anchor): string | undefined {
    const e = this.entry(anchor);
    if (e === undefined || e.final === '') return undefined;
    const text = e.final === undefined || e.partial.startsWith(e.final) ? e.partial : e.final;
    return text === '' ? undefined : text;
  }

  forget(uri: string): void {
    this.entries.delete(uri);
  }

  private entry(anchor: Anchor): Entry | undefined {
    const e = this.entries.get(anchor.uri);
    return e !== undefined && sameAnchor(e.anchor, anchor) ? e : undefined;
  }

  private result(e: Entry, before: string | undefined, nowMs: number): Update {
    const now = this.suggestion(e.anchor);
    let ttftMs: number | undefined;
    if (e.ttftMs === undefined && now !== undefined) {
      e.ttftMs = ttftMs = nowMs - e.startedMs;
    }
    return { changed: now !== before, ttftMs };
  }
}

/** How long a trigger of the re-query may take to bring its explicit call before it is sent again. */
export const REQUERY_RETRY_MS = 400;
/** Most triggers per answer: a trigger VS Code drops or whose call it cancels is sent again, this often. */
export const REQUERY_TRIGGERS = 3;

/** The last answer to VS Code in a document. */
interface Answer {
  readonly anchor: Anchor;
  /** `undefined`: answered with nothing. */
  readonly text: string | undefined;
  /** Given to an explicit call: the last answer VS Code takes at its anchor. */
  readonly last: boolean;
  triggers: number;
  /** A trigger went out and neither its explicit call came nor its time (`retry`) ran out. */
  pending: boolean;
}

/**
 * When to ask VS Code (1.100) for the re-query (`editor.action.inlineSuggest.trigger`): it takes one
 * explicit answer per document version and cursor after the automatic one, and none after that. So: when
 * the server's text at the anchor of an automatic answer is no longer the answered text, the cursor is
 * still there and no explicit call is waiting there. A trigger whose call does not come in time, or whose
 * call VS Code cancels unanswered, is sent again (at most `REQUERY_TRIGGERS` per answer).
 */
export class RequeryPlan {
  private readonly answers = new Map<string, Answer>();
  /** Per document: the anchors of the explicit calls in progress. */
  private readonly explicit = new Map<string, Anchor[]>();

  /** A provider call answered `text` at `anchor`. A second answer at the same anchor keeps its count of
   * triggers. */
  answered(anchor: Anchor, text: string | undefined, explicit: boolean): void {
    const before = this.answers.get(anchor.uri);
    const triggers = before !== undefined && sameAnchor(before.anchor, anchor) ? before.triggers : 0;
    this.answers.set(anchor.uri, { anchor, text, last: explicit, triggers, pending: false });
  }

  /** An explicit call began at `anchor`: a trigger for that anchor has arrived. */
  explicitBegan(anchor: Anchor): void {
    const calls = this.explicit.get(anchor.uri) ?? [];
    calls.push(anchor);
    this.explicit.set(anchor.uri, calls);
    const answer = this.answers.get(anchor.uri);
    if (answer !== undefined && sameAnchor(answer.anchor, anchor)) answer.pending = false;
  }

  /** The explicit call that began with `anchor` ended (answered, or cancelled by VS Code). */
  explicitEnded(anchor: Anchor): void {
    const calls = this.explicit.get(anchor.uri) ?? [];
    const i = calls.indexOf(anchor);
    if (i >= 0) calls.splice(i, 1);
    if (calls.length === 0) this.explicit.delete(anchor.uri);
  }

  /** Whether to send the trigger now, with the editor's cursor at `editor` and the server's text there;
   * true records the trigger. */
  shouldTrigger(uri: string, editor: Anchor | undefined, text: string | undefined): boolean {
    const answer = this.answers.get(uri);
    if (answer === undefined || answer.last || answer.pending || answer.triggers >= REQUERY_TRIGGERS) {
      return false;
    }
    if (editor === undefined || !sameAnchor(answer.anchor, editor) || text === answer.text) return false;
    if ((this.explicit.get(uri) ?? []).some((a) => sameAnchor(a, answer.anchor))) return false;
    answer.triggers += 1;
    answer.pending = true;
    return true;
  }

  /** `REQUERY_RETRY_MS` passed since the last trigger in the document. */
  retry(uri: string): void {
    const answer = this.answers.get(uri);
    if (answer !== undefined) answer.pending = false;
  }

  /** A new request in the document (or it closed): what was answered is no longer shown. */
  forget(uri: string): void {
    this.answers.delete(uri);
  }
}
