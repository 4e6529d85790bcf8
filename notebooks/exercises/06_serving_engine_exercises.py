# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: kernelspec,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Exercises: the serving engine's block manager
#
# **What you will do.** Write the three methods at the heart of notebook 06's paged KV cache. `allocate`
# gives a new sequence its blocks and reuses cached blocks of a shared prefix. `seal` names its full
# blocks once their K/V are computed. `free` takes the blocks back. Then run the checker cell. It replays
# traces against the library's block manager, watches what every block holds, and names the first mistake
# it sees: leaked blocks, a shared block freed while in use, a hash that ignores the parent, a block reused
# before its K/V exist, a starved request (one refused although free blocks would hold it).
#
# Until you write `allocate`, the checker says "not written yet". About 30 minutes.

# %% [markdown]
# ## The state you are given
#
# The cache has `num_blocks` blocks of `block_size` token slots. The class keeps:
#
# - `free_blocks`: the ids of free blocks, **least recently freed first** (hand out from the front,
#   give back at the end);
# - `refs[block]`: how many sequences hold that block;
# - `tables[seq]`: a sequence's blocks in order (its block table);
# - `cached[name]`: the block that holds a full block of tokens known by that name;
# - `name_of[block]`: the name of a full block, while the block still holds it.
#
# A full block's name is `block_hash(parent_name, tokens)`, where `parent_name` is the name of the block
# before it (`None` for the first). Two blocks with the same tokens after different prefixes hold
# different K/V, so they must get different names.

# %% [markdown]
# ## Exercise: `allocate`, `seal` and `free` with prefix reuse
#
# `allocate(seq, tokens)` gives sequence `seq` enough blocks for all of `tokens` and returns how many of
# its tokens the cache already holds. The rules:
#
# 1. Walk the full blocks of `tokens` from the start, naming each. Reuse each block whose name is in
#    `cached`, and stop at the first that is not. **The last token is never served from the cache**: its
#    logits must be computed, so look only at the full blocks of the first `len(tokens) - 1` tokens.
# 2. A reused block gets one more reference. If it had none, it was free: take it out of `free_blocks`.
# 3. Give fresh blocks from the front of `free_blocks` for the rest. A fresh block may still carry an old
#    name: forget it (in `name_of`, and in `cached` if it points at this block).
# 4. Do not name the fresh blocks yet. Their K/V do not exist until the next step computes them.
# 5. Return the number of tokens in the reused blocks.
#
# `seal(seq, tokens)` is called once a step has written the K/V of `tokens`, the sequence so far. Name
# each of its blocks that `tokens` fill completely, unless an equal block is cached already. A partial
# last block gets no name: its tokens may still change. vLLM names blocks the same way: a block is
# hashed only once it is full and computed.
#
# `free(seq)` drops the sequence's table. Each of its blocks loses one reference, and goes back to the
# end of `free_blocks` when no one holds it. Keep its name: a later request may reuse it.

# %%
from shardlib.core.serving.blocks import block_hash


class MyBlockManager:
    """Blocks handed out and taken back; full blocks named by a hash chained to their parent's name."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))  # least recently freed first
        self.refs = [0] * num_blocks
        self.tables: dict = {}
        self.cached: dict = {}  # name -> block
        self.name_of: dict = {}  # block -> name

    def allocate(self, seq, tokens) -> int:
        """Blocks for all of ``tokens``; returns how many tokens cached blocks already hold."""
        raise NotImplementedError("write allocate here (and seal and free below)")

    def seal(self, seq, tokens) -> None:
        """The K/V of ``tokens`` are written: name each full block of ``seq`` not cached already."""
        raise NotImplementedError("seal is yours too")

    def free(self, seq) -> None:
        """Give back ``seq``'s blocks; a block is free again once no sequence holds it."""
        raise NotImplementedError("free is yours too")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.serving_engine import grade_block_manager

grade_block_manager(MyBlockManager)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Sequences a and b share their first block. a is freed. The checker then says block 3 was handed to c "
        "while b still holds it. What went wrong?",
        ("free let block 3 go while b held it", "allocate forgot to give block 3 a name",
         "The hash of block 3 ignored its parent", "c's prompt was too long for the cache"),
        0,
        "A shared block goes back to free_blocks only when its last holder lets go: count references, free at "
        "zero.",
    ),
    Question(
        "Why must a block's name include its parent's name?",
        ("To make the hash faster to compute", "So that blocks are always freed in the right order",
         "Equal tokens after another prefix have other K/V", "Because the last token needs its logits"),
        2,
        "A token's key and value depend on every token before it: equal tokens in another place are not the "
        "same block.",
    ),
    Question(
        "Two requests with the same system prompt are admitted in the same step. Why does the second not "
        "reuse the first's blocks?",
        ("The hash of the second differs", "Their K/V are not computed yet, so they have no name",
         "A block may have only one reference", "The last token is never cached"),
        1,
        "A block is named in seal, after the step that writes its K/V. In that step both requests compute the "
        "system prompt.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A paged cache hands out fixed-size blocks and counts who holds each. A block returns to the free list
#   only at zero references.
# - Prefix reuse names full blocks by a chain of hashes, stops at the first unknown name, and never serves
#   the last token.
# - A block is named only once it is full and its K/V are computed. Until then no other request may
#   find it.
# - A freed block stays findable until it is handed out again, then its old name is forgotten.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
