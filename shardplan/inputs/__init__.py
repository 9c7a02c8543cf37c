"""What a query states: units, model and hardware profiles, the strategy vocabulary, the training
configuration, stacks, and the parsing of query text and names into them."""
