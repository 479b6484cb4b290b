--- lsp-dscoder for Neovim: starts the `lsp-dscoder` language server for the buffers it is enabled for
--- and shows its inline completions as ghost text while you type. See `:help lsp-dscoder`.

local config = require('lsp_dscoder.config')
local ghost = require('lsp_dscoder.ghost')
local keymaps = require('lsp_dscoder.keymaps')
local request = require('lsp_dscoder.request')
local restart = require('lsp_dscoder.restart')
local status = require('lsp_dscoder.status')
local suggestion = require('lsp_dscoder.suggestion')

local M = {}

M.client_name = 'lsp_dscoder'

local cfg = nil ---@type lsp_dscoder.Config?
local augroup = nil ---@type integer?
--- Buffers whose server failed to start with the current `cmd`: not tried again (FileType, BufEnter
--- and `:e` would each report the same spawn error) until setup() is called again.
local start_failed = {} ---@type table<integer, true>

local function native()
  return require('lsp_dscoder.native')
end

--- @param bufnr integer?
--- @return vim.lsp.Client?
local function client_of(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr or vim.api.nvim_get_current_buf(), name = M.client_name })[1]
end

local function wanted(bufnr)
  if
    not vim.api.nvim_buf_is_loaded(bufnr)
    or vim.bo[bufnr].buftype ~= ''
    or vim.api.nvim_buf_get_name(bufnr) == ''
  then
    return false
  end
  local filetypes = config.filetypes(cfg)
  if filetypes and not vim.tbl_contains(filetypes, vim.bo[bufnr].filetype) then
    return false
  end
  return cfg.enabled(bufnr) and true or false
end

local function on_partial(err, params, ctx)
  if cfg.native then
    native().on_partial(err, params)
  else
    request.on_partial(err, params, ctx)
  end
end

local function start(bufnr)
  if start_failed[bufnr] or not wanted(bufnr) or client_of(bufnr) then
    return
  end
  local capabilities = vim.lsp.protocol.make_client_capabilities()
  capabilities.textDocument.inlineCompletion = capabilities.textDocument.inlineCompletion
    or { dynamicRegistration = false }
  local client_id = vim.lsp.start({
    name = M.client_name,
    cmd = cfg.cmd,
    root_dir = vim.fs.root(bufnr, cfg.root_markers) or vim.uv.cwd(),
    init_options = cfg.init_options,
    capabilities = capabilities,
    handlers = {
      ['dscoder/partialCompletion'] = on_partial,
      ['dscoder/status'] = function(_, params)
        status.on_backend_status(params)
      end,
    },
    on_exit = function(code, signal, client_id)
      restart.on_exit(code, signal, client_id, function()
        for _, b in ipairs(vim.api.nvim_list_bufs()) do
          start(b)
        end
      end)
    end,
  }, {
    bufnr = bufnr,
    -- One server (one model in memory) for every buffer, whatever its project.
    reuse_client = function(client, conf)
      return client.name == conf.name and restart.reusable(client)
    end,
  })
  if not client_id and not client_of(bufnr) then
    -- Neovim has reported why (once); remember it for this buffer and for the statusline.
    start_failed[bufnr] = true
    local why = vim.fn.executable(cfg.cmd[1]) == 1 and 'could not start' or 'not executable:'
    status.set_failure(('%s %s'):format(why, cfg.cmd[1]))
  end
end

--- The model finished loading: ask for a suggestion at the cursor, which typing before it was ready
--- did not get.
local function on_ready(client)
  local bufnr = vim.api.nvim_get_current_buf()
  if not cfg.auto_trigger or not client.attached_buffers[bufnr] then
    return
  end
  if vim.api.nvim_get_mode().mode:sub(1, 1) ~= 'i' then
    return
  end
  if cfg.native then
    vim.lsp.inline_completion.get({ bufnr = bufnr })
  else
    suggestion.request(bufnr, client, suggestion.TriggerKind.AUTOMATIC)
  end
