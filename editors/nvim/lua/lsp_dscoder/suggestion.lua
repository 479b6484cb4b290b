--- Streamed suggestions for Neovim 0.10/0.11 (and 0.12 with `native = false`).
---
--- Per buffer: at most one `textDocument/inlineCompletion` request in flight (a newer one cancels it),
--- the `dscoder/partialCompletion` notifications and the final response of that request drawn as ghost
--- text, typing through a suggestion, accepting all / a word / a line of it, dismissing it.
--- Anything stamped with another request, document version or cursor position is dropped.

local ghost = require('lsp_dscoder.ghost')
local status = require('lsp_dscoder.status')

local M = {}

--- lsp.InlineCompletionTriggerKind
M.TriggerKind = { INVOKED = 1, AUTOMATIC = 2 }

local has_011 = vim.fn.has('nvim-0.11') == 1

--- @class lsp_dscoder.Request
--- @field id integer? JSON-RPC id, known once sent
--- @field client_id integer
--- @field uri string
--- @field version integer document version the request was made for
--- @field row integer 0-based
--- @field col integer byte column
--- @field position lsp.Position the same point in the client's position encoding
--- @field sent_ns integer
--- @field got_text boolean
--- @field responded boolean?

--- @class lsp_dscoder.Shown
--- @field row integer
--- @field col integer
--- @field before string the line's text left of col when shown
--- @field text string what accepting inserts at (row, col)

--- @class lsp_dscoder.BufState
--- @field request lsp_dscoder.Request?
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

--- Cursor (0-based row, byte col) if `bufnr` is in the current window and in Insert mode.
--- @return integer?, integer?
local function cursor(bufnr)
  if vim.api.nvim_get_current_buf() ~= bufnr or vim.api.nvim_get_mode().mode:sub(1, 1) ~= 'i' then
    return nil, nil
  end
  local pos = vim.api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function line_text(bufnr, row)
  return vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1]
end

--- Byte column of an LSP character offset in `line`.
local function byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if has_011 then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ok, col = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  end
  return ok and col or #line
end

local function is_current(bufnr, req)
  local st = buffers[bufnr]
  if not st or st.request ~= req or vim.lsp.util.buf_versions[bufnr] ~= req.version then
    return false
  end
  local row, col = cursor(bufnr)
  return row == req.row and col == req.col
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

--- Show what request `req` produced so far. A text that is only a prefix of what is already shown at
--- the same place (typing through or an earlier partial showed more) does not shrink it, unless it is
--- the last partial (`final`).
local function present(bufnr, req, text, final)
  local shown = state(bufnr).shown
  if
    not final
    and shown
    and shown.row == req.row
    and shown.col == req.col
    and vim.startswith(shown.text, text)
  then
    return
  end
  if not req.got_text and text ~= '' then
    req.got_text = true
    status.record_ttft((vim.uv.hrtime() - req.sent_ns) / 1e6)
  end
  show(bufnr, req.row, req.col, text)
end

--- Cancel this buffer's request in flight, if any.
--- @param bufnr integer
function M.cancel(bufnr)
  local st = buffers[bufnr]
  local req = st and st.request
  if not req then
    return
  end
  st.request = nil
  status.set_generating(bufnr, false)
  local client = vim.lsp.get_client_by_id(req.client_id)
  if client and req.id and not req.responded then
    if has_011 then
      client:cancel_request(req.id)
    else
      client.cancel_request(req.id)
    end
  end
end

