"""shardplan: will it fit, how fast will it run, and which sharding strategy to use."""

__version__ = "0.1.0"