end

local function on_attach(bufnr)
  keymaps.set(bufnr, cfg.keymaps, M.visible, M.trigger)
  if cfg.native then
    native().attach(bufnr)
    return
  end
  local function with_client(fn)
    return function()
      local client = client_of(bufnr)
      if client then
        fn(client)
      end
    end
  end
  local function autocmd(events, callback)
    vim.api.nvim_create_autocmd(events, { group = augroup, buffer = bufnr, callback = callback })
  end
  autocmd('InsertEnter', function()
    suggestion.on_insert_enter(bufnr)
    if cfg.auto_trigger then
      -- After the cursor has settled for `a`, `A`, `o`...
      vim.schedule(with_client(function(client)
        suggestion.request(bufnr, client, suggestion.TriggerKind.AUTOMATIC)
      end))
    end
  end)
  autocmd(
    { 'TextChangedI', 'TextChangedP' },
    with_client(function(client)
      suggestion.on_change(bufnr, client, cfg.auto_trigger)
    end)
  )
  autocmd('CursorMovedI', function()
    suggestion.on_cursor_moved(bufnr)
  end)
  autocmd({ 'InsertLeave', 'BufLeave' }, function()
    suggestion.dismiss(bufnr)
  end)
end

local function on_detach(bufnr)
  keymaps.del(bufnr, cfg.keymaps)
  if cfg.native then
    native().detach(bufnr)
  else
    vim.api.nvim_clear_autocmds({ group = augroup, buffer = bufnr })
    suggestion.forget(bufnr)
  end
end

local function our_clients()
  return vim.lsp.get_clients({ name = M.client_name })
end

--- Configure and start. Options: `:help lsp-dscoder-setup`. Called again, it applies the new options to
--- the attached buffers and sends changed `init_options` as `workspace/didChangeConfiguration`; a new
--- `cmd` takes effect when the server next starts.
--- @param opts table?
function M.setup(opts)
  local new = config.resolve(opts)
  for _, client in ipairs(cfg and our_clients() or {}) do
    for bufnr in pairs(client.attached_buffers) do
      on_detach(bufnr)
    end
    if not vim.deep_equal(cfg.init_options, new.init_options) then
      local params = { settings = new.init_options }
      if vim.fn.has('nvim-0.11') == 1 then
        client:notify('workspace/didChangeConfiguration', params)
      else
        client.notify('workspace/didChangeConfiguration', params)
      end
    end
  end
  cfg = new
  start_failed = {}
  restart.forget()
  status.clear_failure()
  ghost.define_highlight()
  augroup = vim.api.nvim_create_augroup('lsp_dscoder', { clear = true })
  local function ours(ev)
    local client = vim.lsp.get_client_by_id(ev.data.client_id)
    return client ~= nil and client.name == M.client_name
  end
  vim.api.nvim_create_autocmd({ 'FileType', 'BufEnter' }, {
    group = augroup,
    callback = function(ev)
      local client = client_of(ev.buf)
      if client and ev.event == 'FileType' and not wanted(ev.buf) then
        vim.lsp.buf_detach_client(ev.buf, client.id) -- `:set filetype=` to one that gets no suggestions
        return
      end
      start(ev.buf)
    end,
  })
  vim.api.nvim_create_autocmd('LspAttach', {
    group = augroup,
    callback = function(ev)
      if ours(ev) then
        on_attach(ev.buf)
      end
    end,
  })
  vim.api.nvim_create_autocmd('LspDetach', {
    group = augroup,
    callback = function(ev)
      if ours(ev) then
        on_detach(ev.buf)
      end
    end,
  })
  vim.api.nvim_create_autocmd('LspProgress', {
    group = augroup,
    callback = function(ev)
      if ours(ev) then
        local params = ev.data.params or ev.data.result
        status.on_progress(params)
        if status.is_ready_end(params) then
          vim.schedule(function()
            local client = vim.lsp.get_client_by_id(ev.data.client_id)
            if client then
              on_ready(client)
            end
          end)
        end
      end
    end,
  })
  if cfg.native then
    vim.api.nvim_create_autocmd('LspRequest', {
      group = augroup,
      callback = function(ev)
        if ours(ev) then
          native().on_lsp_request(ev.data)
        end
      end,
    })
  end
  vim.api.nvim_create_autocmd('ColorScheme', { group = augroup, callback = ghost.define_highlight })
  for _, client in ipairs(our_clients()) do
    for bufnr in pairs(client.attached_buffers) do
      if wanted(bufnr) then
        on_attach(bufnr)
      else
        vim.lsp.buf_detach_client(bufnr, client.id)
      end
    end
  end
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    start(bufnr)
  end
