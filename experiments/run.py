"""`python -m experiments.run`: the entry point; the code lives in experiments.sweep.runner.

The Hydra task function must live in an importable module (not `__main__`), so that
launchers that pickle it into other processes (joblib, submitit) can load it back.
"""
from experiments.sweep.runner import load_pair, main, point, run

__all__ = ["load_pair", "main", "point", "run"]

if __name__ == "__main__":
    main()
