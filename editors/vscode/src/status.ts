/** What the status bar item says: server phase, model-load progress, a remote endpoint that is down, last
 * time to first token. Pure. */

/** `starting`: the process starts; `loading`: it runs and its model is not ready yet (also before the
 * server's load progress begins); `failed`: the server runs but its model did not load; `stopped`: the
 * server process is gone. */
export type Phase = 'starting' | 'loading' | 'idle' | 'generating' | 'failed' | 'stopped';

export interface LoadProgress {
  readonly title: string;
  readonly message: string | undefined;
  readonly percentage: number | undefined;
}

export interface StatusView {
  readonly phase: Phase;
  /** Set while the server reports `$/progress` (model load, warm-up). */
  readonly progress: LoadProgress | undefined;
  /** Request sent -> first streamed text received, for the last request that streamed any. */
  readonly lastTtftMs: number | undefined;
  /** Why the model or the server is not available. */
  readonly error: string | undefined;
  /** Why the remote backend's endpoint is down (the server's `dscoder/status`), until it works again. */
  readonly unreachable: string | undefined;
}

/** The server's notification of its backend's state: a remote endpoint that went down or works again. */
export const BACKEND_STATUS_METHOD = 'dscoder/status';

export const INITIAL: StatusView = {
  phase: 'starting',
  progress: undefined,
  lastTtftMs: undefined,
  error: undefined,
  unreachable: undefined,
};

const ICONS: Record<Phase, string> = {
  starting: '$(sync~spin)',
  loading: '$(sync~spin)',
  idle: '$(sparkle)',
  generating: '$(loading~spin)',
  failed: '$(warning)',
  stopped: '$(error)',
};

/** The server's `$/progress` of its model load (the LSP work-done progress values). */
export type LoadProgressEvent =
  | { kind: 'begin'; title: string; message?: string; percentage?: number }
  | { kind: 'report'; message?: string; percentage?: number }
  | { kind: 'end'; message?: string };

/** The status after a load progress event. The server ends its load progress with `ready` or
 * `failed: <reason>`; a report without a begin changes nothing. */
export function withProgress(v: StatusView, p: LoadProgressEvent): StatusView {
  if (p.kind === 'begin') {
    const progress = { title: p.title, message: p.message, percentage: p.percentage };
    return { ...v, phase: 'loading', progress, error: undefined };
  }
  if (p.kind === 'report') {
    if (v.progress === undefined) return v;
    const { message = v.progress.message, percentage = v.progress.percentage } = p;
    return { ...v, progress: { ...v.progress, message, percentage } };
  }
  const failed = /^failed:\s*(.*)$/s.exec(p.message ?? '');
  if (failed !== null)
    return { ...v, phase: 'failed', progress: undefined, error: failed[1] || 'unknown error' };
  return { ...v, phase: 'idle', progress: undefined };
}

/** The status after `dscoder/status` ({reachable, error, endpoint}); anything else changes nothing. */
export function withBackend(v: StatusView, params: unknown): StatusView {
  if (typeof params !== 'object' || params === null) return v;
  const { reachable, error, endpoint } = params as Record<string, unknown>;
  if (reachable === true) return { ...v, unreachable: undefined };
  if (reachable !== false) return v;
  const why =
    typeof error === 'string' && error !== '' ? error : `the completion endpoint ${String(endpoint)} is down`;
  return { ...v, unreachable: why };
}

/** A request went out or ended: only moves between idle and generating, never hides loading/failure. */
export function withBusy(v: StatusView, generating: boolean): StatusView {
  if (v.phase !== 'idle' && v.phase !== 'generating') return v;
  return { ...v, phase: generating ? 'generating' : 'idle' };
}

export function formatMs(ms: number): string {
  const tenths = Math.round(ms * 10) / 10;
  return tenths < 10 ? `${tenths.toFixed(1)} ms` : `${Math.round(ms)} ms`;
}

/** Longest reason shown in the status bar; the tooltip has all of it. */
const MAX_REASON = 80;

/** The first line of `reason`, cut to MAX_REASON characters. */
export function shortReason(reason: string): string {
  const line = reason.split('\n')[0].trim();
  return line.length <= MAX_REASON ? line : `${line.slice(0, MAX_REASON - 1)}…`;
}

export function renderStatus(v: StatusView): { text: string; tooltip: string } {
  // A model that serves from an endpoint that is down: requests get nothing until it is back.
  if ((v.phase === 'idle' || v.phase === 'generating') && v.unreachable !== undefined) {
    return {
      text: `$(debug-disconnect) dscoder: unreachable: ${shortReason(v.unreachable)}`,
      tooltip: ['lsp-dscoder: unreachable', v.unreachable, 'Click to show the server log.'].join('\n'),
    };
  }
  let text = `${ICONS[v.phase]} dscoder`;
  const tips = [`lsp-dscoder: ${v.phase}`];
  if (v.phase === 'loading' && v.progress !== undefined) {
    const { title, message, percentage } = v.progress;
    text += `: ${message ?? 'loading'}${percentage === undefined ? '' : ` ${Math.round(percentage)}%`}`;
    tips.push(message === undefined ? title : `${title}: ${message}`);
  }
  if (v.lastTtftMs !== undefined && (v.phase === 'idle' || v.phase === 'generating')) {
    text += ` ${formatMs(v.lastTtftMs)}`;
    tips.push(`last time to first token: ${formatMs(v.lastTtftMs)}`);
  }
  if (v.phase === 'starting') text += ': starting';
  if (v.phase === 'loading' && v.progress === undefined) text += ': loading';
  if (v.phase === 'failed' || v.phase === 'stopped') {
    text += `: ${v.phase}${v.error === undefined ? '' : `: ${shortReason(v.error)}`}`;
    if (v.error !== undefined) tips.push(v.error);
  }
  tips.push('Click to show the server log.');
  return { text, tooltip: tips.join('\n') };
}
