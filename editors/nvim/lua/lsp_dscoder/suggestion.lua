--- Ghost-text suggestions for Neovim 0.10/0.11 (and 0.12 with `native = false`): what is shown per
--- buffer, typing through it, accepting all / a word / a line of it, dismissing it. The text comes from
--- `request.lua`, which drops anything stale.

local ghost = require('lsp_dscoder.ghost')
local request = require('lsp_dscoder.request')
local text_rules = require('lsp_dscoder.text')

local M = {}

M.TriggerKind = request.TriggerKind

--- @class lsp_dscoder.Shown
--- @field row integer
--- @field col integer
--- @field before string the line's text left of col when shown
--- @field text string what accepting inserts at (row, col)
--- @field revealed boolean? scrolled into view by an accept key (accepted on the next one)

--- @class lsp_dscoder.BufState
--- @field shown lsp_dscoder.Shown?
--- @field tick integer? changedtick already handled

local buffers = {} ---@type table<integer, lsp_dscoder.BufState>

local function state(bufnr)
  local st = buffers[bufnr]
  if not st then
    st = {}
    buffers[bufnr] = st
  end
  return st
end

local function line_text(bufnr, row)
  return vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1]
end

local function hide(bufnr)
  local st = buffers[bufnr]
  if st then
    st.shown = nil
  end
  ghost.clear(bufnr)
end

local function show(bufnr, row, col, text)
  if text == '' then
    hide(bufnr)
    return
  end
  state(bufnr).shown = { row = row, col = col, before = line_text(bufnr, row):sub(1, col), text = text }
  ghost.show(bufnr, row, col, text)
end

--- Show a request's text so far. A text that is only a prefix of what is already shown at the same
--- place (typing through or an earlier partial showed more) does not shrink it, unless it is the last
--- partial (`final`).
local function present(bufnr, row, col, text, final)
  local shown = state(bufnr).shown
  if not final and shown and shown.row == row and shown.col == col and vim.startswith(shown.text, text) then
    return
  end
  show(bufnr, row, col, text)
end

--- Ask for a suggestion at the cursor; cancels this buffer's previous request.
--- @param bufnr integer
--- @param client vim.lsp.Client
--- @param kind lsp_dscoder.TriggerKind
function M.request(bufnr, client, kind)
  request.send(bufnr, client, kind, function(row, col, text, final)
    present(bufnr, row, col, text, final)
  end)
end

--- What is left of the shown suggestion after the text between it and the cursor was typed, or nil
--- when that text does not continue it.
local function continued(bufnr, shown, row, col)
  if row < shown.row or (row == shown.row and col < shown.col) then
    return nil
  end
  local line = line_text(bufnr, shown.row)
  if not line or line:sub(1, shown.col) ~= shown.before then
    return nil
  end
  local ok, typed = pcall(vim.api.nvim_buf_get_text, bufnr, shown.row, shown.col, row, col, {})
  typed = ok and table.concat(typed, '\n') or nil
  if typed and vim.startswith(shown.text, typed) then
    return shown.text:sub(#typed + 1)
  end
  return nil
end

--- The buffer changed in Insert mode: keep (and trim) the ghost text if the change typed its start,
--- clear it otherwise, then ask again when `auto` (the server answers typing-through from memory).
--- @param bufnr integer
--- @param client vim.lsp.Client
--- @param auto boolean
function M.on_change(bufnr, client, auto)
  local st = state(bufnr)
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  if st.tick == tick then
    return
  end
  st.tick = tick
  local row, col = request.cursor(bufnr)
  local rest = row and st.shown and continued(bufnr, st.shown, row, col)
  if rest then
    show(bufnr, row, col, rest)
  else
    hide(bufnr)
  end
  if auto and row then
    M.request(bufnr, client, M.TriggerKind.AUTOMATIC)
  else
    request.cancel(bufnr)
  end
end

--- The cursor moved: without a text change (TextChangedI follows a change) that leaves the
--- suggestion's place, so drop it and its request.
--- @param bufnr integer
function M.on_cursor_moved(bufnr)
  local st = buffers[bufnr]
  if not st or st.tick ~= vim.api.nvim_buf_get_changedtick(bufnr) then
    return
  end
  local row, col = request.cursor(bufnr)
  local shown, req = st.shown, request.pending(bufnr)
  if shown and (shown.row ~= row or shown.col ~= col) then
    hide(bufnr)
  end
  if req and (req.row ~= row or req.col ~= col) then
    request.cancel(bufnr)
  end
end

--- Entering Insert mode: remember the buffer's state so that only later changes count as typing.
--- @param bufnr integer
function M.on_insert_enter(bufnr)
  state(bufnr).tick = vim.api.nvim_buf_get_changedtick(bufnr)
end

--- The buffer is gone or detached.
--- @param bufnr integer
function M.forget(bufnr)
  M.dismiss(bufnr)
  buffers[bufnr] = nil
end

--- The suggestion shown at the cursor, if any.
--- @param bufnr integer
--- @return lsp_dscoder.Shown?
function M.get(bufnr)
  local st = buffers[bufnr]
  local shown = st and st.shown
  local row, col = request.cursor(bufnr)
  if shown and shown.row == row and shown.col == col then
    return shown
  end
  return nil
end

--- How much of the suggestion to accept.
--- @enum lsp_dscoder.Part
M.Part = { ALL = 'all', WORD = 'word', LINE = 'line' }

--- Insert the shown suggestion, or its next word or line, at the cursor. What is left stays shown.
--- A suggestion drawn partly below the window's last line is first scrolled into view instead: only
--- what the user can see is accepted.
--- @param bufnr integer
--- @param client vim.lsp.Client
--- @param part lsp_dscoder.Part
--- @param auto boolean ask for the next suggestion afterwards
--- @return boolean accepted
function M.accept(bufnr, client, part, auto)
  local shown = M.get(bufnr)
  if not shown then
    return false
  end
  local _, extra = shown.text:gsub('\n', '')
  if not shown.revealed and ghost.lines_below_window(shown.row, extra) > 0 then
    ghost.scroll_into_view(shown.row, extra)
    shown.revealed = true
    return true
  end
  local text = part == M.Part.WORD and text_rules.next_word(shown.text)
    or part == M.Part.LINE and text_rules.next_line(shown.text)
    or shown.text
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, shown.row, shown.col, shown.row, shown.col, lines)
  local last = #lines == 1 and shown.col + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { shown.row + #lines, last })
  M.on_change(bufnr, client, auto)
  return true
end

--- Hide the suggestion and cancel its request (dismiss key, leaving Insert mode or the buffer); the
--- next change asks again.
--- @param bufnr integer
--- @return boolean dismissed whether a suggestion was shown
function M.dismiss(bufnr)
  local had = M.get(bufnr) ~= nil
  request.cancel(bufnr)
  hide(bufnr)
  return had
end

return M
