"""A YAML stream that changes only where it is changed.

``inject`` must hand back the user's manifests as they were, except for what it adds: each
document is kept as its original text and re-emitted by the round-trip library only when
its content changed, in the indentation the document itself uses, with comments, key order
and quoting kept.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

_MARKER = re.compile(r"---(?:[ \t]|$)")
# (mapping indent, offset of a sequence's dash under its key, how null is spelled): the
# styles seen in practice, most common first. kubectl writes (2, 0, "null"); editors and Helm
# charts mostly indent dashes by 2.
Style = tuple[int, int, str]
_STYLES: tuple[Style, ...] = tuple(
    (mapping, offset, null)
    for null in ("null", "")
    for mapping, offset in ((2, 0), (2, 2), (4, 0), (4, 2), (4, 4), (2, 4))
)


class ManifestError(Exception):
    """Input that is not a readable YAML stream, stated in one line."""


@dataclass
class Document:
    """One document of a stream: its marker line, its text, and its content once loaded."""

    marker: str
    text: str
    data: Any = None

    def render(self) -> str:
        return self.marker + self.text

    def rewrite(self) -> None:
        """Write the (changed) content in place of the text, in the text's own style."""
        self.text = dump(self.data, self.style())

    def style(self) -> Style:
        return guess_style(self.text, load(self.text))


def split(text: str) -> list[Document]:
    """The documents of a stream, each keeping its ``---`` line as it was written."""
    documents = [Document("", "")]
    for line in text.splitlines(keepends=True):
        if _is_bare_marker(line):
            documents.append(Document(line, ""))
        else:
            documents[-1].text += line
    if documents[0].text == "" and len(documents) > 1:
        documents.pop(0)
    for index, document in enumerate(documents):
        document.data = load(document.text, index)
    return documents


def _is_bare_marker(line: str) -> bool:
    """``---`` alone or followed by a comment; content on the marker line stays in the text."""
    if not _MARKER.match(line):
        return False
    rest = line[3:].strip()
    return rest == "" or rest.startswith("#")


def join(documents: list[Document]) -> str:
    """The stream again; a document after another always starts on its own ``---`` line."""
    out = ""
    for document in documents:
        text = document.render()
        if out:
            if not out.endswith("\n"):
                out += "\n"
            if not document.marker:
                text = "---\n" + text
        out += text
    return out


def new_document(data: Any, style: Style) -> Document:
    """A document made here (a generated ConfigMap), written in the stream's style."""
    return Document("---\n", dump(data, style), data)


def _yaml(style: Style = _STYLES[0]) -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    # Long values (a JSON annotation, an image digest) stay on one line as they were.
    yaml.width = 1 << 16
    mapping, offset, null = style
    yaml.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    yaml.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", null)
    )
    return yaml


def load(text: str, index: int = 0) -> Any:
    try:
        return _yaml().load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f", line {mark.line + 1}" if mark else ""
        raise ManifestError(f"document {index + 1} is not valid YAML{where}") from None


def dump(data: Any, style: Style = _STYLES[0]) -> str:
    out = io.StringIO()
    _yaml(style).dump(data, out)
    return out.getvalue()


def guess_style(text: str, data: Any) -> Style:
    """The indentation that writes ``data`` back closest to how ``text`` has it."""
    lines = set(text.splitlines())
    best, best_score = _STYLES[0], -1
    for style in _STYLES:
        written = dump(data, style)
        if written == text:
            return style
        score = sum(line in lines for line in written.splitlines())
        if score > best_score:
            best, best_score = style, score
    return best


def stream_style(documents: list[Document]) -> Style:
    """The style of the first document with content, for documents made from scratch."""
    for document in documents:
        if isinstance(document.data, dict):
            return document.style()
    return _STYLES[0]


def plain(node: Any) -> Any:
    """Content as plain dicts, lists and scalars: equal exactly when the YAML means the same."""
    if isinstance(node, dict):
        return {str(key): plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [plain(item) for item in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node
