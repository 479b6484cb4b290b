--- `:checkhealth lsp_dscoder`: Neovim version, the server command, the running server.

local M = {}

function M.check()
  local health = vim.health
  local plugin = require('lsp_dscoder')
  health.start('lsp-dscoder')
  if vim.fn.has('nvim-0.10') == 0 then
    health.error('Neovim 0.10 or later is required')
  elseif vim.fn.has('nvim-0.12') == 1 then
    health.ok('Neovim 0.12+: vim.lsp.inline_completion is available')
  else
    local v = vim.version()
    health.ok(('Neovim %d.%d.%d: ghost text drawn by the plugin'):format(v.major, v.minor, v.patch))
  end
  local cfg = plugin.config()
  if not cfg then
    health.warn('setup() has not been called', { 'require("lsp_dscoder").setup({})' })
    return
  end
  if vim.fn.executable(cfg.cmd[1]) == 1 then
    health.ok(('server command: %s'):format(table.concat(cfg.cmd, ' ')))
  else
    local advice = { 'install the lsp-dscoder Python package', 'or set cmd' }
    health.error(('%s is not executable'):format(cfg.cmd[1]), advice)
  end
  local info = plugin.status_info()
  if info.state == 'failed' then
    health.error(('server: %s'):format(info.error), {
      'check init_options.model (a checkpoint folder or a cached repo id) and cmd',
      ":execute 'edit' v:lua.vim.lsp.log.get_filename() opens the LSP log (the server's stderr is there)",
    })
  elseif info.state == 'unreachable' then
    health.warn(('remote endpoint: %s'):format(info.error), {
      'start the serving engine, or check the endpoint in init_options (docs/remote.md)',
      'the server retries with backoff; suggestions come back once it answers',
    })
  else
    health.info('status: ' .. plugin.status())
  end
end

return M
