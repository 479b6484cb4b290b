--- Pure text rules: what an inline-completion item inserts at the cursor, and how much of a suggestion
--- accept word / accept line take.

local M = {}

--- Byte column of an LSP character offset in `line`.
--- @param line string
--- @param character integer
--- @param encoding string 'utf-8'|'utf-16'|'utf-32'
--- @return integer
function M.byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if vim.fn.has('nvim-0.11') == 1 then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ok, col = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  end
  return ok and col or #line
end

--- The text the first item of an inline-completion result inserts at byte `col` of `line` (row `row`):
--- '' when there is no item, nil when the item's range does not fit there. An item whose range starts
--- before the cursor on its line repeats what is already typed; that part is skipped.
--- @param result lsp.InlineCompletionList|lsp.InlineCompletionItem[]|nil
--- @return string?
function M.item_text(result, row, line, col, encoding)
  local items = result and (result.items or result) or {}
  local item = items[1]
  if not item then
    return ''
  end
  local text = type(item.insertText) == 'table' and item.insertText.value or item.insertText or ''
  if not item.range then
    return text
  end
  local start = item.range.start
  if start.line ~= row then
    return nil
  end
  local typed = line:sub(M.byte_col(line, start.character, encoding) + 1, col)
  if not vim.startswith(text, typed) then
    return nil
  end
  return text:sub(#typed + 1)
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

return M
