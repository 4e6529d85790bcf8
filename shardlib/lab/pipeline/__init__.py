"""Pipeline steps measured on ranks: exactness, the bubble, the schedules' step times.

* ``bubble``: The pipeline claims notebook 03 prints, one ``lab.verdict.Verdict`` per claim, measured again
  while one fails (``verified``).
* ``step``: One pipeline step on the ranks, read as a ``PipelineRun`` and checked against the one-process
  reference.
* ``torch_peer``: torch's own zero-bubble schedules as a peer: their action grids as ``Schedule`` s, and their
  runtime on the ranks beside ours.
* ``zero_bubble``: The zero-bubble claims of notebook 09: each schedule's step measured on the ranks beside
  the prediction of its own list of actions (``simulate``), with the F, B and W measured in the same run.
"""

__all__ = ["bubble", "step", "torch_peer", "zero_bubble"]
