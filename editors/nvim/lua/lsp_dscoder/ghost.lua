--- Ghost text for Neovim 0.10/0.11: one extmark per buffer that shows a suggestion at the cursor,
--- the first line inline (`virt_text_pos = "inline"`), the other lines as virtual lines below.
--- Display only: nothing here touches buffer text.

local M = {}

M.namespace = vim.api.nvim_create_namespace('lsp_dscoder')
M.hl_group = 'LspDscoderGhost'

--- Define the highlight group without overriding a colorscheme's choice.
function M.define_highlight()
  vim.api.nvim_set_hl(0, M.hl_group, { link = 'Comment', default = true })
end

--- Show `text` as if it were inserted at (row, col) (0-based row, byte col).
--- @param bufnr integer
--- @param row integer
--- @param col integer
--- @param text string
function M.show(bufnr, row, col, text)
  local lines = vim.split(text, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    -- An empty chunk list draws an empty virtual line.
    virt_lines[#virt_lines + 1] = lines[i] ~= '' and { { lines[i], M.hl_group } } or {}
  end
  vim.api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  vim.api.nvim_buf_set_extmark(bufnr, M.namespace, row, col, {
    virt_text = { { lines[1], M.hl_group } },
    virt_text_pos = 'inline',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
  })
end

--- @param bufnr integer
function M.clear(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
end

return M
