--- Buffer-local Insert-mode keymaps: accept, accept word, accept line and dismiss act only while a
--- suggestion is shown and otherwise fall through to the mapping they shadow (e.g. Neovim's default
--- snippet <Tab>) or to the key itself (dismiss also cancels a request in flight); trigger always asks.

local M = {}

M.ACTIONS = { 'accept', 'accept_word', 'accept_line', 'dismiss' }

local shadowed = {} ---@type table<integer, table<string, table>> bufnr -> action -> maparg() it shadows

--- Run the shadowed mapping's callback: a non-expression callback cannot run inside our expression
--- mapping, so the fall-through calls it through this as a command.
--- @param bufnr integer
--- @param action string
function M.run(bufnr, action)
  shadowed[bufnr][action].callback()
end

--- Keys that do what `lhs` did before we mapped it: the shadowed mapping, or the key itself.
local function fall_through(bufnr, action, lhs)
  local prev = shadowed[bufnr][action]
  if vim.tbl_isempty(prev) then
    return lhs
  end
  if prev.expr == 1 then
    return (prev.callback and prev.callback() or vim.api.nvim_eval(prev.rhs)) or ''
  end
  if prev.callback then
    return ('<Cmd>lua require("lsp_dscoder.keymaps").run(%d, "%s")<CR>'):format(bufnr, action)
  end
  return prev.rhs
end

--- @param bufnr integer
--- @param keys lsp_dscoder.Keymaps
--- @param visible fun(bufnr: integer): boolean
--- @param trigger function
function M.set(bufnr, keys, visible, trigger)
  local before = shadowed[bufnr] or {}
  shadowed[bufnr] = {}
  for _, action in ipairs(M.ACTIONS) do
    local lhs = keys[action]
    if lhs then
      local prev = vim.api.nvim_buf_call(bufnr, function()
        return vim.fn.maparg(lhs, 'i', false, true)
      end)
      -- Mapped twice: keep what the first mapping shadowed, never fall through to ourselves.
      if (prev.desc or ''):find('^lsp%-dscoder:') then
        prev = before[action] or {}
      end
      shadowed[bufnr][action] = prev
      -- An expression mapping may not change the buffer: the action runs as a command.
      local command = ('<Cmd>lua require("lsp_dscoder").%s()<CR>'):format(action)
      vim.keymap.set('i', lhs, function()
        if visible(bufnr) then
          return command
        end
        -- Dismiss before anything is shown still cancels the request in flight.
        return (action == 'dismiss' and command or '') .. fall_through(bufnr, action, lhs)
      end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'lsp-dscoder: ' .. action })
    end
  end
  if keys.trigger then
    vim.keymap.set('i', keys.trigger, trigger, { buffer = bufnr, desc = 'lsp-dscoder: trigger' })
  end
end

--- Remove the keymaps and restore the buffer's own mappings they replaced.
--- @param bufnr integer
--- @param keys lsp_dscoder.Keymaps
function M.del(bufnr, keys)
  for action, lhs in pairs(keys) do
    if lhs then
      pcall(vim.keymap.del, 'i', lhs, { buffer = bufnr })
      local prev = (shadowed[bufnr] or {})[action]
      if prev and prev.buffer == 1 then
        vim.api.nvim_buf_call(bufnr, function()
          vim.fn.mapset('i', false, prev)
        end)
      end
    end
  end
  shadowed[bufnr] = nil
end

return M
