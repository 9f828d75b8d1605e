"""One module per built-in reward kind, each registering itself with `omnirl.scorers.kinds.register_kind`
(the registry lives below the roles, so the controller reads a kind's `reads_text` and builds group scorers
without importing the reward role; docs/extending.md says how to add a kind)."""
