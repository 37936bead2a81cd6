"""Errors that point at the offending token of the source."""

from __future__ import annotations


class OpLangError(ValueError):
    def __init__(self, message: str, source: str = "", pos: int | None = None) -> None:
        self.message = message
        self.source = source
        self.pos = pos
        super().__init__(self._render())

    def _render(self) -> str:
        if self.pos is None or not self.source:
            return self.message
        line_start = self.source.rfind("\n", 0, self.pos) + 1
        line_end = self.source.find("\n", self.pos)
        line_end = len(self.source) if line_end < 0 else line_end
        line_no = self.source.count("\n", 0, self.pos) + 1
        col = self.pos - line_start
        line = self.source[line_start:line_end]
        return f"{self.message} (line {line_no}, column {col + 1})\n  {line}\n  {' ' * col}^"
