"""tuner: find the vLLM engine settings that serve a team's own traffic best, by measuring them."""

__version__ = "0.1.0"
