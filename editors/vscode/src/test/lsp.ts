/**
 * A language-server session over stdio with vscode-jsonrpc, as the extension's client runs it, that
 * records every message in the order it crossed the pipe (the order the assertions are about).
 */

import { ChildProcessWithoutNullStreams, execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import {
  createMessageConnection,
  DataCallback,
  Disposable,
  Message,
  MessageConnection,
  NotificationMessage,
  RequestMessage,
  ResponseMessage,
  StreamMessageReader,
  StreamMessageWriter,
} from 'vscode-jsonrpc/node';

export const REPO_ROOT = path.resolve(__dirname, '..', '..', '..', '..');

/** LSP_DSCODER_TEST_MODEL, or a tiny checkpoint written by `python3 -m tests.tiny` (removed by `cleanup`). */
export function testModel(): { folder: string; cleanup: () => void } {
  const given = process.env.LSP_DSCODER_TEST_MODEL;
  if (given) return { folder: given, cleanup: () => undefined };
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lsp-dscoder-vscode-'));
  const folder = path.join(tmp, 'tiny');
  execFileSync('python3', ['-m', 'tests.tiny', folder], {
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'inherit'],
    timeout: 300_000,
  });
  return { folder, cleanup: () => fs.rmSync(tmp, { recursive: true, force: true }) };
}

class RecordingReader extends StreamMessageReader {
  constructor(
    readable: NodeJS.ReadableStream,
    private readonly log: Message[],
    private readonly arrived: () => void,
  ) {
    super(readable);
  }

  override listen(callback: DataCallback): Disposable {
    return super.listen((message) => {
      this.log.push(message);
      callback(message);
      this.arrived();
    });
  }
}

class RecordingWriter extends StreamMessageWriter {
  lastRequest: RequestMessage | undefined;

  override write(message: Message): Promise<void> {
    if (Message.isRequest(message)) this.lastRequest = message;
    return super.write(message);
  }
}

export class Session {
  readonly received: Message[] = [];
  readonly stderr: string[] = [];
  readonly connection: MessageConnection;
  private readonly proc: ChildProcessWithoutNullStreams;
  private readonly writer: RecordingWriter;
  private readonly watchers = new Set<() => void>();
  /** Why the server process is gone, once it is: waits then fail at once instead of timing out. */
  private ended: string | undefined;

  /** `configuration(section)`: the answer to the server's `workspace/configuration` for a section. */
  constructor(
    command: string,
    args: readonly string[],
    configuration: (section: string | undefined) => unknown,
  ) {
    this.proc = spawn(command, [...args], { cwd: REPO_ROOT, stdio: 'pipe' });
    this.proc.stderr.setEncoding('utf8').on('data', (chunk: string) => this.stderr.push(chunk));
    const end = (why: string): void => {
      this.ended ??= why;
      this.watchers.forEach((w) => w());
    };
    this.proc.on('error', (err) => end(`could not run ${command}: ${err.message}`));
    this.proc.on('exit', (code, signal) => end(`the server exited (code ${code}, signal ${signal})`));
    this.writer = new RecordingWriter(this.proc.stdin);
    const reader = new RecordingReader(this.proc.stdout, this.received, () =>
      this.watchers.forEach((w) => w()),
    );
    this.connection = createMessageConnection(reader, this.writer);
    // What vscode-languageclient answers to the server's requests.
    this.connection.onRequest('window/workDoneProgress/create', () => null);
    this.connection.onRequest('client/registerCapability', () => null);
    this.connection.onRequest('workspace/configuration', (params: { items: { section?: string }[] }) =>
      params.items.map((item) => configuration(item.section)),
    );
    this.connection.onNotification(() => undefined);
    this.connection.listen();
  }

  /** Sends a request; `id` is the JSON-RPC id it went out with (what the server echoes as requestId). */
  request<R>(method: string, params: unknown, token?: import('vscode-jsonrpc').CancellationToken) {
    const response = token
      ? this.connection.sendRequest<R>(method, params, token)
      : this.connection.sendRequest<R>(method, params);
    const id = this.writer.lastRequest?.id;
    if (typeof id !== 'number') throw new Error(`no id recorded for ${method}`);
    response.catch(() => undefined); // asserted through `received`, not through the promise
    return { id, response };
  }

  notify(method: string, params: unknown): Promise<void> {
    return this.connection.sendNotification(method, params);
  }

  /** Resolves with the first received message `match` accepts; rejects after `timeoutMs`. */
  waitFor<T extends Message>(what: string, timeoutMs: number, match: (m: Message) => m is T): Promise<T>;
  waitFor(what: string, timeoutMs: number, match: (m: Message) => boolean): Promise<Message>;
  waitFor(what: string, timeoutMs: number, match: (m: Message) => boolean): Promise<Message> {
    return new Promise((resolve, reject) => {
      const check = (): boolean => {
        const found = this.received.find(match);
        if (found === undefined && this.ended === undefined) return false;
        finish();
        if (found !== undefined) resolve(found);
        else reject(new Error(`${this.ended} while waiting for ${what}; stderr:\n${this.stderrTail()}`));
        return true;
      };
      const timer = setTimeout(() => {
        finish();
        reject(
          new Error(
            `timed out after ${timeoutMs} ms waiting for ${what}; server stderr:\n${this.stderrTail()}`,
          ),
        );
      }, timeoutMs);
      const finish = (): void => {
        clearTimeout(timer);
        this.watchers.delete(check);
      };
      if (!check()) this.watchers.add(check);
    });
  }

  response(id: number, timeoutMs: number): Promise<ResponseMessage> {
    return this.waitFor(`the response to request ${id}`, timeoutMs, (m): m is ResponseMessage =>
      isResponse(m, id),
    );
  }

  /** Index of a message in arrival order. */
  indexOf(message: Message): number {
    return this.received.indexOf(message);
  }

  notifications(method: string): NotificationMessage[] {
    return this.received.filter(
      (m): m is NotificationMessage => Message.isNotification(m) && m.method === method,
    );
  }

  stderrTail(): string {
    return this.stderr.join('').split('\n').slice(-40).join('\n');
  }

  /** shutdown + exit, then waits (bounded) for the process to end; kills it if it does not. */
  async close(timeoutMs: number): Promise<number | null> {
    const exited = new Promise<number | null>((resolve) => {
      if (this.proc.exitCode !== null) resolve(this.proc.exitCode);
      else this.proc.once('exit', (code) => resolve(code));
    });
    try {
      const { response } = this.request('shutdown', null);
      await Promise.race([response, new Promise((r) => setTimeout(r, timeoutMs))]);
      await this.notify('exit', null);
    } catch {
      // The connection is already closed: the process is gone or going.
    }
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), timeoutMs);
    const code = await exited;
    clearTimeout(timer);
    this.connection.dispose();
    return code;
  }
}

export function isResponse(m: Message, id: number): m is ResponseMessage {
  return Message.isResponse(m) && m.id === id;
}
