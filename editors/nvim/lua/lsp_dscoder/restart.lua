--- A server that exits on its own after it answered `initialize` (a crash, killed for memory) is started
--- again, at most RESTARTS times in RESTART_WINDOW_S, as VS Code's client does; then the statusline says
--- why it stopped. One that never initialized would fail the same way again and is not; one stopped on
--- purpose (`:LspStop`, Neovim exiting) is not.

local status = require('lsp_dscoder.status')

local M = {}

local RESTARTS, RESTART_WINDOW_S = 4, 180
local restarted_at = {} ---@type number[] vim.uv.now() of the restarts inside the window
local exited = {} ---@type table<integer, true> client ids whose process has exited

--- Whether `client` may serve another buffer: not once its process has exited (Neovim forgets it a
--- moment later).
--- @param client vim.lsp.Client
--- @return boolean
function M.reusable(client)
  return not exited[client.id]
end

--- A new setup: the restarts so far no longer count.
function M.forget()
  restarted_at = {}
end

--- @param code integer
--- @param signal integer
--- @param start fun() starts the server for the buffers that want it
local function restart(code, signal, start)
  local now = vim.uv.now()
  restarted_at = vim.tbl_filter(function(t)
    return now - t < RESTART_WINDOW_S * 1000
  end, restarted_at)
  local how = signal ~= 0 and ('signal %d'):format(signal) or ('code %d'):format(code)
  if #restarted_at >= RESTARTS then
    local why = ('the server exited (%s) %d times in %d minutes: not restarted'):format(
      how,
      RESTARTS + 1,
      RESTART_WINDOW_S / 60
    )
    status.set_failure(why)
    vim.notify('lsp-dscoder: ' .. why .. ' (:checkhealth lsp_dscoder)', vim.log.levels.ERROR)
    return
  end
  restarted_at[#restarted_at + 1] = now
  vim.notify(('lsp-dscoder: the server exited (%s); starting it again'):format(how), vim.log.levels.WARN)
  start()
end

--- The client's `on_exit`.
--- @param code integer
--- @param signal integer
--- @param client_id integer
--- @param start fun() starts the server for the buffers that want it
function M.on_exit(code, signal, client_id, start)
  local client = vim.lsp.get_client_by_id(client_id) -- still known: Neovim forgets it after this call
  exited[client_id] = true
  vim.schedule(status.reset)
  -- Code 0: it was stopped (`:LspStop`, Neovim exiting); 15: Neovim ended it.
  local stopped = (code == 0 and signal == 0) or signal == 15 or vim.v.exiting ~= vim.NIL
  if stopped or not (client and client.initialized) then
    return
  end
  -- After Neovim has detached and forgotten the old client (it schedules that after this callback).
  vim.defer_fn(function()
    restart(code, signal, start)
  end, 50)
end

return M
