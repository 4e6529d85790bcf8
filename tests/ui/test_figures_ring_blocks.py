"""Pictures drawn from the mechanisms' own data: the ring all-reduce's chunks per step
(``core.collectives.ring_chunks``, the order the run follows), a block manager's tables, the hand-off's pairs."""

from shardlib.core.collectives import ring_chunks
from shardlib.core.serving.blocks import BlockManager
from shardlib.ui.costs_figures import ring_figure
from shardlib.ui.engine_figures import block_table_figure


def test_the_ring_schedule_sums_every_chunk_once_and_hands_each_rank_its_sum():
    for n in (2, 3, 4, 8):
        held = {r: {c: {r} for c in range(n)} for r in range(n)}  # rank -> chunk -> whose parts it sums
        for step in range(n - 1):
            before = {r: {c: set(parts) for c, parts in chunks.items()} for r, chunks in held.items()}
            for r in range(n):
                sent, arrives = ring_chunks(n, (r - 1) % n, step)[0], ring_chunks(n, r, step)[1]
                assert sent == arrives  # what rank r - 1 sends is what rank r adds into
                held[r][arrives] |= before[(r - 1) % n][sent]
        for r in range(n):  # after the reduce-scatter: chunk r + 1 holds every rank's part
            assert held[r][(r + 1) % n] == set(range(n))
            assert ring_chunks(n, r, n - 1)[0] == (r + 1) % n  # and the all-gather starts with it


def test_the_ring_figure_shows_the_runs_order():
    fig = ring_figure(4)
    text = fig.data[0].text
    assert len(text) == 4 and len(text[0]) == 6
    assert all(text[r][s] == f"chunk {ring_chunks(4, r, s)[0]} → {(r + 1) % 4}" for r in range(4) for s in range(6))


def test_the_block_table_figure_shows_each_table_and_the_shared_blocks():
    blocks = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(100, 108))
    for seq, tokens in (("a", prompt + [1]), ("b", prompt + [2, 3])):
        blocks.allocate(seq, tokens, len(tokens))
        blocks.seal(seq, tokens)
    heat = block_table_figure(blocks).data[0]
    assert list(heat.text[0][:3]) == [f"block {b}" for b in blocks.tables["a"]]
    assert list(heat.z[1][:3]) == [1, 1, 0]  # b shares a's two prompt blocks, not its own last one


def test_the_handoff_figure_draws_the_pairs_the_run_uses():
    from shardlib.core.serving.handoff import head_overlaps
    from shardlib.ui.fleet_figures import handoff_links_figure

    fig = handoff_links_figure(2, splits=((1, 2), (2, 1), (2, 2)))
    labels = [a.text for a in fig.layout.annotations if a.text.startswith("head ")]
    expected = [f"head {', '.join(map(str, o.heads))}" for p, d in ((1, 2), (2, 1), (2, 2))
                for o in head_overlaps(2, p, d)]
    assert labels == expected and len(labels) == 6
