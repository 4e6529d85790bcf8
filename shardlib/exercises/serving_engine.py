"""Grader: the block manager's ``allocate`` and ``free`` with prefix reuse (the serving engine's cache).

The learner writes a class with ``allocate(seq, tokens) -> cached tokens`` and ``free(seq)`` over the
state the starter gives (``free_blocks``: free block ids, least recently freed first; ``refs``; ``tables``;
``cached``: name -> block; ``name_of``: block -> name), naming full blocks with ``block_hash``. The grader
replays traces against ``core.serving.blocks.BlockManager`` and watches what each block holds. It names
leaked blocks, a shared block freed while in use, a hash that ignores the parent (a block reused after a
different prefix), a starved request (refused while free or cached-but-unused blocks would hold it), and
the last token served from the cache (its logits must be computed).
"""

from __future__ import annotations

from shardlib.core.serving.blocks import BlockManager, block_hash
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult

BLOCK_SIZE = 4


def _prompts():
    system = list(range(100, 112))  # 3 full blocks shared by the chats
    return {
        "a": system + [1, 2, 3],
        "b": system + [4, 5, 6, 7, 8],
        "c": list(range(200, 212)) + [9],  # no shared prefix
        "d": system[4:8] + [5],  # the system prompt's 2nd block's tokens, first: another prefix, another block
        "e": system,  # exactly the cached blocks: the last token must still be computed
    }


TRACE = (("allocate", "a"), ("allocate", "b"), ("allocate", "c"), ("free", "a"), ("allocate", "d"),
         ("allocate", "e"), ("free", "b"), ("free", "c"), ("free", "d"), ("free", "e"))


def _freed(mine, ref, seq: str) -> str:
    """After ``free(seq)``: leaked or freed-while-in-use blocks, or ``""``."""
    theirs, right = len(mine.free_blocks), len(ref.free)
    if theirs < right:
        return (f"after free({seq!r}), {theirs} blocks are free where {right} should be: leaked blocks (a block "
                "goes back to free_blocks once no sequence holds it)")
    if theirs > right:
        return (f"after free({seq!r}), {theirs} blocks are free where {right} should be: a shared block was freed "
                "while in use (another sequence still holds it: count references, free at zero)")
    return ""


def _allocated(mine, seq: str, tokens: list[int], cached, holds: dict, live: dict) -> tuple[str, str]:
    """After ``allocate(seq, tokens)``: ``(the property it breaks, what is wrong)`` with its table and the blocks
    it reuses, or ``("", "")``. ``holds``: block -> (prefix name, tokens), what each of the learner's blocks
    holds, kept up to date."""
    table = list(mine.tables.get(seq, []))
    need = -(-len(tokens) // BLOCK_SIZE)
    if len(table) != need:
        return "allocate", (f"{seq!r} has {len(tokens)} tokens, so {need} blocks of {BLOCK_SIZE}; its table has "
                            f"{len(table)}")
    if cached >= len(tokens):
        return "prefix_reuse", (f"allocate({seq!r}) says all {len(tokens)} tokens are cached: the last token's logits "
                                "are needed, so at most the full blocks of the first len(tokens) - 1 tokens can come "
                                "from the cache")
    parent = None
    for i, block in enumerate(table):
        piece = tuple(tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])
        users = [s for s, t in live.items() if block in t]
        had = holds.get(block)
        if i * BLOCK_SIZE < cached and (had is None or had[1] != piece):  # reused: these very tokens
            return "prefix_reuse", (f"{seq!r} reuses block {block} for tokens {list(piece)}, but that block holds "
                                    f"{list(had[1]) if had else 'nothing yet'}")
        if i * BLOCK_SIZE < cached and had[0] != parent:  # ... after this very prefix
            return "prefix_reuse", (f"{seq!r} reuses block {block} for {list(piece)} after a different prefix: the "
                                    "same tokens after other tokens have other K/V. A block's name must chain its "
                                    "parent's name: block_hash(parent_name, tokens)")
        if i * BLOCK_SIZE >= cached and users:
            return "free", (f"block {block} is handed to {seq!r} while {users[0]!r} still holds it: a shared block "
                            "was freed while in use (free a block only when its last holder lets go: count "
                            "references)")
        if i * BLOCK_SIZE >= cached:
            holds[block] = (parent, piece)  # a fresh block: its K/V are these tokens' now
        parent = block_hash(parent, piece) if len(piece) == BLOCK_SIZE else None
    live[seq] = table
    return "", ""


def _run(manager_cls, num_blocks: int, trace, prompts, col: Collector, case: str, compare_counts: bool,
         starved: str = "allocate") -> bool:
    """Replay ``trace`` beside the library's ``BlockManager``, watching every block's tokens. Returns False
    once a mistake has been named; an ``allocate`` that raises breaks the property ``starved``."""
    mine, ref = manager_cls(num_blocks, BLOCK_SIZE), BlockManager(num_blocks, BLOCK_SIZE)
    holds: dict[int, tuple] = {}  # block -> (prefix name, its tokens): what the learner's block holds
    live: dict[str, list[int]] = {}
    for op, seq in trace:
        tokens = prompts[seq]
        if op == "free":
            grading.call(col, f"{case}: free({seq!r})", mine.free, seq, answers=False, check="free")  # may be unwritten
            if col.failed:
                return False
            ref.release(seq)
            live.pop(seq)
            check, problem = "free", _freed(mine, ref, seq)
        else:
            cached = grading.call(col, f"{case}: allocate({seq!r})", mine.allocate, seq, list(tokens), hint=(
                f". With {num_blocks} blocks there is room: a request starved. Blocks that are free but still named "
                "in the cache may be handed out again (forget their name first)."), check=starved)
            if col.failed:
                return False
            expected = ref.allocate(seq, tokens, len(tokens))
            ref.seal(seq, tokens)
            check, problem = _allocated(mine, seq, tokens, cached, holds, live)
            if not problem and compare_counts and cached != expected:
                check, problem = "prefix_reuse", (f"allocate({seq!r}) found {cached} cached tokens; the cache held "
                                                  f"{expected} ({expected // BLOCK_SIZE} full blocks of its prompt)")
        if problem:
            col.fail(f"{case}: {problem}", check)
            return False
    return True


@grading.checks(allocate=1, prefix_reuse=2, free=1)
def grade_block_manager(manager_cls) -> ExerciseResult:
    """Run ``manager_cls(num_blocks, block_size)`` on two traces: a roomy cache (cached counts compared
    with the library's) and a tight one (cached but unused blocks must be handed out again: a request starved
    there breaks ``prefix_reuse``)."""
    col = Collector("block manager with prefix reuse", f"traces of {len(TRACE)} operations, blocks of {BLOCK_SIZE}",
                    grade_block_manager.checks)
    grading.call(col, "allocating a first sequence", lambda: manager_cls(8, BLOCK_SIZE).allocate("probe", [1, 2, 3]))
    if col.failed:
        return col.result()
    prompts = _prompts()
    if _run(manager_cls, 12, TRACE, prompts, col, "a cache of 12 blocks", compare_counts=True):
        tight = (("allocate", "a"), ("free", "a"), ("allocate", "c"), ("free", "c"), ("allocate", "b"),
                 ("free", "b"))
        _run(manager_cls, 5, tight, prompts, col, "a tight cache (5 blocks)", compare_counts=False,
             starved="prefix_reuse")
    return col.result()
