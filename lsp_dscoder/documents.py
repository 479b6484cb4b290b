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

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types

from lsp_dscoder.errors import DocumentNotOpenError, DocumentOutOfSyncError, DocumentSyncError, PositionError
from lsp_dscoder.positions import Encoding, LineIndex, Scan, sanitize

Change = types.TextDocumentContentChangePartial | types.TextDocumentContentChangeWholeDocument


def check_version(version: object) -> int:
    """A document version as LSP defines it: an integer (not a bool, float or string)."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise DocumentSyncError(f"version {version!r} is not an integer")
    return version


def change_params(raw: Any) -> types.DidChangeTextDocumentParams | None:
    """`didChange` params built straight from the JSON (a third of what cattrs' structuring costs: this
    runs on every keystroke); None for any shape other than the usual one, which cattrs then structures
    or refuses with its own message."""
    try:
        ident = raw["textDocument"]
        changes: list[Change] = []
        for change in raw["contentChanges"]:
            text = change["text"]
            if not isinstance(text, str):
                return None
            if "range" not in change:
                changes.append(types.TextDocumentContentChangeWholeDocument(text=text))
                continue
            start, end = change["range"]["start"], change["range"]["end"]
            span = types.Range(
                start=types.Position(line=start["line"], character=start["character"]),
                end=types.Position(line=end["line"], character=end["character"]),
            )
            length = change.get("rangeLength")  # deprecated, unused, but kept as cattrs would
            changes.append(types.TextDocumentContentChangePartial(range=span, text=text, range_length=length))
        if not isinstance(ident["uri"], str):
            return None
        doc = types.VersionedTextDocumentIdentifier(uri=ident["uri"], version=check_version(ident["version"]))
    except (KeyError, TypeError, ValueError, DocumentSyncError):
        return None
    return types.DidChangeTextDocumentParams(text_document=doc, content_changes=tuple(changes))


@dataclass(eq=False)
class Document:
    uri: str
    language_id: str | None
    version: int
    text: str  # sanitised: no lone surrogates
    scan: Scan = field(default_factory=Scan)
    out_of_sync: str | None = None  # why the last change was refused; None while in step with the editor
    serial: int = 0  # tells a reopened document from the one it replaced (same URI, maybe same version)
    index: LineIndex = field(init=False)

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

    def apply(self, version: int, changes: Sequence[Change], encoding: Encoding) -> None:
        """Apply a didChange. All or nothing: raises DocumentSyncError and keeps the old state if any
        change is invalid (and then marks the document out of sync)."""
        try:
            self._apply(check_version(version), changes, encoding)
        except DocumentSyncError as exc:
            self.out_of_sync = str(exc)
            raise

    def _apply(self, version: int, changes: Sequence[Change], encoding: Encoding) -> None:
        if version <= self.version:
            raise DocumentSyncError(f"version {version} does not follow version {self.version}")
        text, index, whole = self.text, self.index, False
        for number, change in enumerate(changes):
            new = self._clean(change.text)
            if isinstance(change, types.TextDocumentContentChangeWholeDocument):
                text, index, whole = new, LineIndex(new, self.scan), True
                continue
            start, end = change.range.start, change.range.end
            if (start.line, start.character) > (end.line, end.character):
                raise DocumentSyncError(f"change {number}: reversed range {_show(change.range)}")
            try:
                a, _ = index.locate(text, start.line, start.character, encoding, self.scan)
                b, _ = index.locate(text, end.line, end.character, encoding, self.scan)
            except PositionError as exc:
                raise DocumentSyncError(f"change {number}: range {_show(change.range)}: {exc}") from None
            text = "".join((text[:a], new, text[b:]))  # two copies of the text where `+` makes three
            index = index.replaced(text, a, b, len(new), self.scan)
        if self.out_of_sync is not None and not whole:
            raise DocumentSyncError(f"still out of sync: {self.out_of_sync}")
        self.text, self.index, self.version, self.out_of_sync = text, index, version, None


def _show(r: types.Range) -> str:
    return f"({r.start.line},{r.start.character})-({r.end.line},{r.end.character})"


class Documents:
    """Open documents by URI (the client's string, as sent)."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}
        self._serials = itertools.count(1)

    def open(self, uri: str, language_id: str | None, version: int, text: str) -> Document | None:
        """Open (or reopen: replace) a document; returns the document it replaced, if any."""
        previous = self._docs.pop(uri, None)
        doc = Document(uri, language_id or None, check_version(version), text, serial=next(self._serials))
        self._docs[uri] = doc
        return previous

    def change(self, uri: str, version: int, changes: Sequence[Change], encoding: Encoding) -> Document:
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

    def state(self, uri: str) -> tuple[int, int] | None:
        """(serial, version) of an open document: what a request was made against."""
        doc = self._docs.get(uri)
        return None if doc is None else (doc.serial, doc.version)

    def __iter__(self) -> Iterator[Document]:
        """In URI order."""
        return iter([self._docs[uri] for uri in sorted(self._docs)])

    def __len__(self) -> int:
        return len(self._docs)
