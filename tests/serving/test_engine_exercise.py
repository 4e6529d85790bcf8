"""The block-manager exercise: the answer passes, a blank is not written, each mistake is named."""

from __future__ import annotations

import pytest
from solutions_module import answers

from shardlib.core.serving.blocks import block_hash
from shardlib.exercises.result import NOT_RIGHT, NOT_WRITTEN, PASSED
from shardlib.exercises.serving_engine import grade_block_manager

Good = answers.PrefixBlockManager


class Blank(Good):
    def allocate(self, seq, tokens):
        raise NotImplementedError


class Leaks(Good):
    def free(self, seq):
        table = self.tables.pop(seq)
        for block in table[:-1]:  # forgets the last block
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free_blocks.append(block)


class NoRefCounts(Good):
    def free(self, seq):
        for block in self.tables.pop(seq):
            self.refs[block] = 0
            if block not in self.free_blocks:
                self.free_blocks.append(block)


def _without_parent(method):
    def patched(self, seq, tokens):
        import shardlib.core.serving.blocks as blocks

        original = blocks.block_hash
        blocks.block_hash = lambda parent, piece: original(None, piece)
        try:
            return method(self, seq, tokens)
        finally:
            blocks.block_hash = original
    return patched


class NoParent(Good):
    allocate = _without_parent(Good.allocate)
    seal = _without_parent(Good.seal)


class NamesInAllocate(Good):
    """Names each fresh block as soon as it is handed out, before the step computes its K/V."""

    def allocate(self, seq, tokens):
        cached = super().allocate(seq, tokens)
        self.seal(seq, tokens)
        return cached


class NamesPartialBlocks(Good):
    def seal(self, seq, tokens):
        super().seal(seq, tokens)
        bs, parent = self.block_size, None
        for i in range(-(-len(tokens) // bs)):
            parent = block_hash(parent, tokens[i * bs:(i + 1) * bs])
            block = self.tables[seq][i]
            if len(tokens[i * bs:(i + 1) * bs]) < bs:  # the last, partial block named too
                self.cached[parent], self.name_of[block] = block, parent


class KeepsOldNames(Good):
    """Hands a freed block out again without forgetting the name of what it held."""

    def allocate(self, seq, tokens):
        names = dict(self.name_of)
        cached = super().allocate(seq, tokens)
        for block in self.tables[seq]:
            if block in names:
                self.name_of[block] = names[block]
                self.cached[names[block]] = block
        return cached


class NeverEvicts(Good):
    def allocate(self, seq, tokens):
        keep = [b for b in self.free_blocks if b in self.name_of]
        self.free_blocks = [b for b in self.free_blocks if b not in self.name_of]  # named blocks stay out
        try:
            return super().allocate(seq, tokens)
        finally:
            self.free_blocks += keep


class CachesTheLastToken(Good):
    def allocate(self, seq, tokens):
        cached = super().allocate(seq, tokens)
        return len(tokens) if len(tokens) % self.block_size == 0 and cached == len(tokens) - self.block_size else cached


class FreeBlank(Good):
    def free(self, seq):
        raise NotImplementedError


class SealBlank(Good):
    def seal(self, seq, tokens):
        raise NotImplementedError


def test_the_answer_passes_and_a_blank_is_not_written():
    assert grade_block_manager(Good).status == PASSED
    assert grade_block_manager(Blank).status == NOT_WRITTEN
    assert grade_block_manager(FreeBlank).status == NOT_WRITTEN  # allocate written, free still blank
    assert grade_block_manager(SealBlank).status == NOT_WRITTEN


@pytest.mark.parametrize("cls, phrase", [
    (Leaks, "leaked blocks"),
    (NoRefCounts, "a shared block was freed while in use"),
    (NoParent, "must chain its parent's name"),
    (NeverEvicts, "a request starved"),
    (CachesTheLastToken, "the last token's logits are needed"),
    (NamesInAllocate, "its K/V are not computed yet ('c' has not been sealed)"),
    (NamesPartialBlocks, "a partial block gets a name only once it is full"),
    (KeepsOldNames, "must forget its old name"),
])
def test_each_mistake_is_named(cls, phrase):
    result = grade_block_manager(cls)
    assert result.status == NOT_RIGHT
    assert any(phrase in m for m in result.messages), result.messages


def test_the_hash_chains():
    assert block_hash(1, (2, 3)) != block_hash(None, (2, 3))
