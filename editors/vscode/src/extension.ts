/**
 * Entry point: starts `lsp-dscoder` over stdio with vscode-languageclient, wires the streamed partial
 * completions into inline suggestions, keeps the status bar item current, sends setting changes to the
 * server, and restarts it when its command line changes.
 */

import type { ChildProcess } from 'node:child_process';
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
import { launchServer } from './launch';
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
  private readonly statusItem = vscode.window.createStatusBarItem(
    'lspDscoder.status',
    vscode.StatusBarAlignment.Right,
    100,
  );
  private status: StatusView = INITIAL;
  private settings: Settings;
  private client: LanguageClient | undefined;
  private inline: InlineStreaming | undefined;
  /** Why the last server process ended (shown as `stopped: <reason>`); unset while one runs. */
  private exitReason: string | undefined;
  private serverProcess: ChildProcess | undefined;
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
    this.exitReason = undefined;
    const serverOptions = async () => {
      this.exitReason = undefined;
      const launched = await launchServer(launch.command, launch.args, (reason) => {
        if (this.client !== client) return; // stopped on purpose (restart, deactivation)
        this.exitReason = reason;
        this.output.warn(`server ${reason}`);
        if (this.status.phase === 'stopped') this.setStatus({ error: reason });
      });
      this.serverProcess = launched.process;
      return launched;
    };
    const client = new LanguageClient(SECTION, 'lsp-dscoder', serverOptions, {
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
    });
    // Also follows the client's own restarts after a server crash.
    client.onDidChangeState(({ newState }) => {
      if (newState === State.Starting)
        this.setStatus({ phase: 'starting', progress: undefined, error: undefined });
      if (newState === State.Running && this.status.phase === 'starting') {
        // The model loads after `initialized`; its progress (or the stats) says when it is ready.
        this.setStatus({ phase: 'loading' });
        void this.checkEngine();
      }
      if (newState === State.Stopped) {
        this.setStatus({ phase: 'stopped', progress: undefined, error: this.exitReason });
      }
    });
    this.client = client;
    this.inline = inline;
    client.onNotification(PARTIAL_COMPLETION_METHOD, (params: unknown) => inline.onPartial(params));
    try {
      await client.start();
    } catch (err) {
      // vscode-languageclient has shown the error; the tooltip says what to change.
      const reason = err instanceof Error ? err.message : String(err);
      this.exitReason = `${reason} (set ${SECTION}.server.command)`;
      this.setStatus({ phase: 'stopped', progress: undefined, error: this.exitReason });
    }
  }

  async stop(): Promise<void> {
    const { client, inline } = this;
    this.client = undefined;
    this.inline = undefined;
    inline?.dispose();
    const server = this.serverProcess;
    this.serverProcess = undefined;
    if (client !== undefined && client.state !== State.Stopped) {
      await client.stop().catch((err) => this.output.warn(`stopping the server: ${String(err)}`));
    }
    // The server exits after `exit`; one that does not is ended after a grace period.
    if (server !== undefined && server.exitCode === null && server.signalCode === null) {
      setTimeout(() => server.exitCode === null && server.signalCode === null && server.kill(), 2000);
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
      // The server ends its load progress with `ready` or `failed: <reason>`.
      const failed = /^failed:\s*(.*)$/s.exec(params.message ?? '');
      if (failed !== null) {
        this.setStatus({ phase: 'failed', progress: undefined, error: failed[1] || 'unknown error' });
      } else {
        this.setStatus({ phase: 'idle', progress: undefined });
        void this.checkEngine();
      }
    }
  }

  /** The engine's state from `dscoder/stats`: ready, failed with its reason, or still loading. */
  private async checkEngine(): Promise<void> {
    const client = this.client;
    const stats = await client?.sendRequest<EngineStats>(STATS_METHOD).catch(() => undefined);
    if (client !== this.client || stats === undefined) return;
    const { phase } = this.status;
    if (stats.engineState === 'failed') {
      this.setStatus({ phase: 'failed', progress: undefined, error: stats.engineError ?? 'unknown error' });
    } else if (stats.engineState === 'ready' && phase === 'loading' && this.status.progress === undefined) {
      this.setStatus({ phase: 'idle' });
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
