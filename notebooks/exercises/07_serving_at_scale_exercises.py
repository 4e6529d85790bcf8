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
# # 07 · Exercise: route requests by prefix, with a balance threshold
#
# **What you will do.** Write the choice at the heart of notebook 07's prefix-aware router, a simplified
# form of SGLang's cache-aware router (SGLang also asks the queues to differ by a ratio). A request should
# go to the replica that already holds its prompt's prefix in its cache. But if every request shares one
# system prompt, that sends them all to one replica. So the router balances once the queues differ by more
# than a threshold. The checker replays traces of requests beside the library's router
# (`shardlib.core.serving.router`). It names the first mistake it sees: the threshold ignored, the
# threshold inverted, balancing at the threshold itself, or the load not updated after a decision.
#
# Until you write `route`, the checker says "not written yet". About 20 minutes.

# %% [markdown]
# ## The state you are given
#
# Your class starts from `PrefixRouterState(replicas, block_size, balance_threshold)`. It keeps:
#
# - `queued[i]`: the requests the router sent to replica `i` that are not finished yet;
# - `trees[i]`: an approximate prefix tree of replica `i`, the blocks of every prompt sent there (not
#   the replica's real cache: the router only knows what it sent);
# - `balance_threshold`: how far apart the queues may drift before the router balances.
#
# Three methods come with it:
#
# - `matched_blocks(request)`: per replica, how many leading full blocks of the prompt its tree holds;
# - `remember(replica, request)`: add the prompt's blocks to that replica's tree;
# - `finished(replica)`: one request there is done (the checker calls it, not you).

# %% [markdown]
# ## Exercise: `route`
#
# `route(request)` returns the index of the replica for `request` and records the decision. The rules:
#
# 1. **Balance first.** If the most queued replica has more than `balance_threshold` requests above the
#    least queued, send the request to the least queued (ties: the lower index).
# 2. **Else follow the prefix.** Send it to the replica with the most matched blocks. Ties go to the
#    fewer queued, then the lower index. If no replica matches a block, this is the least queued.
# 3. **Record it.** One more request is queued at the chosen replica, and its tree remembers the prompt.
#
# Run the checker as soon as you have a first version. If it fails, read why before you open the hint.
#
# <details><summary>Hint (open it after the checker's first answer)</summary>
#
# Compute `spread = max(self.queued) - min(self.queued)` and compare it with the threshold before you look
# at any prefix. A "more than" is `>`, not `>=`. Python's `min(range(n), key=lambda i: (...))` picks by a
# tuple, which settles the ties in order: `(-matched[i], self.queued[i], i)` for the prefix rule. Without
# step 3 the next request sees an idle replica that is not idle, and a tree that never learns the prompt.
#
# </details>

# %%
from shardlib.exercises.serving_at_scale import PrefixRouterState


class MyPrefixRouter(PrefixRouterState):
    """Prefix-aware routing: balance when the queues are too far apart, else follow the longest prefix."""

    def route(self, request) -> int:
        """The replica for ``request``; the decision recorded in ``queued`` and in the replica's tree."""
        raise NotImplementedError("write route: choose the replica, then record the choice")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.serving_at_scale import grade_prefix_router

grade_prefix_router(MyPrefixRouter)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Three replicas have 6, 3 and 5 requests queued, with a threshold of 2. Replica 2 holds the whole prompt. "
        "Where does the request go?",
        ("Replica 2, because it holds the whole prompt", "Replica 1, because the queue spread of 3 passes 2",
         "Replica 0, because it saw the prompt first", "Any replica: the router picks one at random"),
        1,
        "Most minus least queued is 6 - 3 = 3, more than 2: the router balances first, so the least queued wins.",
    ),
    Question(
        "Your route forgets to add one to queued. What does the router do on a burst of requests sharing a prompt?",
        ("It balances them evenly over the replicas", "It refuses them once the cache is full",
         "It piles them all onto a single replica", "It sends each to a random replica"),
        2,
        "The spread stays 0, so the balance rule never fires and the longest prefix keeps winning.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A prefix-aware router sends a request where its prompt's prefix is likely cached, so the prefill
#   skips it.
# - Affinity alone piles a shared prompt's requests on one replica: a balance threshold trades cache
#   hits for even queues.
# - The router balances on its own count of requests in flight, so every decision must update it.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
