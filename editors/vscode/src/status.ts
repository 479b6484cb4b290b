/** What the status bar item says: server phase, model-load progress, last time to first token. Pure. */

export type Phase = 'starting' | 'loading' | 'idle' | 'generating' | 'stopped';

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
  /** Why the server stopped, when it did. */
  readonly error: string | undefined;
}

export const INITIAL: StatusView = { phase: 'starting', progress: undefined, lastTtftMs: undefined, error: undefined };

const ICONS: Record<Phase, string> = {
  starting: '$(sync~spin)',
  loading: '$(sync~spin)',
  idle: '$(sparkle)',
  generating: '$(loading~spin)',
  stopped: '$(error)',
};

export function formatMs(ms: number): string {
  const tenths = Math.round(ms * 10) / 10;
  return tenths < 10 ? `${tenths.toFixed(1)} ms` : `${Math.round(ms)} ms`;
}

export function renderStatus(v: StatusView): { text: string; tooltip: string } {
  const parts = [`${ICONS[v.phase]} dscoder`];
  const tips = [`lsp-dscoder: ${v.phase}`];
  if (v.phase === 'loading' && v.progress !== undefined) {
    const pct = v.progress.percentage === undefined ? '' : ` ${Math.round(v.progress.percentage)}%`;
    parts.push(`${v.progress.title}${pct}`);
    tips.push(v.progress.message === undefined ? v.progress.title : `${v.progress.title}: ${v.progress.message}`);
  }
  if (v.lastTtftMs !== undefined && (v.phase === 'idle' || v.phase === 'generating')) {
    parts.push(formatMs(v.lastTtftMs));
    tips.push(`last time to first token: ${formatMs(v.lastTtftMs)}`);
  }
  if (v.phase === 'stopped' && v.error !== undefined) tips.push(v.error);
  return { text: parts.join(' '), tooltip: tips.join('\n') };
}
