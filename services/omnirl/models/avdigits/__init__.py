"""The built-in audio+video digits model (family `av-digits`): docs/omni.md, "The built-in audio+video task"."""
