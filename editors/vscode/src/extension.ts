/**
 * Entry point: starts `lsp-dscoder` over stdio with vscode-languageclient, wires the streamed partial
 * completions into inline suggestions, keeps the status bar item current, and restarts the server when
 * a setting it was started with changes.
 */

import * as vscode from 'vscode';
import { DidChangeConfigurationNotification, LanguageClient, State } from 'vscode-languageclient/node';

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
import { INITIAL, renderStatus, StatusView } from './status';
import { PARTIAL_COMPLETION_METHOD } from './suggestions';

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
      busy: (generating) => this.setStatus({ phase: generating ? 'generating' : 'idle' }),
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
          handleWorkDoneProgress: (_token, params, next) => {
            if (params.kind === 'begin') {
              const progress = { title: params.title, message: params.message, percentage: params.percentage };
              this.setStatus({ phase: 'loading', progress });
            } else if (params.kind === 'report' && this.status.progress !== undefined) {
              const { message = this.status.progress.message, percentage = this.status.progress.percentage } = params;
              this.setStatus({ progress: { ...this.status.progress, message, percentage } });
            } else if (params.kind === 'end') {
              this.setStatus({ phase: 'idle', progress: undefined });
            }
            next(_token, params);
          },
        },
      },
    );
    client.onDidChangeState((e) => {
      if (e.newState === State.Stopped) this.setStatus({ phase: 'stopped', progress: undefined });
    });
    this.client = client;
    this.inline = inline;
    client.onNotification(PARTIAL_COMPLETION_METHOD, (params: unknown) => inline.onPartial(params));
    this.setStatus({ phase: 'starting', error: undefined });
    try {
      await client.start();
      if (this.status.phase === 'starting') this.setStatus({ phase: 'idle' });
    } catch (err) {
      const error = `could not start "${launch.command} ${launch.args.join(' ')}": ${String(err)}`;
      this.setStatus({ phase: 'stopped', error });
      void vscode.window.showErrorMessage(`lsp-dscoder: ${error}`);
    }
  }

  async stop(): Promise<void> {
    const { client, inline } = this;
    this.client = undefined;
    this.inline = undefined;
    inline?.dispose();
    if (client !== undefined && client.state !== State.Stopped) await client.stop();
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  async dispose(): Promise<void> {
    await this.stop();
    for (const d of this.subscriptions) d.dispose();
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
    // A request finishing during the model load must not hide the load progress.
    if (this.status.progress !== undefined && this.status.phase !== 'stopped') {
      this.status = { ...this.status, phase: 'loading' };
    }
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
  // Not awaited: the server answers `initialize` only after its model has loaded.
  void session.start();
}

export async function deactivate(): Promise<void> {
  await session?.dispose();
  session = undefined;
}
