"""Templates of the standalone transformers code written next to exported AGLU/ANAct models."""
