--- Buffer-local Insert-mode keymaps: accept, accept word, accept line and dismiss act only while a
--- suggestion is shown and otherwise do what their key does; trigger always asks.

local M = {}

M.ACTIONS = { 'accept', 'accept_word', 'accept_line', 'dismiss' }

--- @param bufnr integer
--- @param keys lsp_dscoder.Keymaps
--- @param visible fun(bufnr: integer): boolean
--- @param trigger function
function M.set(bufnr, keys, visible, trigger)
  for _, action in ipairs(M.ACTIONS) do
    local lhs = keys[action]
    if lhs then
      vim.keymap.set('i', lhs, function()
        if visible(bufnr) then
          -- An expression mapping may not change the buffer: run the action as a command.
          return ('<Cmd>lua require("lsp_dscoder").%s()<CR>'):format(action)
        end
        return lhs
      end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'lsp-dscoder: ' .. action })
    end
  end
  if keys.trigger then
    vim.keymap.set('i', keys.trigger, trigger, { buffer = bufnr, desc = 'lsp-dscoder: trigger' })
  end
end

--- @param bufnr integer
--- @param keys lsp_dscoder.Keymaps
function M.del(bufnr, keys)
  for _, lhs in pairs(keys) do
    if lhs then
      pcall(vim.keymap.del, 'i', lhs, { buffer = bufnr })
    end
  end
end

return M
