"""The open documents: their text, version and line index, kept in step with the editor's.

The server owns the text instead of pygls' workspace, whose edits split lines like `str.splitlines` (a
form feed or U+2028 would end a line) and rebuild the whole document per keystroke. Here an edit costs a
scan of its own text (line breaks, lone surrogates) plus copies; positions cost a scan of part of their
own line. `Document.scan` counts the characters examined, so tests can hold that to the edit's size.

Sync is strict: an edit that cannot be applied is refused as a whole, the document keeps its last good
text and version and is marked out of sync (its requests get empty results) until the editor sends its
whole text again, by a didOpen or a full-text change.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types

from lsp_dscoder.errors import DocumentNotOpenError, DocumentOutOfSyncError, DocumentSyncError, PositionError
from lsp_dscoder.positions import Encoding, LineIndex, Scan, sanitize

Change = types.TextDocumentContentChangePartial | types.TextDocumentContentChangeWholeDocument
_UINTEGER = 2**31 - 1  # LSP's uinteger: positions and lengths
Span = tuple[int, int, int, int]  # start line, start character, end line, end character (client's units)


@dataclass(frozen=True, slots=True)
class Edit:
    """One content change of a didChange: `text` in place of `span`, or the whole text when it is None."""

    text: str
    span: Span | None = None

    @staticmethod
    def of(change: Change) -> Edit:
        if isinstance(change, types.TextDocumentContentChangeWholeDocument):
            return Edit(change.text)
        r = change.range
        return Edit(change.text, (r.start.line, r.start.character, r.end.line, r.end.character))


def check_version(version: object) -> int:
    """A document version as LSP defines it: an integer (not a bool, float or string)."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise DocumentSyncError(f"version {version!r} is not an integer")
    return version


def keystroke_change(raw: Any) -> tuple[str, int, list[Edit]] | None:
    """(uri, version, edits) of `didChange` params read straight from the JSON: this runs on every
    keystroke, and the protocol objects cattrs would build cost more than the edit. None for any shape
    other than the usual one, which cattrs then structures or refuses with its own message. Values are
    checked as cattrs would: integers (not bools) for positions and the version, strings for texts."""
    try:
        ident = raw["textDocument"]
        uri, version = ident["uri"], check_version(ident["version"])
        edits: list[Edit] = []
        for change in raw["contentChanges"]:
            text = change["text"]
            if not isinstance(text, str):
                return None
            if "range" not in change:
                edits.append(Edit(text))
                continue
            start, end = change["range"]["start"], change["range"]["end"]
            span = (start["line"], start["character"], end["line"], end["character"])
            length = change.get("rangeLength", 0)  # deprecated and unused, but cattrs would refuse a bad one
            if not all(type(n) is int and 0 <= n <= _UINTEGER for n in (*span, length)):
                return None
            edits.append(Edit(text, span))
        if not isinstance(uri, str):
            return None
    except (KeyError, TypeError, DocumentSyncError):
        return None
    return uri, version, edits


@dataclass(frozen=True)
class Splice:
    """The last didChange as one replacement: `before`'s characters [start, end) became `length` new ones
    (so what lies outside them is known unchanged without comparing it)."""

    before: str  # the text the edit was applied to (the very object)
    start: int
    end: int
    length: int


