"""Routes by topic: decisions, the policy, health."""
