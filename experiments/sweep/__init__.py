"""What `python -m experiments.run` is made of: the Hydra task (runner), variants side by side, costs, figures."""
