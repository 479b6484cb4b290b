/**
 * Entry point: starts `lsp-dscoder` over stdio with vscode-languageclient, wires the streamed partial
 * completions into inline suggestions, keeps the status bar item current, sends setting changes to the
 * server, and restarts it when its command line changes.
 */

import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  State,
  WorkDoneProgressBegin,
  WorkDoneProgressEnd,
  WorkDoneProgressReport,
} from 'vscode-languageclient/node';

import { InlineStreaming } from './inline';
import {
  initializationOptions,
  isEnabled,
  needsRestart,
  readSettings,
  SECTION,
  SERVER_SECTION,
  serverConfiguration,
  serverConfigurationChanged,
  Settings,
  serverLaunch,
} from './settings';
import { INITIAL, renderStatus, StatusView, withBusy } from './status';
import { PARTIAL_COMPLETION_METHOD } from './suggestions';

/** The server's statistics request; the extension reads whether the model loaded. */
const STATS_METHOD = 'dscoder/stats';
interface EngineStats {
  engineState: 'idle' | 'loading' | 'ready' | 'failed';
  engineError: string | null;
}

class Session implements vscode.Disposable {
  private readonly output = vscode.window.createOutputChannel('lsp-dscoder', { log: true });
  private readonly statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  private status: StatusView = INITIAL;
  private settings: Settings;
  private client: LanguageClient | undefined;
  private inline: InlineStreaming | undefined;
  private readonly subscriptions: vscode.Disposable[] = [];

  constructor() {
    this.settings = this.readSettings();
    this.statusItem.command = `${SECTION}.showOutput`;
    this.statusItem.show();
    this.render();
    this.subscriptions.push(
      this.output,
      this.statusItem,
      vscode.commands.registerCommand(`${SECTION}.restart`, () => this.restart()),
      vscode.commands.registerCommand(`${SECTION}.showOutput`, () => this.output.show(true)),
      vscode.workspace.onDidChangeConfiguration((e) => {
        if (e.affectsConfiguration(SECTION)) void this.configurationChanged();
      }),
      vscode.workspace.onDidCloseTextDocument((d) => this.inline?.forget(d.uri.toString())),
    );
  }

  async start(): Promise<void> {
    const launch = serverLaunch(this.settings);
    const inline = new InlineStreaming((languageId) => isEnabled(this.settings, languageId), {
      busy: (generating) => this.setStatus(withBusy(this.status, generating)),
      ttft: (ms) => this.setStatus({ lastTtftMs: ms }),
    });
    const client = new LanguageClient(
      SECTION,
      'lsp-dscoder',
      { command: launch.command, args: [...launch.args] },
      {
        documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
        initializationOptions: initializationOptions(this.settings),
        outputChannel: this.output,
        middleware: {
          ...inline.middleware,
          // The server asks for its section when a configuration change came without it.
          workspace: {
            configuration: async (params, token, next) => {
              const answers = await next(params, token);
              if (!Array.isArray(answers)) return answers;
              return params.items.map((item, i) =>
                item.section === SERVER_SECTION ? serverConfiguration(this.settings) : answers[i],
              );
            },
          },
          handleWorkDoneProgress: (token, params, next) => {
            this.progress(params);
            next(token, params);
          },
        },
      },
    );
    // Also follows the client's own restarts after a server crash.
    client.onDidChangeState(({ newState }) => {
      if (newState === State.Starting)
        this.setStatus({ phase: 'starting', progress: undefined, error: undefined });
      if (newState === State.Running && this.status.phase === 'starting') this.setStatus({ phase: 'idle' });
      if (newState === State.Stopped) this.setStatus({ phase: 'stopped', progress: undefined });
    });
    this.client = client;
    this.inline = inline;
    client.onNotification(PARTIAL_COMPLETION_METHOD, (params: unknown) => inline.onPartial(params));
    try {
      await client.start();
    } catch (err) {
      // vscode-languageclient has shown the error; the tooltip says what to change.
      const command = [launch.command, ...launch.args].join(' ');
      const error = `could not start "${command}" (${String(err)}); set ${SECTION}.server.command`;
      this.setStatus({ phase: 'stopped', error });
    }
  }

  async stop(): Promise<void> {
    const { client, inline } = this;
    this.client = undefined;
    this.inline = undefined;
    inline?.dispose();
    if (client !== undefined && client.state !== State.Stopped) {
      await client.stop().catch((err) => this.output.warn(`stopping the server: ${String(err)}`));
    }
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  async dispose(): Promise<void> {
    await this.stop();
    for (const d of this.subscriptions) d.dispose();
  }

  /** Model load progress from the server's `$/progress`; at its end, whether the model is ready. */
  private progress(params: WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd): void {
    const current = this.status.progress;
    if (params.kind === 'begin') {
      const { title, message, percentage } = params;
      this.setStatus({ phase: 'loading', progress: { title, message, percentage }, error: undefined });
    } else if (params.kind === 'report' && current !== undefined) {
      const { message = current.message, percentage = current.percentage } = params;
      this.setStatus({ progress: { ...current, message, percentage } });
    } else if (params.kind === 'end') {
      this.setStatus({ phase: 'idle', progress: undefined });
      void this.checkEngine();
    }
  }

  private async checkEngine(): Promise<void> {
    const client = this.client;
    const stats = await client?.sendRequest<EngineStats>(STATS_METHOD).catch(() => undefined);
    if (client !== this.client || stats === undefined) return;
    if (stats.engineState === 'failed') {
      this.setStatus({
        phase: 'failed',
        error: `the model did not load: ${stats.engineError ?? 'unknown error'}`,
      });
    }
  }

  private async configurationChanged(): Promise<void> {
    const before = this.settings;
    this.settings = this.readSettings();
    if (needsRestart(before, this.settings)) {
      await this.restart();
    } else if (serverConfigurationChanged(before, this.settings) && this.client?.isRunning()) {
      const settings = initializationOptions(this.settings);
      await this.client.sendNotification(DidChangeConfigurationNotification.type, { settings });
    }
  }

  private readSettings(): Settings {
    const config = vscode.workspace.getConfiguration(SECTION);
    const { settings, problems } = readSettings((key) => config.get(key));
    for (const problem of problems) void vscode.window.showWarningMessage(problem);
    return settings;
  }

  private setStatus(change: Partial<StatusView>): void {
    this.status = { ...this.status, ...change };
    this.render();
  }

  private render(): void {
    const { text, tooltip } = renderStatus(this.status);
    this.statusItem.text = text;
    this.statusItem.tooltip = tooltip;
  }
}

let session: Session | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  session = new Session();
  context.subscriptions.push({ dispose: () => void session?.dispose() });
  // Not awaited: activation does not wait for the server process (the model loads after `initialized`).
  void session.start();
}

export async function deactivate(): Promise<void> {
  await session?.dispose();
  session = undefined;
}
