"""`tunebench tune`: find the best configuration with few runs.

    space.py    the levers (strategy x world size, checkpointing, compile, optimizer, sequence length) and
                the micro-batches, with the accumulation that holds a global batch
    search.py   the planner ranks, measurements correct it, real OOMs bound the batches, clearly worse
                candidates are pruned or abandoned early
    pareto.py   the front of tokens/s, memory and cost over what was measured

Running the candidates, storing them as a sweep and writing the results is tunebench.api.tune's job.
"""

from tunebench.tune.pareto import Point, front
from tunebench.tune.search import OBJECTIVES, Candidate, Objective, Tuner
from tunebench.tune.space import Space

__all__ = ["OBJECTIVES", "Candidate", "Objective", "Point", "Space", "Tuner", "front"]
