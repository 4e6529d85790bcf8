"""Grader: the block manager's ``allocate``, ``seal`` and ``free`` with prefix reuse (the serving engine's cache).

The learner writes a class with ``allocate(seq, tokens) -> cached tokens``, ``seal(seq, tokens)`` and
``free(seq)`` over the state the starter gives (``free_blocks``: free block ids, least recently freed first;
``refs``; ``tables``; ``cached``: name -> block; ``name_of``: block -> name), naming full blocks with
``block_hash``. As in vLLM, a block is named only once it is full and its K/V computed: ``seal`` comes after
the step that wrote them, never ``allocate``. The grader replays traces against
``core.serving.blocks.BlockManager`` and watches what each block holds. It names leaked blocks, a shared
block freed while in use, a hash that ignores the parent (a block reused after a different prefix), a block
reused before its K/V exist (named in ``allocate``), a partial block named, a starved request (refused while
free or cached-but-unused blocks would hold it), and the last token served from the cache (its logits must
be computed).
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
        "g": list(range(200, 204)) + [7],  # c's first block, asked for before c's K/V are written
    }


# ("seal", seq): the step that computed seq's K/V has run. g arrives in c's step: c's blocks are not named yet
TRACE = (("allocate", "a"), ("seal", "a"), ("allocate", "b"), ("seal", "b"), ("allocate", "c"), ("allocate", "g"),
         ("seal", "c"), ("seal", "g"), ("free", "a"), ("allocate", "d"), ("seal", "d"), ("allocate", "e"),
         ("seal", "e"), ("free", "b"), ("free", "c"), ("free", "g"), ("free", "d"), ("free", "e"))


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


def _sealed(mine, seq: str, holds: dict) -> str:
    """After ``seal(seq, tokens)``: a partial block of ``seq`` with a name, or ``""``."""
    for block in mine.tables.get(seq, []):
        parent, piece = holds.get(block, (None, ()))
        if block not in mine.name_of or len(piece) == BLOCK_SIZE:
            continue
        if mine.name_of[block] == block_hash(parent, piece):
            return (f"seal({seq!r}) named block {block}, which holds {len(piece)} of {BLOCK_SIZE} tokens: a partial "
                    "block gets a name only once it is full (until then its tokens may still change)")
        return (f"block {block} of {seq!r} still has the name of the tokens it held before: a block handed out "
                "again must forget its old name (in name_of, and in cached if it points at this block)")
    return ""


def _allocated(mine, seq: str, tokens: list[int], cached, holds: dict, live: dict, computed: set) -> tuple[str, str]:
    """After ``allocate(seq, tokens)``: ``(the property it breaks, what is wrong)`` with its table and the blocks
    it reuses, or ``("", "")``. ``holds``: block -> (prefix name, tokens), what each of the learner's blocks
    holds, kept up to date; ``computed``: the blocks whose K/V a sealed step has written."""
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
        if i * BLOCK_SIZE < cached and block not in computed:  # ... whose K/V exist
            owner = next((s for s, t in live.items() if block in t), "its sequence")
            return "prefix_reuse", (f"{seq!r} reuses block {block}, but its K/V are not computed yet ({owner!r} "
                                    "has not been sealed): name a block in seal, once it is full and its K/V "
                                    "written, not in allocate")
        if i * BLOCK_SIZE >= cached and users:
            return "free", (f"block {block} is handed to {seq!r} while {users[0]!r} still holds it: a shared block "
                            "was freed while in use (free a block only when its last holder lets go: count "
                            "references)")
        if i * BLOCK_SIZE >= cached:
            holds[block] = (parent, piece)  # a fresh block: it will hold these tokens' K/V ...
            computed.discard(block)  # ... once the step has run and seq is sealed
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
    computed: set[int] = set()  # blocks whose K/V are written
    for op, seq in trace:
        tokens = prompts[seq]
        if op == "seal":
            grading.call(col, f"{case}: seal({seq!r})", mine.seal, seq, list(tokens), answers=False,
                         check="prefix_reuse")  # may be unwritten
            if col.failed:
                return False
            ref.seal(seq, tokens)
            computed.update(live[seq])
            check, problem = "prefix_reuse", _sealed(mine, seq, holds)
        elif op == "free":
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
            check, problem = _allocated(mine, seq, tokens, cached, holds, live, computed)
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
    with the library's, one request asking for blocks before their K/V are written) and a tight one (cached
    but unused blocks must be handed out again: a request starved there breaks ``prefix_reuse``)."""
    col = Collector("block manager with prefix reuse", f"traces of {len(TRACE)} operations, blocks of {BLOCK_SIZE}",
                    grade_block_manager.checks)
    grading.call(col, "allocating a first sequence", lambda: manager_cls(8, BLOCK_SIZE).allocate("probe", [1, 2, 3]))
    if col.failed:
        return col.result()
    prompts = _prompts()
    if _run(manager_cls, 14, TRACE, prompts, col, "a cache of 14 blocks", compare_counts=True):
        tight = (("allocate", "a"), ("seal", "a"), ("free", "a"), ("allocate", "c"), ("seal", "c"), ("free", "c"),
                 ("allocate", "b"), ("seal", "b"), ("free", "b"))
        _run(manager_cls, 5, tight, prompts, col, "a tight cache (5 blocks)", compare_counts=False,
             starved="prefix_reuse")
    return col.result()
