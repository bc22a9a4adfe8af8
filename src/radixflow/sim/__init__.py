"""Cost-model simulator: an executor that says how long a worker call would take on a given GPU."""