end

local function act(fn)
  return function()
    local bufnr = vim.api.nvim_get_current_buf()
    local client = cfg and client_of(bufnr)
    if not client then
      return false
    end
    return fn(bufnr, client)
  end
end

--- Insert the whole suggestion at the cursor. @return boolean accepted
M.accept = act(function(bufnr, client)
  if cfg.native then
    return native().accept(bufnr)
  end
  return suggestion.accept(bufnr, client, suggestion.Part.ALL, cfg.auto_trigger)
end)

--- Insert the suggestion up to the end of its next word. @return boolean accepted
M.accept_word = act(function(bufnr, client)
  return not cfg.native and suggestion.accept(bufnr, client, suggestion.Part.WORD, cfg.auto_trigger)
end)

--- Insert the suggestion up to the end of its current line. @return boolean accepted
M.accept_line = act(function(bufnr, client)
  return not cfg.native and suggestion.accept(bufnr, client, suggestion.Part.LINE, cfg.auto_trigger)
end)

--- Hide the suggestion and cancel its request. @return boolean whether one was shown
M.dismiss = act(function(bufnr)
  if cfg.native then
    return native().dismiss(bufnr)
  end
  return suggestion.dismiss(bufnr)
end)

--- Ask for a suggestion at the cursor now (also with `auto_trigger = false`).
M.trigger = act(function(bufnr, client)
  if cfg.native then
    vim.lsp.inline_completion.get({ bufnr = bufnr })
  else
    suggestion.request(bufnr, client, suggestion.TriggerKind.INVOKED)
  end
  return true
end)

--- Whether a suggestion is shown at the cursor of buffer `bufnr` (default: current).
--- @param bufnr integer?
--- @return boolean
function M.visible(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  if not cfg then
    return false
  end
  if cfg.native then
    return native().visible(bufnr)
  end
  return suggestion.get(bufnr) ~= nil
end

--- The suggestion shown at the cursor: `{row, col, text}` (0-based row, byte col, the text
--- accepting inserts), or nil. Not available with `native = true`.
--- @param bufnr integer?
--- @return {row: integer, col: integer, text: string}?
function M.get_suggestion(bufnr)
  local shown = cfg and not cfg.native and suggestion.get(bufnr or vim.api.nvim_get_current_buf())
  return shown and { row = shown.row, col = shown.col, text = shown.text } or nil
end

--- The resolved options, or nil before setup().
--- @return lsp_dscoder.Config?
function M.config()
  return cfg
end

--- State for statuslines: `{state = "off"|"loading"|"idle"|"generating"|"failed", ttft_ms?, progress?,
--- error?}` (`error`: why the model did not load or the server did not start).
--- @return lsp_dscoder.StatusInfo
function M.status_info()
  local client = our_clients()[1]
  return status.info(client ~= nil, client ~= nil and client.initialized == true)
end

--- A short statusline string, e.g. `dscoder: idle · TTFT 31 ms`.
--- @return string
function M.status()
  return status.format(M.status_info())
end

return M
