/**
 * The few VS Code API pieces the inline middleware uses, for running it in node. `install()` makes
 * `require('vscode')` return this module's fake; the test then drives the middleware as VS Code would.
 */

import Module from 'node:module';

export interface FakePosition {
  line: number;
  character: number;
}

class Range {
  constructor(
    readonly start: FakePosition,
    readonly end: FakePosition,
  ) {}
}

class InlineCompletionItem {
  constructor(
    readonly insertText: string,
    readonly range?: Range,
    readonly command?: unknown,
  ) {}
}

type Listener = () => void;

class CancellationTokenSource {
  private listeners = new Set<Listener>();
  private cancelled = false;
  readonly token = {
    isCancellationRequested: false,
    onCancellationRequested: (listener: Listener) => {
      this.listeners.add(listener);
      return { dispose: () => this.listeners.delete(listener) };
    },
  };

  get isCancelled(): boolean {
    return this.cancelled;
  }

  cancel(): void {
    if (this.cancelled) return;
    this.cancelled = this.token.isCancellationRequested = true;
    for (const listener of [...this.listeners]) listener();
  }

  dispose(): void {
    this.listeners.clear();
  }
}

export interface FakeEditor {
  document: { uri: { toString(): string }; version: number; languageId: string };
  selection: { active: FakePosition };
}

/** VS Code's numbers: `Invoke` is an explicit request (`editor.action.inlineSuggest.trigger`). */
enum InlineCompletionTriggerKind {
  Invoke = 0,
  Automatic = 1,
}

export const fake = {
  Range,
  InlineCompletionItem,
  InlineCompletionTriggerKind,
  CancellationTokenSource,
  executed: [] as string[],
  /** Runs after a command is recorded: a test's model of what VS Code does with it. */
  onCommand: undefined as ((command: string) => void) | undefined,
  window: { activeTextEditor: undefined as FakeEditor | undefined },
  commands: {
    executeCommand: async (command: string): Promise<void> => {
      fake.executed.push(command);
      fake.onCommand?.(command);
    },
  },
};

export type FakeTokenSource = CancellationTokenSource;

export function install(): void {
  const host = Module as unknown as { _load: (request: string, ...rest: unknown[]) => unknown };
  const load = host._load;
  host._load = function (request: string, ...rest: unknown[]) {
    return request === 'vscode' ? fake : load.call(this, request, ...rest);
  };
}
