/**
 * Entry point: starts `lsp-dscoder` over stdio with vscode-languageclient, wires the streamed partial
 * completions into inline suggestions, keeps the status bar item current, sends setting changes to the
 * server, and restarts it when its command line changes.
 *
 * Starts, stops and restarts run one at a time, and only the current client may touch the status: a
 * client being replaced still sends state changes and progress (vscode-languageclient cannot stop one
 * that is starting, so its process is ended instead), and those must not overwrite the new one's.
 */

import type { ChildProcess } from 'node:child_process';
import * as vscode from 'vscode';
import {
  CloseAction,
  CloseHandlerResult,
  DidChangeConfigurationNotification,
  ErrorAction,
  LanguageClient,
  State,
  WorkDoneProgressBegin,
  WorkDoneProgressEnd,
  WorkDoneProgressReport,
} from 'vscode-languageclient/node';

import { InlineStreaming } from './inline';
import { isRunning, launchServer, RestartPolicy, SpawnError } from './launch';
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
import {
  BACKEND_STATUS_METHOD,
  INITIAL,
  renderStatus,
  StatusView,
  withBackend,
  withBusy,
  withProgress,
} from './status';
import { PARTIAL_COMPLETION_METHOD } from './suggestions';

/** The server's statistics request; the extension reads whether the model loaded. */
const STATS_METHOD = 'dscoder/stats';
interface EngineStats {
  engineState: 'idle' | 'loading' | 'ready' | 'failed';
  engineError: string | null;
}

