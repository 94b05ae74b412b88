"""What keeps retries from making an outage worse: budget, circuit, fleet state."""
