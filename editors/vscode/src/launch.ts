/**
 * Starts the server process for vscode-languageclient and keeps why it ended: the spawn error, or the exit
 * status with the last line the server wrote on stderr (its one-line `lsp-dscoder: error: ...`). The
 * status item shows that reason as `stopped: <reason>`. No VS Code imports: unit-tested in node.
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

/** Why a server process ended, in words. */
export function exitReason(
  code: number | null,
  signal: string | null,
  stderrLine: string | undefined,
): string {
  const status = signal !== null ? `killed by ${signal}` : `exited with code ${code ?? 'unknown'}`;
  return stderrLine === undefined ? status : `${status}: ${stderrLine}`;
}

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
      if (!spawned) reject(new Error(`could not start "${command}": ${err.message}`));
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
