/** The server launcher with real processes (a spawn error, an exit with its last stderr line) and the
 * policy for a server that ended. */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { exitReason, lastLine, launchServer, RestartPolicy, SpawnError } from '../launch';

test('a command that does not exist rejects with the spawn error, naming the command', async () => {
  await assert.rejects(
    launchServer('/nonexistent/lsp-dscoder', ['--stdio'], () => assert.fail('no exit without a process')),
    (err) => {
      assert.ok(err instanceof SpawnError);
      assert.equal(
        err.message,
        'could not start "/nonexistent/lsp-dscoder": spawn /nonexistent/lsp-dscoder ENOENT',
      );
      return true;
    },
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

test('a server that crashed while running restarts 4 times in 3 minutes, then stays stopped', () => {
  const policy = new RestartPolicy();
  const minute = 60_000;
  const at = [0, 1, 2, 3].map((m) => policy.afterExit(m * minute, true, true));
  assert.deepEqual(at, ['restart', 'restart', 'restart', 'restart']);
  assert.equal(policy.afterExit(3 * minute, true, true), 'stay-stopped');
  // The first restart is more than 3 minutes old at 3 min + 1 ms: one more is allowed.
  assert.equal(policy.afterExit(3 * minute + 1, true, true), 'restart');
  assert.equal(policy.afterExit(3 * minute + 2, true, true), 'stay-stopped');
});

test('a server that ended before initialize, or whose client was replaced, stays stopped', () => {
  const policy = new RestartPolicy();
  assert.equal(policy.afterExit(0, true, false), 'stay-stopped');
  assert.equal(policy.afterExit(0, false, true), 'stay-stopped');
  assert.equal(policy.afterExit(0, false, false), 'stay-stopped');
  // Those do not use up restarts.
  assert.equal(policy.afterExit(0, true, true), 'restart');
});
