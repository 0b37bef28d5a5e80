"""Code generation: a `Program` after its passes -> source text, one backend per target language."""
