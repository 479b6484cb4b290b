--- Neovim >= 0.12: the built-in `vim.lsp.inline_completion` draws and accepts the server's items.
--- It offers no partial acceptance, so accept word/line fall through to their keys there.

local status = require('lsp_dscoder.status')

local M = {}

local sent_ns = {} ---@type table<integer, integer> request id -> time sent, until its first text

--- `LspRequest` of our client: track inline-completion requests for the status line.
--- @param data {request_id: integer, request: {type: string, method: string, bufnr: integer}}
function M.on_lsp_request(data)
  local request = data.request
  if request.method ~= 'textDocument/inlineCompletion' then
    return
  end
  if request.type == 'pending' then
    sent_ns[data.request_id] = vim.uv.hrtime()
  else
    sent_ns[data.request_id] = nil
  end
  status.set_generating(request.bufnr, request.type == 'pending')
end

--- `dscoder/partialCompletion`: the built-in shows only the final item; the first streamed text still
--- gives the time to first token.
--- @param params {requestId: integer, text: string}
function M.on_partial(_, params)
  local t0 = sent_ns[params.requestId]
  if t0 and params.text ~= '' then
    sent_ns[params.requestId] = nil
    status.record_ttft((vim.uv.hrtime() - t0) / 1e6)
  end
end

--- @param bufnr integer
function M.attach(bufnr)
  vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
end

--- @param bufnr integer
function M.detach(bufnr)
  vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
end

--- @param bufnr integer
--- @return boolean
function M.visible(bufnr)
  local ns = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
  return ns ~= nil and #vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { limit = 1 }) > 0
end

--- @param bufnr integer
--- @return boolean
function M.accept(bufnr)
  return vim.lsp.inline_completion.get({ bufnr = bufnr }) == true
end

--- The built-in has no dismiss: disabling the buffer drops its item, enabling it again re-arms it.
--- @param bufnr integer
--- @return boolean
function M.dismiss(bufnr)
  local had = M.visible(bufnr)
  M.detach(bufnr)
  M.attach(bufnr)
  return had
end

return M
