"""Questions answered with the formulas, one module per job:

* ``evaluate``: the evaluator fit and plan share (single configurations as rows of one pass;
  memory + communication + time + verdict of a grid);
* ``fit``: the capacity query (does it fit, term by term, and what would make it fit);
* ``planner``: the strategy search; ``workload``: the global batch as sequences per GPU;
* the sweep: ``grid_sweep`` (``sweep()``), ``sweep_axes``, ``sweep_plan``, ``sweep_chunks``,
  ``sweep_frame``, and ``sweep_analysis`` (pareto, fewest GPUs per group).
"""
