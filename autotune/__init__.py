"""autotune: a Bayesian autotuner daemon for LLM serving engines."""
