/** The server launcher with real processes: a spawn error, and an exit with its last stderr line. */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { exitReason, lastLine, launchServer } from '../launch';

test('a command that does not exist rejects with the spawn error, naming the command', async () => {
  await assert.rejects(
    launchServer('/nonexistent/lsp-dscoder', ['--stdio'], () => assert.fail('no exit without a process')),
    { message: 'could not start "/nonexistent/lsp-dscoder": spawn /nonexistent/lsp-dscoder ENOENT' },
  );
});

test('a server that exits reports its status and the last line it wrote on stderr', async () => {
  const script =
    "process.stderr.write('loading\\nlsp-dscoder: error: no model at /m\\n\\n'); process.exit(2)";
  const exited = new Promise<[string, number | null]>((resolve) => {
    void launchServer(process.execPath, ['-e', script], (reason, code) => resolve([reason, code]));
  });
  assert.deepEqual(await exited, ['exited with code 2: lsp-dscoder: error: no model at /m', 2]);
});

test('a server killed by a signal, or silent, says so', async () => {
  const exited = new Promise<string>((resolve) => {
    void launchServer(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], (reason) =>
      resolve(reason),
    ).then(({ process: child }) => child.kill('SIGTERM'));
  });
  assert.equal(await exited, 'killed by SIGTERM');
  assert.equal(exitReason(0, null, undefined), 'exited with code 0');
  assert.equal(lastLine('  \n'), undefined);
  assert.equal(lastLine(`${'y'.repeat(400)}\r\n`), 'y'.repeat(300));
});
