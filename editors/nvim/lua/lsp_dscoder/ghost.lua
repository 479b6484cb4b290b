--- Ghost text for Neovim 0.10/0.11: one extmark per buffer that shows a suggestion at the cursor,
--- the first line inline (`virt_text_pos = "inline"`), the other lines as virtual lines below.
--- The namespace is scoped to the window with the cursor, so that other windows on the same buffer do
--- not show it. Display only: nothing here touches buffer text.

local M = {}

M.namespace = vim.api.nvim_create_namespace('lsp_dscoder')
M.hl_group = 'LspDscoderGhost'

--- Define the highlight group without overriding a colorscheme's choice.
function M.define_highlight()
  vim.api.nvim_set_hl(0, M.hl_group, { link = 'Comment', default = true })
end

--- Draw this namespace in window `win` only (Neovim 0.10: nvim__win_add_ns; 0.11+: nvim__ns_set).
local function scope_to(win)
  if vim.api.nvim__ns_set then
    vim.api.nvim__ns_set(M.namespace, { wins = { win } })
  elseif vim.api.nvim__win_add_ns then
    for _, other in ipairs(vim.api.nvim_list_wins()) do
      vim.api.nvim__win_del_ns(other, M.namespace)
    end
    vim.api.nvim__win_add_ns(win, M.namespace)
  end
end

--- Screen lines of a suggestion at `row` with `extra` lines after its first (drawn as virtual lines
--- below `row`) that fall below the bottom of the current window; 0 when all of it is visible.
--- @param row integer
--- @param extra integer
--- @return integer
function M.lines_below_window(row, extra)
  local info = vim.fn.getwininfo(vim.api.nvim_get_current_win())[1]
  -- Virtual lines below `row` count as the next line's filler, not as `row`'s: added here.
  local height = vim.api.nvim_win_text_height(0, { start_row = info.topline - 1, end_row = row }).all
  return math.max(0, height + extra - info.height)
end

--- Scroll the current window down until the suggestion at `row` (`extra` lines after its first) fits
--- in it, or its cursor line is the window's first line.
--- @param row integer
--- @param extra integer
function M.scroll_into_view(row, extra)
  local view = vim.fn.winsaveview()
  local topline = view.topline
  while topline <= row and M.lines_below_window(row, extra) > 0 do
    topline = topline + 1
    vim.fn.winrestview({ topline = topline })
  end
end

--- Show `text` as if it were inserted at (row, col) (0-based row, byte col), in the current window.
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
  scope_to(vim.api.nvim_get_current_win())
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
