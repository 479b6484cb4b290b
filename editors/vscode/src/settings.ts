/**
 * The extension's settings (section `lspDscoder`): read once per change, checked for type, and turned
 * into the server's command line and `initializationOptions`. No VS Code imports: unit-tested in node.
 *
 * The values themselves (a model folder, a device name, a token count) are the server's to validate;
 * the extension only passes them on.
 */

export const SECTION = 'lspDscoder';

export interface Settings {
  /** Executable of the language server. */
  readonly serverCommand: string;
  /** Arguments before the model options; `--stdio` selects the transport. */
  readonly serverArgs: readonly string[];
  /** Hugging Face checkpoint folder; `undefined`: the server's default. */
  readonly model: string | undefined;
  /** `undefined` means "let the server choose" (the `auto` setting). */
  readonly device: string | undefined;
  readonly dtype: string | undefined;
  readonly maxTokens: number | undefined;
  /** Language id -> enabled; the key `*` is the default for languages not listed. */
  readonly enable: Readonly<Record<string, boolean>>;
}

export const DEFAULTS: Settings = {
  serverCommand: 'lsp-dscoder',
  serverArgs: ['--stdio'],
  model: undefined,
  device: undefined,
  dtype: undefined,
  maxTokens: undefined,
  enable: { '*': true, plaintext: false, scminput: false },
};

/** Settings plus one message per value that had the wrong type and fell back to its default. */
export interface ReadResult {
  readonly settings: Settings;
  readonly problems: readonly string[];
}

/** `get(key)` returns the raw value of `lspDscoder.<key>` (undefined when unset). */
export function readSettings(get: (key: string) => unknown): ReadResult {
  const problems: string[] = [];
  const bad = (key: string, value: unknown, expected: string): undefined => {
    problems.push(`${SECTION}.${key}: expected ${expected}, got ${JSON.stringify(value)}; using the default`);
    return undefined;
  };
  const str = (key: string): string | undefined => {
    const v = get(key);
    if (v === undefined || v === null || v === '') return undefined;
    return typeof v === 'string' ? v : bad(key, v, 'a string');
  };
  const choice = (key: string): string | undefined => {
    const v = str(key);
    return v === 'auto' ? undefined : v;
  };
  const positiveInt = (key: string): number | undefined => {
    const v = get(key);
    if (v === undefined || v === null) return undefined;
    return Number.isInteger(v) && (v as number) > 0 ? (v as number) : bad(key, v, 'a positive integer');
  };
  const strings = (key: string): string[] | undefined => {
    const v = get(key);
    if (v === undefined || v === null) return undefined;
    const ok = Array.isArray(v) && v.every((a) => typeof a === 'string');
    return ok ? (v as string[]) : bad(key, v, 'an array of strings');
  };
  const enableMap = (key: string): Record<string, boolean> | undefined => {
    const v = get(key);
    if (v === undefined || v === null) return undefined;
    const ok =
      typeof v === 'object' && !Array.isArray(v) && Object.values(v).every((b) => typeof b === 'boolean');
    return ok ? (v as Record<string, boolean>) : bad(key, v, 'an object of language id -> boolean');
  };

  const settings: Settings = {
    serverCommand: str('server.command') ?? DEFAULTS.serverCommand,
    serverArgs: strings('server.args') ?? DEFAULTS.serverArgs,
    model: str('model'),
    device: choice('device'),
    dtype: choice('dtype'),
    maxTokens: positiveInt('maxTokens'),
    enable: enableMap('enable') ?? DEFAULTS.enable,
  };
  return { settings, problems };
}

/** How to start the server: the model is loaded at start, so its options are command-line flags. */
export interface ServerLaunch {
  readonly command: string;
  readonly args: readonly string[];
}

export function serverLaunch(s: Settings): ServerLaunch {
  const args = [...s.serverArgs];
  if (s.model !== undefined) args.push('--model', s.model);
  if (s.device !== undefined) args.push('--device', s.device);
  if (s.dtype !== undefined) args.push('--dtype', s.dtype);
  return { command: s.serverCommand, args };
}

/** Settings the server reads per request; also sent again through `workspace/didChangeConfiguration`. */
export function initializationOptions(s: Settings): Record<string, unknown> {
  const options: Record<string, unknown> = {};
  if (s.maxTokens !== undefined) options.maxTokens = s.maxTokens;
  return options;
}

/** True when a change needs a new server process (the model and device are fixed at start). */
export function needsRestart(a: Settings, b: Settings): boolean {
  return JSON.stringify(serverLaunch(a)) !== JSON.stringify(serverLaunch(b));
}

export function isEnabled(s: Settings, languageId: string): boolean {
  return s.enable[languageId] ?? s.enable['*'] ?? true;
}
