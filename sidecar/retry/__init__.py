"""Whether and when to try again: the decision matrix, the policy, the engine's loop."""
