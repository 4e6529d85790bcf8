"""Context parallelism: a long sequence split over ranks, attention still exact (ring, Ulysses, all-gather).

* ``all_gather``: All-gather K/V context parallelism on a rank (Llama 3, Dubey et al. 2024, section 3.3.2):
  gather, then attend.
* ``online_softmax``: Attention one block of keys at a time: partials, their merge, and each block's
  gradients.
* ``placement``: Token placement: which tokens each rank holds, contiguous or zigzag, and each rank's shard cut
  and joined.
* ``ring``: Ring attention on a rank, forward and backward: queries stay, keys and values travel round the
  ring.
* ``ulysses``: All-to-all sequence parallelism on a rank (DeepSpeed-Ulysses, Jacobs et al. 2023): sequence to
  heads and back.
"""

__all__ = ["all_gather", "online_softmax", "placement", "ring", "ulysses"]
