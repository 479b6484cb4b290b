--- What a statusline shows: loading (the server's `$/progress`), idle, generating, failed (the model
--- did not load, or the server could not start: with the reason), unreachable (the remote backend's
--- endpoint is down: the server's `dscoder/status`, with the reason), and the last time to first token
--- as the editor saw it (request sent -> first streamed text).
--- Fires `User LspDscoderStatus` whenever the displayed state changes.

local M = {}

--- @enum lsp_dscoder.State
M.State = {
  OFF = 'off',
  LOADING = 'loading',
  IDLE = 'idle',
  GENERATING = 'generating',
  FAILED = 'failed',
  UNREACHABLE = 'unreachable',
}

local progress = {} ---@type table<string|integer, {title: string?, message: string?, percentage: integer?}>
local generating = {} ---@type table<integer, boolean> bufnr -> request in flight
local last_ttft_ms = nil ---@type number?
local last_shown = nil ---@type string?
local failure = nil ---@type string? why the model did not load / the server did not start
local load_ended = false -- a load progress has ended since the server started: before, it is loading
local unreachable = nil ---@type string? why the remote backend's endpoint is down

--- @class lsp_dscoder.StatusInfo
--- @field state lsp_dscoder.State
--- @field ttft_ms number?
--- @field progress {title: string?, message: string?, percentage: integer?}?
--- @field error string? with state `failed` or `unreachable`: why

--- @param running boolean whether the server process is up
--- @param ready boolean whether it answered `initialize`
--- @return lsp_dscoder.StatusInfo
function M.info(running, ready)
  local info = { state = M.State.OFF, ttft_ms = last_ttft_ms }
  local _, work = next(progress)
  if failure and not work then
    info.state, info.error = M.State.FAILED, failure
    return info
  end
  if not running then
    return info
  end
  if work or not ready or not load_ended then
    info.state, info.progress = M.State.LOADING, work
  elseif unreachable then
    info.state, info.error = M.State.UNREACHABLE, unreachable
  elseif next(generating) then
    info.state = M.State.GENERATING
  else
    info.state = M.State.IDLE
  end
  return info
end

--- @param info lsp_dscoder.StatusInfo
--- @return string
function M.format(info)
  local parts = { 'dscoder: ' .. info.state }
  local p = info.progress
  local what = p and (p.message or p.title)
  if what then
    parts[#parts + 1] = what .. (p.percentage and (' ' .. p.percentage .. '%') or '')
  end
  if info.error then
    parts[#parts + 1] = info.error
  elseif info.ttft_ms then
    parts[#parts + 1] = ('TTFT %d ms'):format(math.floor(info.ttft_ms + 0.5))
  end
  return table.concat(parts, ' · ')
end

local function changed()
  local shown = M.format(M.info(true, true))
  if shown ~= last_shown then
    last_shown = shown
    vim.api.nvim_exec_autocmds('User', { pattern = 'LspDscoderStatus', modeline = false })
  end
end

--- Feed a `$/progress` notification of the server.
--- @param params {token: string|integer, value: table}
function M.on_progress(params)
  local value = params.value or {}
  if value.kind == 'begin' then
    failure = nil
    progress[params.token] = { title = value.title, message = value.message, percentage = value.percentage }
  elseif value.kind == 'report' and progress[params.token] then
    local work = progress[params.token]
    work.message = value.message or work.message
    work.percentage = value.percentage or work.percentage
  elseif value.kind == 'end' then
    progress[params.token] = nil
    load_ended = true
    -- The server ends its load progress with `ready` or `failed: <reason>`.
    local reason = type(value.message) == 'string' and value.message:match('^failed:%s*(.*)$')
    if reason then
      failure = reason ~= '' and reason or 'the model did not load'
    end
  end
  changed()
end

--- Feed a `dscoder/status` notification: the remote endpoint went down (`reachable` false, `error`
--- why) or works again.
--- @param params {reachable: boolean, error: string?, endpoint: string?}
function M.on_backend_status(params)
  if params.reachable == false then
    local why = type(params.error) == 'string' and params.error or nil
    unreachable = why or ('the completion endpoint ' .. tostring(params.endpoint) .. ' is down')
  else
    unreachable = nil
  end
  changed()
end

--- The server could not start (or the model not load): shown until a new load begins.
--- @param reason string
function M.set_failure(reason)
  failure = reason
  changed()
end

--- Whether the last load progress ended with the model ready (not loading, not failed).
--- @param params {token: string|integer, value: table}
--- @return boolean
function M.is_ready_end(params)
  local value = params.value or {}
  return value.kind == 'end' and not (type(value.message) == 'string' and value.message:find('^failed'))
end

--- @param bufnr integer
--- @param busy boolean
function M.set_generating(bufnr, busy)
  generating[bufnr] = busy or nil
  changed()
end

--- @param ms number
function M.record_ttft(ms)
  last_ttft_ms = ms
  changed()
end

--- Forget the server's progress and requests (it exited); a failure stays shown.
function M.reset()
  progress, generating, load_ended, unreachable = {}, {}, false, nil
  changed()
end

--- Forget a failure too (setup() again: a new command or model).
function M.clear_failure()
  failure = nil
  changed()
end

return M
