"""Data parallelism: flat buckets of gradients (DDP, ZeRO-1, ZeRO-2) and ZeRO-3's gathered units.

* ``buckets``: DDP, ZeRO-1 and ZeRO-2 on one rank: all the weights in flat buckets, gradients reduced bucket
  by bucket.
* ``flat``: Flat groups: parameters laid end to end in one buffer, padded so that ``dp`` ranks split it
  evenly.
* ``zero3``: ZeRO-3 (FSDP's full sharding) on one rank: each unit's weights gathered just in time, then freed.
"""

__all__ = ["buckets", "flat", "zero3"]
