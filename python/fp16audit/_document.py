"""What the Python side's reports share: a JSON document the binary wrote,
shown the way the binary renders it (text, Markdown, HTML), with the
Python side's own notes beside the binary's. Imports no torch."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from typing import Any, Dict, Optional, Sequence, Type

from . import _binary


class Document:
    """A document of the binary (`json`), its exit status and the Python
    side's notes (how the model was exported, that fp16 was emulated on a
    CPU), rendered by `fp16audit render`."""

    #: The error raised when the binary cannot render the document.
    render_error: Type[Exception] = RuntimeError

    def __init__(self, document: Dict[str, Any], exit_code: int, notes: Sequence[str] = ()) -> None:
        self.json = document
        self.exit_code = exit_code
        self.notes = list(notes)
        self._text: Optional[str] = None
        self._html: Optional[str] = None

    def render(self, fmt: str = "text") -> str:
        """The document as the binary renders it: text, markdown, html or json."""
        if fmt == "json":
            return json.dumps(self.json, indent=1)
        doc = dict(self.json, notes=list(self.json.get("notes") or []) + self.notes)
        with tempfile.TemporaryDirectory(prefix="fp16audit-") as tmp:
            path = os.path.join(tmp, "document.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            p = subprocess.run([_binary.find_binary(), "render", path, "--format", fmt, "--no-color"],
                               capture_output=True, text=True)
        if p.returncode != 0:
            raise self.render_error("fp16audit render --format %s: %s" % (fmt, p.stderr.strip()))
        return p.stdout

    def __str__(self) -> str:
        if self._text is None:
            self._text = self.render("text")
        return self._text

    def _repr_html_(self) -> str:
        if self._html is None:
            self._html = self.render("html")
        return self._html
