"""The compiled artifact (`CompiledGraph`: source + what it binds, plain data) and its disk cache."""
