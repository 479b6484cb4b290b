/**
 * The extension's settings (section `lspDscoder`): read once per change, checked for type, and turned
 * into the server's command line and its settings object. No VS Code imports: unit-tested in node.
 *
 * The server's settings (model, device, dtype, maxTokens and any other key in `serverSettings`) travel
 * as `initializationOptions` and `workspace/didChangeConfiguration`, under the server's section
 * `dscoder`; the server validates them (a bad value falls back to its default with a message) and
 * reloads the model in-process when the model, device or dtype change. Each message carries the full
 * set: the server applies it over its defaults, so an unset value returns to the default.
 */

export const SECTION = 'lspDscoder';
/** The server's settings section, as `initializationOptions` and `workspace/configuration` carry it. */
export const SERVER_SECTION = 'dscoder';

export interface Settings {
  /** Executable of the language server. */
  readonly serverCommand: string;
  /** Its arguments; `--stdio` selects the transport the extension speaks. */
  readonly serverArgs: readonly string[];
  /** Hugging Face checkpoint folder; `undefined`: the server's default. */
  readonly model: string | undefined;
  /** `undefined` means "let the server choose" (the `auto` setting). */
  readonly device: string | undefined;
  readonly dtype: string | undefined;
  readonly maxTokens: number | undefined;
  /** Further server settings passed through as they are (prompt budgets, response mode, ...). */
  readonly serverSettings: Readonly<Record<string, unknown>>;
  /** The remote backend's settings (user settings only: they choose where code and a key are sent). */
  readonly remote: Readonly<Record<string, unknown>>;
  /** Language id -> enabled; the key `*` is the default for languages not listed; with neither, the
   * model's languages (`isEnabled`). */
  readonly enable: Readonly<Record<string, boolean>>;
}

export const DEFAULTS: Settings = {
  serverCommand: 'lsp-dscoder',
  serverArgs: ['--stdio'],
  model: undefined,
  device: undefined,
  dtype: undefined,
  maxTokens: undefined,
  serverSettings: {},
  remote: {},
  enable: {},
};

/** What the server's bundled model (its default) was trained on: Python only. */
export const BUNDLED_MODEL_LANGUAGES: readonly string[] = ['python'];
/** Languages a model of your own does not get by default: prose and commit messages. */
const PROSE_LANGUAGES: readonly string[] = ['plaintext', 'scminput'];

/** Settings plus one message per value that had the wrong type and fell back to its default. */
export interface ReadResult {
  readonly settings: Settings;
  readonly problems: readonly string[];
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** Server settings that send code elsewhere: only `lspDscoder.remote` (machine scope) may set them. */
export const REMOTE_KEYS: readonly string[] = [
  'backend',
  'endpoint',
  'remoteModel',
  'apiKeyEnv',
  'remotePrompt',
  'remoteRequest',
  'connectTimeoutMs',
  'firstTokenTimeoutMs',
  'readTimeoutMs',
];

function split(obj: Record<string, unknown>, remote: boolean): Record<string, unknown> {
  return Object.fromEntries(Object.entries(obj).filter(([k]) => REMOTE_KEYS.includes(k) === remote));
}

/** `get(key)` returns the raw value of `lspDscoder.<key>` (undefined when unset). */
export function readSettings(get: (key: string) => unknown): ReadResult {
  const problems: string[] = [];
  // One reader per expected type: `undefined` for unset (or empty) values, a message for wrong ones.
  const read = <T>(key: string, expected: string, ok: (v: unknown) => boolean): T | undefined => {
    const v = get(key);
    if (v === undefined || v === null || v === '') return undefined;
    if (ok(v)) return v as T;
    problems.push(`${SECTION}.${key}: expected ${expected}, got ${JSON.stringify(v)}; using the default`);
    return undefined;
  };
  const str = (key: string) => read<string>(key, 'a string', (v) => typeof v === 'string');
  const choice = (key: string) => {
    const v = str(key);
    return v === 'auto' ? undefined : v;
  };

  let rawServer: Record<string, unknown> = {};
  const settings: Settings = {
    serverCommand: str('server.command') ?? DEFAULTS.serverCommand,
    serverArgs:
      read<string[]>(
        'server.args',
        'an array of strings',
        (v) => Array.isArray(v) && v.every((a) => typeof a === 'string'),
      ) ?? DEFAULTS.serverArgs,
    model: str('model'),
    device: choice('device'),
    dtype: choice('dtype'),
    maxTokens: read<number>(
      'maxTokens',
      'a positive integer',
      (v) => Number.isInteger(v) && (v as number) > 0,
    ),
    serverSettings: split(
      (rawServer = read<Record<string, unknown>>('serverSettings', 'an object', isObject) ?? {}),
      false,
    ),
    remote: split(read<Record<string, unknown>>('remote', 'an object', isObject) ?? {}, true),
    enable:
      read<Record<string, boolean>>(
        'enable',
        'an object of language id -> boolean',
        (v) => isObject(v) && Object.values(v).every((b) => typeof b === 'boolean'),
      ) ?? DEFAULTS.enable,
  };
  const misplaced = Object.keys(split(rawServer, true));
  if (misplaced.length > 0) {
    problems.push(
      `${SECTION}.serverSettings: ${misplaced.join(', ')} ignored; the remote backend is set in ${SECTION}.remote (user settings only)`,
    );
  }
  return { settings, problems };
}

export interface ServerLaunch {
  readonly command: string;
  readonly args: readonly string[];
}

export function serverLaunch(s: Settings): ServerLaunch {
  return { command: s.serverCommand, args: [...s.serverArgs] };
}

/** The server's settings object (camelCase keys); the named settings win over `serverSettings`. */
export function serverConfiguration(s: Settings): Record<string, unknown> {
  const named = { model: s.model, device: s.device, dtype: s.dtype, maxTokens: s.maxTokens };
  const set = Object.entries(named).filter(([, v]) => v !== undefined);
  return { ...s.serverSettings, ...s.remote, ...Object.fromEntries(set) };
}

export function initializationOptions(s: Settings): Record<string, unknown> {
  return { [SERVER_SECTION]: serverConfiguration(s) };
}

/** True when a change needs a new server process: only its command line does. */
export function needsRestart(a: Settings, b: Settings): boolean {
  return JSON.stringify(serverLaunch(a)) !== JSON.stringify(serverLaunch(b));
}

/** True when the server must be told (`workspace/didChangeConfiguration`). */
export function serverConfigurationChanged(a: Settings, b: Settings): boolean {
  return JSON.stringify(serverConfiguration(a)) !== JSON.stringify(serverConfiguration(b));
}

/** Whether the server runs its bundled model: no model in the settings or on its command line, and the
 * in-process backend (a remote backend serves a model of its own). */
export function usesBundledModel(s: Settings): boolean {
  const { model, backend } = serverConfiguration(s);
  const onCommandLine = s.serverArgs.some((a) => a === '--model' || a.startsWith('--model='));
  return (model ?? '') === '' && backend !== 'remote' && !onCommandLine;
}

/** A language listed in `enable`, else `*`, else the model's languages: Python for the bundled model,
 * every language but plain text and commit messages for a model of your own. */
export function isEnabled(s: Settings, languageId: string): boolean {
  const set = s.enable[languageId] ?? s.enable['*'];
  if (set !== undefined) return set;
  if (usesBundledModel(s)) return BUNDLED_MODEL_LANGUAGES.includes(languageId);
  return !PROSE_LANGUAGES.includes(languageId);
}