--- Text the first item of an inline-completion result inserts at the request's position, or nil.
local function item_text(bufnr, req, client, result)
  local items = result and (result.items or result) or {}
  local item = items[1]
  if not item then
    return ''
  end
  local text = type(item.insertText) == 'table' and item.insertText.value or item.insertText or ''
  if item.range then
    -- The item may cover text before the cursor on the same line: skip what is already there.
    local start = item.range.start
    if start.line ~= req.row then
      return nil
    end
    local line = line_text(bufnr, req.row)
    local typed = line:sub(byte_col(line, start.character, client.offset_encoding) + 1, req.col)
    if not vim.startswith(text, typed) then
      return nil
    end
    text = text:sub(#typed + 1)
  end
  return text
end

local function on_response(bufnr, req, err, result)
  local st = buffers[bufnr]
  if not st or st.request ~= req then
    return
  end
  status.set_generating(bufnr, false)
  if err or not is_current(bufnr, req) then
    st.request = nil
    return
  end
  local client = vim.lsp.get_client_by_id(req.client_id)
  local text = client and item_text(bufnr, req, client, result)
  if text then
    -- The response may come as soon as the first line is complete while partials go on: a response
    -- that is a prefix of what they showed does not shrink it.
    present(bufnr, req, text, false)
  end
  -- Partials of this request may still extend the answer; they keep matching `st.request`.
  req.responded = true
end

--- Handler of `dscoder/partialCompletion`: `text` is the whole suggestion so far.
--- @param params {requestId: integer|string, uri: string, version: integer, position: lsp.Position, text: string, done: boolean}
--- @param ctx lsp.HandlerContext
function M.on_partial(_, params, ctx)
  for bufnr, st in pairs(buffers) do
    local req = st.request
    if req and req.client_id == ctx.client_id and tostring(req.id) == tostring(params.requestId) then
      if
        params.uri == req.uri
        and params.version == req.version
        and params.position.line == req.position.line
        and params.position.character == req.position.character
        and is_current(bufnr, req)
      then
        present(bufnr, req, params.text, params.done)
        if params.done then
          status.set_generating(bufnr, false)
        end
      end
      return
    end
  end
end

--- Ask for a suggestion at the cursor; cancels this buffer's previous request.
--- @param bufnr integer
--- @param client vim.lsp.Client
--- @param kind integer lsp.InlineCompletionTriggerKind
function M.request(bufnr, client, kind)
  M.cancel(bufnr)
  local row, col = cursor(bufnr)
  if not row then
    return
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = kind }
  local req = {
    client_id = client.id,
    uri = params.textDocument.uri,
    version = vim.lsp.util.buf_versions[bufnr],
    row = row,
    col = col,
    position = params.position,
    sent_ns = vim.uv.hrtime(),
    got_text = false,
  }
  local st = state(bufnr)
  st.request = req
  local function handler(err, result)
    on_response(bufnr, req, err, result)
  end
  local method = 'textDocument/inlineCompletion'
  local ok, id
  if has_011 then
    ok, id = client:request(method, params, handler, bufnr)
  else
    ok, id = client.request(method, params, handler, bufnr)
  end
  -- The request flushed pending didChange first; the version it was made for is the current one.
  req.version = vim.lsp.util.buf_versions[bufnr]
  if ok and st.request == req then
    req.id = id
    status.set_generating(bufnr, true)
  elseif st.request == req then
    st.request = nil
  end
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
  local row, col = cursor(bufnr)
  local rest = row and st.shown and continued(bufnr, st.shown, row, col)
  if rest then
    show(bufnr, row, col, rest)
  else
    hide(bufnr)
  end
  if auto and row then
    M.request(bufnr, client, M.TriggerKind.AUTOMATIC)
  else
    M.cancel(bufnr)
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
  local row, col = cursor(bufnr)
  local shown, req = st.shown, st.request
  if shown and (shown.row ~= row or shown.col ~= col) then
    hide(bufnr)
  end
  if req and (req.row ~= row or req.col ~= col) then
    M.cancel(bufnr)
  end
end

--- Entering Insert mode: remember the buffer's state so that only later changes count as typing.
--- @param bufnr integer
function M.on_insert_enter(bufnr)
  state(bufnr).tick = vim.api.nvim_buf_get_changedtick(bufnr)
end

--- Leaving Insert mode or the buffer: drop the suggestion and its request.
--- @param bufnr integer
function M.reset(bufnr)
  M.cancel(bufnr)
  hide(bufnr)
end

--- The buffer is gone or detached.
--- @param bufnr integer
function M.forget(bufnr)
  M.reset(bufnr)
  buffers[bufnr] = nil
end

--- The suggestion shown at the cursor, if any.
--- @param bufnr integer
--- @return lsp_dscoder.Shown?
function M.get(bufnr)
  local st = buffers[bufnr]
  local shown = st and st.shown
  local row, col = cursor(bufnr)
  if shown and shown.row == row and shown.col == col then
    return shown
  end
  return nil
end

--- Start of `text` up to the end of the next word: blanks, then a run of word characters (letters,
--- digits, `_`, any non-ASCII) or of other non-blank characters; a leading line break with the next
--- line's indentation counts as one word.
--- @param text string
--- @return string
function M.next_word(text)
  return text:match('^\n[ \t]*')
    or text:match('^[ \t]*[%w_\128-\255]+')
    or text:match('^[ \t]*[^%w_\128-\255%s]+')
    or text:match('^[ \t]+')
    or text
end

--- Start of `text` up to the end of its first line; a leading line break takes the next line.
--- @param text string
--- @return string
function M.next_line(text)
  if text:sub(1, 1) == '\n' then
    return '\n' .. text:sub(2):match('^[^\n]*')
  end
  return text:match('^[^\n]*')
end

--- Insert the shown suggestion, or its next word or line, at the cursor. What is left stays shown.
--- @param bufnr integer
--- @param client vim.lsp.Client
--- @param part 'all'|'word'|'line'
--- @param auto boolean ask for the next suggestion afterwards
--- @return boolean accepted
function M.accept(bufnr, client, part, auto)
  local shown = M.get(bufnr)
  if not shown then
    return false
  end
  local text = part == 'word' and M.next_word(shown.text)
    or part == 'line' and M.next_line(shown.text)
    or shown.text
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, shown.row, shown.col, shown.row, shown.col, lines)
  local last = #lines == 1 and shown.col + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { shown.row + #lines, last })
  M.on_change(bufnr, client, auto)
  return true
end

--- Hide the suggestion and cancel its request; the next change asks again.
--- @param bufnr integer
--- @return boolean dismissed whether a suggestion was shown
function M.dismiss(bufnr)
  local had = M.get(bufnr) ~= nil
  M.reset(bufnr)
  return had
end

return M
