--- Options of `require("lsp_dscoder").setup{...}`: defaults and validation.
--- Model, device and decoding settings belong to the server (`cmd`, `init_options`), not here.

local M = {}

--- @class lsp_dscoder.Keymaps
--- @field accept string|false
--- @field accept_word string|false
--- @field accept_line string|false
--- @field dismiss string|false
--- @field trigger string|false

--- @class lsp_dscoder.Config
--- @field cmd string[]
--- @field init_options table
--- @field filetypes string[]|nil
--- @field enabled fun(bufnr: integer): boolean
--- @field root_markers string[]
--- @field auto_trigger boolean
--- @field native boolean
--- @field keymaps lsp_dscoder.Keymaps

--- What the bundled model (the server's default) was trained on: Python only.
M.BUNDLED_MODEL_FILETYPES = { 'python' }

--- Whether the server runs its bundled model: no `model` in init_options and no `--model` in cmd.
--- @param cfg lsp_dscoder.Config
--- @return boolean
function M.uses_bundled_model(cfg)
  local model = cfg.init_options.model
  if model ~= nil and model ~= vim.NIL and model ~= '' then
    return false
  end
  for _, arg in ipairs(cfg.cmd) do
    if arg == '--model' or vim.startswith(arg, '--model=') then
      return false
    end
  end
  return true
end

--- The filetypes that get suggestions, nil for all: the `filetypes` option, where `"*"` means all;
--- unset, the languages of the model: Python for the bundled model, all for a configured one.
--- @param cfg lsp_dscoder.Config
--- @return string[]?
function M.filetypes(cfg)
  if cfg.filetypes == nil then
    return M.uses_bundled_model(cfg) and M.BUNDLED_MODEL_FILETYPES or nil
  end
  return not vim.tbl_contains(cfg.filetypes, '*') and cfg.filetypes or nil
end

--- The options `setup` takes (a misspelt one is an error, not silently ignored).
M.OPTIONS = {
  'cmd',
  'init_options',
  'filetypes',
  'enabled',
  'root_markers',
  'auto_trigger',
  'native',
  'keymaps',
}

--- @return lsp_dscoder.Config
function M.defaults()
  return {
    cmd = { 'lsp-dscoder', '--stdio' },
    init_options = {},
    filetypes = nil,
    enabled = function()
      return true
    end,
    root_markers = { '.git' },
    auto_trigger = true,
    native = vim.fn.has('nvim-0.12') == 1,
    keymaps = {
      accept = '<Tab>',
      accept_word = '<C-Right>',
      accept_line = '<C-Down>',
      dismiss = '<C-]>',
      trigger = '<M-\\>',
    },
  }
end

local function fail(name, expected, value)
  error(('lsp_dscoder.setup: %s must be %s, got %s'):format(name, expected, vim.inspect(value)), 4)
end

local function is_string_list(v)
  if type(v) ~= 'table' or not vim.islist(v) then
    return false
  end
  for _, s in ipairs(v) do
    if type(s) ~= 'string' then
      return false
    end
  end
  return true
end

--- Merge user options over the defaults; a wrong type raises an error naming the option and value.
--- @param opts table|nil
--- @return lsp_dscoder.Config
function M.resolve(opts)
  opts = opts or {}
  if type(opts) ~= 'table' then
    fail('options', 'a table', opts)
  end
  for key in pairs(opts) do
    if not vim.tbl_contains(M.OPTIONS, key) then
      fail('option ' .. tostring(key), 'one of ' .. table.concat(M.OPTIONS, ', '), key)
    end
  end
  local cfg = vim.tbl_deep_extend('force', M.defaults(), opts)
  -- Lists replace, they are not merged index by index.
  for _, key in ipairs({ 'cmd', 'filetypes', 'root_markers' }) do
    if opts[key] ~= nil then
      cfg[key] = opts[key]
    end
  end
  if not is_string_list(cfg.cmd) or #cfg.cmd == 0 then
    fail('cmd', 'a non-empty list of strings', cfg.cmd)
  end
  if type(cfg.init_options) ~= 'table' then
    fail('init_options', 'a table', cfg.init_options)
  end
  if cfg.filetypes ~= nil and not is_string_list(cfg.filetypes) then
    fail('filetypes', 'nil or a list of strings', cfg.filetypes)
  end
  if type(cfg.enabled) ~= 'function' then
    fail('enabled', 'a function(bufnr) -> boolean', cfg.enabled)
  end
  if not is_string_list(cfg.root_markers) then
    fail('root_markers', 'a list of strings', cfg.root_markers)
  end
  for _, key in ipairs({ 'auto_trigger', 'native' }) do
    if type(cfg[key]) ~= 'boolean' then
      fail(key, 'a boolean', cfg[key])
    end
  end
  if type(cfg.keymaps) ~= 'table' then
    fail('keymaps', 'a table', cfg.keymaps)
  end
  for name, lhs in pairs(cfg.keymaps) do
    if M.defaults().keymaps[name] == nil then
      fail('keymaps.' .. name, 'one of accept, accept_word, accept_line, dismiss, trigger', name)
    end
    if lhs ~= false and type(lhs) ~= 'string' then
      fail('keymaps.' .. name, 'a key string or false', lhs)
    end
  end
  if cfg.native and vim.fn.has('nvim-0.12') == 0 then
    fail('native', 'false before Neovim 0.12 (vim.lsp.inline_completion is missing)', cfg.native)
  end
  return cfg
end

return M
