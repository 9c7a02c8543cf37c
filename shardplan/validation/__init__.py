"""Judging shardplan against runs nobody here made: published runs as queries (``runs``) and the
accuracy report over them. Above ``planning`` (it sends rows through ``fit``'s path), below ``cli``.
"""
