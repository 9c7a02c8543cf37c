"""Questions answered with the formulas: the capacity query (fit), the strategy search (planner)
and the sweep over many configurations."""