/** How long a server may take to exit on its own before it is ended. */
const EXIT_GRACE_MS = 2000;

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
  /** The last start, stop or restart; the next one waits for it. */
  private lifecycle: Promise<void> = Promise.resolve();
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

  /** Runs `op` after the start, stop or restart queued before it. */
  private queue(op: () => Promise<void> | void): Promise<void> {
    this.lifecycle = this.lifecycle.then(op).catch((err) => this.output.error(`server: ${String(err)}`));
    return this.lifecycle;
  }

  /** Starts the server once the lifecycle step before has finished; does not wait for the server. */
  start(): Promise<void> {
    return this.queue(() => this.startClient());
  }

  /** Creates the client and starts it; the status follows it from here. */
  private startClient(): void {
    const launch = serverLaunch(this.settings);
    const inline = new InlineStreaming((languageId) => isEnabled(this.settings, languageId), {
      busy: (generating) => this.setStatus(withBusy(this.status, generating)),
      ttft: (ms) => this.setStatus({ lastTtftMs: ms }),
    });
    const restarts = new RestartPolicy();
    let running = false;
    this.exitReason = undefined;
    const serverOptions = async () => {
      this.exitReason = undefined;
      this.output.info(`starting ${[launch.command, ...launch.args].join(' ')}`);
      const launched = await launchServer(launch.command, launch.args, (reason) => {
        // Ended on purpose: stopped (restart, deactivation), or after `initialize` failed.
        if (this.client !== client || this.serverProcess !== launched.process) return;
        this.exitReason = reason;
        this.output.warn(`server ${reason}`);
        if (this.status.phase === 'stopped') this.setStatus({ error: reason });
      });
      if (this.client !== client) {
        // Replaced while its process was being created: nothing else would end this process.
        launched.process.kill();
        throw new Error('replaced before it started');
      }
      this.serverProcess = launched.process;
      return launched;
    };
    const client: LanguageClient = new LanguageClient(SECTION, 'lsp-dscoder', serverOptions, {
      documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
      initializationOptions: initializationOptions(this.settings),
      outputChannel: this.output,
      errorHandler: {
        error: (_error, _message, count) => ({
          action: count !== undefined && count <= 3 ? ErrorAction.Continue : ErrorAction.Shutdown,
        }),
        // A start failure shows its reason in the status item; no second message for it.
        closed: (): CloseHandlerResult =>
          restarts.afterExit(Date.now(), this.client === client, running) === 'restart'
            ? { action: CloseAction.Restart }
            : { action: CloseAction.DoNotRestart, handled: this.client !== client || !running },
      },
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
          if (this.client === client) this.progress(params);
          next(token, params);
        },
      },
    });
    // Also follows the client's own restarts after a server crash.
    client.onDidChangeState(({ newState }) => {
      if (newState === State.Running) running = true;
      if (this.client !== client) return;
      if (newState === State.Starting)
        this.setStatus({ phase: 'starting', progress: undefined, error: undefined, unreachable: undefined });
      if (newState === State.Running && this.status.phase === 'starting') {
        // The model loads after `initialized`; its progress (or the stats) says when it is ready.
        this.setStatus({ phase: 'loading' });
        void this.checkEngine();
      }
      // StartFailed: the process could not be spawned, or it ended before answering `initialize`.
      if (newState === State.Stopped || newState === State.StartFailed) {
        this.setStatus({ phase: 'stopped', progress: undefined, error: this.exitReason });
      }
    });
    this.client = client;
    this.inline = inline;
    client.onNotification(PARTIAL_COMPLETION_METHOD, (params: unknown) => inline.onPartial(params));
    client.onNotification(BACKEND_STATUS_METHOD, (params: unknown) => {
      if (this.client === client) this.setStatus(withBackend(this.status, params));
    });
    client.start().catch((err: unknown) => {
      if (this.client !== client) return;
      // vscode-languageclient has shown the error. A command that cannot run: the setting is what to
      // change. A server that ended during `initialize`: its exit status says more than the connection.
      const message = err instanceof Error ? err.message : String(err);
      const reason =
        err instanceof SpawnError
          ? `${message} (set ${SECTION}.server.command)`
          : (this.exitReason ?? message);
      this.exitReason = reason;
      this.setStatus({ phase: 'stopped', progress: undefined, error: reason });
      // A server that answered `initialize` with an error runs on, of no use; one that exited is gone.
      const server = this.serverProcess;
      setTimeout(() => {
        if (server === undefined || server !== this.serverProcess || !isRunning(server)) return;
        this.serverProcess = undefined;
        server.kill();
      }, EXIT_GRACE_MS);
    });
  }

  private async stop(): Promise<void> {
    const { client, inline } = this;
    this.client = undefined;
    this.inline = undefined;
    inline?.dispose();
    const server = this.serverProcess;
    this.serverProcess = undefined;
    const alive = () => server !== undefined && isRunning(server);
    if (client?.state === State.Running) {
      await client.stop().catch((err) => this.output.warn(`stopping the server: ${String(err)}`));
    } else if (alive()) {
      // vscode-languageclient refuses to stop a client that is still starting; ending its process ends
      // the start, and the client, no longer current, is not restarted.
      server?.kill();
    }
    // The server exits after `exit`; one that does not is ended after a grace period.
    if (alive()) setTimeout(() => alive() && server?.kill(), EXIT_GRACE_MS);
  }

  restart(): Promise<void> {
    return this.queue(async () => {
      await this.stop();
      this.startClient();
    });
  }

  async dispose(): Promise<void> {
    await this.queue(() => this.stop());
    for (const d of this.subscriptions) d.dispose();
  }

  /** Model load progress from the server's `$/progress`; at its end, whether the model is ready. */
  private progress(params: WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd): void {
    this.status = withProgress(this.status, params);
    this.render();
    if (this.status.phase === 'idle' && params.kind === 'end') void this.checkEngine();
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

  /** Read in turn with starts and stops, so that the last change decides the command line. */
  private configurationChanged(): Promise<void> {
    return this.queue(async () => {
      const before = this.settings;
      this.settings = this.readSettings();
      if (needsRestart(before, this.settings)) {
        await this.stop();
        this.startClient();
      } else if (serverConfigurationChanged(before, this.settings) && this.client?.isRunning()) {
        const settings = initializationOptions(this.settings);
        await this.client.sendNotification(DidChangeConfigurationNotification.type, { settings });
      }
    });
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
  // Activation does not wait for the server process (the model loads after `initialized`).
  void session.start();
}

export async function deactivate(): Promise<void> {
  await session?.dispose();
  session = undefined;
}
