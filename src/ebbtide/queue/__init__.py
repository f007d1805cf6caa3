"""Jobs: the model, the store, the state machine, submission and ordering."""
