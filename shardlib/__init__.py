"""shardlib: tensor, pipeline and expert parallelism, shown on real ranks beside the formulas.

The rank runtime is imported here; the pure modules (``models``, ``plots`` ...) are imported by name.
"""

from .comm import CommRecord
from .context import RankContext
from .ranks import RankError, Ranks, RankTimeoutError
from .timeline import Span

__all__ = ["Ranks", "RankContext", "RankError", "RankTimeoutError", "CommRecord", "Span"]
__version__ = "0.1.0"
