"""Figure and table scripts. They read aggregated results (CSV under results/), never models."""
