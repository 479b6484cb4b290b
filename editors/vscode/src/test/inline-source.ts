/**
 * VS Code 1.100's inline-completion source, as far as re-queries go: what the extension's tests drive the
 * middleware with (src/test/inline.test.ts).
 */

import { fake, FakePosition, FakeTokenSource } from './fake-vscode';

export const TRIGGER = 'editor.action.inlineSuggest.trigger';

export const DEBOUNCE_MS = 10;
export type Shown = { version: number; position: FakePosition; text: string | undefined; explicit: boolean };

/**
 * VS Code 1.100's inline-completion source, as far as re-queries go. A fetch at the version and cursor of
 * the update in flight or of the shown result is skipped when that one is explicit or the new one is
 * automatic (`UpdateRequest.satisfies`); otherwise it cancels the update in flight. Automatic fetches
 * wait DEBOUNCE_MS first; `editor.action.inlineSuggest.trigger` fetches explicitly at once, unless
 * `dropTriggers` says to lose it. A keystroke cancels the update in flight.
 */
export class InlineSource {
  shown: Shown | undefined;
  fetches: { version: number; explicit: boolean }[] = [];
  dropTriggers = 0;
  private update: (Shown & { cancel: FakeTokenSource }) | undefined;

  constructor(
    private at: { version: number; position: FakePosition },
    private readonly provide: (
      version: number,
      position: FakePosition,
      explicit: boolean,
      cancel: FakeTokenSource,
    ) => Promise<{ insertText: string }[] | undefined>,
  ) {
    fake.onCommand = (command) => {
      if (command !== TRIGGER) return;
      if (this.dropTriggers > 0) this.dropTriggers -= 1;
      else void this.fetch(true);
    };
  }

  private satisfies(by: Shown | undefined, explicit: boolean): boolean {
    return (
      by !== undefined &&
      by.version === this.at.version &&
      by.position.line === this.at.position.line &&
      by.position.character === this.at.position.character &&
      (!explicit || by.explicit)
    );
  }

  async fetch(explicit: boolean): Promise<void> {
    if (this.satisfies(this.update, explicit) || this.satisfies(this.shown, explicit)) return;
    this.cancel();
    const update = { ...this.at, text: undefined, explicit, cancel: new fake.CancellationTokenSource() };
    this.update = update;
    if (!explicit) await sleep(DEBOUNCE_MS);
    if (update.cancel.isCancelled) return;
    this.fetches.push({ version: update.version, explicit });
    const result = await this.provide(update.version, update.position, explicit, update.cancel);
    if (update.cancel.isCancelled) return;
    this.update = undefined;
    this.shown = {
      version: update.version,
      position: update.position,
      text: result?.[0]?.insertText,
      explicit,
    };
  }

  /** The user typed: a new version and cursor, and an automatic fetch there. */
  type(version: number, position: FakePosition): Promise<void> {
    this.at = { version, position };
    this.cancel();
    return this.fetch(false);
  }

  /** VS Code drops the update in flight (as it does when it stops asking). */
  cancel(): void {
    this.update?.cancel.cancel();
    this.update = undefined;
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
