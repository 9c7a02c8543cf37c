"""One module per framework family; ``shardplan.export`` dispatches to them."""
