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


class NoParent(Good):
    def allocate(self, seq, tokens):
        import shardlib.core.serving.blocks as blocks

        original = blocks.block_hash
        blocks.block_hash = lambda parent, piece: original(None, piece)
        try:
            return super().allocate(seq, tokens)
        finally:
            blocks.block_hash = original


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


def test_the_answer_passes_and_a_blank_is_not_written():
    assert grade_block_manager(Good).status == PASSED
    assert grade_block_manager(Blank).status == NOT_WRITTEN
    assert grade_block_manager(FreeBlank).status == NOT_WRITTEN  # allocate written, free still blank


@pytest.mark.parametrize("cls, phrase", [
    (Leaks, "leaked blocks"),
    (NoRefCounts, "a shared block was freed while in use"),
    (NoParent, "must chain its parent's name"),
    (NeverEvicts, "a request starved"),
    (CachesTheLastToken, "the last token's logits are needed"),
])
def test_each_mistake_is_named(cls, phrase):
    result = grade_block_manager(cls)
    assert result.status == NOT_RIGHT
    assert any(phrase in m for m in result.messages), result.messages


def test_the_hash_chains():
    assert block_hash(1, (2, 3)) != block_hash(None, (2, 3))
