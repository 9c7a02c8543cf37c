"""shardplan: will it fit, how fast will it run, and which sharding strategy to use."""

__version__ = "0.1.0"

from shardplan.sweep import pareto, sweep  # noqa: E402  (the notebook API: shardplan.sweep(...))
