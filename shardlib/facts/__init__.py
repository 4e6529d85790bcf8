"""Facts with sources: real models' shapes and the hardware they run on. Pure: no torch.

* ``hardware``: Hardware facts, each with its source: links between devices, GPUs, clusters.
* ``models``: Model shapes: ``ModelConfig`` and presets of real public models, from their published configs.
"""

__all__ = ["hardware", "models"]
