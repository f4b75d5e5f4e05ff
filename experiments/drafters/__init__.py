"""Choosing and training a drafter: pair_report, expected_acceptance, replay_tau, train; experiments/README.md."""
