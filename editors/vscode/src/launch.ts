/**
 * Starts the server process for vscode-languageclient and keeps why it ended: the spawn error, or the exit
 * status with the last line the server wrote on stderr (its one-line `lsp-dscoder: error: ...`). The
 * status item shows that reason as `stopped: <reason>`. Also decides whether a server that ended is
 * started again. No VS Code imports: unit-tested in node.
 */

import { ChildProcess, spawn } from 'node:child_process';

/** Longest stderr line kept; the server's error lines are one short line. */
const MAX_LINE = 300;

/** The last non-blank line of `text`, trimmed and cut to MAX_LINE. */
export function lastLine(text: string): string | undefined {
  const lines = text.split(/\r?\n/).map((l) => l.trim());
  const line = lines.reverse().find((l) => l !== '');
  return line === undefined ? undefined : line.slice(0, MAX_LINE);
}

/** True until the process has exited or was killed. */
export function isRunning(child: ChildProcess): boolean {
  return child.exitCode === null && child.signalCode === null;
}

/** Why a server process ended, in words. */
export function exitReason(
  code: number | null,
  signal: string | null,
  stderrLine: string | undefined,
): string {
  const status = signal !== null ? `killed by ${signal}` : `exited with code ${code ?? 'unknown'}`;
  return stderrLine === undefined ? status : `${status}: ${stderrLine}`;
}

/** The command could not be run at all (not found, not executable): the setting is what to change. */
export class SpawnError extends Error {}

export interface Launched {
  readonly process: ChildProcess;
  readonly detached: false;
}

/**
 * Spawns `command args` with piped stdio. Resolves once the process runs; rejects with the spawn error
 * (e.g. `spawn /x/lsp-dscoder ENOENT`). `onExit` gets the reason when the process ends.
 */
export function launchServer(
  command: string,
  args: readonly string[],
  onExit: (reason: string, code: number | null) => void,
): Promise<Launched> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, [...args], { stdio: 'pipe' });
    let tail = '';
    child.stderr.on('data', (chunk: Buffer) => {
      tail = (tail + chunk.toString('utf8')).slice(-4 * MAX_LINE);
    });
    let spawned = false;
    child.once('error', (err) => {
      if (!spawned) reject(new SpawnError(`could not start "${command}": ${err.message}`));
    });
    child.once('spawn', () => {
      spawned = true;
      resolve({ process: child, detached: false });
    });
    // After the spawn only: a failed spawn also closes, with a made-up status.
    child.once('close', (code, signal) => {
      if (spawned) onExit(exitReason(code, signal, lastLine(tail)), code);
    });
  });
}

/** What happens after a server process ended without being asked to. */
export type AfterExit = 'restart' | 'stay-stopped';

/** Restarts allowed within RESTART_WINDOW_MS (vscode-languageclient's own default policy). */
const MAX_RESTARTS = 4;
const RESTART_WINDOW_MS = 3 * 60 * 1000;

/**
 * One per client. A server that crashes while it runs is started again, at most MAX_RESTARTS times in
 * RESTART_WINDOW_MS. A server that ended before it answered `initialize` (bad arguments, a broken
 * install) stays stopped: a new start would fail the same way, and its reason is already shown. A client
 * that is no longer the extension's (stopped for a restart or a settings change) is never restarted: its
 * restart would run the old command line next to the new one.
 */
export class RestartPolicy {
  private readonly restarts: number[] = [];

  afterExit(nowMs: number, current: boolean, wasRunning: boolean): AfterExit {
    if (!current || !wasRunning) return 'stay-stopped';
    while (this.restarts.length > 0 && nowMs - this.restarts[0] > RESTART_WINDOW_MS) this.restarts.shift();
    if (this.restarts.length >= MAX_RESTARTS) return 'stay-stopped';
    this.restarts.push(nowMs);
    return 'restart';
  }
}
