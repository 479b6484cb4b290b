--- Inline-completion requests, at most one in flight per buffer: sending one cancels the previous one.
--- The `dscoder/partialCompletion` notifications and the response of the current request go to its
--- callback; anything for another request, document version or cursor position is dropped.

local status = require('lsp_dscoder.status')
local text_rules = require('lsp_dscoder.text')

local M = {}

--- lsp.InlineCompletionTriggerKind
--- @enum lsp_dscoder.TriggerKind
M.TriggerKind = { INVOKED = 1, AUTOMATIC = 2 }

local has_011 = vim.fn.has('nvim-0.11') == 1

--- @alias lsp_dscoder.OnText fun(row: integer, col: integer, text: string, final: boolean)

--- @class lsp_dscoder.Request
--- @field id integer? JSON-RPC id, known once sent
--- @field client_id integer
--- @field uri string
--- @field version integer document version the request was made for
--- @field row integer 0-based row and byte col of the cursor, `position` in the client's encoding
--- @field col integer
--- @field position lsp.Position
--- @field on_text lsp_dscoder.OnText
--- @field sent_ns integer
--- @field got_text boolean
--- @field responded boolean?

local in_flight = {} ---@type table<integer, lsp_dscoder.Request>

--- Cursor (0-based row, byte col) if `bufnr` is in the current window and in Insert mode.
--- @param bufnr integer
--- @return integer?, integer?
function M.cursor(bufnr)
  if vim.api.nvim_get_current_buf() ~= bufnr or vim.api.nvim_get_mode().mode:sub(1, 1) ~= 'i' then
    return nil, nil
  end
  local pos = vim.api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function is_current(bufnr, req)
  if in_flight[bufnr] ~= req or vim.lsp.util.buf_versions[bufnr] ~= req.version then
    return false
  end
  local row, col = M.cursor(bufnr)
  return row == req.row and col == req.col
end

local function deliver(req, text, final)
  if not req.got_text and text ~= '' then
    req.got_text = true
    status.record_ttft((vim.uv.hrtime() - req.sent_ns) / 1e6)
  end
  req.on_text(req.row, req.col, text, final)
end

--- The buffer's request in flight, if any.
--- @param bufnr integer
--- @return lsp_dscoder.Request?
function M.pending(bufnr)
  return in_flight[bufnr]
end

--- Cancel the buffer's request in flight, if any.
--- @param bufnr integer
function M.cancel(bufnr)
  local req = in_flight[bufnr]
  if not req then
    return
  end
  in_flight[bufnr] = nil
  status.set_generating(bufnr, false)
  local client = vim.lsp.get_client_by_id(req.client_id)
  -- Neovim's own table says whether the request is still pending: a response it has read but whose
  -- callback has not run yet must not be cancelled (the client logs an error for an unknown id).
  if client and req.id and not req.responded and (client.requests or {})[req.id] then
    if has_011 then
      client:cancel_request(req.id)
    else
      client.cancel_request(req.id)
    end
  end
end

local function on_response(bufnr, req, err, result)
  if in_flight[bufnr] ~= req then
    return
  end
  status.set_generating(bufnr, false)
  if err or not is_current(bufnr, req) then
    in_flight[bufnr] = nil
    return
  end
  local client = vim.lsp.get_client_by_id(req.client_id)
  local line = vim.api.nvim_buf_get_lines(bufnr, req.row, req.row + 1, false)[1] or ''
  local text = client and text_rules.item_text(result, req.row, line, req.col, client.offset_encoding)
  -- Not final: the response may come as soon as the first line is complete while partials go on.
  if text then
    deliver(req, text, false)
  end
  -- Later partials of this request may still extend the answer: it stays the current one.
  req.responded = true
end

--- @class lsp_dscoder.Partial
--- @field requestId integer|string the JSON-RPC id of the inline-completion request
--- @field uri string
--- @field version integer
--- @field position lsp.Position
--- @field text string the whole suggestion so far
--- @field done boolean the last one for this request

--- Handler of `dscoder/partialCompletion`.
--- @param params lsp_dscoder.Partial
--- @param ctx lsp.HandlerContext
function M.on_partial(_, params, ctx)
  for bufnr, req in pairs(in_flight) do
    if req.client_id == ctx.client_id and tostring(req.id) == tostring(params.requestId) then
      if
        params.uri == req.uri
        and params.version == req.version
        and params.position.line == req.position.line
        and params.position.character == req.position.character
        and is_current(bufnr, req)
      then
        deliver(req, params.text, params.done)
        if params.done then
          status.set_generating(bufnr, false)
        end
      end
      return
    end
  end
end

--- Ask for a suggestion at the cursor, cancelling the buffer's previous request. `on_text` gets the
--- text so far each time it grows, while the request is still the current one.
--- @param bufnr integer
--- @param client vim.lsp.Client
--- @param kind lsp_dscoder.TriggerKind
--- @param on_text lsp_dscoder.OnText
function M.send(bufnr, client, kind, on_text)
  M.cancel(bufnr)
  local row, col = M.cursor(bufnr)
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
    on_text = on_text,
    sent_ns = vim.uv.hrtime(),
    got_text = false,
  }
  in_flight[bufnr] = req
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
  if in_flight[bufnr] == req then
    req.id = ok and id or nil
    in_flight[bufnr] = ok and req or nil
    status.set_generating(bufnr, ok)
  end
end

return M
