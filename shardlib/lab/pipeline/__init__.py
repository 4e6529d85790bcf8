"""Pipeline steps measured on ranks: exactness, the bubble, the schedules' step times.

* ``bubble_drivers``: The pipeline claims notebook 03 prints, one ``lab.verdict.Verdict`` per claim, measured
  again while one fails (``verified``).
* ``drivers``: Pipeline steps run on a pool: gathered, measured, and checked against the one-process
  reference (``unpipelined_step``: the whole stack, microbatch by microbatch).
* ``ranks``: ``pipeline_step_on_rank``: the stage loop (``core.pipeline.engine``) on a rank, with a probe
  attached, and the input checks.
* ``split_drivers``: The zero-bubble claims of notebook 09: each schedule's step measured on the ranks beside
  the prediction of its own list of actions (``simulate``), evaluated with the F, B and W measured in the
  same run.
* ``torch_peer``: torch's own zero-bubble schedules as a peer: their action grids as ``Schedule`` s, and their
  runtime on the ranks beside ours.
"""

__all__ = ["bubble_drivers", "drivers", "ranks", "split_drivers", "torch_peer"]