@dataclass(eq=False)
class Document:
    uri: str
    language_id: str | None
    version: int
    text: str  # sanitised: no lone surrogates
    scan: Scan = field(default_factory=Scan)
    out_of_sync: str | None = None  # why the last change was refused; None while in step with the editor
    index: LineIndex = field(init=False)
    splice: Splice | None = None  # the last change, when it was one ranged edit

    def __post_init__(self) -> None:
        self.text = self._clean(self.text)
        self.index = LineIndex(self.text, self.scan)

    def _clean(self, text: str) -> str:
        self.scan.chars += len(text)
        return sanitize(text)

    def locate(self, line: int, character: int, encoding: Encoding) -> tuple[int, int]:
        """(offset, character) of a position; the character is the request's own unless it was past the
        line's end or inside a character (then it is where the offset is). Raises PositionError."""
        return self.index.locate(self.text, line, character, encoding, self.scan)

    def position_at(self, offset: int, encoding: Encoding) -> tuple[int, int]:
        return self.index.position_at(self.text, offset, encoding, self.scan)

    def apply(self, version: int, changes: Sequence[Edit | Change], encoding: Encoding) -> None:
        """Apply a didChange. All or nothing: raises DocumentSyncError and keeps the old state if any
        change is invalid (and then marks the document out of sync)."""
        try:
            edits = [c if isinstance(c, Edit) else Edit.of(c) for c in changes]
            self._apply(check_version(version), edits, encoding)
        except DocumentSyncError as exc:
            self.out_of_sync = str(exc)
            raise

    def _apply(self, version: int, edits: Sequence[Edit], encoding: Encoding) -> None:
        if version <= self.version:
            raise DocumentSyncError(f"version {version} does not follow version {self.version}")
        text, index, whole, splice = self.text, self.index, False, None
        for number, edit in enumerate(edits):
            new = self._clean(edit.text)
            if edit.span is None:
                text, index, whole = new, LineIndex(new, self.scan), True
                continue
            sl, sc, el, ec = edit.span
            if (sl, sc) > (el, ec):
                raise DocumentSyncError(f"change {number}: reversed range {_show(edit.span)}")
            try:
                a, _ = index.locate(text, sl, sc, encoding, self.scan)
                b, _ = index.locate(text, el, ec, encoding, self.scan)
            except PositionError as exc:
                raise DocumentSyncError(f"change {number}: range {_show(edit.span)}: {exc}") from None
            splice = Splice(text, a, b, len(new)) if len(edits) == 1 else None
            text = "".join((text[:a], new, text[b:]))  # two copies of the text where `+` makes three
            index = index.replaced(text, a, b, len(new), self.scan)
        if self.out_of_sync is not None and not whole:
            raise DocumentSyncError(f"still out of sync: {self.out_of_sync}")
        self.text, self.index, self.version, self.out_of_sync = text, index, version, None
        self.splice = splice


def _show(span: Span) -> str:
    return "({},{})-({},{})".format(*span)


class Documents:
    """Open documents by URI (the client's string, as sent)."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}

    def open(self, uri: str, language_id: str | None, version: int, text: str) -> Document | None:
        """Open (or reopen: replace) a document; returns the document it replaced, if any."""
        previous = self._docs.pop(uri, None)
        doc = Document(uri, language_id or None, check_version(version), text)
        self._docs[uri] = doc
        return previous

    def change(
        self, uri: str, version: int, changes: Sequence[Edit | Change], encoding: Encoding
    ) -> Document:
        doc = self._docs.get(uri)
        if doc is None:
            raise DocumentNotOpenError(uri)
        doc.apply(version, changes, encoding)
        return doc

    def refuse(self, uri: str, reason: str) -> None:
        """A sync message about `uri` that could not even be read: its copy may have missed a change."""
        if (doc := self._docs.get(uri)) is not None:
            doc.out_of_sync = reason

    def close(self, uri: str) -> bool:
        return self._docs.pop(uri, None) is not None

    def get(self, uri: str) -> Document:
        """The document, if open and in sync (DocumentNotOpenError / DocumentOutOfSyncError)."""
        doc = self._docs.get(uri)
        if doc is None:
            raise DocumentNotOpenError(uri)
        if doc.out_of_sync is not None:
            raise DocumentOutOfSyncError(uri, doc.out_of_sync)
        return doc

    def is_current(self, doc: Document, version: int | None) -> bool:
        """Whether `doc` at `version` is still what the editor has: the one version check."""
        return self._docs.get(doc.uri) is doc and doc.version == version and doc.out_of_sync is None

    def __iter__(self) -> Iterator[Document]:
        """In URI order."""
        return iter([self._docs[uri] for uri in sorted(self._docs)])

    def __len__(self) -> int:
        return len(self._docs)
