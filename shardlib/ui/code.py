"""A notebook's "Read the code" section: the library's own source, shown with its path and line numbers.

``show_code(obj, ...)`` renders the source of functions, classes or whole modules as they are on disk,
so what a learner reads is what runs and can never drift from it. Each block is headed by its path
relative to the repository and its first and last line; the text form (for the static site and a
terminal) carries the same numbers.
"""

from __future__ import annotations

import html
import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds shardlib/


@dataclass(frozen=True)
class SourceBlock:
    """``lines`` of ``path`` (relative to the repository), starting at line ``first``."""

    path: str
    first: int
    lines: tuple[str, ...]

    @property
    def last(self) -> int:
        return self.first + len(self.lines) - 1

    @property
    def title(self) -> str:
        return f"{self.path}, lines {self.first}-{self.last}"


def source_lines(obj) -> SourceBlock:
    """The source of a function, class or module, where it lives on disk."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or isinstance(obj, ModuleType)
            or inspect.ismethod(obj)):
        raise TypeError(f"show_code takes functions, classes or modules, got {type(obj).__name__}")
    lines, first = inspect.getsourcelines(obj)
    path = Path(inspect.getsourcefile(obj)).resolve()
    try:
        shown = path.relative_to(PACKAGE_ROOT).as_posix()
    except ValueError:
        shown = path.name
    return SourceBlock(shown, max(first, 1), tuple(line.rstrip("\n") for line in lines))


class Code:
    """One or more source blocks, displayed highlighted with line numbers in JupyterLab, as text elsewhere."""

    def __init__(self, blocks: tuple[SourceBlock, ...]) -> None:
        self.blocks = blocks

    @property
    def n_lines(self) -> int:
        return sum(len(b.lines) for b in self.blocks)

    def __repr__(self) -> str:
        out = []
        for b in self.blocks:
            out.append(f"# {b.title}")
            out.extend(f"{b.first + i:>4}  {line}" for i, line in enumerate(b.lines))
        return "\n".join(out)

    def _repr_html_(self) -> str:
        style = HtmlFormatter(style="default").get_style_defs(".shardlib-code")
        parts = [f"<style>{style} .shardlib-code pre {{margin:0; font-size:12px; line-height:1.35}}"
                 f" .shardlib-code .linenos {{color:#999; padding-right:8px}}</style>"]
        for b in self.blocks:
            formatter = HtmlFormatter(cssclass="shardlib-code", linenos="inline", linenostart=b.first)
            body = highlight("\n".join(b.lines) + "\n", PythonLexer(), formatter)
            parts.append(f'<div style="font-family:monospace;font-size:12px;color:#555;margin:6px 0 2px">'
                         f"{html.escape(b.title)}</div>{body}")
        return "".join(parts)


def show_code(*objects) -> Code:
    """``show_code(ring_attention)`` as the last line of a cell shows that source, path and line numbers."""
    if not objects:
        raise ValueError("show_code needs at least one function, class or module to show")
    return Code(tuple(source_lines(o) for o in objects))
